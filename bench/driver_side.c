/* driver_side.c - the driver and the allocators under test.
 *
 * The harness loads the driver itself with dlopen, as sop does, so nothing links libcuda and
 * the same binary runs on the simulated driver (test/sim/), where the driver's pools and
 * kernels are missing: those sides and launches are then skipped and only sop runs. Each
 * allocator sits behind struct side (bench.h): sop on its own pool, the driver's pool from
 * cuMemPoolCreate, and the device's default pool through cuMemAllocAsync. sop's own driver
 * calls are read from sop_driver_calls.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kernels.ptx.h"

#define BENCH_STR2(x) #x
#define BENCH_STR(x) BENCH_STR2(x)

struct bench_driver drv;
struct bench_env env;

const char *const side_names[N_SIDES] = {"sop",	     "driver",	     "driver-default",
					 "no-alloc", "cuMemHostAlloc", "event-cache",
					 "pageable"};

static void *driver_dl;
static CUmodule module;
static const char *call_names[BENCH_COUNT_MAX];
static unsigned n_call_names;

void
check_fail(CUresult r, const char *expr, const char *file, int line)
{
	const char *name = NULL;

	if (drv.cuGetErrorName)
		drv.cuGetErrorName(r, &name);
	fprintf(stderr, "sop-bench: %s:%d: %s failed: %s (%d)\n", file, line, expr,
		name ? name : "?", (int)r);
	exit(1);
}

int
env_init(void)
{
	const char *target = getenv("SOP_DRIVER_LIBRARY");
	unsigned long long counts[BENCH_COUNT_MAX];
	size_t n_calls = BENCH_COUNT_MAX;
	sop_pool_t probe;
	cuuint64_t keep = UINT64_MAX;
	int attr = 0;
	CUresult r;
	void *sym;

	if (!target || !*target)
		target = "libcuda.so.1";
	driver_dl = dlopen(target, RTLD_NOW | RTLD_LOCAL);
	if (!driver_dl) {
		fprintf(stderr, "sop-bench: no CUDA driver (%s): nothing to measure, skipped\n",
			target);
		return 77;
	}
#define BENCH_X(name)                                                                              \
	sym = dlsym(driver_dl, BENCH_STR(name));                                                   \
	memcpy(&drv.name, &sym, sizeof sym);
	BENCH_DRIVER_ENTRIES(BENCH_X)
#undef BENCH_X
	env.simulated = dlsym(driver_dl, "sim_live_get") != NULL;
	if (!drv.cuInit || !drv.cuDeviceGet || !drv.cuDevicePrimaryCtxRetain ||
	    !drv.cuCtxSetCurrent || !drv.cuStreamCreate || !drv.cuStreamDestroy ||
	    !drv.cuStreamSynchronize || !drv.cuCtxSynchronize || !drv.cuEventCreate ||
	    !drv.cuEventDestroy || !drv.cuEventRecord || !drv.cuStreamWaitEvent ||
	    !drv.cuEventSynchronize || !drv.cuDeviceTotalMem || !drv.cuMemGetInfo ||
	    !drv.cuMemGetAllocationGranularity || !drv.cuMemAddressReserve ||
	    !drv.cuMemAddressFree || !drv.cuMemCreate || !drv.cuMemRelease || !drv.cuMemMap ||
	    !drv.cuMemUnmap || !drv.cuMemSetAccess) {
		fprintf(stderr, "sop-bench: %s lacks entry points the harness needs\n", target);
		return 1;
	}
	r = drv.cuInit(0);
	if (r == CUDA_ERROR_NO_DEVICE || r == CUDA_ERROR_NOT_INITIALIZED) {
		fprintf(stderr, "sop-bench: no CUDA device: nothing to measure, skipped\n");
		return 77;
	}
	CHECK(r);

	r = sop_device_get_default_pool(&probe, 0);
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, "sop-bench: sop cannot start (error %d)\n", (int)r);
		return 1;
	}
	env.counting = sop_driver_calls(call_names, counts, &n_calls) == CUDA_SUCCESS &&
		       n_calls <= BENCH_COUNT_MAX;
	n_call_names = env.counting ? (unsigned)n_calls : 0;

	CHECK(drv.cuDeviceGet(&env.dev, 0));
	CHECK(drv.cuDevicePrimaryCtxRetain(&env.ctx, env.dev));
	CHECK(drv.cuCtxSetCurrent(env.ctx));
	if (drv.cuDeviceGetName)
		CHECK(drv.cuDeviceGetName(env.device, sizeof env.device, env.dev));
	if (drv.cuDriverGetVersion)
		CHECK(drv.cuDriverGetVersion(&env.driver_version));
	CHECK(drv.cuDeviceTotalMem(&env.total_mem, env.dev));
	CHECK(drv.cuMemGetInfo(&env.free_mem, &env.total_mem));

	if (drv.cuDeviceGetAttribute &&
	    drv.cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, env.dev) !=
		CUDA_SUCCESS)
		attr = 0;
	env.pools = attr && drv.cuMemPoolCreate && drv.cuMemPoolDestroy &&
		    drv.cuMemPoolSetAttribute && drv.cuMemPoolGetAttribute && drv.cuMemPoolTrimTo &&
		    drv.cuDeviceGetDefaultMemPool && drv.cuMemAllocFromPoolAsync &&
		    drv.cuMemAllocAsync && drv.cuMemFreeAsync;
	/* A driver without a default pool (the simulated one) has no driver sides: sop alone. */
	if (env.pools && drv.cuDeviceGetDefaultMemPool(&env.default_pool, env.dev) != CUDA_SUCCESS)
		env.pools = false;
	if (env.pools) {
		/* Both sides cache: the default pool keeps what it reserved, as sop's pools and
		 * the pools created here do. */
		CHECK(drv.cuMemPoolSetAttribute(env.default_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
						&keep));
	}
	env.kernels = drv.cuModuleLoadData && drv.cuModuleGetFunction && drv.cuLaunchKernel &&
		      drv.cuModuleLoadData(&module, bench_kernels_ptx) == CUDA_SUCCESS;
	if (env.kernels) {
		CHECK(drv.cuModuleGetFunction(&env.k_spin, module, "bench_spin"));
		CHECK(drv.cuModuleGetFunction(&env.k_fill, module, "bench_fill"));
	}
	return 0;
}

void
env_fini(void)
{
	CHECK(sop_ctx_synchronize());
	if (env.kernels && drv.cuModuleUnload)
		CHECK(drv.cuModuleUnload(module));
	if (env.pools)
		CHECK(drv.cuMemPoolTrimTo(env.default_pool, 0));
}

bool
side_open(struct side *sd, enum side_kind kind, uint64_t threshold, size_t max_size)
{
	static bool warned;
	CUmemPoolProps props;
	cuuint64_t v = threshold;
	CUresult r;

	memset(sd, 0, sizeof *sd);
	sd->kind = kind;
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = env.dev;
	props.maxSize = max_size;
	switch (kind) {
	case SIDE_SOP:
		CHECK(sop_pool_create(&sd->sop, &props));
		CHECK(sop_pool_set_attr(sd->sop, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
		return true;
	case SIDE_POOL:
		if (!env.pools)
			return false;
		r = drv.cuMemPoolCreate(&sd->pool, &props);
		if (r == CUDA_ERROR_INVALID_VALUE && max_size) {
			/* A driver older than maxSize (CUDA 12.2): run uncapped, and say so. */
			if (!warned)
				note("the driver refused maxSize %zu MiB for its pool: it ran "
				     "uncapped",
				     max_size / MiB);
			warned = true;
			props.maxSize = 0;
			r = drv.cuMemPoolCreate(&sd->pool, &props);
		}
		CHECK(r);
		CHECK(drv.cuMemPoolSetAttribute(sd->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
		return true;
	case SIDE_DEFAULT:
		if (!env.pools)
			return false;
		sd->pool = env.default_pool;
		CHECK(drv.cuMemPoolSetAttribute(sd->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
		CHECK(drv.cuMemPoolTrimTo(sd->pool, 0));
		side_set_attr(sd, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0);
		side_set_attr(sd, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0);
		return true;
	case SIDE_IDEAL:
		return true; /* no pool: the caller's loop allocates nothing */
	default:
		return false;
	}
}

/* The caller has freed everything and synchronized. */
void
side_close(struct side *sd)
{
	switch (sd->kind) {
	case SIDE_SOP:
		CHECK(sop_pool_destroy(sd->sop));
		break;
	case SIDE_POOL:
		CHECK(drv.cuMemPoolDestroy(sd->pool));
		break;
	case SIDE_DEFAULT:
		CHECK(drv.cuMemPoolTrimTo(sd->pool, 0));
		break;
	default:
		break;
	}
	memset(sd, 0, sizeof *sd);
}

bool
side_allowed(enum side_kind kind)
{
	if (!(opts.sides & SIDE_BIT(kind)))
		return false;
	return kind == SIDE_SOP || kind == SIDE_IDEAL || env.pools;
}

int
sides_open(struct side *out, unsigned want, uint64_t threshold, size_t max_size)
{
	int n = 0, k;

	for (k = 0; k < SIDE_IDEAL; k++) {
		if (!(want & SIDE_BIT(k)) || !side_allowed((enum side_kind)k))
			continue;
		if (side_open(&out[n], (enum side_kind)k, threshold, max_size))
			n++;
	}
	return n;
}

void
sides_close(struct side *sd, int n)
{
	int i;

	CHECK(sop_ctx_synchronize());
	CHECK(drv.cuCtxSynchronize());
	for (i = 0; i < n; i++)
		side_close(&sd[i]);
}

CUresult
side_sync(const struct side *sd, CUstream s)
{
	return sd->kind == SIDE_SOP ? sop_stream_synchronize(s) : drv.cuStreamSynchronize(s);
}

CUresult
side_ctx_sync(const struct side *sd)
{
	return sd->kind == SIDE_SOP ? sop_ctx_synchronize() : drv.cuCtxSynchronize();
}

CUresult
side_record(const struct side *sd, CUevent ev, CUstream s)
{
	return sd->kind == SIDE_SOP ? sop_event_record(ev, s) : drv.cuEventRecord(ev, s);
}

CUresult
side_wait(const struct side *sd, CUstream s, CUevent ev)
{
	return sd->kind == SIDE_SOP ? sop_stream_wait_event(s, ev, 0)
				    : drv.cuStreamWaitEvent(s, ev, 0);
}

CUresult
side_event_sync(const struct side *sd, CUevent ev)
{
	return sd->kind == SIDE_SOP ? sop_event_synchronize(ev) : drv.cuEventSynchronize(ev);
}

void
side_trim(const struct side *sd, size_t keep)
{
	if (sd->kind == SIDE_SOP)
		CHECK(sop_trim_to(sd->sop, keep));
	else if (sd->kind == SIDE_POOL || sd->kind == SIDE_DEFAULT)
		CHECK(drv.cuMemPoolTrimTo(sd->pool, keep));
}

CUresult
side_event_destroy(const struct side *sd, CUevent ev)
{
	return sd->kind == SIDE_SOP ? sop_event_destroy(ev) : drv.cuEventDestroy(ev);
}

CUresult
side_stream_destroy(const struct side *sd, CUstream s)
{
	return sd->kind == SIDE_SOP ? sop_stream_destroy(s) : drv.cuStreamDestroy(s);
}

uint64_t
side_attr(const struct side *sd, CUmemPool_attribute attr)
{
	cuuint64_t v = 0;

	if (sd->kind == SIDE_SOP)
		CHECK(sop_pool_get_attr(sd->sop, attr, &v));
	else if (sd->kind == SIDE_POOL || sd->kind == SIDE_DEFAULT)
		CHECK(drv.cuMemPoolGetAttribute(sd->pool, attr, &v));
	return v;
}

void
side_set_attr(const struct side *sd, CUmemPool_attribute attr, uint64_t v)
{
	cuuint64_t x = v;

	if (sd->kind == SIDE_SOP)
		CHECK(sop_pool_set_attr(sd->sop, attr, &x));
	else if (sd->kind == SIDE_POOL || sd->kind == SIDE_DEFAULT)
		CHECK(drv.cuMemPoolSetAttribute(sd->pool, attr, &x));
}

CUstream
stream_new(void)
{
	CUstream s;

	CHECK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	return s;
}

void
stream_free(CUstream s)
{
	CHECK(drv.cuStreamDestroy(s));
}

void
launch_spin(void *out, long long cycles, CUstream s)
{
	void *args[] = {&out, &cycles};

	CHECK(drv.cuLaunchKernel(env.k_spin, 1, 1, 1, 1, 1, 1, 0, s, args, NULL));
}

void
launch_fill(void *p, size_t bytes, unsigned v, CUstream s)
{
	unsigned long long n = bytes / 4;
	unsigned blocks = (unsigned)((n + 255) / 256);
	void *args[] = {&p, &n, &v};

	if (!n)
		return;
	if (blocks > 1024)
		blocks = 1024; /* grid-stride: enough to fill an H100 */
	CHECK(drv.cuLaunchKernel(env.k_fill, blocks, 1, 1, 256, 1, 1, 0, s, args, NULL));
}

void
calls_read(struct calls *c)
{
	const char *names[BENCH_COUNT_MAX];
	unsigned long long counts[BENCH_COUNT_MAX];
	size_t n = BENCH_COUNT_MAX, i;

	memset(c, 0, sizeof *c);
	if (!env.counting || sop_driver_calls(names, counts, &n) != CUDA_SUCCESS)
		return;
	for (i = 0; i < n && i < BENCH_COUNT_MAX; i++)
		c->n[i] = counts[i];
}

unsigned
calls_entries(void)
{
	return n_call_names;
}

const char *
calls_name(unsigned i)
{
	return i < n_call_names ? call_names[i] : "";
}
