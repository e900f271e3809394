/* Whether an address reservation outlives the primary context it was made in: reserved, then
 * the context released to nothing (destroyed) or reset, then retained again; can the range
 * still be mapped and used, freed, and does the new context have another id? And the anchor
 * mapped in it before: still mapped, its access kept, can it be unmapped and released?
 *   gcc -O2 ctx.c -I<cuda>/include -lcuda -o ctx */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#define TRY(x) do { CUresult r_ = (x); const char *n_ = "?"; cuGetErrorName(r_, &n_); printf("  %-58s %s\n", #x, n_); } while (0)

static void round_(CUdevice dev, int reset)
{
	CUcontext c1, c2;
	unsigned long long id1 = 0, id2 = 0;
	CUdeviceptr va = 0, va2 = 0;
	size_t gran = 0, sz;
	CUmemAllocationProp p;
	CUmemAccessDesc a;
	CUmemGenericAllocationHandle h = 0, ah = 0, h2 = 0;
	CUmemAllocationProp hp;
	CUmemAccessDesc ra;
	unsigned long long flags = 0;

	memset(&p, 0, sizeof p);
	memset(&hp, 0, sizeof hp);
	memset(&ra, 0, sizeof ra);
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = dev;
	a.location = p.location;
	a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	printf("%s\n", reset ? "primary context reset" : "primary context released to nothing");
	TRY(cuDevicePrimaryCtxRetain(&c1, dev));
	TRY(cuCtxSetCurrent(c1));
	TRY(cuCtxGetId(c1, &id1));
	cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	sz = (size_t)1 << 30;
	TRY(cuMemAddressReserve(&va, sz, 0, 0, 0));
	/* An anchor: a host granule mapped read-only at the start (vmm.c). */
	hp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	hp.location.type = CU_MEM_LOCATION_TYPE_HOST;
	ra.location = p.location;
	ra.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
	TRY(cuMemCreate(&ah, gran, &hp, 0));
	TRY(cuMemMap(va, gran, 0, ah, 0));
	TRY(cuMemSetAccess(va, gran, &ra, 1));
	if (reset)
		TRY(cuDevicePrimaryCtxReset(dev));
	else
		TRY(cuDevicePrimaryCtxRelease(dev));
	TRY(cuDevicePrimaryCtxRetain(&c2, dev));
	TRY(cuCtxSetCurrent(c2));
	TRY(cuCtxGetId(c2, &id2));
	printf("  context handle %s, id %llu -> %llu\n", c1 == c2 ? "same" : "other", id1, id2);
	TRY(cuMemGetAccess(&flags, &p.location, va));
	printf("  the anchor's access for the device: %llu\n", flags);
	TRY(cuMemRetainAllocationHandle(&h2, (void *)va));
	printf("  the handle mapped there %s the anchor's\n", h2 == ah ? "is" : "is not");
	if (h2)
		TRY(cuMemRelease(h2));
	TRY(cuMemCreate(&h, gran, &p, 0));
	TRY(cuMemMap(va + gran, gran, 0, h, 0));
	TRY(cuMemSetAccess(va + gran, gran, &a, 1));
	TRY(cuMemsetD8(va + gran, 7, gran));
	TRY(cuCtxSynchronize());
	TRY(cuMemUnmap(va + gran, gran));
	TRY(cuMemRelease(h));
	TRY(cuMemUnmap(va, gran));
	TRY(cuMemRelease(ah));
	TRY(cuMemAddressReserve(&va2, sz, 0, 0, 0));
	printf("  new reservation %s the old one's address\n", va2 == va ? "at" : "not at");
	TRY(cuMemAddressFree(va2, sz));
	TRY(cuMemAddressFree(va, sz));
	TRY(cuDevicePrimaryCtxRelease(dev));
}

int main(void)
{
	CUdevice dev;

	cuInit(0);
	cuDeviceGet(&dev, 0);
	round_(dev, 0);
	round_(dev, 1);
	return 0;
}
