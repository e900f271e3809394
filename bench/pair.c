/* pair.c - the same-stream alloc+free pair, sop against the driver's own stream-ordered pool
 * (cuMemAllocFromPoolAsync on a pool with release threshold UINT64_MAX, which is what
 * cudaMallocAsync does), interleaved in one process on one stream: median, min and max over
 * repeated runs, and the ratio. A first cut of the harness that bench/ grows into.
 *
 * Usage: sop-pair [iterations]   (SOP_DRIVER_LIBRARY as for the library; on the simulated
 * driver only sop runs and no timing means anything). */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sop.h>

#define STR2(x) #x
#define STR(x) STR2(x)
#define REPS 9

#define CHECK(call)                                                                                \
	do {                                                                                       \
		CUresult r_ = (call);                                                              \
		if (r_ != CUDA_SUCCESS) {                                                          \
			fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call,      \
				(int)r_);                                                          \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

static __typeof__(cuStreamCreate) *stream_create;
static __typeof__(cuDevicePrimaryCtxRetain) *ctx_retain;
static __typeof__(cuCtxSetCurrent) *ctx_set;
static __typeof__(cuDeviceGetName) *device_name;
static __typeof__(cuMemPoolCreate) *pool_create;
static __typeof__(cuMemPoolSetAttribute) *pool_set_attr;
static __typeof__(cuMemAllocFromPoolAsync) *alloc_from_pool;
static __typeof__(cuMemFreeAsync) *free_async;
static __typeof__(cuStreamSynchronize) *stream_sync;

static void *
sym(void *dl, const char *name)
{
	return dl ? dlsym(dl, name) : NULL;
}

#define LOAD(dl, var, name)                                                                        \
	do {                                                                                       \
		void *s_ = sym(dl, STR(name));                                                     \
		memcpy(&var, &s_, sizeof s_);                                                      \
	} while (0)

static double
now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int
cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

struct result {
	double med, min, max;
};

static struct result
summarize(double *v)
{
	struct result r;

	qsort(v, REPS, sizeof *v, cmp);
	r.med = v[REPS / 2];
	r.min = v[0];
	r.max = v[REPS - 1];
	return r;
}

int
main(int argc, char **argv)
{
	static const size_t sizes[] = {256, 4096, 65536, 1 << 20, 64 << 20};
	int iters = argc > 1 ? atoi(argv[1]) : 200000;
	const char *lib = getenv("SOP_DRIVER_LIBRARY");
	bool simulated = lib && *lib;
	sop_pool_t pool;
	CUmemoryPool dpool = NULL;
	CUmemPoolProps props;
	cuuint64_t keep = UINT64_MAX;
	CUcontext ctx;
	CUstream s;
	char name[128] = "";
	void *dl;
	size_t k;

	CHECK(sop_device_get_default_pool(&pool, 0));
	dl = dlopen(simulated ? lib : "libcuda.so.1", RTLD_NOW);
	LOAD(dl, stream_create, cuStreamCreate);
	LOAD(dl, ctx_retain, cuDevicePrimaryCtxRetain);
	LOAD(dl, ctx_set, cuCtxSetCurrent);
	LOAD(dl, device_name, cuDeviceGetName);
	LOAD(dl, pool_create, cuMemPoolCreate);
	LOAD(dl, pool_set_attr, cuMemPoolSetAttribute);
	LOAD(dl, alloc_from_pool, cuMemAllocFromPoolAsync);
	LOAD(dl, free_async, cuMemFreeAsync);
	LOAD(dl, stream_sync, cuStreamSynchronize);
	CHECK(ctx_retain(&ctx, 0));
	CHECK(ctx_set(ctx));
	CHECK(device_name(name, sizeof name, 0));
	CHECK(stream_create(&s, CU_STREAM_NON_BLOCKING));

	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = 0;
	CHECK(sop_pool_create(&pool, &props));
	CHECK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	if (pool_create && alloc_from_pool && free_async) {
		CHECK(pool_create(&dpool, &props));
		CHECK(pool_set_attr(dpool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	}
	printf("# same-stream alloc+free pair on %s%s, %d pairs per run, %d runs, ns per pair\n",
	       name, simulated ? " (simulated driver: timings mean nothing)" : "", iters, REPS);
	printf("| size | sop median | sop min | sop max | driver median | driver min | driver max "
	       "| driver / sop |\n|---|---|---|---|---|---|---|---|\n");
	for (k = 0; k < sizeof sizes / sizeof *sizes; k++) {
		double vs[REPS], vd[REPS];
		struct result rs, rd = {0, 0, 0};
		int rep, i;

		for (rep = 0; rep < REPS; rep++) {
			void *p;
			CUdeviceptr d;
			double t0 = now_ns();
			for (i = 0; i < iters; i++) {
				CHECK(sop_malloc_from_pool_async(&p, sizes[k], pool, s));
				CHECK(sop_free_async(p, s));
			}
			vs[rep] = (now_ns() - t0) / iters;
			CHECK(sop_stream_synchronize(s));
			if (!dpool)
				continue;
			t0 = now_ns();
			for (i = 0; i < iters; i++) {
				CHECK(alloc_from_pool(&d, sizes[k], dpool, s));
				CHECK(free_async(d, s));
			}
			vd[rep] = (now_ns() - t0) / iters;
			CHECK(stream_sync(s));
		}
		rs = summarize(vs);
		if (dpool)
			rd = summarize(vd);
		printf("| %zu | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1fx |\n", sizes[k], rs.med,
		       rs.min, rs.max, rd.med, rd.min, rd.max, dpool ? rd.med / rs.med : 0.0);
	}
	CHECK(sop_pool_destroy(pool));
	return 0;
}
