/* stats.c - accounting and watermarks: used memory counts exact requested bytes and drops at the
 * free call; writing 0 to a watermark resets it to the current value; reserved memory is the
 * physical memory held, in pieces of at least a 32 MiB step, or what a request needs beyond the
 * free memory next to it. */
#include "helpers.h"

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
	th_stream_destroy(s);
	printf("stats: ok\n");
	return 0;
}
