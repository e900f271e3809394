/* placement.c - where a stream's own memory goes: frees merge with the stream's cached neighbours
 * of another size, equal-size neighbours stay apart so that a batch of one size is reused whole,
 * so does a block freed right after it was handed out at the edge of the stream's cached memory,
 * and a stream splits its own memory only when the heap holds no tighter fit. The stream is kept
 * busy behind a gate for these, so that no free completes and every answer comes from these
 * rules alone. Last, segment affinity: which segment a second stream's memory comes from, before
 * and after threads have met in the pool, and that a stream's own memory comes before growth,
 * that its small requests stay off the pool lock, that a stream done with the pool leaves its
 * segments to the others, that it grows for affinity only at the pool's used high-water mark,
 * and that a stream adopts only a part of a large one. */
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "helpers.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* Blocks freed on a stream next to each other, of different sizes, come back as one. */
static void
merge_different(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0);
	void *a, *b, *c, *guard, *p;

	TH_OK(sop_malloc_from_pool_async(&a, 16 * KiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&b, 48 * KiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&c, 16 * KiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&guard, 4 * KiB, pool, s));
	/* Fresh segment, carved in order: the four are neighbours. */
	TH_EQ((char *)b - (char *)a, (long)(16 * KiB));
	TH_EQ((char *)c - (char *)b, (long)(48 * KiB));
	TH_EQ((char *)guard - (char *)c, (long)(16 * KiB));
	TH_OK(sop_free_async(a, s));
	TH_OK(sop_free_async(c, s));
	/* b joins c after it and a before it: 80 KiB at a. */
	TH_OK(sop_free_async(b, s));
	TH_CHECK(pool);
	TH_OK(sop_malloc_from_pool_async(&p, 80 * KiB, pool, s));
	TH_ASSERT(p == a);
	TH_CHECK(pool);
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_free_async(guard, s));
	TH_OK(sop_pool_destroy(pool));
}

/* A run of equal blocks freed on a stream is handed back block by block, unsplit. */
static void
equal_apart(CUstream s)
{
	enum { K = 8 };
	sop_pool_t pool = th_pool(0, 0);
	void *first[K], *again[K], *p;
	int i, j;

	for (i = 0; i < K; i++) {
		TH_OK(sop_malloc_from_pool_async(&first[i], 64 * KiB, pool, s));
		if (i)
			TH_EQ((char *)first[i] - (char *)first[i - 1], (long)(64 * KiB));
	}
	for (i = 0; i < K; i++)
		TH_OK(sop_free_async(first[i], s));
	TH_CHECK(pool);
	for (i = 0; i < K; i++) {
		bool found = false;
		TH_OK(sop_malloc_from_pool_async(&again[i], 64 * KiB, pool, s));
		for (j = 0; j < K; j++)
			found |= again[i] == first[j];
		TH_ASSERT(found);
		for (j = 0; j < i; j++)
			TH_ASSERT(again[j] != again[i]);
	}
	TH_CHECK(pool);
	for (i = 0; i < K; i++)
		TH_OK(sop_free_async(again[i], s));
	/* The price: two of them cannot serve a request of twice the size, which comes from
	 * elsewhere. */
	TH_OK(sop_malloc_from_pool_async(&p, 128 * KiB, pool, s));
	TH_ASSERT((char *)p < (char *)first[0] || (char *)p >= (char *)first[K - 1] + 64 * KiB);
	TH_CHECK(pool);
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_pool_destroy(pool));
}

/* The block a stream handed out last, freed at once, stays apart from the cached block it was
 * split from, and the next request of its size takes it whole; a neighbour's free joins it
 * again. In a hole between two cached blocks it joins them at once. */
static void
temporary_apart(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0);
	struct sop__block *b;
	void *big, *guard, *t, *u, *rest, *p, *a1, *b1, *c1;
	int i;

	TH_OK(sop_malloc_from_pool_async(&big, 8 * MiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&guard, 4 * KiB, pool, s));
	TH_OK(sop_free_async(big, s)); /* cached on s, pending behind the gate */
	TH_OK(sop_malloc_from_pool_async(&t, 4 * KiB, pool, s));
	TH_ASSERT(t == big); /* split off the front of the cached block */
	for (i = 0; i < 4; i++) {
		TH_OK(sop_free_async(t, s));
		b = sop__map_get(TH_POOL(pool), (CUdeviceptr)(uintptr_t)t);
		TH_ASSERT(b && b->size == 4 * KiB && sop__block_state(b) == SOP_BLOCK_CACHED);
		TH_CHECK(pool);
		TH_OK(sop_malloc_from_pool_async(&u, 4 * KiB, pool, s));
		TH_ASSERT(u == t);
	}
	TH_OK(sop_free_async(t, s));
	/* The rest is whole beside it, and once freed joins it: the 8 MiB serve 8 MiB again. */
	TH_OK(sop_malloc_from_pool_async(&rest, 8 * MiB - 4 * KiB, pool, s));
	TH_ASSERT((char *)rest == (char *)t + 4 * KiB);
	TH_OK(sop_free_async(rest, s));
	b = sop__map_get(TH_POOL(pool), (CUdeviceptr)(uintptr_t)big);
	TH_ASSERT(b && b->size == 8 * MiB);
	TH_CHECK(pool);
	TH_OK(sop_malloc_from_pool_async(&p, 8 * MiB, pool, s));
	TH_ASSERT(p == big);
	TH_OK(sop_free_async(p, s));

	/* In a hole: a1 and c1 cached on both sides of b1, handed out last. */
	TH_OK(sop_malloc_from_pool_async(&a1, 16 * KiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&b1, 4 * KiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&c1, 32 * KiB, pool, s));
	TH_OK(sop_free_async(b1, s));
	TH_OK(sop_malloc_from_pool_async(&b1, 4 * KiB, pool, s));
	TH_ASSERT((char *)b1 == (char *)a1 + 16 * KiB);
	TH_OK(sop_free_async(a1, s));
	TH_OK(sop_free_async(c1, s));
	TH_OK(sop_free_async(b1, s));
	b = sop__map_get(TH_POOL(pool), (CUdeviceptr)(uintptr_t)a1);
	TH_ASSERT(b && b->size >= 52 * KiB);
	TH_CHECK(pool);
	TH_OK(sop_free_async(guard, s));
	TH_OK(sop_pool_destroy(pool));
}

/* The stream holds a large cached block; the heap holds a block that fits the request tightly.
 * The allocation takes the heap's, and the large block stays whole. */
static void
heap_beats_own(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0);
	void *small, *g1, *big, *g2, *p, *q;

	TH_OK(sop_malloc_from_pool_async(&small, 64 * KiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&g1, 4 * KiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&big, 8 * MiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&g2, 4 * KiB, pool, s));
	TH_OK(sop_free_async(big, s)); /* cached on s, pending behind the gate */
	TH_OK(sop_free(small));        /* vouched complete: in the heap, 64 KiB between guards */
	TH_CHECK(pool);
	TH_OK(sop_malloc_from_pool_async(&p, 64 * KiB, pool, s));
	TH_ASSERT(p == small);
	/* The large block is still whole: it serves a request of its size in place. */
	TH_OK(sop_malloc_from_pool_async(&q, 8 * MiB, pool, s));
	TH_ASSERT(q == big);
	TH_CHECK(pool);
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_free_async(q, s));
	TH_OK(sop_free_async(g1, s));
	TH_OK(sop_free_async(g2, s));
	TH_OK(sop_pool_destroy(pool));
}

/* A stream that only frees, blocks of mixed sizes allocated on another: its merges free
 * descriptors, which must go back to the pool rather than pile up on the stream. */
static void
free_only_stream(void)
{
	enum { LIVE = 64, ROUNDS = 40000 };
	sop_pool_t pool = th_pool(0, 0);
	CUstream a = th_stream(), b = th_stream();
	void *live[LIVE] = {0};
	uint64_t x = 12345;
	size_t slabs_warm = 0;
	int i;

	for (i = 0; i < ROUNDS; i++) {
		int k = i % LIVE;

		if (live[k])
			TH_OK(sop_free_async(live[k], b));
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		TH_OK(sop_malloc_from_pool_async(&live[k], 512 + (size_t)(x >> 33) % (64 * KiB),
						 pool, a));
		if (i % 1000 == 999)
			TH_OK(sop_stream_synchronize(b)); /* b's frees become the heap's */
		if (i == ROUNDS / 4)
			slabs_warm = TH_POOL(pool)->n_slabs;
	}
	/* The descriptors in use are bounded by the live blocks and the pieces between them;
	 * after warming up, the pool needs no more. */
	TH_ASSERT(TH_POOL(pool)->n_slabs <= slabs_warm + 2);
	for (i = 0; i < LIVE; i++)
		TH_OK(sop_free_async(live[i], b));
	TH_OK(sop_stream_synchronize(b));
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(a);
	th_stream_destroy(b);
}

/* The segment holding addr. */
static struct sop__segment *
segment_of(sop_pool_t pool, void *addr)
{
	CUdeviceptr a = (CUdeviceptr)(uintptr_t)addr;
	struct sop__segment *seg;

	for (seg = TH_POOL(pool)->segments; seg; seg = seg->next)
		if (a >= seg->va && a - seg->va < seg->size)
			return seg;
	return NULL;
}

/* Segment affinity. In a pool used from one thread, a second stream's small request takes the
 * free memory left in the first stream's segment. Once threads have met on a segment lock (the
 * flag a waiting thread sets, set here by hand), it grows a segment of its own instead, as long
 * as the pool stays within twice its live memory (with 1 MiB live in a 32 MiB segment it shares
 * instead); and a segment whose memory is all free again is nobody's, and the next stream to
 * take memory from it makes it its own. */
static void
affinity(CUstream s1, CUstream s2)
{
	cuuint64_t keep = UINT64_MAX;
	sop_pool_t pool;
	void *a, *b;
	int met;

	for (met = 0; met < 3; met++) {
		size_t a_size = met == 1 ? 20 * MiB : MiB;

		pool = th_pool(0, 0);
		TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
		TH_OK(sop_malloc_from_pool_async(&a, a_size, pool, s1));
		TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 32 * MiB);
		TH_ASSERT(segment_of(pool, a)->home != NULL);
		atomic_store(&TH_POOL(pool)->threads_met, met != 0);
		TH_OK(sop_malloc_from_pool_async(&b, MiB, pool, s2));
		if (met != 1) {
			/* Best fit: the rest of s1's segment, right after a. */
			TH_EQ((char *)b - (char *)a, (long)a_size);
			TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 32 * MiB);
		} else {
			/* A segment of s2's own, elsewhere: a quarter step, as a stream's own
			 * segment grows once threads have met (own_steps). */
			TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
			      32 * MiB + SOP_OWN_STEP);
			TH_ASSERT(segment_of(pool, b) != segment_of(pool, a));
			TH_ASSERT(segment_of(pool, b)->home != segment_of(pool, a)->home);
		}
		TH_CHECK(pool);
		TH_OK(sop_free_async(b, s2));
		TH_OK(sop_free_async(a, s1));
		TH_OK(sop_stream_synchronize(s1));
		TH_OK(sop_stream_synchronize(s2));
		TH_CHECK(pool);
		if (met == 1) {
			/* Both segments are all free again: nobody's. s2 takes from the one that
			 * was s1's and makes it its own. */
			struct sop__segment *seg = segment_of(pool, a);
			TH_ASSERT(seg && !seg->home);
			TH_OK(sop_malloc_from_pool_async(&b, MiB, pool, s2));
			TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
			      32 * MiB + SOP_OWN_STEP);
			TH_ASSERT(segment_of(pool, b)->home != NULL);
			TH_OK(sop_free_async(b, s2));
			TH_OK(sop_stream_synchronize(s2));
		}
		TH_OK(sop_pool_destroy(pool));
	}
}

/* Make s's record hot (slow false) or slow, as its last pacing found it (order.c,
 * sop__stream_pace), until a millisecond after its next free. */
static void
set_pace(CUstream s, bool slow)
{
	struct sop__stream *st;

	TH_OK(sop__stream_lookup(s, false, &st));
	atomic_store(&st->frees_paced, 0);
	atomic_store(&st->slow_probes, slow ? 64u : 0u);
}

/* Both streams' frees completed, the pool checked and destroyed. */
static void
end_two(sop_pool_t pool, CUstream s1, CUstream s2)
{
	TH_OK(sop_stream_synchronize(s1));
	TH_OK(sop_stream_synchronize(s2));
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

/* Once threads have met, a stream's own segment grows by SOP_OWN_STEP however much it maps:
 * two streams that each keep 100 MiB of 1 MiB blocks, allocating in turn, reserve what they
 * hold rounded up to a quarter step each. What a step maps beyond a stream's needs is memory no
 * other stream takes while that one lives: with whole steps past the first 32 MiB, they
 * reserved 128 MiB each (and test-crowd's sixteen workers of about 130 MiB 2896-2976 MiB on
 * the simulated driver, against 2640-2656 in quarter steps all the way). */
static void
own_steps(CUstream s1, CUstream s2)
{
	enum { N = 100 };
	cuuint64_t keep = UINT64_MAX;
	sop_pool_t pool = th_pool(0, 0);
	static void *p[2][N];
	size_t want = 2 * ((N * MiB + SOP_OWN_STEP - 1) / SOP_OWN_STEP * SOP_OWN_STEP);
	int i, k;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	atomic_store(&TH_POOL(pool)->threads_met, true);
	/* Hot streams, as threads that allocate this fast are: a slow one would take the other's
	 * refill before growing (slow_shares), and the tests before left these two quiet. */
	set_pace(s1, false);
	set_pace(s2, false);
	for (i = 0; i < N; i++)
		for (k = 0; k < 2; k++)
			TH_OK(sop_malloc_from_pool_async(&p[k][i], MiB, pool, k ? s2 : s1));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), want);
	for (i = 0; i < N; i++)
		for (k = 0; k < 2; k++)
			TH_OK(sop_free_async(p[k][i], k ? s2 : s1));
	end_two(pool, s1, s2);
}

/* Once threads have met, a stream that takes memory from a larger segment of nobody's adopts a
 * part of it, what one growth of its own would map (SOP_OWN_STEP), and the rest stays nobody's,
 * for the next stream to adopt a part of in turn rather than grow beside it. A part is cut off
 * only where everything from the cut to the segment's end is free: else the stream adopts the
 * segment whole. s1 grows a segment of 64 MiB in quarter steps, then frees what pass says: all
 * of it; all but its first block; all but its last. */
static void
adopt_part(CUstream s1, CUstream s2)
{
	enum { N = 64 };
	cuuint64_t keep = UINT64_MAX;
	static void *p[N];
	void *b, *c;
	int pass, i;

	for (pass = 0; pass < 3; pass++) {
		sop_pool_t pool = th_pool(0, 0);
		struct sop__segment *seg;
		int kept = pass == 1 ? 0 : pass == 2 ? N - 1 : -1;

		TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
		atomic_store(&TH_POOL(pool)->threads_met, true);
		for (i = 0; i < N; i++)
			TH_OK(sop_malloc_from_pool_async(&p[i], MiB, pool, s1));
		TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), N * MiB);
		TH_ASSERT(segment_of(pool, p[0]) == segment_of(pool, p[N - 1]));
		for (i = 0; i < N; i++)
			if (i != kept)
				TH_OK(sop_free_async(p[i], s1));
		TH_OK(sop_stream_synchronize(s1));
		TH_ASSERT(segment_of(pool, p[0])->home == NULL);
		TH_OK(sop_malloc_from_pool_async(&b, MiB, pool, s2));
		seg = segment_of(pool, b);
		TH_ASSERT(seg->home != NULL);
		TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), N * MiB);
		TH_CHECK(pool);
		if (pass == 2) {
			/* A block live at the segment's end: adopted whole. */
			TH_ASSERT(seg == segment_of(pool, p[N - 1]));
			TH_EQ(seg->mapped, N * MiB);
		} else {
			TH_EQ(seg->mapped, SOP_OWN_STEP);
			TH_EQ(seg->size, SOP_OWN_STEP);
			/* The part begins at the first piece boundary in the fit: past the block
			 * kept at the segment's start, whose piece stays nobody's. */
			TH_EQ((char *)b - (char *)p[0], pass == 1 ? (long)SOP_OWN_STEP : 0L);
			TH_ASSERT(seg->next && seg->next->home == NULL &&
				  seg->next->mapped == N * MiB - SOP_OWN_STEP * (pass == 1 ? 2 : 1));
			if (pass == 1)
				TH_ASSERT(seg->prev && seg->prev->home == NULL &&
					  seg->prev->mapped == SOP_OWN_STEP &&
					  segment_of(pool, p[0]) == seg->prev);
			/* s1 is back: a part of what is still nobody's, not growth. */
			TH_OK(sop_malloc_from_pool_async(&c, MiB, pool, s1));
			TH_ASSERT(segment_of(pool, c) != seg && segment_of(pool, c)->home != NULL &&
				  segment_of(pool, c)->home != seg->home);
			TH_EQ(segment_of(pool, c)->mapped, SOP_OWN_STEP);
			TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), N * MiB);
			TH_CHECK(pool);
			TH_OK(sop_free_async(c, s1));
		}
		if (kept >= 0)
			TH_OK(sop_free_async(p[kept], s1));
		TH_OK(sop_free_async(b, s2));
		TH_OK(sop_stream_synchronize(s1));
		TH_OK(sop_stream_synchronize(s2));
		TH_CHECK(pool);
		TH_OK(sop_pool_destroy(pool));
	}
}

/* Threads have met in the pool. s2's segment is one 64 MiB block, which s2 has freed and which
 * stays pending on s2 behind a gate; s1's segment (a quarter step: SOP_OWN_STEP) holds a, a
 * 64 KiB hole that sop_free made the heap's, a guard g, and 7 MiB of free memory after it. */
static void
crowd_setup(sop_pool_t pool, CUstream s1, CUstream s2, struct th_gate *gate, void **a, void **g,
	    void **big)
{
	cuuint64_t keep = UINT64_MAX;
	void *p;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	atomic_store(&TH_POOL(pool)->threads_met, true);
	TH_OK(sop_malloc_from_pool_async(big, 64 * MiB, pool, s2));
	TH_OK(sop_malloc_from_pool_async(a, 1 * MiB - 68 * KiB, pool, s1));
	TH_OK(sop_malloc_from_pool_async(&p, 64 * KiB, pool, s1));
	TH_OK(sop_malloc_from_pool_async(g, 4 * KiB, pool, s1));
	TH_OK(sop_free(p));
	TH_ASSERT(segment_of(pool, *big) != segment_of(pool, *a));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 64 * MiB + SOP_OWN_STEP);
	th_gate_init(gate);
	th_gate_block(gate, s2);
}

static void
crowd_teardown(sop_pool_t pool, CUstream s1, CUstream s2, struct th_gate *gate, void *a, void *g)
{
	th_gate_open(gate);
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_free_async(g, s1));
	end_two(pool, s1, s2);
}

/* The stream's memory comes first (crowd_setup): a request on s2 that fits its large cached
 * block splits it, by the hot path (below POLL_MIN) or by the slow path (2 MiB and more, where
 * the heap's tighter fit in s1's segment counts), and the pool does not grow. It grew a step
 * for each such request when the heap's fit was the tighter (crowded: grow rather than share
 * a segment), and what the request took from the new step came back to the cache when freed,
 * so that the next one grew again: two threads on their own streams, 300 MiB live, reserved
 * 5-14 GiB after a second. */
static void
crowded_own_first(CUstream s1)
{
	sop_pool_t pool = th_pool(0, 0);
	CUstream s2 = th_stream();
	struct th_gate gate;
	void *a, *g, *big, *q[8];
	int i;

	crowd_setup(pool, s1, s2, &gate, &a, &g, &big);
	TH_OK(sop_free_async(big, s2));
	for (i = 0; i < 8; i++) {
		size_t n = i % 2 ? 4 * MiB : 64 * KiB;
		TH_OK(sop_malloc_from_pool_async(&q[i], n, pool, s2));
		TH_ASSERT((char *)q[i] >= (char *)big &&
			  (char *)q[i] + n <= (char *)big + 64 * MiB);
		TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 64 * MiB + SOP_OWN_STEP);
		TH_CHECK(pool);
	}
	for (i = 0; i < 8; i++)
		TH_OK(sop_free_async(q[i], s2));
	crowd_teardown(pool, s1, s2, &gate, a, g);
	th_stream_destroy(s2);
}

struct hot_alloc {
	sop_pool_t pool;
	CUstream s;
	void *big, *p;
	atomic_int phase; /* 1: big freed, 2: go, 3: allocated */
};

static void *
hot_alloc_main(void *arg)
{
	struct hot_alloc *h = arg;

	/* The free makes the thread's cache know the stream, as a worker's would. */
	TH_OK(sop_free_async(h->big, h->s));
	atomic_store(&h->phase, 1);
	while (atomic_load(&h->phase) != 2)
		usleep(100);
	TH_OK(sop_malloc_from_pool_async(&h->p, 64 * KiB, h->pool, h->s));
	atomic_store(&h->phase, 3);
	return NULL;
}

/* Once threads have met, a small request that fits in its stream's cache takes no pool lock,
 * whatever smaller blocks the heap holds in other streams' segments (crowd_setup): the slow
 * path could only take the cache's fit after all, and one allocation in fifty of threads on
 * their own streams queued on the pool lock for it. Here the test holds the pool lock while
 * another thread's request runs. */
static void
hot_stays_off_pool_lock(CUstream s1)
{
	sop_pool_t pool = th_pool(0, 0);
	struct hot_alloc h = {.pool = pool, .s = th_stream()};
	struct th_gate gate;
	void *a, *g;
	pthread_t t;
	int waited;

	crowd_setup(pool, s1, h.s, &gate, &a, &g, &h.big);
	TH_ASSERT(pthread_create(&t, NULL, hot_alloc_main, &h) == 0);
	while (atomic_load(&h.phase) != 1)
		usleep(100);
	sop__mutex_take(&TH_POOL(pool)->lock, SOP_RANK_POOL);
	atomic_store(&h.phase, 2);
	for (waited = 0; waited < 5000 && atomic_load(&h.phase) != 3; waited++)
		usleep(1000);
	sop__mutex_drop(&TH_POOL(pool)->lock);
	pthread_join(t, NULL);
	TH_ASSERT(waited < 5000);
	TH_ASSERT((char *)h.p >= (char *)h.big && (char *)h.p < (char *)h.big + 64 * MiB);
	TH_OK(sop_free_async(h.p, h.s));
	crowd_teardown(pool, s1, h.s, &gate, a, g);
	th_stream_destroy(h.s);
}

struct slow_alloc {
	sop_pool_t pool;
	CUstream s;
	void *p;
	bool known;     /* make the stream known to the pool on this thread first */
	atomic_int tid; /* set once the thread is about to allocate */
	atomic_bool ready, go; /* the thread is ready; the test holds the pool lock */
};

static void *
slow_alloc_main(void *arg)
{
	struct slow_alloc *h = arg;
	void *a;

	if (h->known) {
		/* The state of the stream in the pool, found from this thread; a synchronization
		 * empties its cache. */
		TH_OK(sop_malloc_from_pool_async(&a, MiB, h->pool, h->s));
		TH_OK(sop_free_async(a, h->s));
		TH_OK(sop_stream_synchronize(h->s));
	}
	atomic_store(&h->ready, true);
	while (!atomic_load(&h->go))
		usleep(100);
	atomic_store(&h->tid, (int)syscall(SYS_gettid));
	TH_OK(sop_malloc_from_pool_async(&h->p, MiB, h->pool, h->s));
	return NULL;
}

/* Whether thread tid sleeps (in a futex wait, here: nothing else it does sleeps). */
static bool
sleeping(int tid)
{
	char path[64], buf[256], *end;
	FILE *f;
	size_t n;

	snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
	f = fopen(path, "r");
	if (!f)
		return false;
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	end = strrchr(buf, ')'); /* the state follows the command name */
	return end && end[1] == ' ' && end[2] == 'S';
}

/* Run h's allocation in a thread while the test holds the pool lock, and return whether that
 * marked the pool as one that threads meet in. */
static bool
met_waiting(struct slow_alloc *h)
{
	struct sop_pool *p = TH_POOL(h->pool);
	pthread_t t;
	int i;

	atomic_store(&h->tid, 0);
	atomic_store(&h->ready, false);
	atomic_store(&h->go, false);
	TH_ASSERT(pthread_create(&t, NULL, slow_alloc_main, h) == 0);
	while (!atomic_load(&h->ready))
		usleep(100);
	TH_ASSERT(!atomic_load(&p->threads_met));
	sop__mutex_take(&p->lock, SOP_RANK_POOL);
	atomic_store(&h->go, true);
	while (!atomic_load(&h->tid))
		usleep(100);
	for (i = 0; i < 100000 && !sleeping(atomic_load(&h->tid)); i++)
		usleep(100);
	TH_ASSERT(i < 100000);
	sop__mutex_drop(&p->lock);
	pthread_join(t, NULL);
	return atomic_load(&p->threads_met);
}

/* Threads that start at once on a fresh pool meet first on the pool lock, in their first
 * requests, long before any of them waits for a segment lock: a wait there marks the pool too,
 * so that their memory goes to segments of their own from the start. Both places a request
 * takes the pool lock: a stream's first request in the pool, which makes its state there, and
 * an allocation's slow path. A pool used from several threads one after another stays
 * unmarked. */
static void
pool_wait_meets(CUstream s1)
{
	sop_pool_t pool = th_pool(0, 0);
	struct slow_alloc h = {.pool = pool, .s = th_stream()};
	void *a;
	pthread_t t;

	atomic_init(&h.tid, 0);
	atomic_init(&h.go, true);
	TH_OK(sop_malloc_from_pool_async(&a, MiB, pool, s1));
	TH_ASSERT(pthread_create(&t, NULL, slow_alloc_main, &h) == 0);
	pthread_join(t, NULL);
	TH_ASSERT(!atomic_load(&TH_POOL(pool)->threads_met));
	TH_OK(sop_free_async(h.p, h.s));
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_stream_synchronize(h.s));
	TH_OK(sop_stream_synchronize(s1));

	/* The stream's state made under the held lock. */
	th_stream_destroy(h.s);
	h.s = th_stream();
	TH_ASSERT(met_waiting(&h));
	TH_CHECK(pool);
	TH_OK(sop_free_async(h.p, h.s));
	TH_OK(sop_stream_synchronize(h.s));
	TH_OK(sop_pool_destroy(pool));

	/* The slow path under the held lock: the thread made the stream known to the pool and
	 * synchronized it, so its cache is empty. */
	pool = th_pool(0, 0);
	h.pool = pool;
	h.known = true;
	TH_ASSERT(met_waiting(&h));
	TH_CHECK(pool);
	TH_OK(sop_free_async(h.p, h.s));
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(h.s);
}

/* A stream that synchronized with nothing cached, its live blocks filling less than half of its
 * segments (a worker that freed all but a few blocks, synchronized its stream and destroyed
 * it), gives up its segment, though another stream's block lies there too: a third stream
 * takes the free memory there rather than growing a segment of its own, which it did for as
 * long as the segment stayed the departed stream's (until its last block came back, or a
 * context synchronization retired its state). A stream whose live blocks fill more keeps it. */
static void
idle_disowns(CUstream s1, CUstream s2)
{
	cuuint64_t keep = UINT64_MAX;
	sop_pool_t pool = th_pool(0, 0);
	CUstream s3 = th_stream();
	void *a, *k, *b, *c, *d;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_malloc_from_pool_async(&a, 20 * MiB, pool, s1));
	TH_OK(sop_malloc_from_pool_async(&k, 64 * KiB, pool, s1)); /* left allocated */
	TH_OK(sop_malloc_from_pool_async(&b, MiB, pool, s2)); /* best fit alone: s1's segment */
	TH_ASSERT(segment_of(pool, b) == segment_of(pool, a));
	atomic_store(&TH_POOL(pool)->threads_met, true);
	/* 20 MiB of 32 live at the synchronization: s1 keeps its segment. */
	TH_OK(sop_stream_synchronize(s1));
	TH_ASSERT(segment_of(pool, a)->home != NULL);
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_stream_synchronize(s1));
	TH_ASSERT(segment_of(pool, a)->home == NULL);
	TH_OK(sop_malloc_from_pool_async(&c, MiB, pool, s3));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 32 * MiB);
	TH_ASSERT(segment_of(pool, c) == segment_of(pool, a));
	TH_ASSERT(segment_of(pool, c)->home != NULL);
	/* Now s3's: s1, back for more, would grow a segment of its own, but with 2 MiB live in
	 * 32 reserved it shares s3's (affinity_affordable, reuse.c). */
	TH_OK(sop_malloc_from_pool_async(&d, MiB, pool, s1));
	TH_ASSERT(segment_of(pool, d) == segment_of(pool, a));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 32 * MiB);
	TH_CHECK(pool);
	TH_OK(sop_free_async(k, s1));
	TH_OK(sop_free_async(d, s1));
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop_free_async(c, s3));
	TH_OK(sop_stream_synchronize(s1));
	TH_OK(sop_stream_synchronize(s2));
	TH_OK(sop_stream_synchronize(s3));
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(s3);
}

/* Growth for affinity stops below the pool's used high-water mark: s1 held 28 MiB at a
 * synchronization and holds 20 now, so s2, whose 1 MiB fits only in s1's segment, shares it
 * rather than grow a segment of its own (the memory held more before). Once the mark is reset
 * to what is live, s3 with the same request grows its own, as affinity has it. */
static void
affinity_below_high(CUstream s1, CUstream s2)
{
	cuuint64_t keep = UINT64_MAX, zero = 0;
	sop_pool_t pool = th_pool(0, 0);
	CUstream s3 = th_stream();
	void *a, *x, *b, *c;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_malloc_from_pool_async(&a, 20 * MiB, pool, s1));
	TH_OK(sop_malloc_from_pool_async(&x, 8 * MiB, pool, s1));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 32 * MiB);
	TH_OK(sop_stream_synchronize(s1)); /* folds the mark: 28 MiB */
	TH_OK(sop_free_async(x, s1));
	TH_OK(sop_stream_synchronize(s1));
	TH_ASSERT(segment_of(pool, a)->home != NULL); /* 20 of 32 live: still s1's */
	atomic_store(&TH_POOL(pool)->threads_met, true);
	TH_OK(sop_malloc_from_pool_async(&b, MiB, pool, s2));
	TH_ASSERT(segment_of(pool, b) == segment_of(pool, a));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 32 * MiB);
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
	TH_OK(sop_malloc_from_pool_async(&c, MiB, pool, s3));
	TH_ASSERT(segment_of(pool, c) != segment_of(pool, a));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 32 * MiB + SOP_OWN_STEP);
	TH_CHECK(pool);
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop_free_async(c, s3));
	TH_OK(sop_stream_synchronize(s1));
	TH_OK(sop_stream_synchronize(s2));
	TH_OK(sop_stream_synchronize(s3));
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(s3);
}

/* The block starting at p: its state and size. */
static enum sop__state
block_at(sop_pool_t pool, void *p, size_t *size)
{
	struct sop__block *b = sop__map_get(TH_POOL(pool), (CUdeviceptr)(uintptr_t)p);

	TH_ASSERT(b != NULL);
	if (!b)
		return SOP_BLOCK_DEAD;
	*size = b->size;
	return sop__block_state(b);
}

/* Free memory that came to the heap from a stream's own cache rejoins the stream's cache when
 * the stream frees next to it, so that its free memory stays in few blocks. New memory stays
 * in the heap, and so does all of it while another stream holds cached memory (which may want
 * it), when another stream took memory from the heap last (a stream that allocates what
 * another frees would find the heap empty and grow), or once threads have met in the pool. */
static void
reclaim(CUstream s, CUstream s2)
{
	cuuint64_t keep = UINT64_MAX;
	sop_pool_t pool = th_pool(0, 0);
	void *a, *b, *c, *z = NULL;
	size_t n = 0;
	int pass;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	for (pass = 0; pass < 4; pass++) {
		/* One 32 MiB step: a, b and c, then 8 MiB of new memory. */
		TH_OK(sop_malloc_from_pool_async(&a, 8 * MiB, pool, s));
		TH_OK(sop_malloc_from_pool_async(&b, 8 * MiB, pool, s));
		TH_OK(sop_malloc_from_pool_async(&c, 8 * MiB, pool, s));
		TH_EQ((char *)b - (char *)a, (long)(8 * MiB));
		TH_EQ((char *)c - (char *)b, (long)(8 * MiB));
		TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 32 * MiB);
		if (pass == 1) {
			/* s2 holds cached memory (pending behind nothing, but not known so). */
			TH_OK(sop_malloc_from_pool_async(&z, 4 * KiB, pool, s2));
			TH_OK(sop_free_async(z, s2));
		}
		if (pass == 2)
			atomic_store(&TH_POOL(pool)->threads_met, true);
		if (pass == 3) /* s2 takes heap memory, and keeps it */
			TH_OK(sop_malloc_from_pool_async(&z, 4 * KiB, pool, s2));
		TH_OK(sop_free_async(a, s));
		TH_OK(sop_stream_synchronize(s)); /* a is the heap's, from s's cache */
		TH_EQ(block_at(pool, a, &n), SOP_BLOCK_FREE);
		TH_EQ(n, 8 * MiB);
		TH_OK(sop_free_async(b, s));
		if (pass == 0) {
			/* b took a back: one cached block of 16 MiB. */
			TH_EQ(block_at(pool, a, &n), SOP_BLOCK_CACHED);
			TH_EQ(n, 16 * MiB);
			TH_ASSERT(!sop__map_get(TH_POOL(pool), (CUdeviceptr)(uintptr_t)b));
		} else {
			TH_EQ(block_at(pool, a, &n), SOP_BLOCK_FREE);
			TH_EQ(n, 8 * MiB);
			TH_EQ(block_at(pool, b, &n), SOP_BLOCK_CACHED);
			TH_EQ(n, 8 * MiB);
		}
		/* The new memory after c (where z went in pass 1) is nobody's: c joins its cached
		 * neighbour, not it. */
		TH_OK(sop_free_async(c, s));
		if (pass != 1 && pass != 3) {
			TH_EQ(block_at(pool, (char *)c + 8 * MiB, &n), SOP_BLOCK_FREE);
			TH_EQ(n, 8 * MiB);
		}
		if (pass == 3)
			TH_OK(sop_free_async(z, s2));
		TH_CHECK(pool);
		TH_OK(sop_stream_synchronize(s));
		TH_OK(sop_stream_synchronize(s2));
		TH_CHECK(pool);
		atomic_store(&TH_POOL(pool)->threads_met, false);
	}
	TH_OK(sop_pool_destroy(pool));
}

/* A pool where threads have met, with the opportunistic policy: s1 holds 12 MiB (*big) and
 * has freed a 4 MiB block (*a), complete on the device, which nobody synchronized. */
static sop_pool_t
completed_free(CUstream s1, void **big, void **a)
{
	cuuint64_t keep = UINT64_MAX;
	sop_pool_t pool = th_pool(0, 0);
	int on = 1;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &on));
	atomic_store(&TH_POOL(pool)->threads_met, true);
	TH_OK(sop_malloc_from_pool_async(big, 12 * MiB, pool, s1));
	TH_OK(sop_malloc_from_pool_async(a, 4 * MiB, pool, s1));
	TH_OK(sop_free_async(*a, s1)); /* s1's first free: it gets a probe */
	while (th.cuStreamQuery(s1) == CUDA_ERROR_NOT_READY) /* no synchronization for sop */
		;
	return pool;
}

/* Threads have met, and the pool can grow by the rule of segment affinity (its reserved memory
 * within twice its live memory). s1's freed 4 MiB block is complete, but nobody synchronized.
 * A 4 MiB request on s2, which nothing fits, grows a segment of s2's own without asking s1's
 * probes: what they showed complete would go to the heap in s1's segment, which the request
 * does not take, and s1's hot path would no longer find it. s1's next request of that size
 * takes its block back from its cache. */
static void
others_kept(CUstream s1, CUstream s2)
{
	void *big, *a, *b, *c;
	sop_pool_t pool = completed_free(s1, &big, &a);
	struct sop_pool *p = TH_POOL(pool);
	size_t heap;
	unsigned long queries;

	heap = sop__bins_bytes(&p->heap);
	TH_ASSERT(2 * th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) >=
		  th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
	queries = th.sim_calls ? th.sim_calls("cuEventQuery") : 0;
	set_pace(s2, false); /* a hot stream: a slow one shares (slow_shares) */
	TH_OK(sop_malloc_from_pool_async(&b, 4 * MiB, pool, s2));
	/* s1's probes were not asked (simulated driver: its count of queries). */
	if (th.sim_calls)
		TH_EQ(th.sim_calls("cuEventQuery"), queries);
	TH_ASSERT(segment_of(pool, b) != segment_of(pool, big));
	TH_EQ(sop__bins_bytes(&p->heap), heap);
	TH_OK(sop_malloc_from_pool_async(&c, 4 * MiB, pool, s1));
	TH_ASSERT(c == a);
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop_free_async(c, s1));
	TH_OK(sop_free_async(big, s1));
	end_two(pool, s1, s2);
}

/* The same with s2 slow (it freed less often than once in 100 us when last paced): before it
 * grows, s1's completed free goes to the heap and serves it, in s1's segment, as the driver's
 * pool would serve it. And each of s2's next frees gets a probe, where a hot stream's get none
 * until the 64th. */
static void
slow_shares(CUstream s1, CUstream s2)
{
	void *big, *a, *b, *x[4];
	sop_pool_t pool = completed_free(s1, &big, &a);
	unsigned long records;
	uint64_t reserved;
	int i;

	reserved = th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
	set_pace(s2, true);
	TH_OK(sop_malloc_from_pool_async(&b, 4 * MiB, pool, s2));
	TH_ASSERT(b == a);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), reserved);
	/* Probes: s2's first free gets one as any stream's first; the next ones each one more,
	 * while s2 is slow, and none once it is hot. */
	for (i = 0; i < 4; i++)
		TH_OK(sop_malloc_from_pool_async(&x[i], 4096, pool, s2));
	TH_OK(sop_free_async(x[0], s2));
	records = th.sim_calls ? th.sim_calls("cuEventRecord") : 0;
	TH_OK(sop_free_async(x[1], s2));
	TH_OK(sop_free_async(x[2], s2));
	if (th.sim_calls)
		TH_EQ(th.sim_calls("cuEventRecord"), records + 2);
	set_pace(s2, false);
	TH_OK(sop_free_async(x[3], s2));
	if (th.sim_calls)
		TH_EQ(th.sim_calls("cuEventRecord"), records + 2);
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop_free_async(big, s1));
	end_two(pool, s1, s2);
}

/* Whether s's record counts as slow now (order.c, sop__stream_slow). */
static bool
is_slow(CUstream s)
{
	struct sop__stream *st;

	TH_OK(sop__stream_lookup(s, false, &st));
	return sop__stream_slow(st);
}

/* Free p on s, adding the time since the last such free to *stalls where it is 50 us or more. */
static void
free_timed(void *p, CUstream s, uint64_t *last, uint64_t *stalls)
{
	uint64_t t;

	TH_OK(sop_free_async(p, s));
	t = sop__now_ns();
	if (t - *last >= 50000)
		*stalls += t - *last;
	*last = t;
}

/* A stream's frees pace it, with no slow path in between: sixteen frees more than 100 us apart
 * make it slow, and each of its next frees gets a probe; frees back to back make it hot again
 * once a millisecond has passed. CuPy's tasks at Python's pace took the slow path too seldom
 * for its pacing to cover their frees. */
static void
paced_by_frees(CUstream s1, CUstream s2)
{
	enum { N = 100 };
	sop_pool_t pool = th_pool(0, 0);
	static void *p[N];
	void *a;
	unsigned long records;
	uint64_t t0, last, stalls = 0;
	unsigned long frees;
	int i;

	TH_OK(sop_malloc_from_pool_async(&a, 4096, pool, s1)); /* s2 is not alone in the pool */
	for (i = 0; i < N; i++)
		TH_OK(sop_malloc_from_pool_async(&p[i], 4096, pool, s2));
	set_pace(s2, false);
	for (i = 0; i < 16; i++) {
		TH_ASSERT(!is_slow(s2));
		usleep(150);
		TH_OK(sop_free_async(p[i], s2));
	}
	TH_ASSERT(is_slow(s2));
	records = th.sim_calls ? th.sim_calls("cuEventRecord") : 0;
	t0 = last = sop__now_ns();
	TH_OK(sop_free_async(p[16], s2));
	TH_OK(sop_free_async(p[17], s2));
	if (th.sim_calls)
		TH_EQ(th.sim_calls("cuEventRecord"), records + 2);
	/* Back to back: the other 82, then same-stream pairs for 3 ms, so that pacing windows
	 * (1 ms at least) close. A window of n frees (16 or more) is slow if the n - 1 gaps
	 * between them add up to more than n - 1 times 100 us. Gaps under 50 us add up to less
	 * than half that, so where the others (stalls: a thread kept off its CPU, a driver call
	 * that waited) add up to no more than 15 times 50 us, no window is slow. More, and the
	 * rule may judge it slow (a window of 16 frees with one 2 ms gap is): it is then not
	 * asked about. (Whether it is slow at the end alone says little: 64 frees spend a
	 * verdict's probes.) */
	records = th.sim_calls ? th.sim_calls("cuEventRecord") : 0;
	for (i = 18; i < N; i++)
		free_timed(p[i], s2, &last, &stalls);
	for (frees = N - 18; sop__now_ns() - t0 < 3000000; frees++) {
		TH_OK(sop_malloc_from_pool_async(&p[0], 4096, pool, s2));
		free_timed(p[0], s2, &last, &stalls);
	}
	if (stalls <= 15 * 50000) {
		TH_ASSERT(!is_slow(s2));
		/* No window judged it slow again: the rest of the first verdict's probes, and then
		 * one per 64 frees (with such verdicts, 64 more a millisecond). */
		if (th.sim_calls)
			TH_ASSERT(th.sim_calls("cuEventRecord") - records <= 64 + frees / 64 + 2);
	} else
		printf("placement: paced by frees: %.2f ms of stalls between frees, not asked\n",
		       stalls / 1e6);
	TH_OK(sop_free_async(a, s1));
	end_two(pool, s1, s2);
}

/* Growth for segment affinity spares a stream's splits and merges another's segment lock, which
 * a slow stream does not contend for: where a hot stream's 1 MiB request grows a segment of its
 * own beside s1's 20 MiB (affinity), a slow one's takes the rest of s1's segment, as the
 * driver's pool would. */
static void
slow_no_affinity(CUstream s1, CUstream s2)
{
	cuuint64_t keep = UINT64_MAX;
	int slow;

	for (slow = 0; slow < 2; slow++) {
		sop_pool_t pool = th_pool(0, 0);
		void *a, *b;

		TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
		TH_OK(sop_malloc_from_pool_async(&a, 20 * MiB, pool, s1));
		TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 32 * MiB);
		atomic_store(&TH_POOL(pool)->threads_met, true);
		set_pace(s2, slow);
		TH_OK(sop_malloc_from_pool_async(&b, MiB, pool, s2));
		if (slow) {
			TH_EQ((char *)b - (char *)a, (long)(20 * MiB));
			TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 32 * MiB);
		} else {
			TH_ASSERT(segment_of(pool, b) != segment_of(pool, a));
			TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
			      32 * MiB + SOP_OWN_STEP);
		}
		TH_CHECK(pool);
		TH_OK(sop_free_async(b, s2));
		TH_OK(sop_free_async(a, s1));
		end_two(pool, s1, s2);
	}
	set_pace(s2, false);
}

/* The same, at the pool's maxSize: growth fails, and s1's completed free, which the request was
 * not to ask for while the pool could grow, is what serves it (the driver's pool serves it from
 * there too): with the opportunistic policy and internal dependencies off, sop answered out of
 * memory, and with internal dependencies on, it made s2 wait for s1 for nothing. */
static void
others_asked_at_cap(CUstream s1, CUstream s2)
{
	sop_pool_t pool = th_pool(0, 16 * MiB);
	cuuint64_t keep = UINT64_MAX;
	int on = 1, off = 0;
	void *big, *a, *b;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &on));
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off));
	atomic_store(&TH_POOL(pool)->threads_met, true);
	TH_OK(sop_malloc_from_pool_async(&big, 12 * MiB, pool, s1));
	TH_OK(sop_malloc_from_pool_async(&a, 4 * MiB, pool, s1));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 16 * MiB);
	TH_OK(sop_free_async(a, s1)); /* s1's first free: it gets a probe */
	while (th.cuStreamQuery(s1) == CUDA_ERROR_NOT_READY) /* no synchronization for sop */
		;
	TH_OK(sop_malloc_from_pool_async(&b, 4 * MiB, pool, s2));
	TH_ASSERT(b == a);
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop_free_async(big, s1));
	end_two(pool, s1, s2);
}

int
main(void)
{
	struct th_gate gate;
	CUstream s;

	th_init();
	s = th_stream();
	th_gate_init(&gate);
	th_gate_block(&gate, s);
	merge_different(s);
	equal_apart(s);
	temporary_apart(s);
	heap_beats_own(s);
	th_gate_open(&gate);
	free_only_stream();
	TH_OK(sop_stream_synchronize(s));
	{
		CUstream s2 = th_stream();
		affinity(s, s2);
		own_steps(s, s2);
		crowded_own_first(s);
		hot_stays_off_pool_lock(s);
		pool_wait_meets(s);
		idle_disowns(s, s2);
		affinity_below_high(s, s2);
		adopt_part(s, s2);
		others_kept(s, s2);
		slow_shares(s, s2);
		paced_by_frees(s, s2);
		slow_no_affinity(s, s2);
		others_asked_at_cap(s, s2);
		reclaim(s, s2);
		th_stream_destroy(s2);
	}
	th_stream_destroy(s);
	printf("placement: ok\n");
	return 0;
}
