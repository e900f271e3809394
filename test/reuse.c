/* reuse.c - stream order: a block freed on a busy stream is reused at once by that stream, never
 * by another stream while the free may be pending, and by every stream once a synchronization
 * point has shown the free complete (or once sop_free vouched for it). Data written through the
 * reused block lands after the stream's earlier work. */
#include "helpers.h"

#define MiB ((size_t)1 << 20)

static void
same_stream(sop_pool_t pool, CUstream s1)
{
	struct th_gate gate;
	void *a, *b, *c;

	th_gate_init(&gate);
	th_gate_block(&gate, s1);
	TH_OK(sop_malloc_from_pool_async(&a, 4 * MiB, pool, s1));
	th_fill(a, 4 * MiB, 0x11111111, s1);
	TH_OK(sop_free_async(a, s1));
	/* Same size, same stream, stream still blocked: the same block. */
	TH_OK(sop_malloc_from_pool_async(&b, 4 * MiB, pool, s1));
	TH_ASSERT(b == a);
	TH_OK(sop_free_async(b, s1));
	/* A smaller request on the same stream starts at the same address. */
	TH_OK(sop_malloc_from_pool_async(&c, 1000, pool, s1));
	TH_ASSERT(c == a);
	th_fill(c, 1024, 0x22222222, s1);
	TH_CHECK(pool);
	th_gate_open(&gate);
	/* The second fill ran after the first: stream order held. */
	TH_ASSERT(th_verify(c, 1024, 0x22222222, s1));
	TH_OK(sop_free_async(c, s1));
	TH_OK(sop_stream_synchronize(s1));
	TH_CHECK(pool);
}

static void
other_stream(sop_pool_t pool, CUstream s1, CUstream s2)
{
	struct th_gate gate;
	void *a, *b, *c;

	th_gate_init(&gate);
	th_gate_block(&gate, s1);
	TH_OK(sop_malloc_from_pool_async(&a, 8 * MiB, pool, s1));
	TH_OK(sop_free_async(a, s1));
	/* s1 may still be using a: s2 must get something else. */
	TH_OK(sop_malloc_from_pool_async(&b, 8 * MiB, pool, s2));
	TH_ASSERT(b != a);
	TH_ASSERT((char *)b >= (char *)a + 8 * MiB || (char *)b + 8 * MiB <= (char *)a);
	/* Syncing an unrelated stream changes nothing. */
	TH_OK(sop_stream_synchronize(s2));
	TH_OK(sop_malloc_from_pool_async(&c, 8 * MiB, pool, s2));
	TH_ASSERT(c != a);
	TH_OK(sop_free_async(c, s2));
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop_stream_synchronize(s2));
	TH_CHECK(pool);

	/* Once s1 is synchronized, its free is complete: s2 may take the block. */
	th_gate_open(&gate);
	TH_OK(sop_stream_synchronize(s1));
	TH_OK(sop_malloc_from_pool_async(&c, 8 * MiB, pool, s2));
	TH_ASSERT(c == a || c == b);
	TH_OK(sop_free_async(c, s2));
	TH_OK(sop_stream_synchronize(s2));
	TH_CHECK(pool);
}

static void
ctx_sync(sop_pool_t pool, CUstream s1, CUstream s2)
{
	struct th_gate gate;
	void *a, *b;

	th_gate_init(&gate);
	th_gate_block(&gate, s1);
	TH_OK(sop_malloc_from_pool_async(&a, 3 * MiB, pool, s1));
	TH_OK(sop_free_async(a, s1));
	th_gate_open(&gate);
	TH_OK(sop_ctx_synchronize());
	TH_OK(sop_malloc_from_pool_async(&b, 3 * MiB, pool, s2));
	TH_ASSERT(b == a);
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop_ctx_synchronize());
	TH_CHECK(pool);
}

static void
sync_free(sop_pool_t pool, CUstream s1, CUstream s2)
{
	void *a, *b;

	TH_OK(sop_malloc_from_pool_async(&a, 2 * MiB, pool, s1));
	TH_OK(sop_stream_synchronize(s1));
	TH_OK(sop_free(a));
	TH_OK(sop_malloc_from_pool_async(&b, 2 * MiB, pool, s2));
	TH_ASSERT(b == a);
	th_fill(b, 2 * MiB, 0xabcdef01, s2);
	TH_ASSERT(th_verify(b, 2 * MiB, 0xabcdef01, s2));
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop_stream_synchronize(s2));
	TH_CHECK(pool);
}

/* The special streams: the legacy stream and the per-thread stream are streams like any other. */
static void
special_streams(sop_pool_t pool)
{
	CUstream special[] = {NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
	size_t i;

	for (i = 0; i < 3; i++) {
		void *a, *b;
		TH_OK(sop_malloc_from_pool_async(&a, 4096, pool, special[i]));
		th_fill(a, 4096, 0x5a5a5a5a + (uint32_t)i, special[i]);
		TH_ASSERT(th_verify(a, 4096, 0x5a5a5a5a + (uint32_t)i, special[i]));
		TH_OK(sop_free_async(a, special[i]));
		TH_OK(sop_malloc_async(&b, 4096, special[i]));
		TH_OK(sop_free_async(b, special[i]));
		TH_OK(sop_stream_synchronize(special[i]));
	}
	TH_CHECK(pool);
}

int
main(void)
{
	sop_pool_t pool;
	cuuint64_t keep = UINT64_MAX;
	CUstream s1, s2;

	th_init();
	s1 = th_stream();
	s2 = th_stream();
	pool = th_pool(0, 0);
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	same_stream(pool, s1);
	other_stream(pool, s1, s2);
	ctx_sync(pool, s1, s2);
	sync_free(pool, s1, s2);
	special_streams(pool);
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(s1);
	th_stream_destroy(s2);
	printf("reuse: ok\n");
	return 0;
}
