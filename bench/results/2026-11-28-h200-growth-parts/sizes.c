/* The bare driver calls of a growth by size (create, map, set access; unmap, release), medians
 * of the second round of 41, and what the driver's pool maps for a fresh pool's first 1 MiB.
 *   gcc -O2 -I<cuda>/include sizes.c -L<cuda>/lib64/stubs -lcuda */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda.h>
#define OK(x) do { CUresult r_ = (x); if (r_) { printf("%s: %d (line %d)\n", #x, r_, __LINE__); exit(1); } } while (0)
#define N 41
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmpd(const void *a, const void *b){double x=*(const double*)a,y=*(const double*)b;return x<y?-1:x>y;}
static double med(double *v){qsort(v,N,sizeof *v,cmpd);return v[N/2];}
int main(void)
{
	CUcontext ctx; CUstream s; CUdevice dev = 0;
	OK(cuInit(0)); OK(cuDevicePrimaryCtxRetain(&ctx, 0)); OK(cuCtxSetCurrent(ctx)); OK(cuStreamCreate(&s, 1));
	CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = dev;
	CUmemAccessDesc acc; memset(&acc, 0, sizeof acc); acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CUdeviceptr va; OK(cuMemAddressReserve(&va, 1ull << 30, 0, 0, 0));
	for (size_t mb = 2; mb <= 64; mb *= 2) {
		double c[N], m[N], a[N], u[N], r[N];
		size_t sz = mb << 20;
		for (int w = 0; w < 2; w++) for (int i = 0; i < N; i++) {
			CUmemGenericAllocationHandle h; double t0 = now();
			OK(cuMemCreate(&h, sz, &prop, 0)); double t1 = now();
			OK(cuMemMap(va, sz, 0, h, 0)); double t2 = now();
			OK(cuMemSetAccess(va, sz, &acc, 1)); double t3 = now();
			OK(cuMemUnmap(va, sz)); double t4 = now();
			OK(cuMemRelease(h)); double t5 = now();
			c[i] = t1 - t0; m[i] = t2 - t1; a[i] = t3 - t2; u[i] = t4 - t3; r[i] = t5 - t4;
		}
		printf("%3zu MiB: create %.1f map %.1f access %.1f | unmap %.1f release %.1f us\n", mb, med(c), med(m), med(a), med(u), med(r));
	}
	CUmemPoolProps pp; memset(&pp, 0, sizeof pp);
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	for (int k = 0; k < 3; k++) {
		CUmemoryPool dp; CUdeviceptr q; cuuint64_t res = 0, thr = ~0ull; size_t f0, f1, t;
		OK(cuMemPoolCreate(&dp, &pp)); OK(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
		OK(cuMemGetInfo(&f0, &t));
		double t0 = now(); OK(cuMemAllocFromPoolAsync(&q, 1 << 20, dp, s)); double t1 = now();
		OK(cuMemGetInfo(&f1, &t));
		OK(cuMemPoolGetAttribute(dp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res));
		printf("driver pool first 1 MiB: %.1f us, reserved %llu MiB, device free fell by %zu MiB\n", t1 - t0, (unsigned long long)res >> 20, (f0 - f1) >> 20);
		OK(cuMemFreeAsync(q, s)); OK(cuStreamSynchronize(s)); OK(cuMemPoolDestroy(dp));
	}
	return 0;
}
