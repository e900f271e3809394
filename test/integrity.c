/* integrity.c - the data-integrity stress (stress.c) on sop's API: sop's pools, allocations and
 * frees, and the calls sop learns stream order from (sop_event_record, sop_stream_wait_event, the
 * synchronizations, sop_stream_destroy). Pool 0 is capped at 64 MiB, so that it runs out and
 * reuses through inserted dependencies; pool 1 releases everything at every synchronization
 * point, so that it regrows. At the end every pool's invariants hold and nothing is in use.
 *
 * Usage: test-integrity [--seconds N] [--threads N] [--seed N] [--replace PERMILLE]
 */
#include <string.h>

#include "helpers.h"
#include "kernels.ptx.h"
#include "stress.h"

#define MiB ((size_t)1 << 20)

static sop_pool_t pools[2];

static CUresult
alloc(CUdeviceptr *p, size_t bytes, int pool, CUstream s)
{
	void *q;
	CUresult r = sop_malloc_from_pool_async(&q, bytes, pools[pool], s);

	*p = (CUdeviceptr)(uintptr_t)q;
	return r;
}

static CUresult
free_async(CUdeviceptr p, CUstream s)
{
	return sop_free_async((void *)(uintptr_t)p, s);
}

static CUresult
trim(int pool, size_t keep)
{
	return sop_trim_to(pools[pool], keep);
}

int
main(int argc, char **argv)
{
	static struct stress st = {.n_threads = 4, .seconds = 2.0, .seed = 1, .replace_permille = 2,
				   .trim_step = 32 * MiB};
	struct stress_api api = {
		.alloc = alloc,
		.free = free_async,
		.event_record = sop_event_record,
		.stream_wait_event = sop_stream_wait_event,
		.stream_synchronize = sop_stream_synchronize,
		.event_synchronize = sop_event_synchronize,
		.ctx_synchronize = sop_ctx_synchronize,
		.trim = trim,
		.event_destroy = sop_event_destroy,
	};
	cuuint64_t zero = 0;
	sop_pool_t aux;
	bool gpu;
	int i;

	for (i = 1; i + 1 < argc; i += 2)
		stress_option(&st, argv[i], argv[i + 1]);
	gpu = !th_init();
	api.event_create = th.cuEventCreate;
	api.event_destroy_direct = th.cuEventDestroy;
	api.stream_create = th.cuStreamCreate;
	api.stream_destroy = th.cuStreamDestroy;
	api.ctx_set_current = th.cuCtxSetCurrent;
	api.launch = th.cuLaunchKernel;
	api.memset32 = th.cuMemsetD32Async;
	api.copy_dtoh = th.cuMemcpyDtoHAsync;
	api.host_func = th.cuLaunchHostFunc;
	st.api = &api;
	TH_OK(sop__drv.cuCtxGetCurrent(&st.ctx));
	if (gpu) {
		CUmodule mod;
		TH_OK(th.cuModuleLoadData(&mod, sop_kernels_ptx));
		TH_OK(th.cuModuleGetFunction(&st.spin_fill, mod, "sop_spin_fill"));
		TH_OK(th.cuModuleGetFunction(&st.check, mod, "sop_check"));
	}
	pools[0] = th_pool(0, 64 * MiB);
	pools[1] = th_pool(0, 0);
	TH_OK(sop_pool_set_attr(pools[1], CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero));
	aux = th_pool(0, 0);
	if (gpu) {
		CUstream s = th_stream();
		TH_OK(sop_malloc_from_pool_async((void **)&st.dev_errors,
						 sizeof(unsigned) * STRESS_MAX_THREADS, aux, s));
		TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)st.dev_errors, 0, STRESS_MAX_THREADS,
					  s));
		TH_OK(sop_stream_synchronize(s));
		th_stream_destroy(s);
	}
	stress_run(&st);
	printf("integrity: %s, %d threads, %.0f s, seed %llu: %lu operations, %lu handoffs, "
	       "%lu synchronizations, %lu trims, %lu streams replaced busy, %lu out of memory, "
	       "%lu errors\n",
	       gpu ? "GPU" : "simulated driver", st.n_threads, st.seconds,
	       (unsigned long long)st.seed, atomic_load(&st.ops), atomic_load(&st.handoffs),
	       atomic_load(&st.syncs), atomic_load(&st.trims), atomic_load(&st.replaced),
	       atomic_load(&st.oom), atomic_load(&st.errors));
	TH_EQ(atomic_load(&st.errors), 0);
	for (i = 0; i < 2; i++) {
		TH_CHECK(pools[i]);
		TH_EQ(th_attr(pools[i], CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
		TH_OK(sop_pool_destroy(pools[i]));
	}
	if (st.dev_errors)
		TH_OK(sop_free_async(st.dev_errors, NULL));
	TH_OK(sop_ctx_synchronize());
	TH_OK(sop_pool_destroy(aux));
	return 0;
}
