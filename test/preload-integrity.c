/* preload-integrity.c - the data-integrity stress (stress.c) as an unchanged program meets the
 * interposer: this program links libcuda.so.1, knows nothing of sop, and makes the stress's
 * calls by the driver's names: cuMemAllocFromPoolAsync from a pool of its own capped at 64 MiB
 * (pool 0, which runs out and reuses) and cuMemAllocAsync from the device's default pool (pool
 * 1), cuMemFreeAsync, event records and waits, synchronizations, trims, cuStreamDestroy of busy
 * streams. Under sop-run those calls are sop's: its memo of stream ids across destroys, the
 * synchronizations it learns from, pools made with cuMemPoolCreate. On the driver's own pools
 * (a GPU without sop-run) it checks the test. On the simulated driver's libcuda.so.1, whose own
 * pools are not there, it runs only under the interposer.
 *
 * Usage: test-preload-integrity [--seconds N] [--threads N] [--seed N] [--replace PERMILLE]
 *                               [--expect sop|driver]
 * --expect says whose memory every allocation must be (sop's, asked of sop_pointer_get_pool
 * found with dlsym(RTLD_DEFAULT); the driver's: no sop in the process). Exits 77 without a driver.
 */
#include <dlfcn.h>
#include <string.h>

#include "kernels.ptx.h"
#include "sop.h"
#include "stress.h"

#define MiB ((size_t)1 << 20)

static CUmemoryPool pools[2];
static __typeof__(sop_pointer_get_pool) *pointer_get_pool;
static atomic_ulong n_allocs, n_sop;

static CUresult
alloc(CUdeviceptr *p, size_t bytes, int pool, CUstream s)
{
	return pool ? cuMemAllocAsync(p, bytes, s) : cuMemAllocFromPoolAsync(p, bytes, pools[0], s);
}

static void
allocated(CUdeviceptr p)
{
	sop_pool_t owner;

	atomic_fetch_add(&n_allocs, 1);
	if (pointer_get_pool && pointer_get_pool(&owner, (void *)(uintptr_t)p) == CUDA_SUCCESS)
		atomic_fetch_add(&n_sop, 1);
}

static CUresult
trim(int pool, size_t keep)
{
	return cuMemPoolTrimTo(pools[pool], keep);
}

static CUresult
ctx_synchronize(void)
{
	return cuCtxSynchronize();
}

int
main(int argc, char **argv)
{
	static struct stress st = {.n_threads = 4, .seconds = 2.0, .seed = 1, .replace_permille = 2,
				   .trim_step = 16 * MiB};
	const struct stress_api api = {
		.alloc = alloc,
		.free = cuMemFreeAsync,
		.event_record = cuEventRecord,
		.stream_wait_event = cuStreamWaitEvent,
		.stream_synchronize = cuStreamSynchronize,
		.event_synchronize = cuEventSynchronize,
		.ctx_synchronize = ctx_synchronize,
		.trim = trim,
		.event_destroy = cuEventDestroy,
		.stream_destroy = cuStreamDestroy,
		.allocated = allocated,
		.event_create = cuEventCreate,
		.event_destroy_direct = cuEventDestroy,
		.stream_create = cuStreamCreate,
		.ctx_set_current = cuCtxSetCurrent,
		.launch = cuLaunchKernel,
		.memset32 = cuMemsetD32Async,
		.copy_dtoh = cuMemcpyDtoHAsync,
		.host_func = cuLaunchHostFunc,
	};
	const char *expect = "";
	CUmemPoolProps props;
	CUdeviceptr errors = 0;
	CUdevice dev;
	CUstream s;
	bool gpu;
	void *sym;
	int i;

	for (i = 1; i + 1 < argc; i += 2)
		if (!stress_option(&st, argv[i], argv[i + 1]) && !strcmp(argv[i], "--expect"))
			expect = argv[i + 1];
	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS) {
		printf("skip: no driver or no device\n");
		return 77;
	}
	STRESS_OK(cuDevicePrimaryCtxRetain(&st.ctx, dev));
	STRESS_OK(cuCtxSetCurrent(st.ctx));
	gpu = dlsym(RTLD_DEFAULT, "sim_calls") == NULL;
	sym = dlsym(RTLD_DEFAULT, "sop_pointer_get_pool");
	memcpy(&pointer_get_pool, &sym, sizeof sym); /* ISO C has no cast from data to function */
	if (!gpu && !pointer_get_pool) {
		printf("skip: the simulated driver has no pools of its own\n");
		return 77;
	}
	st.api = &api;
	if (gpu) {
		CUmodule mod;
		STRESS_OK(cuModuleLoadData(&mod, sop_kernels_ptx));
		STRESS_OK(cuModuleGetFunction(&st.spin_fill, mod, "sop_spin_fill"));
		STRESS_OK(cuModuleGetFunction(&st.check, mod, "sop_check"));
	}
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = dev;
	props.maxSize = 64 * MiB;
	STRESS_OK(cuMemPoolCreate(&pools[0], &props));
	STRESS_OK(cuDeviceGetDefaultMemPool(&pools[1], dev));
	STRESS_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	if (gpu) {
		STRESS_OK(cuMemAllocAsync(&errors, sizeof(unsigned) * STRESS_MAX_THREADS, s));
		STRESS_OK(cuMemsetD32Async(errors, 0, STRESS_MAX_THREADS, s));
		STRESS_OK(cuStreamSynchronize(s));
		st.dev_errors = (unsigned *)(uintptr_t)errors;
	}
	stress_run(&st);
	printf("preload-integrity: %s, %s, %d threads, %.0f s, seed %llu: %lu operations, %lu "
	       "allocations (%lu sop's), %lu handoffs, %lu synchronizations, %lu trims, %lu streams "
	       "replaced busy, %lu out of memory, %lu errors\n",
	       gpu ? "GPU" : "simulated driver", pointer_get_pool ? "under the interposer" : "no sop",
	       st.n_threads, st.seconds, (unsigned long long)st.seed, atomic_load(&st.ops),
	       atomic_load(&n_allocs), atomic_load(&n_sop), atomic_load(&st.handoffs),
	       atomic_load(&st.syncs), atomic_load(&st.trims), atomic_load(&st.replaced),
	       atomic_load(&st.oom), atomic_load(&st.errors));
	if (errors)
		STRESS_OK(cuMemFreeAsync(errors, s));
	STRESS_OK(cuStreamSynchronize(s));
	STRESS_OK(cuStreamDestroy(s));
	STRESS_OK(cuMemPoolDestroy(pools[0]));
	if (atomic_load(&st.errors) || !atomic_load(&n_allocs))
		return 1;
	if (!strcmp(expect, "sop") && atomic_load(&n_sop) != atomic_load(&n_allocs)) {
		fprintf(stderr, "preload-integrity: memory not sop's under the interposer\n");
		return 1;
	}
	if (!strcmp(expect, "driver") && atomic_load(&n_sop)) {
		fprintf(stderr, "preload-integrity: sop's memory without the interposer\n");
		return 1;
	}
	return 0;
}
