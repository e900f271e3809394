/* gpu-host.c - on a real GPU, host pools (pinned host memory) under kernels, copies and the CPU.
 * Kernels write tags into host-pool memory and the CPU checks them after synchronizing; the CPU
 * writes tags and kernels count the words that differ; cuMemcpyAsync moves data between host-pool
 * memory and device-pool memory both ways. Several streams allocate, use and free host-pool blocks
 * at once, some freed on another stream after an event, so that blocks move between streams while
 * kernels that spin still run: a block handed out too early shows as a wrong tag. Needs a GPU
 * (exit 77 on the simulated driver, and where the driver makes no host memory through cuMemCreate).
 * Last, it tells (without asserting) whether a copy reaches host-pool memory that no device was
 * granted access to, which the driver does not document. */
#include <string.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)
#define STREAMS 6
#define ROUNDS 200

static bool
cpu_holds(const uint32_t *p, size_t words, uint32_t v)
{
	size_t i;

	for (i = 0; i < words; i++)
		if (p[i] != v)
			return false;
	return true;
}

static sop_pool_t
host_pool(const CUmemLocation *loc)
{
	CUmemPoolProps props;
	CUmemAccessDesc d;
	cuuint64_t keep = UINT64_MAX;
	sop_pool_t pool;
	int i;

	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location = *loc;
	TH_OK(sop_pool_create(&pool, &props));
	memset(&d, 0, sizeof d);
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	for (i = 0; i < th_n_devices; i++) {
		d.location.id = i;
		TH_OK(sop_pool_set_access(pool, &d, 1));
	}
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	return pool;
}

int
main(void)
{
	CUmemLocation locs[2] = {{CU_MEM_LOCATION_TYPE_HOST, 0}, {CU_MEM_LOCATION_TYPE_HOST, 0}};
	CUstream s[STREAMS];
	CUevent ev[STREAMS];
	sop_pool_t dev_pool;
	unsigned *bad, host_bad[STREAMS];
	uint64_t seed = 777;
	int l, i, r;

	th_init();
	th_require_gpu();
	{
		CUmemPoolProps props;
		sop_pool_t probe;
		CUresult rc;

		memset(&props, 0, sizeof props);
		props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		props.location = locs[0];
		rc = sop_pool_create(&probe, &props);
		if (rc != CUDA_SUCCESS) {
			printf("skip: the driver makes no host memory through cuMemCreate (%d)\n",
			       (int)rc);
			return TH_SKIP;
		}
		TH_OK(sop_pool_destroy(probe));
	}
	TH_OK(sop_device_get_host_location(&locs[1], 0));
	th_kernels_load();
	dev_pool = th_pool(0, 0);
	for (i = 0; i < STREAMS; i++) {
		s[i] = th_stream();
		TH_OK(th.cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
	}
	TH_OK(sop_malloc_from_pool_async((void **)&bad, sizeof host_bad, dev_pool, s[0]));
	TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)bad, 0, STREAMS, s[0]));
	TH_OK(sop_stream_synchronize(s[0]));

	for (l = 0; l < 2; l++) {
		sop_pool_t pool = host_pool(&locs[l]);
		size_t words = 8 * MiB / 4;
		uint32_t *h, *h2, *d;

		/* Kernel writes, the CPU checks after synchronizing; the CPU writes, a kernel
		 * checks. */
		TH_OK(sop_malloc_from_pool_async((void **)&h, words * 4, pool, s[0]));
		th_spin_fill(h, words, 0x1234abcdu, 1000000, s[0]);
		TH_OK(sop_stream_synchronize(s[0]));
		TH_ASSERT(cpu_holds(h, words, 0x1234abcdu));
		for (i = 0; i < (int)words; i++)
			h[i] = 0x0badf00du;
		th_check(h, words, 0x0badf00du, bad, s[1]);
		/* cuMemcpyAsync both ways: host pool -> device pool -> another host-pool block. */
		TH_OK(sop_malloc_from_pool_async((void **)&d, words * 4, dev_pool, s[1]));
		TH_OK(sop_malloc_from_pool_async((void **)&h2, words * 4, pool, s[1]));
		TH_OK(th.cuMemcpyAsync((CUdeviceptr)(uintptr_t)d, (CUdeviceptr)(uintptr_t)h,
				       words * 4, s[1]));
		th_check(d, words, 0x0badf00du, bad + 1, s[1]);
		TH_OK(th.cuMemcpyAsync((CUdeviceptr)(uintptr_t)h2, (CUdeviceptr)(uintptr_t)d,
				       words * 4, s[1]));
		TH_OK(sop_stream_synchronize(s[1]));
		TH_ASSERT(cpu_holds(h2, words, 0x0badf00du));
		TH_OK(sop_free_async(h, s[1]));
		TH_OK(sop_free_async(h2, s[1]));
		TH_OK(sop_free_async(d, s[1]));

		/* Streams at once, blocks moving between them. */
		for (r = 0; r < ROUNDS; r++) {
			uint32_t *p[STREAMS];
			size_t n[STREAMS];
			uint32_t tag[STREAMS];

			for (i = 0; i < STREAMS; i++) {
				seed = seed * 6364136223846793005ull + 1442695040888963407ull;
				n[i] = 64 + (seed >> 33) % (1u << 18);
				tag[i] = (uint32_t)(l << 24 | r << 8 | i) * 2654435761u;
				TH_OK(sop_malloc_from_pool_async((void **)&p[i], n[i] * 4, pool,
								 s[i]));
				th_spin_fill(p[i], n[i], tag[i], 20000, s[i]);
				th_check(p[i], n[i], tag[i], bad + i, s[i]);
			}
			if (r % 5 == 0) {
				/* The CPU reads what the kernels wrote. */
				for (i = 0; i < STREAMS; i++) {
					TH_OK(sop_stream_synchronize(s[i]));
					TH_ASSERT(cpu_holds(p[i], n[i], tag[i]));
				}
			}
			for (i = 0; i < STREAMS; i++) {
				if (r % 3 == 1) {
					int j = (i + 1) % STREAMS;
					TH_OK(sop_event_record(ev[i], s[i]));
					TH_OK(sop_stream_wait_event(s[j], ev[i], 0));
					TH_OK(sop_free_async(p[i], s[j]));
				} else {
					TH_OK(sop_free_async(p[i], s[i]));
				}
			}
			if (r % 40 == 39)
				TH_OK(sop_ctx_synchronize());
		}
		TH_OK(sop_ctx_synchronize());
		TH_OK(th.cuMemcpyDtoHAsync(host_bad, (CUdeviceptr)(uintptr_t)bad, sizeof host_bad,
					   s[0]));
		TH_OK(sop_stream_synchronize(s[0]));
		for (i = 0; i < STREAMS; i++)
			TH_EQ(host_bad[i], 0);
		TH_CHECK(pool);
		TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
		printf("gpu-host: location %d/%d: kernels, copies and the CPU agree; reserved %llu\n",
		       (int)locs[l].type, locs[l].id,
		       (unsigned long long)th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH));
		TH_OK(sop_pool_destroy(pool));
	}

	/* Observation: a copy from host-pool memory that no device was granted. Last, as a fault
	 * would end the context. */
	{
		CUmemPoolProps props;
		sop_pool_t bare;
		uint32_t *h, *d;
		CUresult rc;

		memset(&props, 0, sizeof props);
		props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		props.location = locs[0];
		TH_OK(sop_pool_create(&bare, &props));
		TH_OK(sop_malloc_from_pool_async((void **)&h, MiB, bare, s[0]));
		TH_OK(sop_malloc_from_pool_async((void **)&d, MiB, dev_pool, s[0]));
		TH_OK(sop_stream_synchronize(s[0]));
		memset(h, 0x42, MiB);
		rc = th.cuMemcpyAsync((CUdeviceptr)(uintptr_t)d, (CUdeviceptr)(uintptr_t)h, MiB,
				      s[0]);
		if (rc == CUDA_SUCCESS)
			rc = sop_stream_synchronize(s[0]);
		printf("gpu-host: copy from host-pool memory without device access: %d\n", (int)rc);
	}
	printf("gpu-host: ok\n");
	return 0;
}
