/* Whether one cuMemUnmap and one cuMemSetAccess may span several adjacent mappings, and what
 * each costs against one call per mapping. gcc -O2 ranges.c -I/usr/local/cuda/include -lcuda */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define OK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_; cuGetErrorName(r_, &s_); \
	printf("%s: %s (line %d)\n", #x, s_, __LINE__); exit(1); } } while (0)

static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

int main(void)
{
	CUdevice dev; CUcontext ctx; CUmemAllocationProp prop = {0}; CUmemAccessDesc acc = {0};
	size_t MiB = 1 << 20, pieces[] = {2 * MiB, 32 * MiB, 64 * MiB, 128 * MiB};
	int ks[] = {1, 4, 16};
	CUdeviceptr va;
	OK(cuInit(0)); OK(cuDeviceGet(&dev, 0)); OK(cuDevicePrimaryCtxRetain(&ctx, dev)); OK(cuCtxSetCurrent(ctx));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
	acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	OK(cuMemAddressReserve(&va, 4096 * MiB, 0, 0, 0));
	for (int pi = 0; pi < 4; pi++) for (int ki = 0; ki < 3; ki++) {
		size_t p = pieces[pi]; int k = ks[ki];
		if (p * k > 2048 * MiB) continue;
		CUmemGenericAllocationHandle h[16];
		double one_map[9], one_acc[9], one_un[9], per_acc[9], per_un[9], mapk[9];
		for (int i = 0; i < k; i++) OK(cuMemCreate(&h[i], p, &prop, 0));
		for (int rep = 0; rep < 9; rep++) {
			double t0 = now_us();
			for (int i = 0; i < k; i++) OK(cuMemMap(va + i * p, p, 0, h[i], 0));
			double t1 = now_us();
			CUresult r = cuMemSetAccess(va, p * k, &acc, 1);
			double t2 = now_us();
			if (r != CUDA_SUCCESS) { const char *s; cuGetErrorName(r, &s); printf("set access over %d mappings of %zu MiB: %s\n", k, p >> 20, s); exit(1); }
			if (rep == 0) {
				unsigned *hb = malloc(8);
				OK(cuMemsetD32(va, 0x12345678u, p * k / 4));
				OK(cuMemcpyDtoH(hb, va + p * k - 4, 4));
				if (hb[0] != 0x12345678u) printf("data wrong\n");
				free(hb);
			}
			r = cuMemUnmap(va, p * k);
			double t3 = now_us();
			if (r != CUDA_SUCCESS) { const char *s; cuGetErrorName(r, &s); printf("unmap over %d mappings of %zu MiB: %s\n", k, p >> 20, s); exit(1); }
			/* one call per mapping */
			for (int i = 0; i < k; i++) OK(cuMemMap(va + i * p, p, 0, h[i], 0));
			double t4 = now_us();
			for (int i = 0; i < k; i++) OK(cuMemSetAccess(va + i * p, p, &acc, 1));
			double t5 = now_us();
			for (int i = 0; i < k; i++) OK(cuMemUnmap(va + i * p, p));
			double t6 = now_us();
			mapk[rep] = t1 - t0; one_acc[rep] = t2 - t1; one_un[rep] = t3 - t2;
			one_map[rep] = t4 - t3; per_acc[rep] = t5 - t4; per_un[rep] = t6 - t5;
		}
		qsort(mapk, 9, sizeof(double), cmpd); qsort(one_acc, 9, sizeof(double), cmpd); qsort(one_un, 9, sizeof(double), cmpd);
		qsort(per_acc, 9, sizeof(double), cmpd); qsort(per_un, 9, sizeof(double), cmpd); qsort(one_map, 9, sizeof(double), cmpd);
		printf("%3d x %4zu MiB: maps %6.1f us; set access one call %6.1f, per mapping %6.1f; unmap one call %6.1f, per mapping %6.1f\n",
		       k, p >> 20, mapk[4], one_acc[4], per_acc[4], one_un[4], per_un[4]);
		for (int i = 0; i < k; i++) OK(cuMemRelease(h[i]));
	}
	/* cuMemCreate cost by size */
	for (int pi = 0; pi < 4; pi++) {
		double c[9], rl[9];
		for (int rep = 0; rep < 9; rep++) {
			CUmemGenericAllocationHandle g;
			double t0 = now_us(); OK(cuMemCreate(&g, pieces[pi], &prop, 0)); double t1 = now_us();
			OK(cuMemRelease(g)); double t2 = now_us();
			c[rep] = t1 - t0; rl[rep] = t2 - t1;
		}
		qsort(c, 9, sizeof(double), cmpd); qsort(rl, 9, sizeof(double), cmpd);
		printf("create %4zu MiB %.1f us, release unmapped %.1f us\n", pieces[pi] >> 20, c[4], rl[4]);
	}
	OK(cuMemAddressFree(va, 4096 * MiB));
	return 0;
}
