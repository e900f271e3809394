/* random-after.c - why sop's random run is slower when the driver's pool runs between its repetitions: time
 * sop's 20000-op run (RMM's random_allocations, sizes up to MAXMIB) after each of: nothing (sop
 * alone), the driver's pool's same run, a CPU sweep over THRASH MiB of memory, and sop's own
 * run again. Medians of REPS. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "sop.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static unsigned long long x;
static unsigned long long rnd(void){x+=0x9e3779b97f4a7c15ull; unsigned long long z=x; z=(z^(z>>30))*0xbf58476d1ce4e5b9ull; z=(z^(z>>27))*0x94d049bb133111ebull; return z^(z>>31);}
enum { N = 10000 };
static void *live[N]; static size_t lsz[N];
static CUstream s; static sop_pool_t sp; static CUmemoryPool dp; static size_t maxs;
static int alloc(int drv, void **p, size_t sz){ return drv ? cuMemAllocFromPoolAsync((CUdeviceptr*)p, sz, dp, s) : sop_malloc_from_pool_async(p, sz, sp, s); }
static void fre(int drv, void *p){ if (drv) cuMemFreeAsync((CUdeviceptr)p, s); else sop_free_async(p, s); }
static double run(int drv){
	long n=0, allocs=0; size_t bytes=0, cap=(size_t)10<<30; x=20240601;
	double t0=now();
	for (long i = 0; i < 2 * N; i++) {
		size_t sz = 1 + rnd() % maxs; int al = n == 0 || rnd() % 100 < 73;
		if (al && allocs < N && bytes + sz < cap && alloc(drv, &live[n], sz) == CUDA_SUCCESS) { lsz[n++] = sz; allocs++; bytes += sz; continue; }
		if (n) { long j = (long)(rnd() % N) % n; fre(drv, live[j]); bytes -= lsz[j]; live[j] = live[n-1]; lsz[j] = lsz[--n]; }
	}
	double t = now() - t0;
	while (n) fre(drv, live[--n]);
	cuStreamSynchronize(s);
	return t / (2.0 * N);
}
static int cmp(const void *a, const void *b){ double x=*(double*)a, y=*(double*)b; return x<y?-1:x>y; }
static char *junk; static size_t junk_n;
static void thrash(void){ for (size_t i = 0; i < junk_n; i += 64) junk[i]++; }
int main(void){
	CUdevice d; CUcontext c;
	int reps = getenv("REPS") ? atoi(getenv("REPS")) : 15;
	maxs = (size_t)(getenv("MAXMIB") ? atoi(getenv("MAXMIB")) : 1) << 20;
	junk_n = (size_t)(getenv("THRASH") ? atoi(getenv("THRASH")) : 256) << 20;
	junk = malloc(junk_n); memset(junk, 1, junk_n);
	cuInit(0); cuDeviceGet(&d,0); cuDevicePrimaryCtxRetain(&c,d); cuCtxSetCurrent(c);
	cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	CUmemPoolProps pp={0}; pp.allocType=CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type=CU_MEM_LOCATION_TYPE_DEVICE;
	CUmemPoolProps dpp = pp;
	if (getenv("SOPMAX")) pp.maxSize = (size_t)atoi(getenv("SOPMAX")) << 30;
	if (getenv("DRVMAX")) dpp.maxSize = (size_t)atoi(getenv("DRVMAX")) << 30;
	sop_pool_create(&sp,&pp); cuMemPoolCreate(&dp,&dpp); cuuint64_t keep=~0ull;
	sop_pool_set_attr(sp,CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,&keep); cuMemPoolSetAttribute(dp,CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,&keep);
	run(0); run(1);
	const char *names[] = {"sop after sop", "sop after driver", "sop after CPU sweep", "sop after driver+sweep", "driver after sop"};
	double t[5][64];
	for (int r = 0; r < reps && r < 64; r++) {
		run(0); t[0][r] = run(0);
		run(1); t[1][r] = run(0);
		thrash(); t[2][r] = run(0);
		run(1); thrash(); t[3][r] = run(0);
		t[4][r] = run(1);
	}
	for (int v = 0; v < 5; v++) { qsort(t[v], reps, sizeof(double), cmp); printf("sizes <= %zu MiB, %-24s %7.1f ns/op (%.1f-%.1f)\n", maxs>>20, names[v], t[v][reps/2], t[v][0], t[v][reps-1]); }
	return 0;
}
