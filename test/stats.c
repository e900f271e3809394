/* stats.c - accounting and watermarks: used memory counts exact requested bytes and drops at the
 * free call; writing 0 to a watermark resets it to the current value; reserved memory is the
 * physical memory held, in pieces of at least a 32 MiB step, or what a request needs beyond the
 * free memory next to it. Free extents count free and pending memory alike, the largest the
 * longest contiguous run of it. The used-memory watermark stays near the true peak when streams
 * come and go, each synchronized at its end. */
#include "helpers.h"

#define MiB ((size_t)1 << 20)

static void
extents_are(sop_pool_t pool, size_t largest, size_t total)
{
	size_t l = 1, t = 1;

	TH_OK(sop_pool_get_free_extents(pool, &l, &t));
	TH_EQ(l, largest);
	TH_EQ(t, total);
}

static void
free_extents(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0), gone = th_pool(0, 0);
	size_t l = 7, t = 7;
	void *a, *b, *c;

	extents_are(pool, 0, 0);
	/* One 32 MiB step: a, b, c at its start, 20 MiB free after them. */
	TH_OK(sop_malloc_from_pool_async(&a, 4 * MiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&b, 4 * MiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&c, 4 * MiB, pool, s));
	TH_EQ((char *)b - (char *)a, (long)(4 * MiB));
	TH_EQ((char *)c - (char *)b, (long)(4 * MiB));
	extents_are(pool, 20 * MiB, 20 * MiB);
	/* b pending on s, between two live blocks: free, but apart. */
	TH_OK(sop_free_async(b, s));
	extents_are(pool, 20 * MiB, 24 * MiB);
	/* c joins the free memory after it, and b before it. */
	TH_OK(sop_free(c));
	extents_are(pool, 28 * MiB, 28 * MiB);
	TH_OK(sop_free_async(a, s));
	extents_are(pool, 32 * MiB, 32 * MiB);
	TH_CHECK(pool);

	TH_EQ(sop_pool_get_free_extents(NULL, &l, &t), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_free_extents(pool, NULL, &t), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_free_extents(pool, &l, NULL), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_pool_destroy(gone));
	TH_EQ(sop_pool_get_free_extents(gone, &l, &t), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(l, 7);
	TH_EQ(t, 7);
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_pool_destroy(pool));
}

/* A stream per task, one after another: 4 MiB live in each, freed, synchronized, destroyed.
 * The true peak is 4 MiB. The watermark sums the streams' own highs since it last folded them;
 * folded only when read, it reported every task's high added up (800 MiB here, and 200 GiB for
 * sixteen threads running tasks for half a second on the H100). A synchronization folds the pool
 * of the stream it covers, whose high is then its present use. */
static void
watermark_tasks(void)
{
	sop_pool_t pool = th_pool(0, 0);
	uint64_t max = UINT64_MAX;
	void *p[4];
	int t, i;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
	for (t = 0; t < 200; t++) {
		CUstream s = th_stream();

		for (i = 0; i < 4; i++)
			TH_OK(sop_malloc_from_pool_async(&p[i], MiB, pool, s));
		for (i = 0; i < 4; i++)
			TH_OK(sop_free_async(p[i], s));
		TH_OK(sop_stream_synchronize(s));
		th_stream_destroy(s);
	}
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 4 * MiB);
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

/* Two streams: one synchronized, the other's free still pending. The synchronization folds the
 * high of every stream it can, and one it cannot (its lock held by a thread allocating on it)
 * keeps its high until the next fold: either way the watermark never drops below the peak. */
static void
watermark_two_streams(void)
{
	sop_pool_t pool = th_pool(0, 0);
	uint64_t max = UINT64_MAX, zero = 0;
	CUstream s1 = th_stream(), s2 = th_stream();
	void *a, *b;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
	TH_OK(sop_malloc_from_pool_async(&a, 3 * MiB, pool, s2));
	TH_OK(sop_free_async(a, s2));
	TH_OK(sop_malloc_from_pool_async(&b, MiB, pool, s1));
	TH_OK(sop_free_async(b, s1));
	TH_OK(sop_stream_synchronize(s1));
	/* The peak was 3 MiB; the sum of the two streams' highs is 4. */
	TH_ASSERT(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= 3 * MiB);
	TH_ASSERT(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) <= 4 * MiB);
	TH_OK(sop_malloc_from_pool_async(&b, 2 * MiB, pool, s1));
	TH_OK(sop_stream_synchronize(s2));
	TH_ASSERT(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= 3 * MiB);
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 2 * MiB);
	TH_OK(sop_free_async(b, s1));
	TH_OK(sop_stream_synchronize(s1));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 2 * MiB);
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(s1);
	th_stream_destroy(s2);
}

int
main(void)
{
	sop_pool_t pool;
	void *a, *b, *c, *d;
	cuuint64_t zero = 0;
	struct th_gate gate;
	CUstream s;

	th_init();
	s = th_stream();
	pool = th_pool(0, 0);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);

	/* Keep the stream busy: the free below is still pending when used drops. */
	th_gate_init(&gate);
	th_gate_block(&gate, s);

	TH_OK(sop_malloc_from_pool_async(&a, 1, pool, s));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 1);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 32 << 20);
	TH_OK(sop_malloc_from_pool_async(&b, 1000, pool, s));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 1001);
	/* 512-byte spacing, as the driver's pool. */
	TH_EQ((char *)b - (char *)a, 512);
	TH_OK(sop_malloc_from_pool_async(&c, (1 << 20) + 1, pool, s));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 1001 + (1 << 20) + 1);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 1001 + (1 << 20) + 1);
	TH_CHECK(pool);

	TH_OK(sop_free_async(c, s));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 1001);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 1001 + (1 << 20) + 1);
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 1001);

	/* A request larger than the free memory at the end of the mapped memory joins it: 40 MiB
	 * maps one 32 MiB step next to the 31 MiB left free after c, not 42 MiB of its own. */
	TH_OK(sop_malloc_from_pool_async(&c, (40 << 20) + 5, pool, s));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 64 << 20);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 64 << 20);
	TH_EQ((char *)c - (char *)a, (long)(1 << 20) + 2048);
	/* Past a step, only what is missing, in whole granules: 60 MiB next to the 23 MiB left
	 * maps 38 MiB. */
	TH_OK(sop_malloc_from_pool_async(&d, 60 << 20, pool, s));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), (64 + 38) << 20);
	TH_EQ((char *)d - (char *)c, (40 << 20) + 512);
	TH_CHECK(pool);
	TH_OK(sop_free_async(d, s));
	TH_OK(sop_free_async(c, s));
	TH_OK(sop_free_async(b, s));
	TH_OK(sop_free_async(a, s));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	TH_CHECK(pool);
	/* Frees pending: nothing can be released yet, whatever the threshold. */
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), (64 + 38) << 20);

	th_gate_open(&gate);
	TH_OK(sop_stream_synchronize(s));
	/* Threshold 0: the synchronization released everything. */
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), (64 + 38) << 20);
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 0);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 1001 + (40 << 20) + 5 + (60 << 20));
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 0);
	TH_CHECK(pool);

	TH_OK(sop_pool_destroy(pool));
	free_extents(s);
	th_stream_destroy(s);
	watermark_tasks();
	watermark_two_streams();
	printf("stats: ok\n");
	return 0;
}
