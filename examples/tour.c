/* tour.c - a short tour of sop: a pool, allocations on several streams, statistics, trimming.
 *
 * Runs on the GPU when there is one; `examples/run.sh` runs it on the simulated driver
 * otherwise (SOP_DRIVER_LIBRARY names the driver library sop loads). Uses only the public API
 * and cuda.h; the few driver calls it makes itself go through dlsym on the same library sop
 * loaded, so the program needs no link with libcuda.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sop.h>

#define CHECK(call)                                                                                \
	do {                                                                                       \
		CUresult r_ = (call);                                                              \
		if (r_ != CUDA_SUCCESS) {                                                          \
			fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call,      \
				(int)r_);                                                          \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define MiB ((size_t)1 << 20)

#define STR2(x) #x
#define STR(x) STR2(x)

/* The few driver calls the tour makes itself. */
static __typeof__(cuStreamCreate) *stream_create;
static __typeof__(cuStreamDestroy) *stream_destroy;
static __typeof__(cuMemsetD32Async) *memset_d32;
static __typeof__(cuDevicePrimaryCtxRetain) *ctx_retain;
static __typeof__(cuCtxSetCurrent) *ctx_set;
static __typeof__(cuDeviceGetName) *device_name;

static void
load(void *dl, const char *name, void *fn_ptr)
{
	void *sym = dlsym(dl, name);

	if (!sym) {
		fprintf(stderr, "driver lacks %s\n", name);
		exit(1);
	}
	memcpy(fn_ptr, &sym, sizeof sym);
}

static void
print_stats(const char *when, sop_pool_t pool)
{
	cuuint64_t used, used_high, reserved, reserved_high;

	CHECK(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
	CHECK(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &used_high));
	CHECK(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
	CHECK(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &reserved_high));
	printf("%-34s used %10llu (high %10llu)  reserved %5llu MiB (high %5llu MiB)\n", when,
	       (unsigned long long)used, (unsigned long long)used_high,
	       (unsigned long long)(reserved / MiB), (unsigned long long)(reserved_high / MiB));
}

int
main(void)
{
	const char *lib = getenv("SOP_DRIVER_LIBRARY");
	CUmemPoolProps props;
	cuuint64_t keep = UINT64_MAX;
	sop_pool_t pool, def;
	CUstream s[4];
	CUcontext ctx;
	void *dl, *p[4], *q;
	char name[128] = "";
	int i;

	/* sop loads the driver itself; the tour opens the same library for its own calls. */
	CUresult r = sop_device_get_default_pool(&def, 0);
	if (r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_NO_DEVICE) {
		printf("no CUDA driver or device here (%d): run examples/run.sh, which uses the "
		       "simulated driver\n",
		       (int)r);
		return 0;
	}
	CHECK(r);
	dl = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!dl)
		dl = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW);
	load(dl, STR(cuStreamCreate), &stream_create);
	load(dl, STR(cuStreamDestroy), &stream_destroy);
	load(dl, STR(cuMemsetD32Async), &memset_d32);
	load(dl, STR(cuDevicePrimaryCtxRetain), &ctx_retain);
	load(dl, STR(cuCtxSetCurrent), &ctx_set);
	load(dl, STR(cuDeviceGetName), &device_name);
	CHECK(ctx_retain(&ctx, 0));
	CHECK(ctx_set(ctx));
	CHECK(device_name(name, sizeof name, 0));
	printf("sop tour on %s (%s driver)\n\n", name,
	       lib && *lib ? "simulated" : "real");

	/* 1. A pool of device 0's memory that keeps what it has (threshold: never release at
	 *    synchronization points), made the device's current pool. */
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = 0;
	CHECK(sop_pool_create(&pool, &props));
	CHECK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	CHECK(sop_device_set_pool(0, pool));
	print_stats("new pool", pool);

	/* 2. Allocations on four streams; work on each stream uses its block. */
	for (i = 0; i < 4; i++) {
		CHECK(stream_create(&s[i], CU_STREAM_NON_BLOCKING));
		CHECK(sop_malloc_async(&p[i], (size_t)(i + 1) * MiB + 1000, s[i]));
		CHECK(memset_d32((CUdeviceptr)(uintptr_t)p[i], 0xC0FFEE00u + (unsigned)i,
				 ((size_t)(i + 1) * MiB + 1000) / 4, s[i]));
		printf("stream %d: %p\n", i, p[i]);
	}
	print_stats("four allocations", pool);

	/* 3. Free in stream order: the same stream gets the block back at once, without waiting
	 *    for the memset above to finish. */
	CHECK(sop_free_async(p[0], s[0]));
	CHECK(sop_malloc_async(&q, MiB, s[0]));
	printf("stream 0 reuses its own free at once: %s\n", q == p[0] ? "yes" : "no");
	p[0] = q;
	for (i = 0; i < 4; i++)
		CHECK(sop_free_async(p[i], s[i]));
	print_stats("all freed (used drops at once)", pool);

	/* 4. A synchronization point makes the frees reusable by every stream; the release
	 *    threshold keeps the memory cached. */
	CHECK(sop_ctx_synchronize());
	print_stats("after sop_ctx_synchronize", pool);

	/* 5. Trim what is not in use. */
	CHECK(sop_trim_to(pool, 0));
	print_stats("after sop_trim_to(0)", pool);

	for (i = 0; i < 4; i++)
		CHECK(stream_destroy(s[i]));
	CHECK(sop_pool_destroy(pool));
	printf("\ndone: the device's current pool is the default again\n");
	return 0;
}
