/* What a pool's first allocation and its destroy cost when the pool takes the reservation of a
 * pool destroyed before it, against a fresh reservation each time, and against the driver's
 * pool, in one loop that rotates the order every repetition. Bare driver calls, the shapes sop
 * makes: a reservation of four times the device's memory aligned to 1 GiB, the first piece of
 * 32 MiB one granule above its start (the anchor's place), opened to the device.
 *   fresh:  reserve; [first] create+map+access; [destroy] unmap+release, address free
 *   kept:   one reservation throughout; [first] create+map+access; [destroy] unmap+release
 *   kept+anchor: as kept, with a host granule mapped read-only at the reservation's start
 *           for the whole run (the anchor: vmm.c), so that the page tables stay
 *   driver: cuMemPoolCreate, threshold max; [first] cuMemAllocFromPoolAsync 1 MiB; free, sync;
 *           [destroy] cuMemPoolDestroy
 * Medians over N repetitions after W warm-up ones.
 *   gcc -O2 kept.c -I<cuda>/include -lcuda -o kept */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OK(x) do { CUresult r_ = (x); if (r_) { printf("%s: %d (line %d)\n", #x, r_, __LINE__); exit(1); } } while (0)
#define N 81
#define W 5
enum { FRESH, KEPT, ANCHORED, DRIVER, NK };
static const char *kname[NK] = {"fresh reservation", "kept reservation", "kept + anchor", "driver's pool"};
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static double med(double *v) { double w[N]; memcpy(w, v, sizeof w); qsort(w, N, sizeof *w, cmpd); return w[N / 2]; }
static double q(double *v, int k) { double w[N]; memcpy(w, v, sizeof w); qsort(w, N, sizeof *w, cmpd); return w[k]; }

static CUmemAllocationProp prop;
static CUmemAccessDesc acc;
static size_t gran, big;
static CUdeviceptr kept_va[2];
static CUstream s;

static void bare(int k, double *first, double *destroy, double *create)
{
	CUdeviceptr va;
	CUmemGenericAllocationHandle h;
	size_t seg = 32 << 20;
	double t0 = now();

	if (k == FRESH)
		OK(cuMemAddressReserve(&va, big, (size_t)1 << 30, 0, 0));
	else
		va = kept_va[k == ANCHORED];
	*create = now() - t0;
	t0 = now();
	OK(cuMemCreate(&h, seg, &prop, 0));
	OK(cuMemMap(va + gran, seg, 0, h, 0));
	OK(cuMemSetAccess(va + gran, seg, &acc, 1));
	*first = now() - t0;
	t0 = now();
	OK(cuMemUnmap(va + gran, seg));
	OK(cuMemRelease(h));
	if (k == FRESH)
		OK(cuMemAddressFree(va, big));
	*destroy = now() - t0;
}

static void driver(double *first, double *destroy, double *create)
{
	CUmemPoolProps pp;
	CUmemoryPool p;
	CUdeviceptr d;
	cuuint64_t thr = ~0ull;
	double t0;

	memset(&pp, 0, sizeof pp);
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	t0 = now();
	OK(cuMemPoolCreate(&p, &pp));
	*create = now() - t0;
	OK(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
	t0 = now();
	OK(cuMemAllocFromPoolAsync(&d, 1 << 20, p, s));
	*first = now() - t0;
	OK(cuMemFreeAsync(d, s));
	OK(cuStreamSynchronize(s));
	t0 = now();
	OK(cuMemPoolDestroy(p));
	*destroy = now() - t0;
}

int main(void)
{
	static double f[NK][N], d[NK][N], c[NK][N];
	CUdevice dev;
	CUcontext ctx;
	size_t total;
	CUmemGenericAllocationHandle ah;
	CUmemAllocationProp hp;
	CUmemAccessDesc ad;
	size_t hgran;
	int i, j;

	OK(cuInit(0));
	OK(cuDeviceGet(&dev, 0));
	OK(cuDevicePrimaryCtxRetain(&ctx, dev));
	OK(cuCtxSetCurrent(ctx));
	OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(cuDeviceTotalMem(&total, dev));
	big = (total * 4 + ((size_t)1 << 30) - 1) & ~(((size_t)1 << 30) - 1);
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	acc.location = prop.location;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	OK(cuMemAddressReserve(&kept_va[0], big, (size_t)1 << 30, 0, 0));
	OK(cuMemAddressReserve(&kept_va[1], big, (size_t)1 << 30, 0, 0));
	memset(&hp, 0, sizeof hp);
	hp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	hp.location.type = CU_MEM_LOCATION_TYPE_HOST;
	OK(cuMemGetAllocationGranularity(&hgran, &hp, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	OK(cuMemCreate(&ah, gran, &hp, 0));
	OK(cuMemMap(kept_va[1], gran, 0, ah, 0));
	memset(&ad, 0, sizeof ad);
	ad.location = prop.location;
	ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
	OK(cuMemSetAccess(kept_va[1], gran, &ad, 1));
	for (i = -W; i < N; i++)
		for (j = 0; j < NK; j++) {
			int k = ((i < 0 ? 0 : i) + j) % NK;
			double ff, dd, cc;

			if (k == DRIVER)
				driver(&ff, &dd, &cc);
			else
				bare(k, &ff, &dd, &cc);
			if (i >= 0) {
				f[k][i] = ff;
				d[k][i] = dd;
				c[k][i] = cc;
			}
		}
	printf("%s, %zu MiB reservations, medians of %d (quartiles)\n", "device 0", big >> 20, N);
	printf("%-20s %-26s %-26s %s\n", "", "first 32 MiB / 1 MiB", "destroy", "reserve / pool create");
	for (j = 0; j < NK; j++)
		printf("%-20s %6.1f (%5.1f-%5.1f) us      %6.1f (%5.1f-%5.1f) us      %5.1f us\n", kname[j],
		       med(f[j]), q(f[j], N / 4), q(f[j], 3 * N / 4), med(d[j]), q(d[j], N / 4),
		       q(d[j], 3 * N / 4), med(c[j]));
	return 0;
}
