/* Whether a physical allocation's part can be mapped a second time, at another address, with an
 * offset into it, and what that costs: the premise of serving a large request from free parts
 * of pieces already mapped elsewhere. gcc -O2 alias.c -I/usr/local/cuda/include -lcuda */
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
	CUmemGenericAllocationHandle h; CUdeviceptr va1, va2; size_t gran, MiB = 1 << 20;
	size_t piece = 1024 * MiB, sizes[] = {2 * MiB, 32 * MiB, 256 * MiB, 512 * MiB};
	unsigned *host; int i, k;

	OK(cuInit(0)); OK(cuDeviceGet(&dev, 0)); OK(cuDevicePrimaryCtxRetain(&ctx, dev)); OK(cuCtxSetCurrent(ctx));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
	OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	OK(cuMemCreate(&h, piece, &prop, 0));
	OK(cuMemAddressReserve(&va1, piece, 0, 0, 0)); OK(cuMemAddressReserve(&va2, piece, 0, 0, 0));
	OK(cuMemMap(va1, piece, 0, h, 0)); OK(cuMemSetAccess(va1, piece, &acc, 1));
	/* The second half of the piece, mapped again at va2 with an offset: refused on driver 580
	 * (CUDA_ERROR_NOT_SUPPORTED). Then the whole piece, mapped again at va2. */
	{
		CUresult r = cuMemMap(va2, piece / 2, piece / 2, h, 0);
		const char *s;
		cuGetErrorName(r, &s);
		printf("a part of a piece mapped again, at an offset: %s\n", s);
		if (r == CUDA_SUCCESS)
			OK(cuMemUnmap(va2, piece / 2));
	}
	OK(cuMemMap(va2, piece, 0, h, 0)); OK(cuMemSetAccess(va2, piece, &acc, 1));
	OK(cuMemsetD32(va1, 0x11111111u, piece / 4));
	OK(cuMemsetD32(va2 + piece / 2, 0xabcd1234u, piece / 8));
	host = malloc(8);
	OK(cuMemcpyDtoH(host, va1 + piece / 2, 4)); OK(cuMemcpyDtoH(host + 1, va1 + piece / 2 - 4, 4));
	printf("granularity %zu KiB; a whole 1 GiB piece mapped again: %s (read through the first mapping 0x%08x, before it 0x%08x)\n",
	       gran >> 10, host[0] == 0xabcd1234u && host[1] == 0x11111111u ? "aliases" : "DOES NOT alias", host[0], host[1]);
	OK(cuMemUnmap(va2, piece));
	/* Cost of mapping a whole piece of n bytes a second time: map + set access, then unmap;
	 * medians of 15. */
	for (k = 0; k < 4; k++) {
		CUmemGenericAllocationHandle g;
		CUdeviceptr a;
		double m[15], u[15];
		OK(cuMemCreate(&g, sizes[k], &prop, 0));
		OK(cuMemAddressReserve(&a, sizes[k], 0, 0, 0));
		OK(cuMemMap(a, sizes[k], 0, g, 0)); OK(cuMemSetAccess(a, sizes[k], &acc, 1));
		for (i = 0; i < 15; i++) {
			double t0 = now_us(), t1, t2;
			OK(cuMemMap(va2, sizes[k], 0, g, 0)); OK(cuMemSetAccess(va2, sizes[k], &acc, 1));
			t1 = now_us(); OK(cuMemUnmap(va2, sizes[k])); t2 = now_us();
			m[i] = t1 - t0; u[i] = t2 - t1;
		}
		qsort(m, 15, sizeof *m, cmpd); qsort(u, 15, sizeof *u, cmpd);
		printf("a whole %4zu MiB piece mapped a second time: map+access %.1f us (min %.1f), unmap %.1f us\n",
		       sizes[k] >> 20, m[7], m[0], u[7]);
		OK(cuMemUnmap(a, sizes[k])); OK(cuMemRelease(g)); OK(cuMemAddressFree(a, sizes[k]));
	}
	OK(cuMemUnmap(va1, piece)); OK(cuMemRelease(h));
	OK(cuMemAddressFree(va1, piece)); OK(cuMemAddressFree(va2, piece));
	return 0;
}
