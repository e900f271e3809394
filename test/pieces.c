/* pieces.c - physical memory in pieces: a segment is a range of the pool's reservation that blocks
 * tile, backed by pieces (one driver allocation each, of at least 32 MiB or of what a request
 * needs beyond the free memory next to it, in whole granules), the rest of it HOLE blocks.
 * Growth maps a piece next to free memory and the request takes both, at contiguous addresses;
 * memory pending on the allocating stream counts as free there. A wholly free piece between two
 * live ones is released on its own, leaving a hole; a request that fits only across that hole and
 * the free memory on both sides of it is served by mapping exactly the hole. A free of an address
 * in a released hole is refused and changes nothing. Reserved memory is read after every step;
 * the stream is kept behind a gate wherever frees must stay pending. */
#include <unistd.h>

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

/* Growth maps with the pool lock dropped. While the driver creates a piece for a 40 MiB request
 * on s, another thread either (phase 1) grants a second device access to the pool and
 * allocates on a stream of its own, from free memory beside a block that stream keeps, or
 * (phase 2) trims the pool to nothing, which gives back the very piece the growth planned to
 * join and leaves its segment with nothing mapped, and runs two retirement passes of stream
 * states, which must leave the state of s alone. Each must finish while the growth is still
 * in the driver (both waited for it while the pool lock was held through the driver's calls);
 * the piece mapped meanwhile must be open to the new device; the segment must stay, and the
 * growth, its plan spoilt, plan again. The request is then served whole, and the pool is
 * consistent. Simulated driver (its hook on cuMemCreate). */
struct meanwhile {
	sop_pool_t pool;
	bool trim;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done, in_time;
	CUresult grant, alloc, trimmed;
	void *p;
	CUstream s;
	CUcontext ctx;
};

static struct meanwhile *hooked;

static void *
meanwhile_run(void *arg)
{
	struct meanwhile *m = arg;
	CUmemAccessDesc grant = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};

	TH_OK(th.cuCtxSetCurrent(m->ctx));
	if (m->trim) {
		struct sop_pool *p = TH_POOL(m->pool);

		m->trimmed = sop_trim_to(m->pool, 0);
		/* Two retirement passes: the second retires a state idle since the first. */
		sop__mutex_take(&p->lock, SOP_RANK_POOL);
		sop__sstream_retire_idle(p);
		sop__sstream_retire_idle(p);
		sop__mutex_drop(&p->lock);
	} else {
		m->grant = th_n_devices > 1 ? sop_pool_set_access(m->pool, &grant, 1) : CUDA_SUCCESS;
		m->alloc = sop_malloc_from_pool_async(&m->p, MiB, m->pool, m->s);
	}
	pthread_mutex_lock(&m->lock);
	m->done = true;
	pthread_cond_signal(&m->cond);
	pthread_mutex_unlock(&m->lock);
	return NULL;
}

static void
in_create(void *arg)
{
	struct meanwhile *m = hooked;
	struct timespec until;
	pthread_t th_id;
	int rc = 0;

	(void)arg;
	th.sim_hook("cuMemCreate", NULL, NULL); /* once */
	TH_ASSERT(!pthread_create(&th_id, NULL, meanwhile_run, m));
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	pthread_mutex_lock(&m->lock);
	while (!m->done && rc == 0)
		rc = pthread_cond_timedwait(&m->cond, &m->lock, &until);
	m->in_time = m->done;
	pthread_mutex_unlock(&m->lock);
	if (!m->in_time)
		fprintf(stderr, "pieces: the other thread waited for a growth in the driver\n");
	pthread_detach(th_id);
}

static void
growth_unlocked(CUstream s, bool trim)
{
	sop_pool_t pool;
	struct meanwhile m = {0};
	size_t big = 40 * MiB;
	CUmemLocation dev1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
	unsigned long long flags = 0;
	uint64_t keep_all = UINT64_MAX;
	void *a, *b, *y = NULL;

	if (!th.sim_hook)
		return;
	pool = th_pool(0, 0);
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
	m.pool = pool;
	m.trim = trim;
	m.s = th_stream();
	TH_OK(sop__drv.cuCtxGetCurrent(&m.ctx));
	pthread_mutex_init(&m.lock, NULL);
	pthread_cond_init(&m.cond, NULL);
	/* One step: with trim, wholly free once a's free is known complete; else with y live at
	 * its start, kept by the other thread's stream, and free memory after it. */
	if (!trim)
		TH_OK(sop_malloc_from_pool_async(&y, MiB, pool, m.s));
	TH_OK(sop_malloc_from_pool_async(&a, MiB, pool, s));
	TH_OK(sop_free_async(a, s));
	TH_OK(sop_stream_synchronize(s));
	TH_EQ(reserved(pool), STEP);

	hooked = &m;
	th.sim_hook("cuMemCreate", in_create, NULL);
	/* 40 MiB: the free memory of the step joined with a step mapped after it. */
	TH_OK(sop_malloc_from_pool_async(&b, big, pool, s));
	th.sim_hook("cuMemCreate", NULL, NULL);
	pthread_mutex_lock(&m.lock);
	while (!m.done)
		pthread_cond_wait(&m.cond, &m.lock);
	pthread_mutex_unlock(&m.lock);
	TH_ASSERT(m.in_time);
	TH_CHECK(pool);
	/* The state of s, empty and idle to look at while its request waited for growth, was
	 * not retired under it. */
	TH_ASSERT(TH_POOL(pool)->streams && TH_POOL(pool)->streams->id);
	th_fill(b, big, 0xb1b1b1b1u, s);
	TH_ASSERT(th_verify(b, big, 0xb1b1b1b1u, s));
	if (trim) {
		TH_OK(m.trimmed);
	} else {
		TH_OK(m.grant);
		TH_OK(m.alloc);
		if (th_n_devices > 1) {
			/* Both ends of b: the end lies in the piece mapped before the grant. */
			TH_OK(th.cuMemGetAccess(&flags, &dev1, (CUdeviceptr)b));
			TH_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
			TH_OK(th.cuMemGetAccess(&flags, &dev1, (CUdeviceptr)b + big - 1));
			TH_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
		}
		th_fill(m.p, MiB, 0xb2b2b2b2u, m.s);
		TH_ASSERT(th_verify(m.p, MiB, 0xb2b2b2b2u, m.s));
		TH_OK(sop_free_async(m.p, m.s));
		TH_OK(sop_free_async(y, m.s));
	}
	TH_OK(sop_free_async(b, s));
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_stream_synchronize(m.s));
	TH_CHECK(pool);
	th_stream_destroy(m.s);
	TH_OK(sop_pool_destroy(pool));
	pthread_mutex_destroy(&m.lock);
	pthread_cond_destroy(&m.cond);
}

/* A request that waits for another thread's growth has met that thread in the pool. Threads
 * that start together on a fresh pool otherwise find the pool lock free while the first one's
 * growth is in the driver (it maps with the lock dropped), wait for that growth instead, and
 * nobody notes that threads met: the pool then places their first blocks by best fit alone, in
 * one another's segments, where every split and merge of theirs shares a segment lock. The
 * other thread's first request on its own stream comes while this one's growth is in the
 * driver, and must find the pool's threads met. Simulated driver (its hook on cuMemCreate). */
struct waiter {
	sop_pool_t pool;
	CUstream s;
	CUcontext ctx;
	void *p;
	CUresult r;
	pthread_t th;
	bool waited;
};

static struct waiter *waiting;

static void *
waiter_run(void *arg)
{
	struct waiter *w = arg;

	TH_OK(th.cuCtxSetCurrent(w->ctx));
	w->r = sop_malloc_from_pool_async(&w->p, MiB, w->pool, w->s);
	return NULL;
}

/* In the first growth's cuMemCreate: start the other thread, and return once its request waits
 * for this growth (two stream states growing: this one's and the waiter's). */
static void
in_create_waiter(void *arg)
{
	struct waiter *w = waiting;
	struct sop_pool *p = TH_POOL(w->pool);
	int i;

	(void)arg;
	th.sim_hook("cuMemCreate", NULL, NULL); /* once */
	TH_ASSERT(!pthread_create(&w->th, NULL, waiter_run, w));
	for (i = 0; i < 10000 && !w->waited; i++) {
		struct sop__sstream *ss;
		unsigned n = 0;

		sop__mutex_take(&p->lock, SOP_RANK_POOL);
		for (ss = p->streams; ss; ss = ss->next)
			n += ss->growing != 0;
		sop__mutex_drop(&p->lock);
		w->waited = n == 2;
		if (!w->waited)
			usleep(1000);
	}
}

static void
growth_wait_meets(CUstream s)
{
	struct waiter w = {0};
	void *a;

	if (!th.sim_hook)
		return;
	w.pool = th_pool(0, 0);
	w.s = th_stream();
	TH_OK(sop__drv.cuCtxGetCurrent(&w.ctx));
	waiting = &w;
	th.sim_hook("cuMemCreate", in_create_waiter, NULL);
	TH_OK(sop_malloc_from_pool_async(&a, MiB, w.pool, s));
	th.sim_hook("cuMemCreate", NULL, NULL);
	TH_ASSERT(!pthread_join(w.th, NULL));
	TH_ASSERT(w.waited);
	TH_OK(w.r);
	TH_ASSERT(atomic_load(&TH_POOL(w.pool)->threads_met));
	TH_CHECK(w.pool);
	TH_OK(sop_free_async(a, s));
	TH_OK(sop_free_async(w.p, w.s));
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_stream_synchronize(w.s));
	th_stream_destroy(w.s);
	TH_OK(sop_pool_destroy(w.pool));
}

/* How many stream states of the pool have a request growing or waiting for a growth. */
static int
growing_states(struct sop_pool *p)
{
	struct sop__sstream *ss;
	int n = 0;

	sop__mutex_take(&p->lock, SOP_RANK_POOL);
	for (ss = p->streams; ss; ss = ss->next)
		n += ss->growing != 0;
	sop__mutex_drop(&p->lock);
	return n;
}

/* A request that waited for another's growth finds the pool torn down meanwhile: it fails as
 * calls on a destroyed pool do, and makes no driver call for it. Policies off but follow. X
 * (48 MiB) is cached on s3, its free pending; Y's 32 MiB piece is idle. T1 asks for 40 MiB: its growth maps with the pool lock dropped, and T2's 40 MiB request
 * waits for it on grown. Meanwhile a peer is granted access and the pool is destroyed: Y's
 * piece goes (its cuMemRelease fails: an orphan, retried later), and the teardown waits for X.
 * T1's growth fails (its access catch-up), wakes T2 and returns out of memory; T1 then retries
 * the orphan under the lock (alloc_slow step 5), long enough for T2 to queue on the pool lock
 * behind R, a synchronization of s3 (any thread's may come then). R flushes X, gives it back
 * and reaps the pool: dead, its reservation freed, its context released. T2 then takes the
 * lock and finds nothing: it must not grow the dead pool (a segment of the freed reservation,
 * which pool B, made meanwhile, may hold by then). Simulated driver, two devices. */
static struct {
	sop_pool_t pool;
	struct sop_pool *p;
	CUstream s2, s3;
	CUcontext ctx;
	pthread_t t2, r;
	void *p2;
	CUresult r2, rd;
	int set_access, releases;
	atomic_bool grew_dead, held;
	sop_pool_t b; /* made while R reaps: it may take the freed reservation */
} rp;

/* R's reap releases the pool's context after freeing its reservation: make another pool then. */
static void
d_ctx_release(void *arg)
{
	(void)arg;
	th.sim_hook("cuDevicePrimaryCtxRelease", NULL, NULL);
	rp.b = th_pool(0, 0);
}

static void *
d_t2(void *arg)
{
	(void)arg;
	TH_OK(th.cuCtxSetCurrent(rp.ctx));
	rp.r2 = sop_malloc_from_pool_async(&rp.p2, 40 * MiB, rp.pool, rp.s2);
	return NULL;
}

static void *
d_r(void *arg)
{
	(void)arg;
	TH_OK(th.cuCtxSetCurrent(rp.ctx));
	rp.rd = sop_stream_synchronize(rp.s3);
	return NULL;
}

/* A physical-memory call once the pool is dead (T2 is pinned in its call: p is readable). */
static void
d_after(void *arg)
{
	(void)arg;
	if (atomic_load(&rp.p->dead))
		atomic_store(&rp.grew_dead, true);
}

/* cuMemRelease: T1's failed piece first, then its retry of the orphan (step 5), under the pool
 * lock after its growth woke T2: let T2 queue on the lock behind R; the retry fails again, so
 * that T1 does not grow again. */
static void
d_release(void *arg)
{
	(void)arg;
	if (++rp.releases < 2)
		return;
	th.sim_hook("cuMemRelease", NULL, NULL);
	usleep(200000);
	th.sim_fail("cuMemRelease", 1, CUDA_ERROR_UNKNOWN);
	atomic_store(&rp.held, true);
}

/* cuMemSetAccess: the first is T1's piece opened with the lock dropped; the second its catch-up
 * under the lock, after the grant: queue R on the pool lock, then fail the call. */
static void
d_set_access(void *arg)
{
	(void)arg;
	if (++rp.set_access < 2)
		return;
	th.sim_hook("cuMemSetAccess", d_after, NULL);
	TH_ASSERT(!pthread_create(&rp.r, NULL, d_r, NULL));
	usleep(200000); /* R waits for the pool lock, which T1 holds */
	th.sim_hook("cuMemRelease", d_release, NULL);
	th.sim_hook("cuDevicePrimaryCtxRelease", d_ctx_release, NULL);
	th.sim_fail("cuMemSetAccess", 1, CUDA_ERROR_OUT_OF_MEMORY);
}

/* T1's cuMemCreate, the pool lock dropped: start T2, let it wait for this growth, grant a peer
 * access (growth catches up on it under the lock), destroy the pool. */
static void
d_create(void *arg)
{
	CUmemAccessDesc grant = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	int i;

	(void)arg;
	th.sim_hook("cuMemCreate", d_after, NULL);
	TH_ASSERT(!pthread_create(&rp.t2, NULL, d_t2, NULL));
	for (i = 0; i < 10000 && growing_states(rp.p) < 2; i++)
		usleep(1000);
	TH_EQ(growing_states(rp.p), 2);
	TH_OK(sop_pool_set_access(rp.pool, &grant, 1));
	th.sim_fail("cuMemRelease", 1, CUDA_ERROR_UNKNOWN);
	TH_OK(sop_pool_destroy(rp.pool)); /* not torn down: X is cached, T1's claim maps */
	TH_ASSERT(TH_POOL(rp.pool));
	TH_EQ(rp.p->n_orphans, 1);
	th.sim_hook("cuMemSetAccess", d_set_access, NULL);
}

static void
growth_pool_reaped(CUstream s)
{
	cuuint64_t keep = UINT64_MAX;
	int off = 0;
	void *x, *y, *a = NULL;
	CUresult r;

	if (!th.sim_hook || th_n_devices < 2)
		return;
	rp.pool = th_pool(0, 0);
	rp.p = TH_POOL(rp.pool);
	rp.s2 = th_stream();
	rp.s3 = th_stream();
	TH_OK(sop__drv.cuCtxGetCurrent(&rp.ctx));
	TH_OK(sop_pool_set_attr(rp.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_pool_set_attr(rp.pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &off));
	TH_OK(sop_pool_set_attr(rp.pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off));
	TH_OK(sop_malloc_from_pool_async(&x, 48 * MiB, rp.pool, rp.s3));
	TH_OK(sop_malloc_from_pool_async(&y, MiB, rp.pool, s));
	TH_OK(sop_free_async(y, s));
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_free_async(x, rp.s3)); /* pending: s3 is not synchronized */
	TH_EQ(th_attr(rp.pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 80 * MiB);
	th.sim_hook("cuMemCreate", d_create, NULL);
	r = sop_malloc_from_pool_async(&a, 40 * MiB, rp.pool, s);
	TH_ASSERT(!pthread_join(rp.t2, NULL));
	TH_ASSERT(!pthread_join(rp.r, NULL));
	th.sim_hook("cuMemCreate", NULL, NULL);
	th.sim_hook("cuMemSetAccess", NULL, NULL);
	th.sim_hook("cuMemRelease", NULL, NULL);
	th.sim_fail_clear();
	if (rp.b) {
		void *q;

		/* Pool B is whole: its first allocation succeeds. */
		TH_OK(sop_malloc_from_pool_async(&q, MiB, rp.b, s));
		TH_OK(sop_free_async(q, s));
		TH_OK(sop_stream_synchronize(s));
		TH_CHECK(rp.b);
		TH_OK(sop_pool_destroy(rp.b));
	}
	TH_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
	TH_ASSERT(atomic_load(&rp.held));
	TH_OK(rp.rd);
	TH_ASSERT(!TH_POOL(rp.pool)); /* reaped */
	TH_ASSERT(!atomic_load(&rp.grew_dead));
	TH_EQ(rp.r2, CUDA_ERROR_INVALID_VALUE); /* as a request that finds the pool dead */
	th_stream_destroy(rp.s2);
	th_stream_destroy(rp.s3);
}

/* The pool's invariants hold while a growth maps: sop__pool_check allows a growth in flight
 * (MAPPING blocks, claims, pool->mapping), and the spare leaves the growth took for its splits,
 * neither attached, nor a segment's, nor the pool's while it maps, count as the growth's.
 * Simulated driver. */
static sop_pool_t c_pool;
static int c_line = -1;

static void
c_create(void *arg)
{
	(void)arg;
	th.sim_hook("cuMemCreate", NULL, NULL);
	c_line = sop__pool_check(TH_POOL(c_pool)); /* the pool lock is free: growth dropped it */
}

static void
growth_check_mid(CUstream s)
{
	void *a;

	if (!th.sim_hook)
		return;
	c_pool = th_pool(0, 0);
	th.sim_hook("cuMemCreate", c_create, NULL);
	TH_OK(sop_malloc_from_pool_async(&a, MiB, c_pool, s));
	th.sim_hook("cuMemCreate", NULL, NULL);
	TH_EQ(c_line, 0);
	TH_OK(sop_free_async(a, s));
	TH_OK(sop_stream_synchronize(s));
	TH_CHECK(c_pool);
	TH_OK(sop_pool_destroy(c_pool));
}

/* An idle piece moves where growth needs memory: x, y and z take a piece of 32 MiB each, y is
 * freed and known complete, so its piece is idle between two live ones. A request of 40 MiB
 * fits nowhere; making it whole would hold 136 MiB for 104 live, past 1.3 times, so growth
 * unmaps y's piece, maps it again in the new range and makes only the 8 MiB beyond it: 104 MiB
 * reserved, one piece made, two mapped. The moved memory is whole memory (written and
 * read back end to end, its neighbours untouched); y's range is a hole, refused as a pointer. A
 * request that stays within 1.3 times makes its piece and moves nothing. */
static void
growth_moves(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0);
	cuuint64_t keep_all = UINT64_MAX;
	void *x, *y, *z, *w, *v;
	unsigned long c0, m0;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
	TH_OK(sop_malloc_from_pool_async(&x, 32 * MiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&y, 32 * MiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&z, 32 * MiB, pool, s));
	TH_EQ(reserved(pool), 3 * STEP);
	TH_EQ(n_pieces(pool), 3);
	TH_EQ((char *)z - (char *)x, (long)(64 * MiB));
	th_fill(x, 32 * MiB, 0x11111111u, s);
	th_fill(y, 32 * MiB, 0x22222222u, s);
	th_fill(z, 32 * MiB, 0x33333333u, s);
	TH_OK(sop_free_async(y, s));
	TH_OK(sop_stream_synchronize(s));
	TH_EQ(reserved(pool), 3 * STEP);

	c0 = creates();
	m0 = th.sim_calls ? th.sim_calls("cuMemMap") : 0;
	TH_OK(sop_malloc_from_pool_async(&w, 40 * MiB, pool, s));
	TH_EQ(reserved(pool), 104 * MiB);
	TH_CREATES(c0, 1);
	if (th.sim_calls)
		TH_EQ(th.sim_calls("cuMemMap") - m0, 2);
	TH_EQ(n_pieces(pool), 4);
	gone(y);
	live(pool, w);
	TH_CHECK(pool);
	th_fill(w, 40 * MiB, 0x44444444u, s);
	TH_ASSERT(th_verify(x, 32 * MiB, 0x11111111u, s));
	TH_ASSERT(th_verify(z, 32 * MiB, 0x33333333u, s));
	TH_ASSERT(th_verify(w, 40 * MiB, 0x44444444u, s));

	/* 104 MiB live and 32 more asked: a piece made for them (136 MiB reserved) stays within
	 * 1.3 times, and nothing is idle to move anyway. */
	c0 = creates();
	TH_OK(sop_malloc_from_pool_async(&v, 32 * MiB, pool, s));
	TH_EQ(reserved(pool), 136 * MiB);
	TH_CREATES(c0, 1);
	TH_EQ(n_pieces(pool), 5);
	TH_CHECK(pool);
	TH_OK(sop_free_async(v, s));
	TH_OK(sop_free_async(w, s));
	TH_OK(sop_free_async(x, s));
	TH_OK(sop_free_async(z, s));
	TH_OK(sop_stream_synchronize(s));
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
	growth_unlocked(s, false);
	growth_unlocked(s, true);
	growth_wait_meets(s);
	growth_check_mid(s);
	growth_pool_reaped(s);
	growth_moves(s);
	th_stream_destroy(s);
	printf("pieces: ok\n");
	return 0;
}
