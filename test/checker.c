/* checker.c - the invariant walker catches what it is there to catch. Every other test trusts
 * sop__pool_check (check.c) as its oracle after each operation; a walker that passed a broken
 * pool would make them all pass with it. So this test breaks a live pool on purpose, one
 * invariant at a time, expects the walker to fail, puts the pool back as it was and expects it
 * to pass again.
 *
 * The pool holds every kind of block the walker reads: ALLOC blocks on two streams, a CACHED one
 * between two of them, FREE memory in the heap, a HOLE where growth left room unmapped. In a
 * build with -Dchecks=true it also takes locks out of their order (types.h, enum sop__rank), in
 * child processes, and expects each to abort. Runs on the simulated driver and on a GPU alike
 * (it touches only the host's bookkeeping).
 */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

#define KIB ((size_t)1 << 10)

static struct sop_pool *pool;
static int broken; /* cases the walker caught */

static struct sop__block *
block_at(void *p)
{
	struct sop__block *b = sop__map_get(pool, (CUdeviceptr)(uintptr_t)p);

	TH_ASSERT(b != NULL);
	return b;
}

/* The walker fails now (on some line of check.c), where it passed before. */
static void
expect_caught(const char *what)
{
	int line;

	th_phase("%s", what);
	line = sop__pool_check(pool);
	if (!line) {
		fprintf(stderr, "checker: the walker missed: %s\n", what);
		th_fail();
	}
	printf("  %-58s caught at check.c:%d\n", what, line);
	broken++;
}

static void
expect_whole(const char *what)
{
	int line = sop__pool_check(pool);

	th_phase("%s, put back", what);
	if (line) {
		fprintf(stderr, "checker: %s, put back, still fails at check.c:%d\n", what, line);
		th_fail();
	}
}

/* Break one word of the pool's bookkeeping: save it, write the bad value, check, restore. */
#define BREAK(what, lvalue, bad)                                                                   \
	do {                                                                                       \
		__typeof__(lvalue) saved_ = (lvalue);                                              \
		(lvalue) = (bad);                                                                  \
		expect_caught(what);                                                               \
		(lvalue) = saved_;                                                                 \
		expect_whole(what);                                                                \
	} while (0)

static void
set_tag(struct sop__block *b, enum sop__state st)
{
	atomic_store(&b->tag, sop__tag(b->addr, st));
}

#if SOP_CHECKS
/* In a child, since what it checks aborts: fn(arg) ends in abort (true) or returns. */
static bool
aborts(void (*fn)(struct sop__sstream *), struct sop__sstream *ss)
{
	int status;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	TH_ASSERT(pid >= 0);
	if (pid == 0) {
		fclose(stderr); /* the message is expected */
		fn(ss);
		_exit(0);
	}
	TH_ASSERT(waitpid(pid, &status, 0) == pid);
	return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static void
segment_then_pool(struct sop__sstream *ss)
{
	(void)ss;
	sop__lock_take(&pool->segments->lock);
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
}

static void
two_states(struct sop__sstream *ss)
{
	struct sop__sstream *other = pool->streams == ss ? pool->streams->next : pool->streams;

	sop__lock_take(&ss->lock);
	sop__lock_take(&other->lock);
}

static void
pool_twice(struct sop__sstream *ss)
{
	(void)ss;
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
}

static void
heap_put_unlocked(struct sop__sstream *ss)
{
	(void)ss;
	SOP_HELD(&pool->lock);
}

/* The sanctioned exception: a trylock under a lock of a higher rank, then the usual order. */
static void
state_then_try_pool(struct sop__sstream *ss)
{
	sop__lock_take(&ss->lock);
	if (sop__mutex_try(&pool->lock, SOP_RANK_POOL))
		sop__mutex_drop(&pool->lock);
	sop__lock_drop(&ss->lock);
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	sop__lock_take(&ss->lock);
	sop__lock_take(&pool->segments->lock);
	sop__lock_drop(&pool->segments->lock);
	sop__lock_drop(&ss->lock);
	sop__mutex_drop(&pool->lock);
}
#endif

/* The lock ranks of a checked build (-Dchecks=true): takes out of order abort, as does a
 * function's lock that is not held; the order itself and a trylock out of it do not. */
static void
lock_order(struct sop__sstream *ss)
{
#if SOP_CHECKS
	th_phase("lock order");
	TH_ASSERT(aborts(segment_then_pool, ss));
	TH_ASSERT(aborts(two_states, ss));
	TH_ASSERT(aborts(pool_twice, ss));
	TH_ASSERT(aborts(heap_put_unlocked, ss));
	TH_ASSERT(!aborts(state_then_try_pool, ss));
	printf("checker: lock order checked: ok\n");
#else
	(void)ss;
	printf("checker: lock order not checked in this build (-Dchecks=false)\n");
#endif
}

int
main(void)
{
	sop_pool_t handle;
	CUstream s1, s2;
	void *a, *b, *c, *d, *e;
	struct sop__block *ba, *bb, *bc, *free_b = NULL, *hole = NULL, *x;
	struct sop__sstream *ss1;
	struct sop__segment *seg;
	uint64_t saved_tag;
	th_init();
	handle = th_pool(0, 0);
	pool = TH_POOL(handle);
	s1 = th_stream();
	s2 = th_stream();

	th_phase("building the pool");
	TH_OK(sop_malloc_from_pool_async(&a, 64 * KIB, handle, s1));
	TH_OK(sop_malloc_from_pool_async(&b, 64 * KIB, handle, s1));
	TH_OK(sop_malloc_from_pool_async(&c, 64 * KIB, handle, s1));
	TH_OK(sop_malloc_from_pool_async(&d, 100, handle, s2));
	/* b pending on s1 between two live blocks; e freed and synchronized: FREE in the heap. */
	TH_OK(sop_free_async(b, s1));
	TH_OK(sop_malloc_from_pool_async(&e, 256 * KIB, handle, s2));
	TH_OK(sop_free_async(e, s2));
	TH_OK(sop_stream_synchronize(s2));
	TH_CHECK(handle);

	ba = block_at(a);
	bb = block_at(b);
	bc = block_at(c);
	TH_EQ(sop__block_state(ba), SOP_BLOCK_ALLOC);
	TH_EQ(sop__block_state(bb), SOP_BLOCK_CACHED);
	TH_EQ(sop__block_state(bc), SOP_BLOCK_ALLOC);
	TH_ASSERT(ba->phys_next == bb && bb->phys_next == bc);
	ss1 = sop__block_owner(bb);
	TH_ASSERT(ss1 != NULL);
	for (seg = pool->segments; seg; seg = seg->next)
		for (x = seg->first; x; x = x->phys_next) {
			if (!free_b && sop__block_state(x) == SOP_BLOCK_FREE)
				free_b = x;
			if (!hole && sop__block_state(x) == SOP_BLOCK_HOLE)
				hole = x;
		}
	TH_ASSERT(free_b != NULL);

	printf("checker: the walker against a pool broken on purpose\n");

	/* Blocks: tags, sizes, tiling, links. */
	saved_tag = atomic_load(&ba->tag);
	set_tag(ba, SOP_BLOCK_FREE);
	expect_caught("an ALLOC block tagged FREE, in no heap list");
	atomic_store(&ba->tag, saved_tag);
	expect_whole("an ALLOC block tagged FREE");

	saved_tag = atomic_load(&bb->tag);
	set_tag(bb, SOP_BLOCK_ALLOC);
	expect_caught("a CACHED block tagged ALLOC, still in its stream's list");
	atomic_store(&bb->tag, saved_tag);
	expect_whole("a CACHED block tagged ALLOC");

	saved_tag = atomic_load(&ba->tag);
	atomic_store(&ba->tag, sop__tag(ba->addr + SOP_ALIGN, SOP_BLOCK_ALLOC));
	expect_caught("a tag naming another address");
	atomic_store(&ba->tag, saved_tag);
	expect_whole("a tag naming another address");

	BREAK("a block one alignment unit too large", ba->size, ba->size + SOP_ALIGN);
	BREAK("a block size that is not whole units", bc->size, bc->size - 1);
	BREAK("a block at the wrong address", bc->addr, bc->addr + SOP_ALIGN);
	BREAK("a neighbour link skipping a block", bc->phys_prev, ba);
	BREAK("a block naming another segment", ba->seg, (struct sop__segment *)NULL);
	BREAK("requested bytes above the block's size", ba->req, ba->size + 1);
	BREAK("requested bytes that used memory does not count", ba->req, ba->req - 1);

	/* The free lists: the heap and a stream's cache. */
	BREAK("a heap bitmap bit with an empty list", pool->heap.fl_bitmap,
	      pool->heap.fl_bitmap ^ ((uint64_t)1 << (SOP_FL_COUNT - 1)));
	BREAK("a heap count one short", pool->heap.n_blocks, pool->heap.n_blocks - 1);
	BREAK("heap bytes off by a unit", pool->heap.n_bytes, pool->heap.n_bytes + SOP_ALIGN);
	BREAK("the readers' hint out of step with the bitmap", pool->heap.fl_hint,
	      pool->heap.fl_hint ^ 1);
	BREAK("a stream's cache count one short", ss1->cache.n_blocks, ss1->cache.n_blocks - 1);
	BREAK("a stream's cached bytes off by a unit", ss1->cache.n_bytes,
	      ss1->cache.n_bytes + SOP_ALIGN);
	BREAK("a CACHED block owned by no stream", bb->owner, (struct sop__sstream *)NULL);
	{
		/* A CACHED block that names another stream than the one whose list holds it. */
		struct sop__sstream *other;

		for (other = pool->streams; other == ss1; other = other->next)
			;
		TH_ASSERT(other != NULL);
		BREAK("a CACHED block naming another stream", bb->owner, other);
	}
	BREAK("a stream's spare count one over", ss1->n_spare, ss1->n_spare + 1);
	{
		/* A FREE block out of the heap's lists, its state unchanged. */
		sop__bins_remove(&pool->heap, free_b);
		expect_caught("a FREE block in no heap list");
		sop__bins_insert(&pool->heap, free_b);
		expect_whole("a FREE block in no heap list");
	}
	{
		/* A CACHED block in the heap rather than its stream's cache. */
		sop__bins_remove(&ss1->cache, bb);
		sop__bins_insert(&pool->heap, bb);
		expect_caught("a CACHED block in the heap's lists");
		sop__bins_remove(&pool->heap, bb);
		sop__bins_insert(&ss1->cache, bb);
		expect_whole("a CACHED block in the heap's lists");
	}
	{
		/* A block in the list of another size (its bytes counted as that size's). */
		size_t saved = free_b->size, other = saved < ((size_t)1 << 20) ? (size_t)64 << 20
									: SOP_ALIGN;

		sop__bins_remove(&pool->heap, free_b);
		free_b->size = other;
		sop__bins_insert(&pool->heap, free_b);
		free_b->size = saved;
		expect_caught("a FREE block in the list of another size");
		free_b->size = other;
		sop__bins_remove(&pool->heap, free_b);
		free_b->size = saved;
		sop__bins_insert(&pool->heap, free_b);
		expect_whole("a FREE block in the list of another size");
	}

	/* Segments, pieces and the statistics. */
	seg = pool->segments;
	BREAK("a segment's mapped bytes off by a granule", seg->mapped,
	      seg->mapped + pool->granularity);
	BREAK("a segment whose first block has a neighbour before it", seg->first->phys_prev,
	      seg->first);
	BREAK("a segment list's back link broken", seg->prev, seg);
	BREAK("reserved memory off by a granule", pool->reserved,
	      atomic_load(&pool->reserved) + pool->granularity);
	BREAK("the reserved watermark below reserved memory", pool->reserved_high,
	      atomic_load(&pool->reserved) - 1);
	BREAK("a pool leaf count that loses a leaf", pool->n_leaves, pool->n_leaves + 1);
	if (hole) {
		saved_tag = atomic_load(&hole->tag);
		set_tag(hole, SOP_BLOCK_FREE);
		expect_caught("a HOLE tagged FREE: memory no piece backs, handed out");
		atomic_store(&hole->tag, saved_tag);
		expect_whole("a HOLE tagged FREE");
		if (pool->holes == hole) {
			BREAK("a HOLE missing from the pool's list of holes", pool->holes,
			      hole->free_next);
		}
	}
	{
		/* A block the map does not find at its address. */
		struct sop__segment *bseg = bb->seg;

		sop__lock_take(&bseg->lock);
		sop__map_remove(pool, bseg, bb->addr);
		sop__lock_drop(&bseg->lock);
		expect_caught("a block the map does not find");
		sop__lock_take(&bseg->lock);
		sop__map_add(pool, &bseg->leaves, bb->addr, bb);
		sop__lock_drop(&bseg->lock);
		expect_whole("a block the map does not find");
	}

	lock_order(ss1);

	th_phase("tearing down");
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_free_async(c, s1));
	TH_OK(sop_free_async(d, s2));
	TH_OK(sop_stream_synchronize(s1));
	TH_OK(sop_stream_synchronize(s2));
	TH_CHECK(handle);
	th_stream_destroy(s1);
	th_stream_destroy(s2);
	TH_OK(sop_pool_destroy(handle));
	printf("checker: %d broken pools caught, each whole again once put back: ok\n", broken);
	return 0;
}
