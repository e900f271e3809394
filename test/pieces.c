/* pieces.c - physical memory in pieces: a segment is a range of the pool's reservation that blocks
 * tile, backed by pieces (one driver allocation each, of at least 32 MiB or of what a request
 * needs beyond the free memory next to it, in whole granules), the rest of it HOLE blocks.
 * Growth maps a piece next to free memory and the request takes both, at contiguous addresses;
 * memory pending on the allocating stream counts as free there. A wholly free piece between two
 * live ones is released on its own, leaving a hole; a request that fits only across that hole and
 * the free memory on both sides of it is served by mapping exactly the hole. A free of an address
 * in a released hole is refused and changes nothing. Reserved memory is read after every step;
 * the stream is kept behind a gate wherever frees must stay pending. */
#include "helpers.h"

#define MiB ((size_t)1 << 20)
#define STEP ((size_t)32 << 20) /* the least growth maps: the driver's step */

static uint64_t
reserved(sop_pool_t pool)
{
	return th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
}

/* Driver allocations so far (each piece is one); 0 on a real driver, where it is not checked. */
static unsigned long
creates(void)
{
	return th.sim_calls ? th.sim_calls("cuMemCreate") : 0;
}

#define TH_CREATES(before, n)                                                                      \
	do {                                                                                       \
		if (th.sim_calls)                                                                  \
			TH_EQ(creates() - (before), (n));                                          \
	} while (0)

/* What growth maps next to have free bytes for a request of size: what is missing, in whole
 * granules, and at least a step. */
static size_t
grows_by(sop_pool_t pool, size_t size, size_t have)
{
	size_t missing = sop__round_up(sop__round_up(size, 512) - have, TH_POOL(pool)->granularity);

	return missing > STEP ? missing : STEP;
}

static size_t
n_pieces(sop_pool_t pool)
{
	struct sop__segment *seg;
	size_t n = 0;

	for (seg = TH_POOL(pool)->segments; seg; seg = seg->next)
		n += seg->n_pieces;
	return n;
}

static void
live(sop_pool_t pool, void *p)
{
	sop_pool_t got = NULL;

	TH_OK(sop_pointer_get_pool(&got, p));
	TH_ASSERT(got == pool);
}

static void
gone(void *p)
{
	sop_pool_t got = NULL;

	TH_EQ(sop_pointer_get_pool(&got, p), CUDA_ERROR_INVALID_VALUE);
}

/* Rule 1: a request larger than the free memory at the end of the mapped memory maps only what
 * is missing (a step at least) and starts in that free memory: one block across two pieces. */
static void
growth_joins(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0);
	struct th_gate gate;
	size_t sa = 4 * MiB, sb = 40 * MiB, sc = 61 * MiB + 1000, r1, r2, r3;
	unsigned long c0;
	void *a, *b, *c;

	th_gate_init(&gate);
	th_gate_block(&gate, s);
	TH_EQ(reserved(pool), 0);

	c0 = creates();
	TH_OK(sop_malloc_from_pool_async(&a, sa, pool, s));
	r1 = grows_by(pool, sa, 0); /* a step: 32 MiB */
	TH_EQ(r1, STEP);
	TH_EQ(reserved(pool), r1);
	TH_CREATES(c0, 1);

	/* 28 MiB free after a; 40 MiB misses 12, so one step is mapped, and b starts right
	 * after a, running into the new piece. */
	c0 = creates();
	TH_OK(sop_malloc_from_pool_async(&b, sb, pool, s));
	r2 = grows_by(pool, sb, r1 - sa);
	TH_EQ(r2, STEP);
	TH_EQ(reserved(pool), r1 + r2);
	TH_EQ((char *)b - (char *)a, (long)sa);
	TH_CREATES(c0, 1);
	TH_CHECK(pool);

	/* 20 MiB free after b; 61 MiB and change misses 41 MiB and change: more than a step, so
	 * exactly that, rounded up to whole granules (42 MiB with 2 MiB granules). */
	c0 = creates();
	TH_OK(sop_malloc_from_pool_async(&c, sc, pool, s));
	r3 = grows_by(pool, sc, r1 + r2 - sa - sb);
	TH_ASSERT(r3 > STEP);
	if (TH_POOL(pool)->granularity == 2 * MiB)
		TH_EQ(r3, 42 * MiB);
	TH_EQ(reserved(pool), r1 + r2 + r3);
	TH_EQ((char *)c - (char *)b, (long)sb);
	TH_CREATES(c0, 1);
	TH_EQ(n_pieces(pool), 3);
	TH_EQ(TH_POOL(pool)->n_segments, 1);
	TH_CHECK(pool);

	/* The blocks across piece boundaries are whole memory: written and read back end to
	 * end (needs the stream running). */
	th_gate_open(&gate);
	th_fill(b, sb, 0xb0b0b0b0u, s);
	th_fill(c, sc, 0xc0c0c0c0u, s);
	TH_ASSERT(th_verify(b, sb, 0xb0b0b0b0u, s));
	TH_ASSERT(th_verify(c, sc, 0xc0c0c0c0u, s));
	TH_OK(sop_free_async(a, s));
	TH_OK(sop_free_async(b, s));
	TH_OK(sop_free_async(c, s));
	TH_OK(sop_stream_synchronize(s));
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

/* Rule 1 with the free memory pending on the allocating stream: the stream may use what it
 * freed at once, so growth joins it as it joins free memory. */
static void
growth_joins_pending(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0);
	struct th_gate gate;
	void *x, *y, *z;
	unsigned long c0;

	th_gate_init(&gate);
	th_gate_block(&gate, s);
	TH_OK(sop_malloc_from_pool_async(&x, 8 * MiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&y, 24 * MiB, pool, s)); /* the rest of the first piece */
	TH_EQ((char *)y - (char *)x, (long)(8 * MiB));
	TH_EQ(reserved(pool), STEP);
	TH_OK(sop_free_async(y, s)); /* pending behind the gate: cached on s */
	TH_CHECK(pool);
	/* 40 MiB next to the 24 MiB pending on s misses 16: one step, and z starts at y. */
	c0 = creates();
	TH_OK(sop_malloc_from_pool_async(&z, 40 * MiB, pool, s));
	TH_EQ(reserved(pool), STEP + grows_by(pool, 40 * MiB, 24 * MiB));
	TH_EQ(reserved(pool), 2 * STEP);
	TH_ASSERT(z == y);
	TH_CREATES(c0, 1);
	TH_CHECK(pool);
	TH_OK(sop_free_async(z, s));
	TH_OK(sop_free_async(x, s));
	th_gate_open(&gate);
	TH_OK(sop_stream_synchronize(s));
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

/* Rules 2 to 4 on one segment of three pieces, offsets in MiB from a (the segment's start):
 *
 *   piece 1 [0,32)          piece 2 [32,64)          piece 3 [64,96)      hole [96,128)
 *   a [0,8)  m [8,48) ...................  m2 [48,64)  n [64,80)  c [80,96)
 *
 * a, m and n each force growth (m maps one step next to the 24 MiB free after a; n finds its
 * left neighbour allocated and maps a step of its own); m2 and c fill the rest of pieces 2 and
 * 3. Freeing m and m2 leaves piece 2 wholly free, with a and n live around it: it is released
 * on its own, [32,64) becomes a hole and [8,32) stays free in piece 1. With n freed too (rule
 * 3), 24 MiB free before the hole and 16 MiB after it: a request of 72 MiB fits only across all
 * three, and is served by mapping exactly the hole, at a + 8 MiB. The free memory on either
 * side may also be pending on the allocating stream, which growth joins as it joins free
 * memory: with RIGHT, n's free is pending; with BOTH, so is that of l, which takes the 24 MiB
 * before the hole again first (neither side then fits the request with the hole alone, so
 * both are joined at once). */
enum sides { DONE, RIGHT, BOTH };

static void
middle_piece(CUstream s, enum sides pending)
{
	sop_pool_t pool = th_pool(0, 0);
	cuuint64_t keep_all = UINT64_MAX;
	struct th_gate gate, gate2;
	void *a, *m, *m2, *n, *c, *l = NULL, *p, *hole;
	unsigned long c0;

	/* Synchronizations release nothing: only sop_trim_to does, below. */
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
	th_gate_init(&gate);
	th_gate_block(&gate, s);

	TH_OK(sop_malloc_from_pool_async(&a, 8 * MiB, pool, s));
	TH_EQ(reserved(pool), STEP);
	TH_OK(sop_malloc_from_pool_async(&m, 40 * MiB, pool, s));
	TH_EQ(reserved(pool), 2 * STEP);
	TH_EQ((char *)m - (char *)a, (long)(8 * MiB));
	TH_OK(sop_malloc_from_pool_async(&m2, 16 * MiB, pool, s)); /* fits: no growth */
	TH_EQ(reserved(pool), 2 * STEP);
	TH_EQ((char *)m2 - (char *)a, (long)(48 * MiB));
	TH_OK(sop_malloc_from_pool_async(&n, 16 * MiB, pool, s));
	TH_EQ(reserved(pool), 3 * STEP);
	TH_EQ((char *)n - (char *)a, (long)(64 * MiB));
	TH_OK(sop_malloc_from_pool_async(&c, 16 * MiB, pool, s)); /* fits: no growth */
	TH_EQ(reserved(pool), 3 * STEP);
	TH_EQ((char *)c - (char *)a, (long)(80 * MiB));
	TH_EQ(TH_POOL(pool)->n_segments, 1);
	TH_EQ(n_pieces(pool), 3);
	TH_CHECK(pool);

	/* Rule 2. Pending frees keep the piece. */
	TH_OK(sop_free_async(m, s));
	TH_OK(sop_free_async(m2, s));
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(reserved(pool), 3 * STEP);
	TH_CHECK(pool);
	th_gate_open(&gate);
	TH_OK(sop_stream_synchronize(s));
	TH_EQ(reserved(pool), 3 * STEP); /* the threshold keeps everything */
	TH_CHECK(pool);
	/* Complete: the middle piece alone is idle, and goes; the two around it hold a and n. */
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(reserved(pool), 2 * STEP);
	TH_EQ(TH_POOL(pool)->n_segments, 1);
	TH_EQ(n_pieces(pool), 2);
	TH_CHECK(pool);
	live(pool, a);
	live(pool, n);
	live(pool, c);
	live(pool, (char *)a + 8 * MiB - 1);
	live(pool, (char *)n + 16 * MiB - 1);
	gone(m2);
	th_fill(a, 8 * MiB, 0xaaaaaaaau, s);
	th_fill(n, 16 * MiB, 0x11111111u, s);
	th_fill(c, 16 * MiB, 0xccccccccu, s);
	TH_ASSERT(th_verify(a, 8 * MiB, 0xaaaaaaaau, s));
	TH_ASSERT(th_verify(n, 16 * MiB, 0x11111111u, s));
	TH_ASSERT(th_verify(c, 16 * MiB, 0xccccccccu, s));

	/* Rule 4: frees of addresses in the hole (a pointer that was allocated there, and the
	 * hole's own start) are refused, and nothing changes. */
	hole = (char *)a + 32 * MiB;
	TH_EQ(sop_free_async(m2, s), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_free_async(hole, s), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_free_async((char *)hole + 8 * MiB, s), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_free(m2), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_free(hole), CUDA_ERROR_INVALID_VALUE);
	gone(hole);
	TH_EQ(reserved(pool), 2 * STEP);
	TH_EQ(n_pieces(pool), 2);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 8 * MiB + 16 * MiB + 16 * MiB);
	TH_CHECK(pool);
	live(pool, a);
	live(pool, n);
	live(pool, c);

	/* Rule 3. Neither a nor c is freed: free memory on both sides of the hole is 24 MiB in
	 * piece 1 and n's 16 MiB in piece 3. */
	if (pending == BOTH) {
		c0 = creates();
		TH_OK(sop_malloc_from_pool_async(&l, 24 * MiB, pool, s)); /* the free 24 MiB */
		TH_EQ((char *)l - (char *)a, (long)(8 * MiB));
		TH_EQ(reserved(pool), 2 * STEP);
		TH_CREATES(c0, 0);
	}
	if (pending != DONE) {
		th_gate_init(&gate2);
		th_gate_block(&gate2, s);
	}
	TH_OK(sop_free_async(n, s));
	if (l)
		TH_OK(sop_free_async(l, s));
	if (pending == DONE)
		TH_OK(sop_stream_synchronize(s));
	TH_EQ(reserved(pool), 2 * STEP);
	TH_CHECK(pool);
	/* 72 MiB: more than either side with the hole (56, 48), more than a step of its own in
	 * the hole, and mapping elsewhere would take 72 MiB; the hole, filled whole, takes 32. */
	c0 = creates();
	TH_OK(sop_malloc_from_pool_async(&p, 72 * MiB, pool, s));
	TH_EQ(reserved(pool), 3 * STEP);
	TH_EQ((char *)p - (char *)a, (long)(8 * MiB));
	TH_CREATES(c0, 1);
	TH_EQ(TH_POOL(pool)->n_segments, 1);
	TH_EQ(n_pieces(pool), 3);
	TH_CHECK(pool);
	live(pool, p);
	live(pool, (char *)p + 72 * MiB - 1);
	if (pending != DONE)
		th_gate_open(&gate2);
	th_fill(p, 72 * MiB, 0x72727272u, s);
	TH_ASSERT(th_verify(p, 72 * MiB, 0x72727272u, s));
	TH_ASSERT(th_verify(a, 8 * MiB, 0xaaaaaaaau, s));
	TH_ASSERT(th_verify(c, 16 * MiB, 0xccccccccu, s));

	TH_OK(sop_free_async(p, s));
	TH_OK(sop_free_async(a, s));
	TH_OK(sop_free_async(c, s));
	TH_OK(sop_stream_synchronize(s));
	TH_EQ(reserved(pool), 3 * STEP);
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(reserved(pool), 0);
	TH_EQ(TH_POOL(pool)->n_segments, 0);
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

/* A compacting pool: the setting and its bad input, growth in 8 MiB pieces (sixteenth parts of
 * a growth past 128 MiB), each given back on its own, where a pool without compaction holds
 * the same blocks in one piece it cannot give back. */
static void
compaction_pieces(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0), plain = th_pool(0, 0), gone = th_pool(0, 0);
	cuuint64_t keep = UINT64_MAX;
	void *a, *b, *c, *d, *e, *pa, *pb, *pc;
	unsigned long c0;
	int on = 7;

	TH_OK(sop_pool_get_compaction(pool, &on));
	TH_EQ(on, 0);
	TH_EQ(sop_pool_set_compaction(pool, 2), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_set_compaction(pool, -1), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_set_compaction(NULL, 1), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_compaction(pool, NULL), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_compaction(NULL, &on), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_pool_destroy(gone));
	TH_EQ(sop_pool_set_compaction(gone, 1), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_compaction(gone, &on), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_pool_get_compaction(pool, &on));
	TH_EQ(on, 0);
	TH_OK(sop_pool_set_compaction(pool, 1));
	TH_OK(sop_pool_get_compaction(pool, &on));
	TH_EQ(on, 1);
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_pool_set_attr(plain, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));

	/* Three 8 MiB blocks: a piece each, at contiguous addresses. */
	c0 = creates();
	TH_OK(sop_malloc_from_pool_async(&a, 8 * MiB, pool, s));
	TH_EQ(reserved(pool), 8 * MiB);
	TH_OK(sop_malloc_from_pool_async(&b, 8 * MiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&c, 8 * MiB, pool, s));
	TH_EQ(reserved(pool), 24 * MiB);
	TH_EQ(n_pieces(pool), 3);
	TH_CREATES(c0, 3);
	TH_EQ((char *)b - (char *)a, (long)(8 * MiB));
	TH_EQ((char *)c - (char *)b, (long)(8 * MiB));
	/* 40 MiB maps five pieces; 300 MiB fifteen of 20 MiB (a sixteenth, in whole granules). */
	c0 = creates();
	TH_OK(sop_malloc_from_pool_async(&d, 40 * MiB, pool, s));
	TH_EQ(reserved(pool), 64 * MiB);
	TH_EQ(n_pieces(pool), 8);
	TH_CREATES(c0, 5);
	TH_OK(sop_malloc_from_pool_async(&e, 300 * MiB, pool, s));
	TH_EQ(reserved(pool), 364 * MiB);
	TH_EQ(n_pieces(pool), 23);
	TH_CREATES(c0, 20);
	TH_CHECK(pool);
	th_fill(d, 40 * MiB, 0xddddddddu, s);
	th_fill(e, 300 * MiB, 0xeeeeeeeeu, s);

	/* b's piece, idle between two live blocks, goes back alone. */
	TH_OK(sop_free_async(b, s));
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(reserved(pool), 356 * MiB);
	TH_EQ(n_pieces(pool), 22);
	live(pool, a);
	live(pool, c);
	TH_ASSERT(th_verify(d, 40 * MiB, 0xddddddddu, s));
	TH_ASSERT(th_verify(e, 300 * MiB, 0xeeeeeeeeu, s));
	TH_CHECK(pool);
	/* Without compaction the three share one 32 MiB piece, which b's free leaves in use. */
	TH_OK(sop_malloc_from_pool_async(&pa, 8 * MiB, plain, s));
	TH_OK(sop_malloc_from_pool_async(&pb, 8 * MiB, plain, s));
	TH_OK(sop_malloc_from_pool_async(&pc, 8 * MiB, plain, s));
	TH_EQ(reserved(plain), STEP);
	TH_EQ(n_pieces(plain), 1);
	TH_OK(sop_free_async(pb, s));
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_trim_to(plain, 0));
	TH_EQ(reserved(plain), STEP);
	TH_OK(sop_free_async(pa, s));
	TH_OK(sop_free_async(pc, s));
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_pool_destroy(plain));

	/* Turned off, growth maps one piece again, a step at least. */
	TH_OK(sop_pool_set_compaction(pool, 0));
	c0 = creates();
	TH_OK(sop_malloc_from_pool_async(&b, 40 * MiB, pool, s));
	TH_CREATES(c0, 1);
	TH_CHECK(pool);
	TH_OK(sop_free_async(b, s));
	TH_OK(sop_free_async(d, s));
	TH_OK(sop_free_async(e, s));
	TH_OK(sop_free_async(a, s));
	TH_OK(sop_free_async(c, s));
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(reserved(pool), 0);
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

/* In a compacting pool, a small request that splits takes the lowest-addressed fit, from the
 * stream's own pending memory (hot path) and from the heap (slow path); without compaction, the
 * smallest; and once threads have met in the pool (met), the smallest again: placement then
 * follows segment affinity, and the search would lengthen every thread's hold of the locks. */
static void
compaction_placement(CUstream s, bool compact, bool met)
{
	sop_pool_t pool = th_pool(0, 0);
	cuuint64_t keep = UINT64_MAX;
	void *p0, *p1, *p2, *big, *sm, *x;
	CUstream s2 = th_stream();
	bool low = compact && !met;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_pool_set_compaction(pool, compact));
	/* p0 | big 1 MiB | p1 | sm 256 KiB | p2 | the rest of the piece, free */
	TH_OK(sop_malloc_from_pool_async(&p0, 64 << 10, pool, s));
	TH_OK(sop_malloc_from_pool_async(&big, 1 * MiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&p1, 64 << 10, pool, s));
	TH_OK(sop_malloc_from_pool_async(&sm, 256 << 10, pool, s));
	TH_OK(sop_malloc_from_pool_async(&p2, 64 << 10, pool, s));
	TH_ASSERT((char *)big < (char *)sm && (char *)sm < (char *)p2);
	if (met)
		atomic_store(&TH_POOL(pool)->threads_met, true);
	/* Pending on s: s's own memory. */
	TH_OK(sop_free_async(big, s));
	TH_OK(sop_free_async(sm, s));
	TH_OK(sop_malloc_from_pool_async(&x, 200 << 10, pool, s));
	TH_ASSERT(x == (low ? big : sm));
	TH_OK(sop_free_async(x, s));
	/* Known complete, in the heap: another stream's request, or, once threads have met, the
	 * same stream's (another stream would grow a segment of its own rather than share s's). */
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_malloc_from_pool_async(&x, 200 << 10, pool, met ? s : s2));
	TH_ASSERT(x == (low ? big : sm));
	TH_CHECK(pool);
	TH_OK(sop_free_async(x, met ? s : s2));
	TH_OK(sop_free_async(p0, s));
	TH_OK(sop_free_async(p1, s));
	TH_OK(sop_free_async(p2, s));
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_stream_synchronize(s2));
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(s2);
}

/* Streams of their own once threads have met: each stream's first growth makes a segment of its
 * own, a thirty-second of the reservation, and maps a quarter step there. Once the reservation
 * has no room for another segment, growth falls back to a hole in another stream's segment,
 * where it maps a whole step: still one piece per growth, each in its own driver allocation. */
static void
growth_no_addresses(void)
{
	enum { N = 64 };
	sop_pool_t pool;
	struct sop_pool *p;
	CUstream s[N];
	void *a[N];
	size_t i, segs = 0;
	unsigned long c0;

	/* The simulated device's reservation runs out of room for segments in fifty streams;
	 * a GPU's, of tens of gigabytes, in about a thousand. */
	if (!th.sim_calls)
		return;
	pool = th_pool(0, 0);
	p = TH_POOL(pool);
	atomic_store(&p->threads_met, true);
	c0 = creates();
	for (i = 0; i < N; i++) {
		s[i] = th_stream();
		TH_OK(sop_malloc_from_pool_async(&a[i], MiB, pool, s[i]));
		th_fill(a[i], MiB, 0xa0000000u + (uint32_t)i, s[i]);
		if (p->n_segments > segs)
			segs = p->n_segments;
	}
	/* The reservation ran out of room for segments before the last streams came. */
	TH_ASSERT(segs < N);
	TH_EQ(n_pieces(pool), creates() - c0); /* every piece made is there, each a growth's */
	TH_CHECK(pool);
	for (i = 0; i < N; i++) {
		TH_ASSERT(th_verify(a[i], MiB, 0xa0000000u + (uint32_t)i, s[i]));
		TH_OK(sop_free_async(a[i], s[i]));
		TH_OK(sop_stream_synchronize(s[i]));
		th_stream_destroy(s[i]);
	}
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

int
main(void)
{
	CUstream s;

	th_init();
	/* One stream throughout, each part behind gates of its own. */
	s = th_stream();
	growth_joins(s);
	growth_joins_pending(s);
	middle_piece(s, DONE);
	middle_piece(s, RIGHT);
	middle_piece(s, BOTH);
	compaction_pieces(s);
	compaction_placement(s, false, false);
	compaction_placement(s, true, false);
	compaction_placement(s, true, true);
	growth_no_addresses();
	th_stream_destroy(s);
	printf("pieces: ok\n");
	return 0;
}
