/* sync.c - synchronization points, across every pool: a stream, event or context synchronized
 * (or a stream about to be destroyed) makes the frees it covered reusable by every stream,
 * applies the release thresholds of the pools concerned and finishes the teardown of destroyed
 * pools that are now empty.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* A synchronization call returned: frees on each stream up to its marked epoch have
 * completed. Give them to the heap in every pool, apply the release thresholds, fold the
 * used-memory watermarks, and finish the teardown of destroyed pools. */
struct sync_mark {
	struct sop__stream *st;
	uint64_t epoch;
};

/* A stream left with nothing cached by a synchronization, its live blocks filling less than half
 * of its segments, gives them up (sop__segments_disown). A worker that freed everything (or
 * all but a few blocks), synchronized its stream and destroyed it would otherwise keep them
 * while other streams' blocks lie there too, and every other stream would grow rather than
 * use their free memory (heap_pick): until the last of those blocks came back, or a context
 * synchronization retired its state. Pool lock held. */
static void
sstream_disown_if_idle(struct sop_pool *pool, struct sop__sstream *ss)
{
	int64_t used;
	bool cached;

	sop__lock_take(&ss->lock);
	cached = ss->cache.n_blocks != 0;
	used = sop__sstream_used(ss);
	sop__lock_drop(&ss->lock);
	if (!cached)
		sop__sstream_disown(pool, ss, used > 0 ? (size_t)used : 0);
}

/* Whether a synchronization has anything to do in pool: a state of a stream it marked to flush,
 * a threshold to apply, a pressure to end, a destroyed pool to tear down. A pool it does not
 * concern is not locked: a thread pool whose tasks each synchronize a stream of their own would
 * otherwise take every pool's lock at every task. Read without the lock, pinned: a state made
 * meanwhile holds no free the marks cover (sop__stream_pool_add), and memory that a pool's
 * threshold would give back now was there before, for the synchronization that came first. */
static bool
sync_concerns(struct sop_pool *pool, const struct sync_mark *marks, size_t n)
{
	size_t k;

	if (atomic_load(&pool->destroyed) || atomic_load(&pool->pressure) ||
	    atomic_load(&pool->reserved) > atomic_load(&pool->release_threshold))
		return true;
	for (k = 0; k < n; k++)
		if (sop__stream_in_pool(marks[k].st, pool->handle))
			return true;
	return false;
}

static void
sync_complete(const struct sync_mark *marks, size_t n, bool retire)
{
	struct sop_pool **pools;
	struct sop__pin *pin;
	size_t n_pools, i, k;

	for (k = 0; k < n; k++)
		sop__stream_completed(marks[k].st, marks[k].epoch);
	/* Pinned while it holds the snapshot: a pool another thread tears down meanwhile stays
	 * readable, and is found dead under its lock. */
	pin = sop__pin();
	pools = sop__registry_snapshot(&n_pools);
	for (i = 0; i < n_pools; i++) {
		struct sop_pool *pool = pools[i];
		struct sop__sstream *ss;

		if (pool->imported) {
			sop__import_sync(pool, false);
			continue;
		}
		if (!retire && !sync_concerns(pool, marks, n))
			continue;
		sop__pool_lock_spun(pool);
		if (atomic_load(&pool->dead)) {
			sop__mutex_drop(&pool->lock);
			continue;
		}
		for (ss = pool->streams; ss; ss = ss->next)
			for (k = 0; k < n; k++)
				if (ss->st == marks[k].st) {
					sop__sstream_flush(ss, marks[k].epoch);
					sstream_disown_if_idle(pool, ss);
				}
		if (retire && pool->n_streams > 16)
			sop__sstream_retire_idle(pool);
		/* Fold the used-memory shards into the watermark: it sums their highs since they
		 * last started again, which streams that come and go, each synchronized at its end,
		 * would otherwise add up task after task (sop__pool_used). */
		sop__pool_used(pool, SOP_FOLD_FREE);
		atomic_store(&pool->pressure, false);
		sop__pool_apply_threshold(pool);
		if (!sop__pool_reap(pool))
			sop__mutex_drop(&pool->lock);
	}
	sop__unpin(pin);
	free(pools);
	sop__epoch_reclaim();
}

/* The stream of st is gone: its state in pool may be retired, and its segments are nobody's.
 * A state whose synchronization gave them up (a task that synchronizes its stream before it
 * destroys it) is marked without the pool lock: sixteen threads whose tasks each make a stream
 * waited for it there about 27 us a task on the H100, to do nothing. Pinned. */
static void
pool_stream_gone(struct sop_pool *pool, uint64_t id)
{
	struct sop__sstream *ss = sop__sstream_find_unlocked(pool, id);

	if (ss && !atomic_load_explicit(&ss->may_home, memory_order_relaxed)) {
		atomic_store_explicit(&ss->gone, true, memory_order_relaxed);
		return;
	}
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	if (!atomic_load(&pool->dead) && (ss = sop__sstream_find(pool, id))) {
		atomic_store_explicit(&ss->gone, true, memory_order_relaxed);
		sop__sstream_disown(pool, ss, 0);
	}
	sop__mutex_drop(&pool->lock);
}

void
sop__pools_stream_gone(struct sop__stream *st)
{
	struct sop_pool **pools;
	size_t n_pools, i;

	/* Only the pools whose states hold the record: the few it names, or, past those, all. */
	if (!atomic_load(&st->in_more)) {
		for (i = 0; i < 2; i++) {
			uint64_t h = atomic_load(&st->in_pool[i]);
			struct sop_pool *pool = h ? sop__pool_lookup((sop_pool_t)(uintptr_t)h) : NULL;
			if (pool)
				pool_stream_gone(pool, st->id);
		}
		return;
	}
	pools = sop__registry_snapshot(&n_pools);
	for (i = 0; i < n_pools; i++)
		pool_stream_gone(pools[i], st->id);
	free(pools);
}

CUresult
sop__sync_stream(CUstream stream)
{
	struct sync_mark mark;
	CUresult r;

	/* Held, not pinned, through the driver's synchronization (epoch.c: no pin waits). */
	r = sop__stream_lookup(stream, true, &mark.st);
	/* Without host memory, or on a capturing stream (the driver's answer, then), nothing to
	 * learn. */
	if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
		return SOP_DRV(cuStreamSynchronize)(stream);
	if (r != CUDA_SUCCESS)
		return r;
	/* Frees tagged up to this epoch were called before the synchronize. */
	mark.epoch = sop__stream_mark(mark.st);
	r = SOP_DRV(cuStreamSynchronize)(stream);
	if (r == CUDA_SUCCESS)
		sync_complete(&mark, 1, false);
	sop__stream_release(mark.st);
	return r;
}

/* The records of the context with this id, held, each marked: frees tagged up to its mark were
 * called before now. NULL with *n 0 when there are none, or without host memory (then nothing is
 * learnt: safe). */
static struct sync_mark *
ctx_marks(unsigned long long ctx_id, struct sop__stream ***all, size_t *n)
{
	struct sync_mark *marks;
	size_t i;

	*all = sop__stream_all(ctx_id, n); /* held */
	marks = *n ? calloc(*n, sizeof *marks) : NULL;
	for (i = 0; marks && i < *n; i++) {
		marks[i].st = (*all)[i];
		marks[i].epoch = sop__stream_mark((*all)[i]);
	}
	return marks;
}

/* The context's work that came before the marks has completed (done): their frees are
 * reusable. Then the records are let go. */
static void
ctx_marks_finish(struct sop__stream **all, struct sync_mark *marks, size_t n, bool done)
{
	size_t i;

	if (done)
		sync_complete(marks, marks ? n : 0, true);
	for (i = 0; i < n; i++)
		sop__stream_release(all[i]);
	free(marks);
	free(all);
}

CUresult
sop__sync_ctx(void)
{
	struct sop__stream **all;
	struct sync_mark *marks;
	unsigned long long ctx_id;
	CUcontext ctx = NULL;
	size_t n;
	CUresult r;

	r = SOP_DRV(cuCtxGetCurrent)(&ctx);
	if (r != CUDA_SUCCESS)
		return r;
	if (!ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	/* By id: a destroyed context's handle value names the next context created. */
	r = SOP_DRV(cuCtxGetId)(ctx, &ctx_id);
	if (r != CUDA_SUCCESS)
		return r;
	marks = ctx_marks(ctx_id, &all, &n);
	r = SOP_DRV(cuCtxSynchronize)();
	ctx_marks_finish(all, marks, n, r == CUDA_SUCCESS);
	return r;
}

CUresult
sop__sync_ctx_destroy(CUcontext ctx, CUresult(CUDAAPI *destroy)(CUcontext))
{
	struct sop__stream **all = NULL;
	struct sync_mark *marks = NULL;
	unsigned long long ctx_id;
	size_t n = 0;
	CUresult r;

	/* A handle the driver does not know (already destroyed, or never a context) is the
	 * driver's to refuse: nothing is marked. */
	if (ctx && SOP_DRV(cuCtxGetId)(ctx, &ctx_id) == CUDA_SUCCESS)
		marks = ctx_marks(ctx_id, &all, &n);
	r = destroy(ctx);
	ctx_marks_finish(all, marks, n, r == CUDA_SUCCESS);
	return r;
}

/* The frees of pointers imported into device's pools wait on events of sop's, in the contexts of
 * the streams they were made on: settled before a reset of its primary context destroys them. */
static void
imports_settle(CUdevice device)
{
	struct sop_pool **pools;
	struct sop__pin *pin = sop__pin();
	size_t n, i;

	pools = sop__registry_snapshot(&n);
	for (i = 0; i < n; i++)
		if (pools[i]->imported && pools[i]->device == device)
			sop__import_sync(pools[i], true);
	sop__unpin(pin);
	free(pools);
}

CUresult
sop__sync_primary_reset(CUdevice device, CUresult(CUDAAPI *reset)(CUdevice))
{
	struct sop__stream **all = NULL;
	struct sync_mark *marks = NULL;
	unsigned long long ctx_id;
	CUcontext ctx;
	size_t n = 0;
	CUresult r;

	/* sop has records and probe events only in a primary context it retained (order.c); an
	 * imported pointer's free makes an event without a record. A bad ordinal is the driver's
	 * to refuse. Records swept out and not yet freed give their events to the spares when
	 * they are: freed first, where no call holds them (one a call pinned on another thread
	 * holds back only forgets its events when it is freed: order.c, events_give). */
	sop__epoch_reclaim();
	ctx = sop__driver_primary_held(device);
	if (ctx && SOP_DRV(cuCtxGetId)(ctx, &ctx_id) == CUDA_SUCCESS) {
		marks = ctx_marks(ctx_id, &all, &n);
		sop__stream_ctx_reset(ctx);
	}
	imports_settle(device);
	r = reset(device);
	ctx_marks_finish(all, marks, n, r == CUDA_SUCCESS);
	return r;
}

CUresult
sop__sync_event(CUevent event)
{
	struct sync_mark marks[SOP_DEPS];
	struct sop__clock clock;
	size_t n = 0, i;
	CUresult r;

	if (!sop__event_clock(event, &clock))
		clock.n = 0;
	r = SOP_DRV(cuEventSynchronize)(event);
	if (r != CUDA_SUCCESS)
		return r;
	/* What the event carries is a claim (order.c): the application may have recorded it
	 * again, or destroyed it and made another at the same handle, without sop. Each stream's
	 * frees become reusable as far as its probes, recorded before the event, now show them
	 * complete, which is all of the claim when it is true. A stream whose record is gone has
	 * nothing cached anywhere. */
	for (i = 0; i < clock.n; i++) {
		struct sop__stream *st = sop__stream_find(clock.e[i].id, clock.e[i].gen);
		uint64_t proven, upto;

		if (!st)
			continue;
		proven = sop__stream_prove(st);
		upto = proven < clock.e[i].epoch ? proven : clock.e[i].epoch;
		if (upto) {
			marks[n].st = st;
			marks[n++].epoch = upto;
		} else {
			sop__stream_release(st);
		}
	}
	sync_complete(marks, n, false);
	for (i = 0; i < n; i++)
		sop__stream_release(marks[i].st);
	return r;
}
