/* block.c - blocks: descriptors, split and merge, and the pool-wide heap of FREE blocks.
 *
 * Blocks tile their segment (segment.c) and are linked to their neighbours there. FREE blocks
 * sit in the pool heap (bins.c) and are merged with FREE neighbours as they arrive; CACHED
 * blocks belong to a stream (sstream.c), which splits and merges them under its own lock and
 * the segment's. Descriptors come from per-pool slabs and go back to the pool's spare list,
 * never to libc while the pool lives.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- Descriptors ------------------------------------------------------------------------ */

#define SLAB_BLOCKS 256
#define SPARES_LOW 8
#define SPARES_FILL 32
#define SPARES_HIGH 64
/* The longest chain a descriptor given back one at a time joins. */
#define CHAIN_MAX SPARES_HIGH

/* The pool's spare descriptors (pool->spare, and pool->returned until it is taken) are a list
 * of chains: a chain's first descriptor holds its last in free_prev and its length in seq, and
 * its last links to the next chain. A state that runs low takes chains whole, and a descriptor
 * given back joins the first chain or starts one: nothing walks the descriptors, each a miss
 * on a line another thread wrote last (eight such misses a state, one at a time, were a fifth
 * of the time sixteen threads whose tasks each make a stream held the pool lock on the H100).
 * Pool lock held. */
static inline void
chain_mark(struct sop__block *head, struct sop__block *tail, uint64_t n)
{
	head->free_prev = tail;
	head->seq = n;
}

static void
spare_push(struct sop_pool *pool, struct sop__block *b)
{
	struct sop__block *h = pool->spare;

	if (h && h->seq < CHAIN_MAX)
		chain_mark(b, h->free_prev, h->seq + 1);
	else
		chain_mark(b, b, 1);
	b->free_next = h;
	pool->spare = b;
}

static struct sop__block *
spare_pop(struct sop_pool *pool)
{
	struct sop__block *b = pool->spare, *n = b->free_next;

	if (b->seq > 1)
		chain_mark(n, b->free_prev, b->seq - 1);
	pool->spare = n;
	return b;
}

/* The first chain, whole: its first descriptor, which still names its last and its length. */
static struct sop__block *
chain_pop(struct sop_pool *pool)
{
	struct sop__block *h = pool->spare;

	pool->spare = h->free_prev->free_next;
	h->free_prev->free_next = NULL;
	return h;
}

/* A pool's first slabs are small (16, then 64 descriptors), so that its first allocation
 * zeroes a page of fresh host memory rather than eight: each first touch of a page is a fault
 * that costs microseconds, and eight of them were half of sop's own time in that allocation. */
static size_t
slab_blocks(const struct sop_pool *pool)
{
	return pool->n_slabs >= 2 ? SLAB_BLOCKS : SLAB_BLOCKS >> (4 - 2 * pool->n_slabs);
}

static bool
slab_add(struct sop_pool *pool)
{
	size_t i, n = slab_blocks(pool);
	struct sop__block *slab;

	if (pool->n_slabs == pool->cap_slabs) {
		size_t cap = pool->cap_slabs ? pool->cap_slabs * 2 : 8;
		void **slabs = realloc(pool->slabs, cap * sizeof *slabs);
		if (!slabs)
			return false;
		pool->slabs = slabs;
		pool->cap_slabs = cap;
	}
	slab = aligned_alloc(_Alignof(struct sop__block), n * sizeof *slab);
	if (!slab)
		return false;
	memset(slab, 0, n * sizeof *slab);
	pool->slabs[pool->n_slabs++] = slab;
	for (i = 0; i < n; i++)
		spare_push(pool, &slab[i]);
	return true;
}

/* Descriptors are never returned to libc while the pool lives: a free racing with a merge may
 * still read one, and its tag then tells it the block is gone. */
struct sop__block *
sop__block_new(struct sop_pool *pool)
{
	struct sop__block *b;

	if (!pool->spare)
		pool->spare = atomic_exchange_explicit(&pool->returned, NULL, memory_order_acquire);
	if (!pool->spare && !slab_add(pool))
		return NULL;
	b = spare_pop(pool);
	/* Spares are a list through cold descriptors: fetch the one after the next now (the
	 * next one's line the pop has written), so that the next call does not stall on it. */
	if (pool->spare && pool->spare->free_next)
		__builtin_prefetch(pool->spare->free_next, 1);
	b->free_next = b->free_prev = NULL;
	sop__link_set(&b->phys_prev, NULL);
	b->phys_next = NULL;
	sop__block_set_owner(b, NULL);
	b->seg = NULL;
	b->req = 0;
	b->seq = 0;
	return b;
}

void
sop__block_delete(struct sop_pool *pool, struct sop__block *b)
{
	atomic_store_explicit(&b->tag, sop__tag(0, SOP_BLOCK_DEAD), memory_order_release);
	spare_push(pool, b);
}

/* ---- Split and merge -------------------------------------------------------------------- */

/* Split b at size, the rest in the given state and in no bin: NULL, b left whole, when nothing
 * is left over or there is no descriptor or map slot for the rest (no host memory: the block is
 * then handed out whole, which wastes device memory but stays correct). Pool lock held. */
static struct sop__block *
split_off(struct sop_pool *pool, struct sop__block *b, size_t size, enum sop__state state)
{
	struct sop__block *rest;

	if (b->size - size < SOP_ALIGN)
		return NULL;
	rest = sop__block_new(pool);
	if (!rest)
		return NULL;
	if (!sop__segment_lock_leaves(pool, b->seg, 1)) {
		sop__block_delete(pool, rest);
		return NULL;
	}
	sop__block_split(pool, b, rest, size, state, &b->seg->leaves);
	sop__lock_drop(&b->seg->lock);
	return rest;
}

void
sop__block_carve(struct sop_pool *pool, struct sop__block *b, size_t size,
		 struct sop__sstream *from, bool from_held)
{
	enum sop__state state = sop__block_state(b);
	struct sop__block *rest = split_off(pool, b, size, state);

	SOP_HELD(&pool->lock);
	if (!rest)
		return;
	if (state == SOP_BLOCK_CACHED) {
		if (!from_held)
			sop__lock_take(&from->lock);
		sop__block_set_owner(rest, from);
		sop__bins_insert(&from->cache, rest);
		if (!from_held)
			sop__lock_drop(&from->lock);
	} else {
		sop__block_set_owner(rest, sop__block_owner(b));
		sop__bins_insert(&pool->heap, rest);
	}
}

void
sop__block_carve_refill(struct sop_pool *pool, struct sop__block *b, size_t size, size_t keep,
			struct sop__sstream *ss)
{
	struct sop__block *rest;

	sop__block_carve(pool, b, size + keep, NULL, true);
	if (b->size - size > keep) {
		/* No descriptor for the split above: the plain carve, all of the rest to the heap. */
		sop__block_carve(pool, b, size, NULL, true);
		return;
	}
	rest = split_off(pool, b, size, SOP_BLOCK_CACHED);
	if (!rest)
		return;
	rest->seq = 0; /* nothing pending on it: safe for any stream */
	sop__block_set_owner(rest, ss);
	sop__bins_insert(&ss->cache, rest);
}

bool
sop__block_carve_own(struct sop_pool *pool, struct sop__sstream *ss, struct sop__block *b,
		     size_t size)
{
	struct sop__block *rest = ss->spare;

	if (b->size - size < SOP_ALIGN) {
		sop__bins_remove(&ss->cache, b);
		return true;
	}
	if (!rest || !sop__segment_lock_leaves(pool, b->seg, 1))
		return false;
	sop__bins_remove(&ss->cache, b);
	ss->spare = rest->free_next;
	if (ss->spare)
		__builtin_prefetch(ss->spare, 1);
	else
		ss->spare_last = NULL;
	ss->n_spare--;
	rest->free_next = NULL;
	sop__block_split(pool, b, rest, size, SOP_BLOCK_CACHED, &b->seg->leaves);
	sop__lock_drop(&b->seg->lock);
	sop__block_set_owner(rest, ss);
	sop__bins_insert(&ss->cache, rest);
	return true;
}

/* A descriptor was pushed onto ss's spares: the first of them is also the last. */
static inline void
spare_pushed(struct sop__sstream *ss)
{
	if (!ss->spare_last)
		ss->spare_last = ss->spare;
	ss->n_spare++;
}

void
sop__block_absorb_next(struct sop_pool *pool, struct sop__block *b, struct sop__sstream *ss)
{
	struct sop__block *n = b->phys_next;

	SOP_HELD(&b->seg->lock);
	sop__map_remove(pool, b->seg, n->addr);
	b->size += n->size;
	b->phys_next = n->phys_next;
	if (n->phys_next)
		sop__link_set(&n->phys_next->phys_prev, b);
	atomic_store_explicit(&n->tag, sop__tag(0, SOP_BLOCK_DEAD), memory_order_release);
	sop__block_set_owner(n, NULL);
	if (!ss) {
		spare_push(pool, n);
		return;
	}
	n->free_next = ss->spare;
	ss->spare = n;
	spare_pushed(ss);
}

/* Hand the spares of ss above SPARES_LOW back to the pool without its lock: a stream that only
 * frees gains one with every merge and would otherwise keep them all. Pushed as one chain onto
 * a list the pool lock holder takes whole (sop__block_new), so a compare-and-swap suffices.
 * Stream lock held. */
static void
spares_shed(struct sop_pool *pool, struct sop__sstream *ss)
{
	struct sop__block *head = ss->spare, *tail = head, *old;
	uint64_t n = 1;

	while (ss->n_spare > SPARES_LOW + 1) {
		tail = tail->free_next;
		ss->n_spare--;
		n++;
	}
	ss->spare = tail->free_next;
	if (!ss->spare)
		ss->spare_last = NULL;
	ss->n_spare--;
	chain_mark(head, tail, n); /* the list it joins is one of chains, like the pool's */
	old = atomic_load_explicit(&pool->returned, memory_order_relaxed);
	do
		tail->free_next = old;
	while (!atomic_compare_exchange_weak_explicit(&pool->returned, &old, head,
						      memory_order_release, memory_order_relaxed));
}

/* Whether b, a neighbour of the block being merged, is worth joining to it: cached on ss too,
 * and of another size. Two equal neighbours stay apart: a stream that frees a run of blocks of
 * one size is likely to ask for that size again, and then reuses them whole (a batch of k
 * allocations and k frees costs no split and no merge) where joined they would be split again
 * one by one. The size is read only once b is known to be ss's: ss's lock keeps it still. */
static inline bool
mergeable(struct sop__block *b, size_t size, struct sop__sstream *ss)
{
	return b && sop__block_state(b) == SOP_BLOCK_CACHED && sop__block_owner(b) == ss &&
	       b->size != size;
}

/* Whether b is FREE memory that came from ss's own cache, which a block ss frees next to it
 * takes back. Exact with the pool and segment locks held; a peek without them. */
static inline bool
reclaimable(struct sop__block *b, struct sop__sstream *ss)
{
	return b && sop__block_state(b) == SOP_BLOCK_FREE && sop__block_owner(b) == ss;
}

/* Take the pool lock if ss may take back FREE memory next to a block it frees: only while one
 * thread uses the pool (trying the lock, never waiting for it, out of order under ss's), ss is
 * the stream that last took memory from the heap, and no other stream holds cached memory.
 * Joined to the cached block, that memory is pending on ss until ss's frees are seen complete:
 * another stream that came for it would grow the pool instead (a stream that only allocates,
 * handing its blocks to one that frees them, grew without end when the freeing stream took
 * back what its probes had returned). Apart, the FREE memory and the stream's cached blocks
 * are two sets of pieces, and a request that fits neither alone splits a large one or grows
 * (replaying a training step, a 512 MiB block found the previous step's cut up by the next
 * forward pass's activations). */
static bool
reclaim_begin(struct sop_pool *pool, struct sop__sstream *ss)
{
	/* Never in a pool with a cap. FREE memory is known complete, which makes it reusable by
	 * every stream whatever the policies; joined to a cached block it is pending on ss again,
	 * and no later search can tell it apart: a pool at its cap, its policies off, would then
	 * answer out of memory to another stream while the driver's pool hands that memory out
	 * (a block freed and synchronized on ss, its neighbour freed while ss is busy). Without a
	 * cap, the pool grows instead. A look first, so that the free of a stream that may not
	 * take back (say, one freeing what another allocates) does not try the lock each time;
	 * then again under it. */
	if (pool->max_size || atomic_load_explicit(&pool->threads_met, memory_order_relaxed) ||
	    atomic_load_explicit(&pool->heap_user, memory_order_relaxed) != ss ||
	    !sop__mutex_try(&pool->lock, SOP_RANK_POOL))
		return false;
	if (atomic_load_explicit(&pool->heap_user, memory_order_relaxed) == ss &&
	    !sop__others_cache(pool, ss, 1))
		return true;
	sop__mutex_drop(&pool->lock);
	return false;
}

/* Whether b, freed by ss right after ss handed it out, stays apart from the cached block beside
 * it: a loop that allocates and frees one size (a temporary) then takes it back whole, where
 * joined it would be split off again at every allocation. A pool that had served random sizes
 * up to 1 MiB held a few large merged blocks in the stream's cache, and each pair split one and
 * joined the piece back: 1695 instructions a pair on the simulated driver (its own included)
 * against 1157 on a fresh pool, and 4.7-5.0x the driver's pool on an H200; apart, 1282 and
 * 6.5-6.9x (bench/results/2026-11-28-h200-temporary-apart-ab/). Only below SOP_POLL_MIN, only
 * where no cached block of its list could serve that size again, only where no FREE neighbour
 * is taken back, and only at the edge of the cached memory around it, never in a hole between
 * two cached blocks, which it would keep cut in three. Its neighbour's next free joins it. */
static inline bool
keep_apart(struct sop__sstream *ss, const struct sop__block *b, struct sop__block *p,
	   struct sop__block *n)
{
	return b == ss->handed && b->size < SOP_POLL_MIN &&
	       !(mergeable(p, b->size, ss) && mergeable(n, b->size, ss)) &&
	       sop__bins_list_empty(&ss->cache, b->size);
}

struct sop__block *
sop__block_merge_own(struct sop_pool *pool, struct sop__sstream *ss, struct sop__block *b)
{
	struct sop__block *p = sop__link_peek(&b->phys_prev), *n = sop__link_peek(&b->phys_next);
	struct sop__segment *seg = b->seg;
	bool reclaim = (reclaimable(n, ss) || reclaimable(p, ss)) && reclaim_begin(pool, ss);

	SOP_HELD(&ss->lock);
	/* A look without the segment lock first, so that a free with nothing to merge (the common
	 * case when streams share a segment) touches no shared line. It is exact: only ss's lock
	 * holder makes a block cached on ss or changes b's next link, and a prev link that another
	 * thread rewrites points at a block not cached on ss before and after. */
	if (!reclaim && !mergeable(n, b->size, ss) && !mergeable(p, b->size, ss))
		return b;
	if (!reclaim && keep_apart(ss, b, p, n))
		return b;
	sop__segment_lock(seg);
	for (;;) {
		n = b->phys_next;
		if (reclaim && reclaimable(n, ss)) {
			sop__bins_remove(&pool->heap, n);
		} else if (mergeable(n, b->size, ss)) {
			sop__bins_remove(&ss->cache, n);
			if (n->seq > b->seq)
				b->seq = n->seq;
		} else {
			break;
		}
		sop__block_absorb_next(pool, b, ss);
	}
	for (;;) {
		p = b->phys_prev;
		if (reclaim && reclaimable(p, ss)) {
			/* Cached on ss from here on, with b's pending work. */
			sop__bins_remove(&pool->heap, p);
			p->seq = b->seq;
			atomic_store_explicit(&p->tag, sop__tag(p->addr, SOP_BLOCK_CACHED),
					      memory_order_release);
		} else if (mergeable(p, b->size, ss)) {
			sop__bins_remove(&ss->cache, p);
			if (b->seq > p->seq)
				p->seq = b->seq;
		} else {
			break;
		}
		sop__block_absorb_next(pool, p, ss);
		b = p;
	}
	sop__lock_drop(&seg->lock);
	if (reclaim)
		sop__mutex_drop(&pool->lock);
	if (ss->n_spare > SPARES_HIGH)
		spares_shed(pool, ss);
	return b;
}

void
sop__spares_balance(struct sop_pool *pool, struct sop__sstream *ss)
{
	if (ss->n_spare >= SPARES_LOW)
		return;
	/* Once threads have met in the pool, whole chains until SPARES_FILL: eight at a time, a
	 * state whose first requests each split a block ran out every eight and took the pool
	 * lock again each time. */
	if (atomic_load_explicit(&pool->threads_met, memory_order_relaxed)) {
		while (ss->n_spare < SPARES_FILL) {
			struct sop__block *h;

			if (!pool->spare)
				pool->spare = atomic_exchange_explicit(&pool->returned, NULL,
								       memory_order_acquire);
			if (!pool->spare && !slab_add(pool))
				return;
			h = chain_pop(pool);
			h->free_prev->free_next = ss->spare;
			if (!ss->spare)
				ss->spare_last = h->free_prev;
			ss->spare = h;
			ss->n_spare += (unsigned)h->seq;
		}
		return;
	}
	/* Before, eight one at a time: a fresh pool's first allocation then takes them from one
	 * small slab (slab_blocks), where a chain would empty it. */
	while (ss->n_spare < SPARES_LOW) {
		struct sop__block *d = sop__block_new(pool);
		if (!d)
			return;
		atomic_store_explicit(&d->tag, sop__tag(0, SOP_BLOCK_DEAD), memory_order_relaxed);
		d->free_next = ss->spare;
		ss->spare = d;
		spare_pushed(ss);
	}
}

/* At once, as one chain: walking up to SPARES_HIGH descriptors, long out of the cache, took a
 * retirement pass about a microsecond a state under the pool lock, where threads whose tasks
 * each make a stream retire a state per task. */
void
sop__spares_return(struct sop_pool *pool, struct sop__sstream *ss)
{
	SOP_HELD(&pool->lock);
	if (ss->spare) {
		chain_mark(ss->spare, ss->spare_last, ss->n_spare);
		ss->spare_last->free_next = pool->spare;
		pool->spare = ss->spare;
	}
	ss->spare = ss->spare_last = NULL;
	ss->n_spare = 0;
}

struct sop__block *
sop__heap_put(struct sop_pool *pool, struct sop__block *b)
{
	struct sop__segment *seg = b->seg;
	struct sop__block *p, *n;

	SOP_HELD(&pool->lock);
	b->req = 0;
	b->seq = 0;
	sop__segment_lock(seg);
	p = b->phys_prev;
	n = b->phys_next;
	if (n && sop__block_state(n) == SOP_BLOCK_FREE) {
		sop__bins_remove(&pool->heap, n);
		if (sop__block_owner(n) != sop__block_owner(b))
			sop__block_set_owner(b, NULL);
		sop__block_absorb_next(pool, b, NULL);
	}
	if (p && sop__block_state(p) == SOP_BLOCK_FREE) {
		sop__bins_remove(&pool->heap, p);
		if (sop__block_owner(p) != sop__block_owner(b))
			sop__block_set_owner(p, NULL);
		sop__block_absorb_next(pool, p, NULL);
		b = p;
	}
	atomic_store_explicit(&b->tag, sop__tag(b->addr, SOP_BLOCK_FREE), memory_order_release);
	sop__lock_drop(&seg->lock);
	sop__bins_insert(&pool->heap, b);
	if (b->size == seg->mapped)
		seg->home = NULL; /* empty: nobody's until a stream takes memory from it */
	return b;
}
