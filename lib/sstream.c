/* sstream.c - a pool's stream states: the blocks freed on each stream that only it may reuse
 * yet, the stream's used-memory shard, and the life of a state: found or made, flushed to the
 * heap when its frees are known complete, retired when idle, freed with the pool.
 *
 * A state is reached through the thread-local cache of stream.c, which retirement keeps honest
 * through the pool's states_gen; a retired state is freed once no call can be reading it
 * (epoch.c).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- Stream states ---------------------------------------------------------------------- */

struct sop__sstream *
sop__sstream_find(struct sop_pool *pool, uint64_t id)
{
	struct sop__sstream *ss;

	for (ss = pool->streams; ss; ss = ss->next)
		if (ss->id == id)
			return ss;
	return NULL;
}

/* Zeroed memory for a state, made before the pool lock is taken: a state is nearly 10 KiB
 * (its cache's bins), and clearing it under the lock cost every other thread whose tasks each
 * make a stream the wait. NULL without host memory. */
static struct sop__sstream *
sstream_alloc(void)
{
	struct sop__sstream *ss = aligned_alloc(_Alignof(struct sop__sstream), sizeof *ss);

	if (ss) {
		memset(ss, 0, sizeof *ss);
		sop__lock_init(&ss->lock, SOP_RANK_STATE);
	}
	return ss;
}

/* ss, from sstream_alloc, becomes the state for the stream with this id, holding its record.
 * Pool lock held. */
static struct sop__sstream *
sstream_new(struct sop_pool *pool, uint64_t id, struct sop__stream *st, struct sop__sstream *ss)
{
	if (pool->n_streams >= pool->retire_at)
		sop__sstream_retire_idle(pool);
	ss->pool = pool;
	ss->id = id;
	ss->st = st;
	ss->active = true; /* about to be used: not for the next retirement pass */
	ss->next = pool->streams;
	/* The record names the pool before any thread can find the state: a free another thread
	 * makes in it as soon as it is published (sop__sstream_find_unlocked), then a
	 * synchronization of the stream, finds the pool concerned (sync.c, sync_concerns). */
	sop__stream_pool_add(st, pool->handle);
	__atomic_store_n(&pool->streams, ss, __ATOMIC_RELEASE); /* sop__sstream_find_unlocked */
	__atomic_store_n(&pool->n_streams, pool->n_streams + 1, __ATOMIC_RELAXED);
	return ss;
}

/* Each idle pass that retires a state makes every thread look its own states up again
 * (states_gen), and sixteen threads whose tasks each make a stream did that under the pool lock
 * nearly once a task on the H100, walking states whose lines their threads were writing. A
 * state retired while this walks keeps its memory until the call returns (pinned); one
 * unlinked meanwhile may lead the walk into the retired ones, whose id is 0, and a state it
 * misses is found under the lock. The caller checks the id under the state's lock, as for an
 * entry of the thread's cache. */
struct sop__sstream *
sop__sstream_find_unlocked(struct sop_pool *pool, uint64_t id)
{
	struct sop__sstream *ss;

	for (ss = __atomic_load_n(&pool->streams, __ATOMIC_ACQUIRE); ss;
	     ss = __atomic_load_n(&ss->next, __ATOMIC_ACQUIRE))
		if (__atomic_load_n(&ss->id, __ATOMIC_RELAXED) == id)
			return ss;
	return NULL;
}

/* The pool's state for the stream with this id, made if the pool has none. Pinned. */
CUresult
sop__sstream_lookup(struct sop_pool *pool, CUstream stream, uint64_t id,
		    struct sop__stream_ref *out)
{
	struct sop__stream *st;
	struct sop__sstream *ss, *fresh;
	CUresult r;

	if (!atomic_load(&pool->dead) && (ss = sop__sstream_find_unlocked(pool, id))) {
		out->ss = ss;
		out->id = id;
		return CUDA_SUCCESS;
	}
	r = sop__stream_of(stream, id, true, &st); /* the state will hold it */
	if (r != CUDA_SUCCESS)
		return r;
	fresh = sstream_alloc();
	sop__pool_lock_noting(pool); /* a stream's first request: where threads meet first */
	if (atomic_load(&pool->dead)) {
		/* Torn down since the caller found it (epoch.c keeps it readable): no new state. */
		sop__mutex_drop(&pool->lock);
		sop__stream_release(st);
		free(fresh);
		return CUDA_ERROR_INVALID_VALUE;
	}
	ss = sop__sstream_find(pool, id);
	if (!ss && fresh) {
		ss = sstream_new(pool, id, st, fresh);
		fresh = NULL;
	} else {
		sop__stream_release(st);
	}
	sop__mutex_drop(&pool->lock);
	free(fresh);
	if (!ss)
		return CUDA_ERROR_OUT_OF_MEMORY;
	out->ss = ss;
	out->id = id;
	return CUDA_SUCCESS;
}

void
sop__sstream_disown(struct sop_pool *pool, struct sop__sstream *ss, size_t used)
{
	SOP_HELD(&pool->lock);
	if (sop__segments_disown(pool, ss, used))
		atomic_store_explicit(&ss->may_home, false, memory_order_relaxed);
}

/* Every cached block of a stream, gathered so the caller may change the bins while it walks.
 * Lock held. NULL with *n = 0 when there is none or no host memory (callers then do less). */
struct sop__block **
sop__cache_collect(struct sop__sstream *ss, size_t *n)
{
	struct sop__block **v, *b;
	unsigned fl, sl;
	size_t k = 0;

	*n = 0;
	if (!ss->cache.n_blocks)
		return NULL;
	v = malloc(ss->cache.n_blocks * sizeof *v);
	if (!v)
		return NULL;
	for (fl = 0; fl < SOP_FL_COUNT; fl++) {
		if (!(ss->cache.fl_bitmap >> fl & 1))
			continue;
		for (sl = 0; sl < SOP_SL_COUNT; sl++)
			for (b = ss->cache.head[fl][sl]; b; b = b->free_next)
				v[k++] = b;
	}
	*n = k;
	return v;
}

size_t
sop__sstream_flush(struct sop__sstream *ss, uint64_t epoch)
{
	struct sop_pool *pool = ss->pool;
	struct sop__block **v;
	size_t n, i, moved = 0;

	SOP_HELD(&ss->pool->lock);
	sop__lock_take(&ss->lock);
	v = sop__cache_collect(ss, &n);
	for (i = 0; i < n; i++) {
		if (v[i]->seq > epoch)
			continue;
		sop__bins_remove(&ss->cache, v[i]);
		/* heap_put may merge v[i] into a FREE neighbour; no other entry of v is FREE. */
		sop__heap_put(pool, v[i]);
		moved++;
	}
	sop__lock_drop(&ss->lock);
	free(v);
	return moved;
}

static void
sstream_free(struct sop__retired *r)
{
	free((char *)r - offsetof(struct sop__sstream, retired));
}

void
sop__sstream_retire_idle(struct sop_pool *pool)
{
	struct sop__sstream **pp = &pool->streams, *ss, *retired = NULL;
	struct sop__segment *seg;

	SOP_HELD(&pool->lock);
	while ((ss = *pp)) {
		bool gone = atomic_load_explicit(&ss->gone, memory_order_relaxed), idle, cached;

		sop__lock_take(&ss->lock);
		idle = !ss->active;
		cached = ss->cache.n_blocks != 0;
		sop__lock_drop(&ss->lock);
		/* What an idle stream holds, as far as its probes show its frees complete, goes to
		 * the heap: a stream that was destroyed without sop knowing (busy, or with frees the
		 * program never synchronized) would otherwise keep it until the context is
		 * synchronized. A stream known to be gone can never reuse it itself, whatever the
		 * policies; an idle live one gives it up only with the opportunistic policy. */
		/* A gone stream's segments are nobody's: others may take their free memory. */
		if (gone)
			sop__sstream_disown(pool, ss, 0);
		/* Memory a refill gave the stream has nothing pending (seq 0): it goes whatever
		 * the probes say. */
		if (cached && (gone || (idle && atomic_load(&pool->reuse_opportunistic)))) {
			uint64_t done = sop__stream_poll(ss->st);
			sop__sstream_flush(ss, done);
			if (done > ss->flushed)
				ss->flushed = done;
		}
		sop__lock_take(&ss->lock);
		/* Only a state with nothing cached, nothing allocated on it (a live block names it
		 * for its used memory), no request waiting for growth, and idle since the last
		 * pass goes, or sooner once its stream is known to be gone: one in use would be
		 * looked up again at once, and threads would chase it. */
		if (ss->cache.n_blocks || sop__sstream_used(ss) || ss->growing ||
		    (ss->active && !gone)) {
			ss->active = false;
			sop__lock_drop(&ss->lock);
			pp = &ss->next;
			continue;
		}
		__atomic_store_n(&ss->id, 0, __ATOMIC_RELAXED);
		sop__spares_return(pool, ss);
		/* Its high since the last fold, for USED_MEM_HIGH (sop__pool_used). */
		pool->retired_hw += ss->used_hw;
		sop__lock_drop(&ss->lock);
		__atomic_store_n(pp, ss->next, __ATOMIC_RELEASE);
		__atomic_store_n(&pool->n_streams, pool->n_streams - 1, __ATOMIC_RELAXED);
		__atomic_store_n(&ss->next, retired, __ATOMIC_RELAXED);
		retired = ss;
	}
	if (retired) {
		/* What compares states without following them must not take a new state at the
		 * same address for a retired one. */
		for (seg = pool->segments; seg; seg = seg->next)
			for (ss = retired; ss; ss = ss->next)
				if (seg->home == ss)
					seg->home = NULL;
		/* Then no thread cache entry made before leads to them (tls_match). */
		atomic_fetch_add_explicit(&pool->states_gen, 1, memory_order_release);
	}
	while ((ss = retired)) {
		retired = ss->next;
		{
			struct sop__sstream *expect = ss;
			atomic_compare_exchange_strong(&pool->heap_user, &expect, NULL);
		}
		sop__stream_pool_drop(ss->st, pool->handle);
		sop__stream_release(ss->st);
		sop__epoch_retire(&ss->retired, sstream_free, false);
	}
	pool->retire_at = 2 * pool->n_streams > SOP_STATES_MIN ? 2 * pool->n_streams
							       : SOP_STATES_MIN;
}

void
sop__sstream_destroy_all(struct sop_pool *pool)
{
	struct sop__sstream *ss;

	while ((ss = pool->streams)) {
		pool->streams = ss->next;
		sop__stream_pool_drop(ss->st, pool->handle);
		sop__stream_release(ss->st);
		free(ss);
	}
	__atomic_store_n(&pool->n_streams, 0, __ATOMIC_RELAXED);
}

/* ---- Used memory ---------------------------------------------------------------------------- */

uint64_t
sop__pool_used(struct sop_pool *pool, enum sop__fold fold)
{
	struct sop__sstream *ss;
	int64_t used = 0, high = pool->retired_hw;

	for (ss = pool->streams; ss; ss = ss->next) {
		int64_t u, hw;
		bool locked = false;

		/* Under the stream's lock, so that its allocations do not move the high between the
		 * read and the restart. A synchronization does not wait for a lock that another
		 * thread holds: taking each stream's lock at every task's synchronization made the
		 * pool lock's longest hold with sixteen threads on the H100, spinning on the locks of
		 * streams other threads were allocating on. Such a shard is read as it stands and
		 * not started again: it keeps every high since it last was, so the sum stays at
		 * least the peak. */
		if (fold == SOP_FOLD_ALL) {
			sop__lock_take(&ss->lock);
			locked = true;
		} else if (fold == SOP_FOLD_FREE) {
			locked = sop__lock_try(&ss->lock);
		}
		u = sop__sstream_used(ss);
		hw = __atomic_load_n(&ss->used_hw, __ATOMIC_RELAXED);
		if (locked) {
			__atomic_store_n(&ss->used_hw, u, __ATOMIC_RELAXED);
			sop__lock_drop(&ss->lock);
		}
		used += u;
		/* A cross-stream free may have taken the shard below its high since. */
		high += hw > u ? hw : u;
	}
	if (fold != SOP_FOLD_NONE) {
		pool->retired_hw = 0;
		if ((uint64_t)high > pool->used_high)
			pool->used_high = (uint64_t)high;
	}
	return used > 0 ? (uint64_t)used : 0;
}
