/* RMM random_allocations, or same-stream pairs, against sop or the driver's pool: one warm
 * run, then timed runs; median ns per operation (random) or per pair (pair).
 * usage: rand sop|drv rand N MAX_MIB REPS | rand sop|drv pair N SIZE REPS */
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
static int drv;
static sop_pool_t sp;
static CUmemoryPool dp;
static CUresult (*d_alloc)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
static CUresult (*d_free)(CUdeviceptr, CUstream);
static inline CUresult A(void **p, size_t n, CUstream s) { if (drv) return d_alloc((CUdeviceptr *)p, n, dp, s); return sop_malloc_from_pool_async(p, n, sp, s); }
static inline CUresult F(void *p, CUstream s) { if (drv) return d_free((CUdeviceptr)p, s); return sop_free_async(p, s); }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv)
{
	drv = !strcmp(argv[1], "drv");
	int pair = !strcmp(argv[2], "pair");
	long n = atol(argv[3]);
	size_t max = pair ? strtoul(argv[4], 0, 0) : strtoul(argv[4], 0, 0) << 20;
	int reps = atoi(argv[5]);
	void *lib = dlopen(getenv("SOP_DRIVER_LIBRARY") ? getenv("SOP_DRIVER_LIBRARY") : "libcuda.so.1", RTLD_NOW);
	CUresult (*init)(unsigned) = dlsym(lib, "cuInit");
	CUresult (*retain)(CUcontext *, CUdevice) = dlsym(lib, "cuDevicePrimaryCtxRetain");
	CUresult (*setcur)(CUcontext) = dlsym(lib, "cuCtxSetCurrent");
	CUresult (*mks)(CUstream *, unsigned) = dlsym(lib, "cuStreamCreate");
	CUresult (*ssync)(CUstream) = dlsym(lib, "cuStreamSynchronize");
	CUresult (*pcreate)(CUmemoryPool *, const CUmemPoolProps *) = dlsym(lib, "cuMemPoolCreate");
	CUresult (*pset)(CUmemoryPool, CUmemPool_attribute, void *) = dlsym(lib, "cuMemPoolSetAttribute");
	d_alloc = dlsym(lib, "cuMemAllocFromPoolAsync");
	d_free = dlsym(lib, "cuMemFreeAsync");
	CUcontext ctx; CUstream s;
	CUmemPoolProps pp; memset(&pp, 0, sizeof pp);
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	OK(init(0)); OK(retain(&ctx, 0)); OK(setcur(ctx)); OK(mks(&s, 1));
	cuuint64_t t = ~0ull;
	if (drv) { OK(pcreate(&dp, &pp)); OK(pset(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t)); }
	else { OK(sop_pool_create(&sp, &pp)); OK(sop_pool_set_attr(sp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t)); }
	if (getenv("CALLS")) {
		CUresult (*gid)(CUstream, unsigned long long *) = dlsym(lib, "cuStreamGetId");
		CUresult (*isc)(CUstream, CUstreamCaptureStatus *) = dlsym(lib, "cuStreamIsCapturing");
		unsigned long long id; CUstreamCaptureStatus cs; double c0 = now();
		for (long i = 0; i < 200000; i++) { OK(gid(s, &id)); OK(isc(s, &cs)); }
		double c1 = now(); volatile double x = 1; for (long i = 0; i < 20000000; i++) x = x * 1.0000001;
		double c2 = now();
		printf("calls %.1f ns/pair-of-queries, fp loop %.2f ns/iter; ", (c1 - c0) / 200000, (c2 - c1) / 20000000);
	}
	struct live *lv = calloc(n, sizeof *lv);
	size_t peak = 0;
	CUresult (*pget)(CUmemoryPool, CUmemPool_attribute, void *) = dlsym(lib, "cuMemPoolGetAttribute");
	cuuint64_t hi = 0;
	double v[256]; int k;
	for (k = 0; k <= reps; k++) {
		double t0, dt;
		if (pair) {
			void *q;
			t0 = now();
			for (long i = 0; i < n; i++) { OK(A(&q, max, s)); OK(F(q, s)); }
			dt = (now() - t0) / n;
		} else {
			long nl = 0, allocs = 0; size_t bytes = 0;
			st = 20240601;
			t0 = now();
			for (long i = 0; i < 2 * n; i++) {
				size_t size = 1 + below(max);
				int a = nl == 0 || below(100) < 73;
				if (a && allocs < n && bytes + size < (size_t)16000 << 20) {
					OK(A(&lv[nl].p, size, s));
					lv[nl++].size = size; allocs++; bytes += size; if (bytes > peak) peak = bytes; continue;
				}
				if (nl) { long j = (long)(below(n) % nl); OK(F(lv[j].p, s)); bytes -= lv[j].size; lv[j] = lv[--nl]; }
			}
			dt = (now() - t0) / (2.0 * n);
			while (nl) OK(F(lv[--nl].p, s));
		}
		OK(ssync(s));
		if (k) v[k - 1] = dt;
		if (!k && !pair) { if (drv) OK(pget(dp, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &hi)); else OK(sop_pool_get_attr(sp, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &hi)); }
	}
	qsort(v, reps, sizeof v[0], cmp);
	printf("%s %s n=%ld %s=%zu: median %.1f ns, min %.1f, mem %.3f\n", argv[1], argv[2], n, pair ? "size" : "maxMiB", pair ? max : max >> 20, v[reps / 2], v[0], peak ? (double)hi / peak : 0.0);
	return 0;
}
