/* gpu-kernels.c - on a real GPU, kernels write and verify patterns in pool memory across
 * streams. Each stream repeatedly allocates a block, runs a kernel that spins and then fills it
 * with the stream's tag for this round, a kernel that counts words that are not that tag, and
 * frees the block; other streams allocate at the same time. A block handed to another stream
 * while a kernel still uses it shows up as a wrong tag. Some blocks are freed on another stream
 * after an event, and synchronization points are mixed in so that blocks do move between
 * streams. Needs a GPU (exit 77 on the simulated driver). */
#include <string.h>
#include <unistd.h>

#include "helpers.h"

#define STREAMS 8
#define ROUNDS 400

/* The reuse scenarios with a kernel that really runs, instead of a blocked host function:
 * s1 spins about 50 ms and then fills its block; another stream's allocation must not get the
 * block while that kernel may run (A), gets it through an event dependency or an inserted one
 * and then runs after it (D, F). The check kernels prove the order: each block still holds the
 * tag of the kernel that was meant to write it last. */
static void
spin_scenarios(unsigned *bad)
{
	const size_t words = (4 << 20) / 4;
	const long long spin = 100000000; /* ~50 ms at 2 GHz */
	CUstream s1 = th_stream(), s2 = th_stream();
	sop_pool_t pool = th_pool(0, 0), capped = th_pool(0, 4 << 20);
	cuuint64_t keep = UINT64_MAX;
	CUevent ev;
	void *a, *b;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_pool_set_attr(capped, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));

	/* A: s1 busy in a kernel that will write a; s2 must get another block. */
	TH_OK(sop_malloc_from_pool_async(&a, words * 4, pool, s1));
	th_spin_fill(a, words, 0xA1A1A1A1u, spin, s1);
	th_check(a, words, 0xA1A1A1A1u, bad + 0, s1);
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_malloc_from_pool_async(&b, words * 4, pool, s2));
	TH_ASSERT(b != a);
	th_spin_fill(b, words, 0xB1B1B1B1u, 0, s2);
	th_check(b, words, 0xB1B1B1B1u, bad + 0, s2);
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop_ctx_synchronize());

	/* D: the same, but s2 waits on an event recorded after the free: it gets a, and its fill
	 * runs after s1's kernel and check. */
	TH_OK(sop_malloc_from_pool_async(&a, words * 4, pool, s1));
	th_spin_fill(a, words, 0xA2A2A2A2u, spin, s1);
	th_check(a, words, 0xA2A2A2A2u, bad + 1, s1);
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_event_record(ev, s1));
	TH_OK(sop_stream_wait_event(s2, ev, 0));
	TH_OK(sop_malloc_from_pool_async(&b, words * 4, pool, s2));
	TH_ASSERT(b == a);
	th_spin_fill(b, words, 0xB2B2B2B2u, 0, s2);
	th_check(b, words, 0xB2B2B2B2u, bad + 1, s2);
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop_ctx_synchronize());

	/* F: a 4 MiB pool, full, s1 busy; s2 gets a through a wait sop inserts. */
	TH_OK(sop_malloc_from_pool_async(&a, words * 4, capped, s1));
	th_spin_fill(a, words, 0xA3A3A3A3u, spin, s1);
	th_check(a, words, 0xA3A3A3A3u, bad + 2, s1);
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_malloc_from_pool_async(&b, words * 4, capped, s2));
	TH_ASSERT(b == a);
	th_spin_fill(b, words, 0xB3B3B3B3u, 0, s2);
	th_check(b, words, 0xB3B3B3B3u, bad + 2, s2);
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop_ctx_synchronize());

	TH_OK(sop_event_destroy(ev));
	TH_OK(sop_pool_destroy(pool));
	TH_OK(sop_pool_destroy(capped));
	th_stream_destroy(s1);
	th_stream_destroy(s2);
}

static void CUDA_CB
sleep_fn(void *arg)
{
	(void)arg;
	usleep(200000);
}

/* A destroyed busy stream's handle goes to the next stream at once: A fills a block, sleeps in a
 * host function, then a kernel reads the block; the block is freed on A and A destroyed; B, made
 * next (with A's handle), synchronizes, allocates the same size and writes it. The read must see
 * A's tag, and with release threshold 0 the memory must still be mapped when it runs. */
static void
destroyed_busy(unsigned *bad, cuuint64_t threshold, int *reused)
{
	const size_t words = (16 << 20) / 4;
	sop_pool_t pool = th_pool(0, 0);
	CUstream a_s = th_stream(), b_s;
	void *a, *b;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
	TH_OK(sop_malloc_from_pool_async(&a, words * 4, pool, a_s));
	th_spin_fill(a, words, 0xA4A4A4A4u, 0, a_s);
	TH_OK(th.cuLaunchHostFunc(a_s, sleep_fn, NULL));
	th_check(a, words, 0xA4A4A4A4u, bad + 3, a_s);
	TH_OK(sop_free_async(a, a_s));
	th_stream_destroy(a_s);
	b_s = th_stream();
	*reused += b_s == a_s;
	TH_OK(sop_stream_synchronize(b_s));
	TH_OK(sop_malloc_from_pool_async(&b, words * 4, pool, b_s));
	th_spin_fill(b, words, 0xB4B4B4B4u, 0, b_s);
	th_check(b, words, 0xB4B4B4B4u, bad + 4, b_s);
	TH_OK(sop_free_async(b, b_s));
	TH_OK(sop_stream_synchronize(b_s));
	TH_OK(sop_ctx_synchronize());
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(b_s);
}

int
main(void)
{
	CUstream s[STREAMS];
	CUevent ev[STREAMS];
	unsigned *bad;
	unsigned host_bad[STREAMS];
	sop_pool_t pool, counters;
	uint64_t seed = 12345, reused_across = 0;
	int i, r;

	th_init();
	th_require_gpu();
	th_kernels_load();

	pool = th_pool(0, 0);
	counters = th_pool(0, 0);
	for (i = 0; i < STREAMS; i++) {
		s[i] = th_stream();
		TH_OK(th.cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
	}
	TH_OK(sop_malloc_from_pool_async((void **)&bad, sizeof host_bad, counters, s[0]));
	TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)bad, 0, STREAMS, s[0]));
	TH_OK(sop_stream_synchronize(s[0]));
	spin_scenarios(bad);
	{
		int reused = 0;
		destroyed_busy(bad, UINT64_MAX, &reused);
		destroyed_busy(bad, 0, &reused);
		printf("gpu-kernels: destroyed busy stream, new stream at its handle %d of 2 times\n",
		       reused);
	}

	for (r = 0; r < ROUNDS; r++) {
		void *prev[STREAMS];
		for (i = 0; i < STREAMS; i++) {
			size_t words;
			uint32_t tag = (uint32_t)(r << 8 | i) * 2654435761u;
			void *p;

			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			words = 64 + (seed >> 33) % (1u << 18);
			TH_OK(sop_malloc_from_pool_async(&p, words * 4, pool, s[i]));
			/* ~20 us of spinning keeps the kernels overlapping the host's calls. */
			th_spin_fill(p, words, tag, 40000, s[i]);
			th_check(p, words, tag, bad + i, s[i]);
			prev[i] = p;
			if (r % 7 == 3) {
				/* Free on the next stream, ordered after this one's work. */
				int j = (i + 1) % STREAMS;
				TH_OK(sop_event_record(ev[i], s[i]));
				TH_OK(sop_stream_wait_event(s[j], ev[i], 0));
				TH_OK(sop_free_async(p, s[j]));
			} else {
				TH_OK(sop_free_async(p, s[i]));
			}
		}
		if (r % 50 == 49) {
			TH_OK(sop_ctx_synchronize());
		} else if (r % 10 == 9) {
			TH_OK(sop_stream_synchronize(s[r % STREAMS]));
		}
		/* Count blocks that moved to another stream after a synchronization point. */
		for (i = 0; i < STREAMS; i++) {
			void *q;
			TH_OK(sop_malloc_from_pool_async(&q, 4096, pool, s[(i + 3) % STREAMS]));
			reused_across += q == prev[i];
			TH_OK(sop_free_async(q, s[(i + 3) % STREAMS]));
		}
	}
	TH_OK(sop_ctx_synchronize());
	TH_OK(th.cuMemcpyDtoHAsync(host_bad, (CUdeviceptr)(uintptr_t)bad, sizeof host_bad, s[0]));
	TH_OK(sop_stream_synchronize(s[0]));
	for (i = 0; i < STREAMS; i++)
		TH_EQ(host_bad[i], 0);
	TH_OK(sop_free_async(bad, s[0]));
	TH_OK(sop_stream_synchronize(s[0]));
	TH_CHECK(pool);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	for (i = 0; i < STREAMS; i++) {
		TH_OK(th.cuEventDestroy(ev[i]));
		th_stream_destroy(s[i]);
	}
	TH_OK(sop_pool_destroy(pool));
	TH_OK(sop_pool_destroy(counters));
	printf("gpu-kernels: ok (%d streams x %d rounds, %llu blocks reused across streams)\n",
	       STREAMS, ROUNDS, (unsigned long long)reused_across);
	return 0;
}
