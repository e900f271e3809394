/* What a first piece's create, map and set access cost by where it lies: a reservation of its
 * own size, or a pool-sized one (4x the device's memory, 1 GiB aligned, as sop's) at offset 0, 2 MiB (sop's first
 * segment, after the anchor's granule), 32 MiB or 1 GiB. Medians of 21, configurations interleaved. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmp(const void *a, const void *b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
#define R 21
#define K 5
int main(void){
	CUdevice d; CUcontext c; size_t total, g;
	cuInit(0); cuDeviceGet(&d,0); cuDevicePrimaryCtxRetain(&c,d); cuCtxSetCurrent(c);
	cuDeviceTotalMem(&total, d);
	CUmemAllocationProp pr = {0}; pr.type = CU_MEM_ALLOCATION_TYPE_PINNED; pr.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	CUmemAccessDesc ad = {0}; ad.location = pr.location; ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	cuMemGetAllocationGranularity(&g, &pr, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	size_t piece = 32 << 20, big = (4 * total + (1ul << 30) - 1) & ~((1ul << 30) - 1);
	const char *name[K] = {"own 32 MiB reservation", "pool-sized, offset 0", "pool-sized, offset 2 MiB", "pool-sized, offset 32 MiB", "pool-sized, offset 1 GiB"};
	double t[K][6][R];
	for (int r = 0; r < R; r++) for (int k0 = 0; k0 < K; k0++) {
		int k = (k0 + r) % K;
		size_t vs = k == 0 ? piece : big, off = k == 2 ? g : k == 3 ? piece : k == 4 ? (1ul << 30) : 0;
		CUdeviceptr va; CUmemGenericAllocationHandle h;
		double a = now();
		cuMemAddressReserve(&va, vs, k == 0 ? 0 : (1ul << 30), 0, 0);
		double b = now();
		cuMemCreate(&h, piece, &pr, 0);
		double c1 = now();
		cuMemMap(va + off, piece, 0, h, 0);
		double d1 = now();
		if (cuMemSetAccess(va + off, piece, &ad, 1)) { printf("setaccess failed\n"); return 1; }
		double e = now();
		cuMemUnmap(va + off, piece); cuMemRelease(h);
		double f = now();
		cuMemAddressFree(va, vs);
		double gg = now();
		t[k][0][r] = b - a; t[k][1][r] = c1 - b; t[k][2][r] = d1 - c1; t[k][3][r] = e - d1; t[k][4][r] = f - e; t[k][5][r] = gg - f;
	}
	printf("%-40s %8s %8s %8s %8s %8s %8s %8s\n", "us (medians of 21)", "reserve", "create", "map", "access", "c+m+a", "unm+rel", "free");
	for (int k = 0; k < K; k++) {
		double m[6];
		for (int i = 0; i < 6; i++) { qsort(t[k][i], R, sizeof(double), cmp); m[i] = t[k][i][R/2]; }
		printf("%-40s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f\n", name[k], m[0], m[1], m[2], m[3], m[1]+m[2]+m[3], m[4], m[5]);
	}
	return 0;
}
