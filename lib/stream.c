/* stream.c - the hot path: allocation and free in stream order on a stream's own cache, and the
 * thread-local cache through which a call finds the pool's state for its stream (sstream.c).
 *
 * Each pool keeps, per stream, the blocks freed on that stream whose frees have not been seen
 * to complete. Work enqueued on the stream later runs after the free, so the stream itself may
 * reuse them at once: a same-stream free and allocation is a push and a pop on the stream's
 * bins under the stream's own lock, with no pool-wide lock. Other streams get these blocks only
 * when stream order allows: at synchronization points, through events, when probes show the
 * frees complete, or by waiting on a probe (doc/reuse.md; the slow path, reuse.c, with order.c
 * and event.c).
 *
 * Who the stream is. An allocation asks the driver for the id of the stream its handle names
 * (order.c says why a handle is no identity), and a thread finds the pool's state for that
 * stream through a small thread-local cache keyed by (pool, handle, id). A free does not ask,
 * when the thread's cache holds a state for (pool, handle) and the block was allocated on that
 * state's stream of a primary context: if the handle named another stream now, that stream would
 * have been destroyed, and the block then waits in a cache that no live stream can reach (only a
 * synchronization of the context, or the destroyed stream's own probes, make it reusable):
 * memory held late, never early. A stream of a context the program created has no probes, and
 * its context may be gone (cuCtxDestroy) where nothing can synchronize it again: a free there
 * always asks. Every other free asks, as an allocation does.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Thread-local cache of recently used stream states. An entry is followed only while its pool's
 * states have the generation it was made in: a retirement pass that retires a state moves the
 * generation on before the state is retired (epoch.c), so no entry made earlier leads to freed
 * memory; users then take the state's lock and compare its id with the entry's before trusting
 * it. Entries name their pool by handle, never reused, rather than by address: a pool's object
 * is freed some time after its teardown (epoch.c), and a new pool may get the same memory.
 *
 * The cache is reached through one initial-exec thread-local pointer: a library's own
 * thread-local arrays would cost a __tls_get_addr call per access, and a few pointers of static
 * TLS fit even when the library is loaded with dlopen. */
#define TLS_SETS 16
#define TLS_ASSOC 4 /* a thread driving 16 streams keeps them all */

struct tls_entry {
	uint64_t pool; /* the pool's handle */
	CUstream handle;
	struct sop__stream_ref ref; /* ref.id: the stream the handle named when it was cached */
	uint64_t gen;               /* the pool's states_gen then */
};

struct sop__tcache {
	struct tls_entry streams[TLS_SETS][TLS_ASSOC]; /* most recent first in each set */
};

static __thread struct sop__tcache *tcache __attribute__((tls_model("initial-exec")));
static pthread_key_t tcache_key;
static pthread_once_t tcache_once = PTHREAD_ONCE_INIT;

static void
tcache_free(void *p)
{
	free(p);
}

static void
tcache_key_make(void)
{
	pthread_key_create(&tcache_key, tcache_free);
}

static __attribute__((noinline)) struct sop__tcache *
tcache_slow(void)
{
	struct sop__tcache *c;

	pthread_once(&tcache_once, tcache_key_make);
	c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	pthread_setspecific(tcache_key, c); /* freed when the thread exits */
	tcache = c;
	return c;
}

static inline struct sop__tcache *
tcache_get(void)
{
	struct sop__tcache *c = tcache;

	return SOP_LIKELY(c != NULL) ? c : tcache_slow();
}

/* The set of (pool, handle, id): by handle, so that a free, which knows no id, finds the entry
 * an allocation left; a special handle names a different stream in each context and thread,
 * and all three share a few values, so for them the id picks the set. Every bit counts: driver
 * handles share their low bits (alignment) and often the bits above. */
static inline struct tls_entry *
tls_set(struct sop__tcache *c, struct sop_pool *pool, CUstream stream, uint64_t id)
{
	uint64_t k = sop__stream_special(stream) ? id : (uint64_t)(uintptr_t)stream;
	uint64_t h = (pool->handle ^ k) * 0x9E3779B97F4A7C15u;

	return c->streams[h >> (64 - 4)];
}

static inline uint64_t
states_gen(const struct sop_pool *pool)
{
	return atomic_load_explicit(&pool->states_gen, memory_order_acquire);
}

static inline bool
tls_match(const struct tls_entry *e, struct sop_pool *pool, CUstream stream, uint64_t id)
{
	return e->ref.id == id && e->handle == stream && e->pool == pool->handle && e->ref.ss &&
	       e->gen == states_gen(pool);
}

/* The stream of a state is known to be gone: a retirement pass may take it as soon as nothing
 * is cached or allocated on it, and frees stop trusting the thread caches that name it. The
 * state may be retired already (ref.id no longer its id): then nothing to do. Pinned. */
static void
sstream_gone(struct sop__stream_ref ref)
{
	sop__lock_take(&ref.ss->lock);
	if (ref.ss->id == ref.id)
		atomic_store_explicit(&ref.ss->gone, true, memory_order_relaxed);
	sop__lock_drop(&ref.ss->lock);
}

/* The rest of sstream_get: other ways of the set, then the pool's list. The new entry takes the
 * place of one for the same (pool, handle), which named a stream that no longer has it. */
static __attribute__((noinline)) CUresult
sstream_get_slow(struct sop_pool *pool, CUstream stream, uint64_t id, struct tls_entry *set,
		 struct sop__stream_ref *out)
{
	struct tls_entry hit;
	uint64_t gen;
	CUresult r;
	int w;

	for (w = 1; w < TLS_ASSOC; w++) {
		if (tls_match(&set[w], pool, stream, id)) {
			hit = set[w];
			memmove(&set[1], &set[0], (size_t)w * sizeof *set);
			set[0] = hit;
			*out = hit.ref;
			return CUDA_SUCCESS;
		}
	}
	/* The generation first: a state retired after it was read, while this call is pinned,
	 * is freed only once the call returns. */
	gen = states_gen(pool);
	r = sop__sstream_lookup(pool, stream, id, out);
	if (r != CUDA_SUCCESS)
		return r;
	for (w = 0; w < TLS_ASSOC - 1; w++) {
		if (set[w].pool == pool->handle && set[w].handle == stream) {
			/* The handle named another stream when this entry was made: that stream
			 * is gone (the driver gives a handle to one live stream at a time). */
			if (!sop__stream_special(stream) && set[w].ref.id != id && set[w].ref.ss &&
			    set[w].gen == gen)
				sstream_gone(set[w].ref);
			break;
		}
	}
	memmove(&set[1], &set[0], (size_t)w * sizeof *set);
	set[0].pool = pool->handle;
	set[0].handle = stream;
	set[0].ref = *out;
	set[0].gen = gen;
	return CUDA_SUCCESS;
}

/* Find or make the pool's state for the stream with this id, which stream names now; the
 * thread-local cache makes this a few loads. Inlined into the hot paths: its hit case is a hash
 * and three compares. */
static inline __attribute__((always_inline)) CUresult
sstream_get(struct sop_pool *pool, CUstream stream, uint64_t id, struct sop__stream_ref *out)
{
	struct sop__tcache *c = tcache_get();
	struct tls_entry *set;

	if (SOP_UNLIKELY(!c))
		return sop__sstream_lookup(pool, stream, id, out); /* no host memory for a cache */
	set = tls_set(c, pool, stream, id);
	if (SOP_LIKELY(tls_match(&set[0], pool, stream, id))) {
		*out = set[0].ref;
		return CUDA_SUCCESS;
	}
	return sstream_get_slow(pool, stream, id, set, out);
}

/* For a free of b on stream: the state the thread's cache holds for (pool, stream) if b was
 * allocated on it, without asking the driver who the stream is (*checked false; the top of the
 * file says why that is safe); else the state of the stream the driver says stream names. */
static inline __attribute__((always_inline)) CUresult
sstream_get_free(struct sop_pool *pool, CUstream stream, const struct sop__block *b,
		 struct sop__stream_ref *out, bool *checked)
{
	struct sop__tcache *c = tcache;
	uint64_t id;
	CUresult r;

	if (SOP_LIKELY(c != NULL) && !sop__stream_special(stream)) {
		struct tls_entry *e = &tls_set(c, pool, stream, 0)[0];
		if (e->handle == stream && e->pool == pool->handle && e->ref.ss &&
		    e->gen == states_gen(pool) &&
		    e->ref.ss == __atomic_load_n(&b->alloc_ss, __ATOMIC_RELAXED) &&
		    !atomic_load_explicit(&e->ref.ss->gone, memory_order_relaxed) &&
		    /* Only where a later synchronization can still release the block: a stream of
		     * a context the program created may be gone with its context, which nothing
		     * can synchronize again, and the block would be held for good. */
		    e->ref.ss->st->probes_ok) {
			*out = e->ref;
			*checked = false;
			return CUDA_SUCCESS;
		}
	}
	*checked = true;
	r = sop__stream_id(stream, &id);
	return r == CUDA_SUCCESS ? sstream_get(pool, stream, id, out) : r;
}

/* Forget the thread's entry for (pool, stream) after it proved stale. */
static void
tls_drop(struct sop_pool *pool, CUstream stream, uint64_t id)
{
	struct sop__tcache *c = tcache;
	int w;

	for (w = 0; c && w < TLS_ASSOC; w++) {
		struct tls_entry *e = &tls_set(c, pool, stream, id)[w];
		if (e->pool == pool->handle && e->handle == stream)
			e->ref.ss = NULL;
	}
}

/* ---- Allocation ------------------------------------------------------------------------- */

/* A thread's cached reference to a stream state can go stale when the state is retired
 * (sop__sstream_retire_idle); the call then looks the stream up again. Retirement spares states
 * used since its last pass, so a second miss is rare and a third unheard of. */
#define STALE_TRIES 8

/* The pool cannot grow any more: a free then gets a probe of its own, so that a stream short of
 * memory can take it by waiting for that probe (internal dependencies). */
static bool
pool_pressed(struct sop_pool *pool)
{
	uint64_t reserved = atomic_load_explicit(&pool->reserved, memory_order_relaxed);

	return atomic_load_explicit(&pool->pressure, memory_order_relaxed) ||
	       (pool->max_size && reserved + pool->granularity > pool->max_size);
}

static inline bool
cover_at_once(struct sop_pool *pool, size_t freed)
{
	unsigned left;

	if (freed < sop__poll_min(pool))
		return false;
	left = atomic_load_explicit(&pool->starved, memory_order_relaxed);
	if (!left)
		return false;
	/* Racing frees may cover a few more than that: not worth a locked instruction. */
	atomic_store_explicit(&pool->starved, left - 1, memory_order_relaxed);
	return true;
}

/* A stream's cache holds many blocks or much memory: worth learning when its frees complete.
 * A loop that frees and reallocates keeps one or two blocks there and never gets here. Lock
 * held. */
static inline bool
cache_hoards(const struct sop__sstream *ss)
{
	return ss->cache.n_blocks >= 32 || ss->cache.n_bytes >= ((size_t)256 << 20);
}

/* Whether the heap may hold a tighter fit than have bytes for a request of size bytes, worth
 * the slow path: the bitmap's hint, by powers of two (sop__bins_hint_smaller). Not once threads
 * have met in the pool, for a request below SOP_POLL_MIN: the slow path would only weigh the heap's
 * fit against the cache's, and the heap's counts there only in the stream's own segments or
 * nobody's (heap_pick), which the bitmap cannot tell from the others' small pieces and growth
 * left-overs. Asked anyway, it sent one allocation in fifty of sixteen threads on their own
 * streams through the pool lock (simulated driver), where nineteen in twenty took the cache's
 * fit after all. */
static inline bool
heap_may_beat(struct sop_pool *pool, size_t size, size_t have)
{
	if (size < SOP_POLL_MIN && atomic_load_explicit(&pool->threads_met, memory_order_relaxed))
		return false;
	return sop__bins_hint_smaller(&pool->heap, size, have);
}

CUresult
sop__alloc(struct sop_pool *pool, CUstream stream, uint64_t id, size_t req, void **ptr)
{
	size_t size = sop__round_up(req, SOP_ALIGN);
	struct sop__stream_ref ref;
	struct sop__sstream *ss;
	struct sop__block *b = NULL;
	CUresult r;
	int tries;

	if (size < req || size > pool->va_size)
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (tries = 0; tries < STALE_TRIES; tries++) {
		r = sstream_get(pool, stream, id, &ref);
		if (r != CUDA_SUCCESS)
			return r;
		ss = ref.ss;
		sop__lock_take(&ss->lock);
		if (SOP_LIKELY(ss->id == ref.id)) {
			b = sop__bins_find_close(&ss->cache, size, sop__close_limit(size));
			if (b) {
				sop__bins_remove(&ss->cache, b);
			} else {
				/* Else it splits the stream's own memory, the first fit in its
				 * cache (which its frees keep merged), unless the heap may hold a
				 * tighter fit: then the slow path weighs both. */
				b = sop__split_fit(pool, &ss->cache, size);
				if (b && (heap_may_beat(pool, size, b->size) ||
					  !sop__block_carve_own(pool, ss, b, size)))
					b = NULL;
			}
			if (b) {
				/* Out of the cache and ALLOC under the lock: a coalescing thread
				 * must never see a CACHED block that is in no bin. */
				sop__block_hand_out(ss, b, req, ptr);
				sop__lock_drop(&ss->lock);
				return CUDA_SUCCESS;
			}
			sop__lock_drop(&ss->lock);
			r = sop__alloc_slow(pool, ss, ref.id, stream, size, req, ptr);
			if (r != CUDA_ERROR_NOT_FOUND)
				return r;
		} else {
			sop__lock_drop(&ss->lock);
		}
		tls_drop(pool, stream, id);
	}
	return CUDA_ERROR_NOT_FOUND;
}

CUresult
sop__free_async(struct sop_pool *pool, CUdeviceptr addr, CUstream stream)
{
	const uint64_t alloc_tag = sop__tag(addr, SOP_BLOCK_ALLOC);
	struct sop__block *b = sop__map_get(pool, addr);
	struct sop__stream_ref ref;
	struct sop__sstream *ss;
	struct sop__stream *st;
	uint64_t seq;
	CUresult r;
	bool hoard, cover, checked;
	int tries;

	if (!b || atomic_load_explicit(&b->tag, memory_order_acquire) != alloc_tag)
		return CUDA_ERROR_INVALID_VALUE;
	/* Resolve the stream before claiming: a bad stream leaves the block allocated. */
	for (tries = 0; tries < STALE_TRIES; tries++) {
		r = sstream_get_free(pool, stream, b, &ref, &checked);
		if (r != CUDA_SUCCESS)
			return r;
		ss = ref.ss;
		sop__lock_take(&ss->lock);
		if (SOP_LIKELY(ss->id == ref.id)) {
			uint64_t expect = alloc_tag;
			/* The claim: exactly one of racing frees of the same pointer wins, and a
			 * descriptor reused for another address never matches. */
			if (!atomic_compare_exchange_strong_explicit(
				    &b->tag, &expect, sop__tag(addr, SOP_BLOCK_CACHED),
				    memory_order_seq_cst, memory_order_acquire)) {
				sop__lock_drop(&ss->lock);
				return CUDA_ERROR_INVALID_VALUE;
			}
			sop__used_sub(b, ss);
			/* Sequentially consistent with the claim, against an export racing this free
			 * (sop__share_pointer): one of the two sees the other. Plain on x86. */
			if (SOP_UNLIKELY(__atomic_load_n(&b->gen, __ATOMIC_SEQ_CST)))
				sop__share_forget(pool, b); /* exported: off the board (share.c) */
			sop__block_set_owner(b, ss);
			ss->active = true;
			/* Read under the lock: once it is dropped, a synchronization may retire the
			 * state and another stream may take it over. */
			st = ss->st;
			/* Read after the application's earlier work on the stream was enqueued: a mark
			 * that advances the epoch past this value comes after that work. */
			seq = atomic_load(&st->epoch);
			b->seq = seq;
			ss->last_seq = seq;
			sop__stream_freed(st, seq);
			cover = cover_at_once(pool, b->size);
			/* Joined at once with the stream's pieces around it: the stream's own
			 * memory stays in few large blocks, as in any heap that merges on free. */
			b = sop__block_merge_own(pool, ss, b);
			sop__bins_insert(&ss->cache, b);
			hoard = cache_hoards(ss);
			sop__lock_drop(&ss->lock);
			/* Probes, now and then: when other streams may want what this one frees, or
			 * when this stream holds so much pending memory that only knowing it complete
			 * lets the pool merge and reshape it. */
			if (hoard || (sop__streams_interact() &&
				      (atomic_load_explicit(&pool->reuse_opportunistic,
							    memory_order_relaxed) ||
				       atomic_load_explicit(&pool->reuse_internal, memory_order_relaxed))))
				sop__stream_after_free(
					st, stream, seq, cover || pool_pressed(pool), checked,
					__atomic_load_n(&pool->n_streams, __ATOMIC_RELAXED) <= 1);
			return CUDA_SUCCESS;
		}
		sop__lock_drop(&ss->lock);
		tls_drop(pool, stream, ref.id);
	}
	return CUDA_ERROR_NOT_FOUND;
}
