/* A fresh pool's create, first 1 MiB allocation and destroy, each allocator alone in its
 * process: the harness runs sop, the driver's pool and the bare calls in one process, where
 * what one frees the next may find (the driver's pool ran 14-17 us below the bare calls on a
 * fresh range while sop gave its reservation back, and above them while sop kept it: ab/).
 *   alone sop|driver|bare [N]: N repetitions (default 101) of: create a pool (release
 *   threshold UINT64_MAX), time its first 1 MiB, free, synchronize, time its destroy; bare is
 *   a 32 MiB piece on a range of four times the device's memory, reserved and freed each time.
 *   Medians and quartiles of the repetitions after the first, and the first one alone.
 *   gcc -O2 alone.c -Iinclude -I<cuda>/include -L<build> -lsop -lcuda -o alone */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "sop.h"

#define OK(x) do { CUresult r_ = (CUresult)(x); if (r_) { printf("%s: %d (line %d)\n", #x, r_, __LINE__); exit(1); } } while (0)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static void report(const char *what, double *v, int n)
{
	double first = v[0];
	qsort(v + 1, n - 1, sizeof *v, cmpd);
	printf("  %-8s %7.1f us (%.1f-%.1f), first %.1f\n", what, v[1 + (n - 1) / 2], v[1 + (n - 1) / 4],
	       v[1 + 3 * (n - 1) / 4], first);
}

int main(int argc, char **argv)
{
	const char *who = argc > 1 ? argv[1] : "sop";
	int n = argc > 2 ? atoi(argv[2]) : 101, i;
	double *c = calloc(n, sizeof *c), *f = calloc(n, sizeof *f), *d = calloc(n, sizeof *d);
	cuuint64_t thr = ~0ull;
	CUmemPoolProps pp;
	CUdevice dev;
	CUcontext ctx;
	CUstream s;
	size_t total, gran;
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;

	OK(cuInit(0));
	OK(cuDeviceGet(&dev, 0));
	OK(cuDevicePrimaryCtxRetain(&ctx, dev));
	OK(cuCtxSetCurrent(ctx));
	OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(cuDeviceTotalMem(&total, dev));
	memset(&pp, 0, sizeof pp);
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	memset(&prop, 0, sizeof prop);
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location = pp.location;
	acc.location = pp.location;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	for (i = 0; i < n; i++) {
		double t0 = now();
		if (!strcmp(who, "sop")) {
			sop_pool_t p;
			void *q;
			OK(sop_pool_create(&p, &pp));
			c[i] = now() - t0;
			OK(sop_pool_set_attr(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
			t0 = now();
			OK(sop_malloc_from_pool_async(&q, 1 << 20, p, s));
			f[i] = now() - t0;
			OK(sop_free_async(q, s));
			OK(sop_stream_synchronize(s));
			t0 = now();
			OK(sop_pool_destroy(p));
			d[i] = now() - t0;
		} else if (!strcmp(who, "driver")) {
			CUmemoryPool p;
			CUdeviceptr q;
			OK(cuMemPoolCreate(&p, &pp));
			c[i] = now() - t0;
			OK(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
			t0 = now();
			OK(cuMemAllocFromPoolAsync(&q, 1 << 20, p, s));
			f[i] = now() - t0;
			OK(cuMemFreeAsync(q, s));
			OK(cuStreamSynchronize(s));
			t0 = now();
			OK(cuMemPoolDestroy(p));
			d[i] = now() - t0;
		} else {
			size_t big = (total * 4 + ((size_t)1 << 30) - 1) & ~(((size_t)1 << 30) - 1);
			CUdeviceptr va;
			CUmemGenericAllocationHandle h;
			OK(cuMemAddressReserve(&va, big, (size_t)1 << 30, 0, 0));
			c[i] = now() - t0;
			t0 = now();
			OK(cuMemCreate(&h, 32 << 20, &prop, 0));
			OK(cuMemMap(va + gran, 32 << 20, 0, h, 0));
			OK(cuMemSetAccess(va + gran, 32 << 20, &acc, 1));
			f[i] = now() - t0;
			t0 = now();
			OK(cuMemUnmap(va + gran, 32 << 20));
			OK(cuMemRelease(h));
			OK(cuMemAddressFree(va, big));
			d[i] = now() - t0;
		}
	}
	printf("%s alone, %d repetitions: median (quartiles) of all but the first\n", who, n);
	report("create", c, n);
	report("first", f, n);
	report("destroy", d, n);
	return 0;
}
