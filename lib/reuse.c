/* reuse.c - the slow path: which memory a request takes when its stream's cache has no close
 * fit, in the order doc/reuse.md describes: the stream's own cache merged, the heap's best fit,
 * other streams' frees that stream order allows (followed events, probes seen complete, a
 * wait on a probe), growth, and release of what is idle before giving up.
 *
 * Pool lock held, with the stream's lock where a cache is touched; the hot path (stream.c)
 * comes here when it finds nothing of its own.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Merge each of the stream's cached blocks with neighbours that the stream may also use (FREE,
 * or cached on the same stream), so that scattered pieces can serve a larger request. The merged
 * block stays cached on the stream with the latest free among its parts. Pool and stream locks
 * held. */
static void
cache_coalesce(struct sop_pool *pool, struct sop__sstream *ss)
{
	struct sop__block **v, *b, *n;
	size_t cnt, i;

	SOP_HELD(&pool->lock);
	SOP_HELD(&ss->lock);
	v = sop__cache_collect(ss, &cnt);
	for (i = 0; i < cnt; i++) {
		b = v[i];
		if (sop__block_state(b) != SOP_BLOCK_CACHED || sop__block_owner(b) != ss)
			continue; /* absorbed by an earlier one */
		sop__bins_remove(&ss->cache, b);
		sop__segment_lock(b->seg);
		while (b->phys_prev && (sop__block_state(b->phys_prev) == SOP_BLOCK_FREE ||
					(sop__block_state(b->phys_prev) == SOP_BLOCK_CACHED &&
					 sop__block_owner(b->phys_prev) == ss)))
			b = b->phys_prev;
		if (b != v[i]) {
			/* b is the run's first block: it becomes the merged block. */
			if (sop__block_state(b) == SOP_BLOCK_FREE)
				sop__bins_remove(&pool->heap, b);
			else
				sop__bins_remove(&ss->cache, b);
			atomic_store_explicit(&b->tag, sop__tag(b->addr, SOP_BLOCK_CACHED),
					      memory_order_release);
			sop__block_set_owner(b, ss);
			b->seq = b->seq > v[i]->seq ? b->seq : v[i]->seq;
			/* Put v[i] back so the loop below absorbs it like any neighbour. */
			sop__bins_insert(&ss->cache, v[i]);
		}
		while ((n = b->phys_next) && (sop__block_state(n) == SOP_BLOCK_FREE ||
					      (sop__block_state(n) == SOP_BLOCK_CACHED && sop__block_owner(n) == ss))) {
			if (sop__block_state(n) == SOP_BLOCK_FREE) {
				sop__bins_remove(&pool->heap, n);
			} else {
				sop__bins_remove(&ss->cache, n);
				if (n->seq > b->seq)
					b->seq = n->seq;
			}
			sop__block_absorb_next(pool, b, NULL);
		}
		sop__lock_drop(&b->seg->lock);
		sop__bins_insert(&ss->cache, b);
	}
	free(v);
}

/* After a stream had to grow the pool while another held enough memory whose frees were not
 * known complete, the next STARVED_COVER frees of large blocks get a probe at once each, so
 * that a stream short of memory can learn that they completed (flush_observed) rather than
 * grow the pool again (replaying a training step on three streams, the loader's next batch
 * found the compute stream's frees uncovered for want of a probe). A stream that keeps
 * starving others keeps them covered; one that never does again stops paying for the probes.
 * A small free waits for the next probe, which costs about as much as it does. */
#define STARVED_COVER 256

/* Before growing for size bytes (or, in a host pool, taking a loose fit for them): if another
 * stream holds that much memory not known complete, cover the next frees of large blocks (in a
 * host pool, of SOP_HOST_POLL_MIN and up). Pool lock held. */
static void
note_starved(struct sop_pool *pool, struct sop__sstream *ss, size_t size)
{
	if (sop__others_cache(pool, ss, size))
		atomic_store_explicit(&pool->starved, STARVED_COVER, memory_order_relaxed);
}

/* A block cached on o of at least size bytes whose free is covered by epoch (seq <= epoch;
 * UINT64_MAX: any), looking at no more than a bounded number of candidates. Both locks held. */
#define CROSS_PROBES 32

static struct sop__block *
cache_find_covered(struct sop__sstream *o, size_t size, uint64_t epoch)
{
	struct sop__block *b = sop__bins_find(&o->cache, size);
	unsigned fl, sl, n = 0;

	if (!b)
		return NULL;
	/* Walk from the first fitting list onwards: every block there fits. */
	sop__bins_index(b->size, &fl, &sl);
	for (; fl < SOP_FL_COUNT && n < CROSS_PROBES; fl++, sl = 0) {
		if (!(o->cache.fl_bitmap >> fl & 1))
			continue;
		for (; sl < SOP_SL_COUNT && n < CROSS_PROBES; sl++)
			for (b = o->cache.head[fl][sl]; b && n < CROSS_PROBES; b = b->free_next, n++)
				if (b->size >= size && b->seq <= epoch)
					return b;
	}
	return NULL;
}

/* Take b out of o's cache for another stream; the caller carves it (the rest stays pending on
 * o). o's lock held and dropped here. */
static struct sop__block *
cache_take(struct sop__sstream *o, struct sop__block *b)
{
	sop__bins_remove(&o->cache, b);
	sop__block_set_owner(b, NULL);
	sop__lock_drop(&o->lock);
	return b;
}

/* The epoch of s in a clock, 0 if s is not in it. */
static uint64_t
clock_epoch(const struct sop__clock *c, const struct sop__stream *s)
{
	unsigned i;

	for (i = 0; i < c->n; i++)
		if (c->e[i].gen == s->gen)
			return c->e[i].epoch;
	return 0;
}

/* Follow event dependencies: memory freed on another stream whose free the allocating stream is
 * ordered after. Only the streams in this stream's clocks are looked at (a stream that waited on
 * nothing costs one load here, whatever the number of streams). What events carry is a claim
 * (order.c): a block is taken under one only after this stream waited for a probe of the other
 * that covers the free (sop__stream_wait_for), which the GPU finds already passed when the claim
 * is true; a proven dependency needs no new wait. Pool lock held; stream names ss's stream. */
static struct sop__block *
take_followed(struct sop_pool *pool, struct sop__sstream *ss, CUstream stream, size_t size,
	      size_t limit, struct sop__sstream **from)
{
	struct sop__clock deps, claims;
	struct sop__sstream *o;

	sop__stream_order(ss->st, &deps, &claims);
	if (!deps.n && !claims.n)
		return NULL;
	for (o = pool->streams; o; o = o->next) {
		uint64_t proven, claim;
		struct sop__block *b;

		if (o == ss)
			continue;
		proven = clock_epoch(&deps, o->st);
		claim = clock_epoch(&claims, o->st);
		if (!proven && !claim)
			continue;
		sop__lock_take(&o->lock);
		b = o->cache.n_bytes >= size
			    ? cache_find_covered(o, size, proven > claim ? proven : claim)
			    : NULL;
		if (b && b->size <= limit &&
		    (b->seq <= proven ||
		     sop__stream_wait_for(ss->st, stream, o->st, b->seq) == CUDA_SUCCESS)) {
			*from = o;
			return cache_take(o, b);
		}
		sop__lock_drop(&o->lock);
	}
	return NULL;
}

/* Whether o's cache holds a block a request of size bytes would take whole. */
static bool
cache_has_close(struct sop__sstream *o, size_t size)
{
	bool has;

	sop__lock_take(&o->lock);
	has = sop__bins_find_close(&o->cache, size, sop__close_limit(size)) != NULL;
	sop__lock_drop(&o->lock);
	return has;
}

/* How many streams a request with a loose fit asks (flush_observed), and how long after such
 * a request asked in vain the next one does not ask. */
#define CLOSE_POLLS 2
#define CLOSE_POLL_GAP_NS 100000

/* Opportunistic: ask the probes of the other streams holding cached memory what has completed,
 * and give what has to the heap. With close (a request that has a fit, only a loose one, looking
 * for a block it would take whole), only streams holding such a block are asked, at most
 * CLOSE_POLLS of them, and not at all within CLOSE_POLL_GAP_NS of such a request that found
 * nothing: a query of a running stream costs more than the allocation it serves, and when many
 * streams each start with such a request (say after a synchronization, while the others' first
 * kernels run), asking every time delays every stream's next launch (sixteen streams of 64 MiB
 * blocks ran at 1.07 of the ideal wall time with every request asking, 1.01 with none). Pool
 * lock held. Returns true if anything moved. */
/* Whether flush_observed, for ss and close (0: no fit at all), asks o. Pool lock held. */
static bool
asks(struct sop__sstream *ss, struct sop__sstream *o, size_t close)
{
	return o != ss && sop__sstream_cached(o) && (!close || cache_has_close(o, close));
}

static bool
flush_observed(struct sop_pool *pool, struct sop__sstream *ss, size_t close)
{
	struct sop__sstream *o;
	bool moved = false;
	int asked = 0;
	uint64_t t = 0;

	SOP_HELD(&pool->lock);
	if (close) {
		t = sop__now_ns();
		if (t < pool->loose_poll_ns)
			return false;
	}
	for (o = pool->streams; o; o = o->next) {
		uint64_t done;

		if ((close && asked == CLOSE_POLLS) || !asks(ss, o, close))
			continue;
		asked++;
		done = sop__stream_poll(o->st);
		if (done && sop__sstream_flush(o, done))
			moved = true;
	}
	if (close && asked && !moved)
		pool->loose_poll_ns = t + CLOSE_POLL_GAP_NS;
	return moved;
}

/* Internal dependencies: memory whose free is still pending on another stream, taken by making
 * the allocating stream wait for a probe recorded after the free. Pool lock held. */
static struct sop__block *
take_with_wait(struct sop_pool *pool, struct sop__sstream *ss, CUstream stream, size_t size,
	       struct sop__sstream **from)
{
	struct sop__sstream *o;

	SOP_HELD(&pool->lock);
	for (o = pool->streams; o; o = o->next) {
		struct sop__block *b;
		uint64_t newest;

		if (o == ss || sop__sstream_cached(o) < size)
			continue;
		newest = atomic_load(&o->st->newest);
		if (!newest)
			continue;
		sop__lock_take(&o->lock);
		b = cache_find_covered(o, size, newest);
		if (!b) {
			/* The pieces may fit once joined. */
			cache_coalesce(pool, o);
			b = cache_find_covered(o, size, newest);
		}
		if (b && sop__stream_wait_for(ss->st, stream, o->st, b->seq) == CUDA_SUCCESS) {
			*from = o;
			return cache_take(o, b);
		}
		sop__lock_drop(&o->lock);
	}
	return NULL;
}

/* Flush what the stream's probes have newly seen complete. Pool lock held. */
static void
own_flush(struct sop__sstream *ss)
{
	uint64_t done = sop__stream_poll(ss->st);

	if (done > ss->flushed) {
		sop__sstream_flush(ss, done);
		ss->flushed = done;
	}
}

/* Whether learning what has completed may turn up a closer fit for a request of close bytes
 * than the loose one in hand: this stream's probes have news, or, with the opportunistic
 * policy, flush_observed would ask another stream. Otherwise the fit in hand is kept, not put
 * back and looked for again. Pool lock held. */
static bool
worth_asking(struct sop_pool *pool, struct sop__sstream *ss, size_t close)
{
	struct sop__sstream *o;

	if (sop__stream_poll(ss->st) > ss->flushed)
		return true;
	if (!atomic_load(&pool->reuse_opportunistic) || sop__now_ns() < pool->loose_poll_ns)
		return false;
	for (o = pool->streams; o; o = o->next)
		if (asks(ss, o, close))
			return true;
	return false;
}

/* Return a block best_take took, unused, to the bins it came from. Pool lock held. */
static void
put_back(struct sop_pool *pool, struct sop__block *b, struct sop__sstream *from)
{
	if (from) {
		sop__lock_take(&from->lock);
		sop__block_set_owner(b, from);
		sop__bins_insert(&from->cache, b);
		sop__lock_drop(&from->lock);
	} else {
		sop__bins_insert(&pool->heap, b);
	}
}

/* Take b out of the stream's cache for the slow path: without an owner until it is handed out
 * or put back. Stream lock held. */
static struct sop__block *
cache_remove(struct sop__sstream *ss, struct sop__block *b)
{
	sop__bins_remove(&ss->cache, b);
	sop__block_set_owner(b, NULL);
	return b;
}

/* A segment may have become ss's (struct sop__sstream). Pool lock held. */
static void
may_home(struct sop__sstream *ss)
{
	atomic_store_explicit(&ss->may_home, true, memory_order_relaxed);
}

/* Requests up to this size take heap memory from the stream's own segments first; larger ones
 * take the best fit wherever it is, since for them placement is what keeps the pool small. */
#define HOME_MAX ((size_t)8 << 20)
/* How many heap blocks the search for the stream's own looks at. */
#define HOME_PROBES 64
/* What a stream adopts of a larger segment of nobody's: what one growth of a segment of its own
 * would map once threads have met (growth_step, grow.c), cut off where the rest can stay
 * nobody's (sop__segment_adopt). Adopted whole, a segment that threads gone before had left
 * was the first new stream's, however little of it that one used, and the streams after it
 * grew their own beside its free memory: sixteen threads arriving one by one reserved 1.218-
 * 1.237 times their live peak on the driver's operations on an H200, 1.169-1.176 in parts (the
 * driver's pool 1.081-1.110), at the same rate (bench/results/2026-11-28-h200-adopt-part-ab/). */
#define ADOPT_PART SOP_OWN_STEP

static bool
pick_own(const struct sop__block *b, const void *ss)
{
	return b->seg->home == ss;
}

static bool
pick_nobodys(const struct sop__block *b, const void *ss)
{
	(void)ss;
	return !b->seg->home;
}

/* The heap's block for a request of ss, left in the heap: the best fit, or, for a small request
 * once threads have met in the pool, a block in a segment of ss's own, or of nobody's (which
 * becomes ss's, or the part of it around the block does: sop__segment_adopt). *crowded: the
 * block returned is in another stream's segment, which the caller should grow a segment of its
 * own rather than take. Pool lock held. */
static struct sop__block *
heap_pick(struct sop_pool *pool, struct sop__sstream *ss, size_t size, bool *crowded)
{
	struct sop__block *b = sop__split_fit(pool, &pool->heap, size), *h;
	unsigned own = HOME_PROBES, nobodys = HOME_PROBES;

	SOP_HELD(&pool->lock);
	*crowded = false;
	if (!b || b->seg->home == ss || size > HOME_MAX ||
	    !atomic_load_explicit(&pool->threads_met, memory_order_relaxed))
		return b;
	h = sop__bins_scan(&pool->heap, size, &own, pick_own, ss);
	if (!h && (h = sop__bins_scan(&pool->heap, size, &nobodys, pick_nobodys, ss))) {
		h = sop__segment_adopt(pool, h, size, ADOPT_PART, ss);
		may_home(ss);
	}
	if (h)
		return h;
	/* Only another stream's, as far as the search went. Once threads meet in the pool,
	 * sharing a segment with a stream that may be on another thread costs every split and
	 * merge of both a contended lock: if the search saw every candidate, growing is better. */
	*crowded = own && nobodys;
	return b;
}

/* The better of the fits in the stream's cache and in the heap (heap_pick): the smaller, or,
 * where sop__split_fit looks for low addresses, the lower; but a heap fit in another stream's
 * segment (crowded) never beats one in the cache, which is the stream's own memory already and
 * costs no growth. Taken out of its bins; *from says which (NULL: the heap). Pool lock held. */
static struct sop__block *
best_take_locked(struct sop_pool *pool, struct sop__sstream *ss, size_t size,
		 struct sop__sstream **from, bool *crowded)
{
	struct sop__block *mine, *any = heap_pick(pool, ss, size, crowded);
	bool low = sop__place_low(pool, size);

	SOP_HELD(&pool->lock);
	SOP_HELD(&ss->lock);
	mine = sop__split_fit(pool, &ss->cache, size);
	/* Were the crowded fit to win on size, the caller would grow rather than take it, while
	 * this fit stayed in the cache: the memory taken from the new piece comes back to the
	 * cache when freed, and the next request with a tighter heap fit in another stream's
	 * segment grows again (two threads on their own streams, 300 MiB live, reserved 5-14 GiB
	 * after a second on the H100). */
	if (mine &&
	    (!any || *crowded || (low ? mine->addr <= any->addr : mine->size <= any->size))) {
		cache_remove(ss, mine);
		*from = ss;
		*crowded = false;
		return mine;
	}
	if (any)
		sop__bins_remove(&pool->heap, any);
	*from = NULL;
	return any;
}

static struct sop__block *
best_take(struct sop_pool *pool, struct sop__sstream *ss, size_t size, struct sop__sstream **from,
	  bool *crowded)
{
	struct sop__block *b;

	sop__lock_take(&ss->lock);
	b = best_take_locked(pool, ss, size, from, crowded);
	sop__lock_drop(&ss->lock);
	return b;
}

/* Whether a segment of a stream's own, grown rather than share free memory in another's, keeps
 * the pool within twice its live memory: a pool whose streams come and go (threads that each
 * bring a stream, a stream per task) would otherwise hold a segment per stream seen lately,
 * 20 steps for 32 MiB live on the simulated driver, while the memory they give back lies in
 * segments that their successors do not count as theirs. And only while the pool's used memory
 * is at its high-water mark (as last folded, at a synchronization or a read of the attribute):
 * below it, the pool held as much live memory before in what it reserves now, and a growth for
 * affinity only adds to it. Streams of tasks, whose states come and go below that mark, grew
 * for affinity to 1.60-1.74 times their live peak at four threads on an H200 (the driver's
 * exact operations; its pool: 1.33), and with the mark to 1.42-1.53, at the same rate
 * (bench/results/2026-11-29-h200-affinity-below-high-ab/). Pool lock held, no stream's lock. */
static bool
affinity_affordable(struct sop_pool *pool)
{
	uint64_t used = sop__pool_used(pool, SOP_FOLD_NONE);

	return atomic_load_explicit(&pool->reserved, memory_order_relaxed) <= 2 * used &&
	       used >= pool->used_high;
}

/* Whether ss should grow a segment of its own rather than take free memory in another stream's
 * (affinity_affordable), which only pays for a stream whose splits and merges would contend:
 * not for one paced slow (order.c, sop__stream_pace), which frees every hundred microseconds
 * or less often. CuPy tasks that each bring a stream, at Python's pace, grew for affinity in
 * 17 of their 22 growths at eight threads on an H200, while the other streams held memory
 * whose probes had not yet shown it complete; without those growths, and with every free of
 * a slow stream probed (order.c, PACE_FREES), they hold what the driver's pool holds
 * (bench/results/2026-11-29-h200-tasks-affinity/). Pool lock held. */
static bool
affinity_pays(struct sop_pool *pool, struct sop__sstream *ss)
{
	return !sop__stream_slow(ss->st) && affinity_affordable(pool);
}

/* Once threads meet in a pool, every request a stream's cache cannot serve takes the pool lock,
 * and a stream that starts empty (a new one, or one whose frees a synchronization gave back)
 * takes it for each of its first requests: sixteen threads whose tasks each make a stream spent
 * half their time waiting for it on the H100, and ran slower together than one thread alone.
 * So a small request served from the heap there takes up to SOP_REFILL bytes in all, the rest
 * going to the stream's cache, where its next requests split it without the pool lock. The rest
 * has nothing pending: a synchronization or an idle pass gives it back to the heap like any
 * completed free. Never in a pool with a maxSize or under pressure, where memory some stream
 * holds could decide whether another's request fails, nor in a compacting one, which places
 * small requests low on purpose. 8 MiB: a task then takes the lock about 6 times, not 15 as
 * with 2 MiB, which pays only where its stream gets one probe (order.c, count_probe_due): with
 * five, the driver's stream creation and destruction took what the lock gave back. Pool lock
 * and ss's lock held. */
#define SOP_REFILL ((size_t)8 << 20)

static size_t
refill_keep(struct sop_pool *pool, const struct sop__sstream *ss, const struct sop__block *b,
	    size_t size)
{
	size_t keep;

	if (size >= SOP_REFILL || ss->cache.n_bytes >= SOP_REFILL || pool->max_size ||
	    !atomic_load_explicit(&pool->threads_met, memory_order_relaxed) ||
	    atomic_load_explicit(&pool->pressure, memory_order_relaxed) ||
	    atomic_load_explicit(&pool->compact, memory_order_relaxed))
		return 0;
	keep = SOP_REFILL - size;
	if (keep > b->size - size)
		keep = b->size - size;
	return keep / SOP_ALIGN * SOP_ALIGN;
}

/* Whether other streams' completed frees, once in the heap, may serve a request of size bytes:
 * not a small one once threads have met, while the pool can grow by the rule of segment
 * affinity, for they lie in those streams' segments and the request grows rather than share
 * them. Asked then, the other streams only lost their cached memory to the heap, where their
 * hot paths no longer find it: with growth's driver calls out of the pool lock, slow paths ran
 * while others grew and flushed twice as often, and threads that start together held 1.30-1.34
 * times their live peak, against 1.22-1.26 without asking (simulated driver, SOP_SIM_VMM_US of
 * 20); on the H100, at two to eight threads, 1.35-1.41 against 1.29-1.31. Pool lock held. */
static bool
others_may_serve(struct sop_pool *pool, size_t size)
{
	return size > HOME_MAX || !atomic_load_explicit(&pool->threads_met, memory_order_relaxed) ||
	       !affinity_affordable(pool);
}

static CUresult alloc_slow_relaxed(struct sop_pool *pool, struct sop__sstream *ss, uint64_t id,
				   CUstream stream, size_t size, size_t req, void **ptr);

CUresult
sop__alloc_slow(struct sop_pool *pool, struct sop__sstream *ss, uint64_t id, CUstream stream,
		size_t size, size_t req, void **ptr)
{
	/* Growth, release, probe queries and waits are sop's own calls: relaxed, so that none
	 * invalidates a capture in global mode running in another thread. */
	int token = sop__capture_relax_lazy();
	CUresult r = alloc_slow_relaxed(pool, ss, id, stream, size, req, ptr);
	sop__capture_restore_lazy(token);
	return r;
}

/* What the pool may reserve before growth for size bytes moves idle pieces rather than adds
 * to them (grow.c): SOP_MOVE_PAST_TENTHS tenths of its live memory with the request, and at
 * least its high-water mark (CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH). A move costs driver time to
 * keep the pool from holding more; below what it held before, that buys nothing its peak
 * shows, and a warm pool of random sizes up to 1 GiB, moving whenever past 1.3 times, moved
 * 0.15 pieces an operation and ran at 0.1 M operations a second on the H100 (the driver's
 * pool: 0.01). Pool lock held. */
static uint64_t
roomy(struct sop_pool *pool, size_t size)
{
	uint64_t live = (sop__pool_used(pool, SOP_FOLD_NONE) + size) * SOP_MOVE_PAST_TENTHS / 10;
	uint64_t high = atomic_load(&pool->reserved_high);

	return live > high ? live : high;
}

/* Whether a request about to grow should first learn if its stream's own frees have completed,
 * to have them in the heap (step 3 below). In a compacting pool, always. Elsewhere, only for a
 * request larger than a piece (SOP_PIECE_MAX) in a pool whose pieces move, once growth would
 * pass roomy(): its growth maps several pieces, and the stream's completed frees, merged in the
 * heap, may hold idle ones to move there. Random sizes up to 1 GiB, where a stream kept its
 * frees cached, reserved 1.50 times their live peak; flushed for such requests, 1.29-1.50
 * (simulated driver). Flushed for every request that grows, the replayed inference trace
 * reserved 1.72-1.77 times its peak instead of 1.33: the stream's small requests then came from
 * the heap's best fit instead of its cache, and its large blocks no longer lay next to the holes
 * its later growths joined them from. Pool lock held. */
static bool
flush_pays(struct sop_pool *pool, size_t size)
{
	if (atomic_load_explicit(&pool->compact, memory_order_relaxed))
		return true;
	return size > SOP_PIECE_MAX && sop__pieces_move(pool) &&
	       atomic_load(&pool->reserved) + size > roomy(pool, size);
}

/* Growth; or, where it waited for another thread's growth (sop__heap_grow), what that left
 * in the heap, if it fits, before growing again: by the rule of segment affinity, as if the
 * request had come after that growth (a fit in another stream's segment only while growth
 * would take the pool past twice its live memory). Taking such fits after every wait made
 * sixteen threads that start together on a fresh pool share their segments' locks, and run
 * at a fifth of their rate on the H100. */
static CUresult
grow_or_find(struct sop_pool *pool, struct sop__sstream *ss, size_t size, struct sop__block **b,
	     struct sop__sstream **from)
{
	CUresult r;
	bool crowded;

	while ((r = sop__heap_grow(pool, ss, size, roomy(pool, size), b, from)) ==
	       CUDA_ERROR_NOT_READY) {
		*b = best_take(pool, ss, size, from, &crowded);
		if (*b && (!crowded || !affinity_pays(pool, ss))) {
			sop__growth_pass(pool);
			return CUDA_SUCCESS;
		}
		if (*b)
			put_back(pool, *b, *from);
	}
	return r;
}

static CUresult
alloc_slow_relaxed(struct sop_pool *pool, struct sop__sstream *ss, uint64_t id, CUstream stream,
		   size_t size, size_t req, void **ptr)
{
	struct sop__sstream *from = NULL;
	struct sop__block *b = NULL;
	CUresult r = CUDA_SUCCESS;
	bool stale = false, crowded = false;

	sop__pool_lock_noting(pool);
	if (atomic_load(&pool->dead)) {
		/* Torn down since the caller found it: nothing to allocate from, or to grow. */
		sop__mutex_drop(&pool->lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	sop__lock_take(&ss->lock);
	stale = ss->id != id;
	if (!stale) {
		sop__spares_balance(pool, ss);
		b = best_take_locked(pool, ss, size, &from, &crowded);
	}
	sop__lock_drop(&ss->lock);
	if (stale) {
		sop__mutex_drop(&pool->lock);
		return CUDA_ERROR_NOT_FOUND; /* caller looks the stream up again */
	}
	sop__stream_pace(ss->st);
	/* 1. The best fit among the blocks this stream may use: what it freed itself (safe for it
	 * whatever else is pending), the heap (safe for anyone), and, with the follow policy,
	 * what other streams freed before an event this stream waited on. The driver's pool
	 * appears to choose the same way: a block of the right size just freed beats fresh space.
	 * If none fits closely and the request is large (small ones carve free space without
	 * asking), or if nothing fits at all, first learn what has completed (it costs queries):
	 * frees that probes have seen complete go to the heap, where they merge with their free
	 * neighbours and whole segments become free to reshape; this stream's own, and, with the
	 * opportunistic policy, other streams'. */
	if (!b ||
	    (b->size > sop__close_limit(size) && size >= sop__poll_min(pool) &&
	     worth_asking(pool, ss, size))) {
		size_t close = b ? size : 0;

		if (b)
			put_back(pool, b, from);
		own_flush(ss);
		if (atomic_load(&pool->reuse_opportunistic) && others_may_serve(pool, size))
			flush_observed(pool, ss, close);
		b = best_take(pool, ss, size, &from, &crowded);
		/* A host pool's CPU fills what it allocates: a loose fit from memory that went
		 * cold, while other streams hold close fits not known complete, makes their next
		 * frees get a probe each, so that the next request finds the one freed last. */
		if (pool->host && b && b->size > sop__close_limit(size))
			note_starved(pool, ss, size);
	}
	/* Free memory in another stream's segment, once threads meet in the pool: a segment of
	 * this stream's own, if the pool can grow, costs a step of memory once and keeps this
	 * thread's splits and merges off the other's lock from then on; not once that would take
	 * the pool past twice its live memory, nor for a slow stream (affinity_pays). */
	if (b && crowded && affinity_pays(pool, ss)) {
		/* Back first: growth may join the new memory with it. */
		put_back(pool, b, from);
		may_home(ss); /* growth homes new segments */
		if (grow_or_find(pool, ss, size, &b, &from) != CUDA_SUCCESS)
			b = best_take(pool, ss, size, &from, &crowded);
	}
	if (atomic_load(&pool->reuse_follow)) {
		struct sop__sstream *o = NULL;
		struct sop__block *f = take_followed(pool, ss, stream, size, b ? b->size : SIZE_MAX, &o);
		if (f) {
			if (b)
				put_back(pool, b, from);
			b = f;
			from = o;
		}
	}
	/* 2. Failing all of those, the stream's pieces joined with their free neighbours. */
	if (!b) {
		sop__lock_take(&ss->lock);
		if (ss->cache.n_bytes >= size) {
			cache_coalesce(pool, ss);
			b = sop__bins_find(&ss->cache, size);
			if (b) {
				cache_remove(ss, b);
				from = ss;
			}
		}
		sop__lock_drop(&ss->lock);
	}
	/* 3. Before paying for growth, learn whether the stream's own pending frees have
	 * completed: one query of the stream, against a growth's tens of microseconds. If its
	 * work is done, they go to the heap, where they merge with their free neighbours into a
	 * fit, or become idle pieces that the growth moves or gives back instead of adding to
	 * them (only memory known complete may be unmapped). Else leave a probe on this stream,
	 * so that the next time its pending frees can be known complete, merged and reshaped
	 * (step 1). Where that pays: flush_pays. */
	if (!b) {
		uint64_t last;
		sop__lock_take(&ss->lock);
		last = ss->cache.n_blocks ? ss->last_seq : 0;
		sop__lock_drop(&ss->lock);
		if (last && flush_pays(pool, size) && sop__stream_query(ss->st, stream) >= last) {
			own_flush(ss);
			b = best_take(pool, ss, size, &from, &crowded);
		} else if (last) {
			sop__stream_probe(ss->st, stream, last);
		}
	}
	/* 4. Before a slow stream grows (order.c, sop__stream_pace), where step 1 did not ask
	 * them (others_may_serve): other streams' frees that their probes show complete, which
	 * the driver's pool would hand it, wherever they lie. Streams that allocate at the pace of
	 * Python, or between kernels they wait for, fight over no lock in a shared segment; their
	 * pending frees were what their pool held beyond the driver's. Hot streams grow instead
	 * (others_may_serve says why). */
	if (!b && atomic_load(&pool->reuse_opportunistic) && sop__stream_slow(ss->st) &&
	    !others_may_serve(pool, size) && flush_observed(pool, ss, 0))
		b = best_take(pool, ss, size, &from, &crowded);
	/* 5. More physical memory, next to free memory where that maps less, in place of idle
	 * pieces too small or too scattered to serve the request. */
	if (!b) {
		note_starved(pool, ss, size);
		may_home(ss);
		r = grow_or_find(pool, ss, size, &b, &from);
		/* Growth failed (maxSize, a memory limit, the device full): other streams' frees
		 * that their probes show complete, which a request that can grow leaves in their
		 * caches (others_may_serve), may serve it, as they would the driver's pool. */
		if (r == CUDA_ERROR_OUT_OF_MEMORY && atomic_load(&pool->reuse_opportunistic) &&
		    flush_observed(pool, ss, 0) &&
		    (b = best_take(pool, ss, size, &from, &crowded)) != NULL)
			r = CUDA_SUCCESS;
		if (r == CUDA_ERROR_OUT_OF_MEMORY && atomic_load(&pool->reserved)) {
			/* 6. Idle pieces given back to make room for one that fits. */
			if (sop__heap_release(pool, 0, 0) == CUDA_SUCCESS)
				r = grow_or_find(pool, ss, size, &b, &from);
		}
		if (r != CUDA_SUCCESS)
			b = NULL;
		if (r == CUDA_ERROR_OUT_OF_MEMORY) {
			atomic_store(&pool->pressure, true);
		}
	}
	/* 7. Memory still pending on another stream, with a wait inserted. */
	if (!b && r == CUDA_ERROR_OUT_OF_MEMORY && atomic_load(&pool->reuse_internal))
		b = take_with_wait(pool, ss, stream, size, &from);
	if (b) {
		if (!from)
			atomic_store_explicit(&pool->heap_user, ss, memory_order_relaxed);
		/* Under ss's lock (the used-memory shard), which the carve also needs if b was
		 * ss's; another stream's lock is never taken while holding it. */
		if (from && from != ss) {
			sop__block_carve(pool, b, size, from, false);
			sop__lock_take(&ss->lock);
		} else {
			size_t keep;
			sop__lock_take(&ss->lock);
			if (!from && (keep = refill_keep(pool, ss, b, size)) != 0)
				sop__block_carve_refill(pool, b, size, keep, ss);
			else
				sop__block_carve(pool, b, size, from, true);
		}
		sop__block_hand_out(ss, b, req, ptr);
		sop__lock_drop(&ss->lock);
		r = CUDA_SUCCESS;
	} else if (r == CUDA_SUCCESS) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	sop__mutex_drop(&pool->lock);
	return r;
}
