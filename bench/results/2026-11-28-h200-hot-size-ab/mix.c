/* One process, many rounds: in each, the same-stream pair and RMM's random loop on sop's pool
 * and on the driver's, and the two stream queries sop makes per allocation, timed back to back,
 * so that a change of speed over time inside one process shows apart from one between
 * processes. usage: mix ROUNDS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <dlfcn.h>
#include "sop.h"
#define OK(x) do { CUresult r_ = (x); if (r_) { printf("%s: %d\n", #x, r_); exit(1); } } while (0)
static uint64_t st;
static uint64_t nx(void) { uint64_t z = (st += 0x9e3779b97f4a7c15ull); z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; z = (z ^ (z >> 27)) * 0x94d049bb133111ebull; return z ^ (z >> 31); }
static uint64_t below(uint64_t n) { return nx() % n; }
struct live { void *p; size_t size; };
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static sop_pool_t sp;
static CUmemoryPool dp;
static CUresult (*d_alloc)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
static CUresult (*d_free)(CUdeviceptr, CUstream);
static CUresult (*ssync)(CUstream);
static inline CUresult A(int drv, void **p, size_t n, CUstream s) { if (drv) return d_alloc((CUdeviceptr *)p, n, dp, s); return sop_malloc_from_pool_async(p, n, sp, s); }
static inline CUresult F(int drv, void *p, CUstream s) { if (drv) return d_free((CUdeviceptr)p, s); return sop_free_async(p, s); }
static struct live *lv;

static double pair(int drv, long n, size_t size, CUstream s)
{
	void *q; double t0 = now();
	for (long i = 0; i < n; i++) { OK(A(drv, &q, size, s)); OK(F(drv, q, s)); }
	double dt = (now() - t0) / n; OK(ssync(s)); return dt;
}
static double rnd(int drv, long n, size_t max, CUstream s)
{
	long nl = 0, allocs = 0; size_t bytes = 0; st = 20240601;
	double t0 = now();
	for (long i = 0; i < 2 * n; i++) {
		size_t size = 1 + below(max);
		int a = nl == 0 || below(100) < 73;
		if (a && allocs < n && bytes + size < (size_t)16000 << 20) { OK(A(drv, &lv[nl].p, size, s)); lv[nl++].size = size; allocs++; bytes += size; continue; }
		if (nl) { long j = (long)(below(n) % nl); OK(F(drv, lv[j].p, s)); bytes -= lv[j].size; lv[j] = lv[--nl]; }
	}
	double dt = (now() - t0) / (2.0 * n);
	while (nl) OK(F(drv, lv[--nl].p, s));
	OK(ssync(s)); return dt;
}
int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 20;
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	CUresult (*init)(unsigned) = dlsym(lib, "cuInit");
	CUresult (*retain)(CUcontext *, CUdevice) = dlsym(lib, "cuDevicePrimaryCtxRetain");
	CUresult (*setcur)(CUcontext) = dlsym(lib, "cuCtxSetCurrent");
	CUresult (*mks)(CUstream *, unsigned) = dlsym(lib, "cuStreamCreate");
	CUresult (*pcreate)(CUmemoryPool *, const CUmemPoolProps *) = dlsym(lib, "cuMemPoolCreate");
	CUresult (*pset)(CUmemoryPool, CUmemPool_attribute, void *) = dlsym(lib, "cuMemPoolSetAttribute");
	CUresult (*gid)(CUstream, unsigned long long *) = dlsym(lib, "cuStreamGetId");
	CUresult (*isc)(CUstream, CUstreamCaptureStatus *) = dlsym(lib, "cuStreamIsCapturing");
	ssync = dlsym(lib, "cuStreamSynchronize");
	d_alloc = dlsym(lib, "cuMemAllocFromPoolAsync");
	d_free = dlsym(lib, "cuMemFreeAsync");
	CUcontext ctx; CUstream s;
	CUmemPoolProps pp; memset(&pp, 0, sizeof pp);
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	OK(init(0)); OK(retain(&ctx, 0)); OK(setcur(ctx)); OK(mks(&s, 1));
	cuuint64_t t = ~0ull;
	OK(pcreate(&dp, &pp)); OK(pset(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
	OK(sop_pool_create(&sp, &pp)); OK(sop_pool_set_attr(sp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
	lv = calloc(10000, sizeof *lv);
	rnd(0, 10000, 1 << 20, s); rnd(1, 10000, 1 << 20, s); pair(0, 10000, 256, s); pair(1, 10000, 256, s);
	printf("round  t_s  sop_pair_ns drv_pair_ns ratio | sop_rand_ns drv_rand_ns ratio | queries_ns\n");
	double t00 = now();
	for (int r = 0; r < rounds; r++) {
		double sp1 = pair(0, 200000, 256, s), dp1 = pair(1, 20000, 256, s);
		double sr = rnd(0, 10000, 1 << 20, s), dr = rnd(1, 10000, 1 << 20, s);
		unsigned long long id; CUstreamCaptureStatus cs; double c0 = now();
		for (long i = 0; i < 100000; i++) { OK(gid(s, &id)); OK(isc(s, &cs)); }
		double q = (now() - c0) / 100000;
		printf("%5d %5.1f %8.1f %8.1f %6.2f | %8.1f %8.1f %6.2f | %6.1f\n", r, (now() - t00) / 1e9, sp1, dp1, dp1 / sp1, sr, dr, dr / sr, q);
		fflush(stdout);
	}
	return 0;
}
