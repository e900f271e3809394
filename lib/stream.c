/* stream.c - stream-ordered free caches and the hot path.
 *
 * Each pool keeps, per stream, the blocks freed on that stream whose frees have not been seen
 * to complete. Work enqueued on the stream later runs after the free, so the stream itself may
 * reuse them at once: a same-stream free and allocation is a push and a pop on the stream's
 * bins under the stream's own lock, with no pool-wide lock. Other streams get these blocks only
 * when stream order allows: at synchronization points, through events, when probes show the
 * frees complete, or by waiting on a probe (doc/reuse.md; the slow path below, with order.c).
 *
 * Who the stream is. An allocation asks the driver for the id of the stream its handle names
 * (order.c says why a handle is no identity), and a thread finds the pool's state for that
 * stream through a small thread-local cache keyed by (pool, handle, id). A free does not ask,
 * when the thread's cache holds a state for (pool, handle) and the block was allocated on that
 * state's stream: if the handle named another stream now, that stream would have been destroyed,
 * and the block then waits in a cache that no live stream can reach (only a synchronization of
 * the context, or the destroyed stream's own probes, make it reusable): memory held late, never
 * early. Every other free asks, as an allocation does.
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

/* A new state for the stream with this id, holding its record. Pool lock held. */
static struct sop__sstream *
sstream_new(struct sop_pool *pool, uint64_t id, struct sop__stream *st)
{
	struct sop__sstream *ss;

	if (pool->n_streams >= pool->retire_at)
		sop__sstream_retire_idle(pool);
	ss = calloc(1, sizeof *ss);
	if (!ss)
		return NULL;
	ss->pool = pool;
	ss->id = id;
	ss->st = st;
	ss->active = true; /* about to be used: not for the next retirement pass */
	ss->next = pool->streams;
	pool->streams = ss;
	pool->n_streams++;
	return ss;
}

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

/* The pool's state for the stream with this id, made if the pool has none. */
static CUresult
sstream_lookup(struct sop_pool *pool, CUstream stream, uint64_t id, struct sop__stream_ref *out)
{
	struct sop__stream *st;
	struct sop__sstream *ss;
	CUresult r;

	r = sop__stream_of(stream, id, true, &st); /* the state will hold it */
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&pool->lock);
	if (atomic_load(&pool->dead)) {
		/* Torn down since the caller found it (epoch.c keeps it readable): no new state. */
		pthread_mutex_unlock(&pool->lock);
		sop__stream_release(st);
		return CUDA_ERROR_INVALID_VALUE;
	}
	ss = sop__sstream_find(pool, id);
	if (ss)
		sop__stream_release(st);
	else if (!(ss = sstream_new(pool, id, st)))
		sop__stream_release(st);
	pthread_mutex_unlock(&pool->lock);
	if (!ss)
		return CUDA_ERROR_OUT_OF_MEMORY;
	out->ss = ss;
	out->id = id;
	return CUDA_SUCCESS;
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
	r = sstream_lookup(pool, stream, id, out);
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
		return sstream_lookup(pool, stream, id, out); /* no host memory for a cache */
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
		    !atomic_load_explicit(&e->ref.ss->gone, memory_order_relaxed)) {
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

/* Every cached block of a stream, gathered so the caller may change the bins while it walks.
 * Lock held. NULL with *n = 0 when there is none or no host memory (callers then do less). */
static struct sop__block **
cache_collect(struct sop__sstream *ss, size_t *n)
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

	sop__lock_take(&ss->lock);
	v = cache_collect(ss, &n);
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
			sop__segments_disown(pool, ss, 0);
		if (cached && (gone || (idle && atomic_load(&pool->reuse_opportunistic)))) {
			uint64_t done = sop__stream_poll(ss->st);
			if (done > ss->flushed) {
				sop__sstream_flush(ss, done);
				ss->flushed = done;
			}
		}
		sop__lock_take(&ss->lock);
		/* Only a state with nothing cached, nothing allocated on it (a live block names it
		 * for its used memory) and idle since the last pass goes, or sooner once its
		 * stream is known to be gone: one in use would be looked up again at once, and
		 * threads would chase it. */
		if (ss->cache.n_blocks || sop__sstream_used(ss) ||
		    (ss->active && !gone)) {
			ss->active = false;
			sop__lock_drop(&ss->lock);
			pp = &ss->next;
			continue;
		}
		ss->id = 0;
		sop__spares_return(pool, ss);
		/* Its high since the last fold, for USED_MEM_HIGH (sop__pool_used). */
		pool->retired_hw += ss->used_hw;
		sop__lock_drop(&ss->lock);
		*pp = ss->next;
		pool->n_streams--;
		ss->next = retired;
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
		sop__stream_release(ss->st);
		free(ss);
	}
	pool->n_streams = 0;
}

/* ---- Allocation ------------------------------------------------------------------------- */

/* A thread's cached reference to a stream state can go stale when the state is retired
 * (sop__sstream_retire_idle); the call then looks the stream up again. Retirement spares states
 * used since its last pass, so a second miss is rare and a third unheard of. */
#define STALE_TRIES 8

static void
block_hand_out(struct sop__sstream *ss, struct sop__block *b, size_t req, void **ptr)
{
	sop__block_set_owner(b, NULL);
	sop__used_add(ss, b, req);
	ss->active = true;
	atomic_store_explicit(&b->tag, sop__tag(b->addr, SOP_BLOCK_ALLOC), memory_order_release);
	*ptr = (void *)(uintptr_t)b->addr;
}

/* Merge each of the stream's cached blocks with neighbours that the stream may also use (FREE,
 * or cached on the same stream), so that scattered pieces can serve a larger request. The merged
 * block stays cached on the stream with the latest free among its parts. Pool and stream locks
 * held. */
static void
cache_coalesce(struct sop_pool *pool, struct sop__sstream *ss)
{
	struct sop__block **v, *b, *n;
	size_t cnt, i;

	v = cache_collect(ss, &cnt);
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
			sop__block_absorb_next(pool, b, &pool->spare);
		}
		sop__lock_drop(&b->seg->lock);
		sop__bins_insert(&ss->cache, b);
	}
	free(v);
}

/* The pool cannot grow any more: a free then gets a probe of its own, so that a stream short of
 * memory can take it by waiting for that probe (internal dependencies). */
static bool
pool_pressed(struct sop_pool *pool)
{
	uint64_t reserved = atomic_load_explicit(&pool->reserved, memory_order_relaxed);

	return atomic_load_explicit(&pool->pressure, memory_order_relaxed) ||
	       (pool->max_size && reserved + pool->granularity > pool->max_size);
}

/* On the slow path, requests of at least this size ask what has completed before carving a
 * loose fit: for them reusing a block just freed beats splitting a large free range. Smaller
 * ones carve without asking, unless nothing fits at all. Frees of at least this size may be
 * covered by a probe at once (cover_at_once). */
#define POLL_MIN ((size_t)2 << 20)

/* After a stream had to grow the pool while another held enough memory whose frees were not
 * known complete, the next STARVED_COVER frees of large blocks get a probe at once each, so
 * that a stream short of memory can learn that they completed (flush_observed) rather than
 * grow the pool again (replaying a training step on three streams, the loader's next batch
 * found the compute stream's frees uncovered for want of a probe). A stream that keeps
 * starving others keeps them covered; one that never does again stops paying for the probes.
 * A small free waits for the next probe, which costs about as much as it does. */
#define STARVED_COVER 256

static inline bool
cover_at_once(struct sop_pool *pool, size_t freed)
{
	unsigned left;

	if (freed < POLL_MIN)
		return false;
	left = atomic_load_explicit(&pool->starved, memory_order_relaxed);
	if (!left)
		return false;
	/* Racing frees may cover a few more than that: not worth a locked instruction. */
	atomic_store_explicit(&pool->starved, left - 1, memory_order_relaxed);
	return true;
}

/* Before growing for size bytes: if another stream holds that much memory not known complete,
 * cover the next frees of large blocks. Pool lock held. */
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

/* Take a cached block whole on the hot path if it wastes at most an eighth of the request;
 * larger ones are split. */
static inline size_t
close_limit(size_t size)
{
	return size + (size >> 3);
}

/* Whether o's cache holds a block a request of size bytes would take whole. */
static bool
cache_has_close(struct sop__sstream *o, size_t size)
{
	bool has;

	sop__lock_take(&o->lock);
	has = sop__bins_find_close(&o->cache, size, close_limit(size)) != NULL;
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

/* Whether a request of size bytes splits the lowest-addressed fit rather than the smallest: a
 * small request in a compacting pool that threads have not met in (once they have, placement
 * follows segment affinity, and the search would hold the locks longer on every thread). */
static inline bool
place_low(struct sop_pool *pool, size_t size)
{
	return size < SOP_COMPACT_LOW_MAX &&
	       atomic_load_explicit(&pool->compact, memory_order_relaxed) &&
	       !atomic_load_explicit(&pool->threads_met, memory_order_relaxed);
}

/* The block a request of size bytes splits in bins when none fits closely: the first fit, or,
 * where place_low says so, the lowest-addressed of the first few fits, which gathers small
 * blocks at low addresses and leaves longer free runs elsewhere. */
static inline struct sop__block *
split_fit(struct sop_pool *pool, struct sop__bins *bins, size_t size)
{
	if (place_low(pool, size))
		return sop__bins_find_lowest(bins, size, SOP_COMPACT_PROBES);
	return sop__bins_find(bins, size);
}

/* Requests up to this size take heap memory from the stream's own segments first; larger ones
 * take the best fit wherever it is, since for them placement is what keeps the pool small. */
#define HOME_MAX ((size_t)8 << 20)
/* How many heap blocks the search for the stream's own looks at. */
#define HOME_PROBES 64

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
 * becomes ss's). *crowded: the block returned is in another stream's segment, which the
 * caller should grow a segment of its own rather than take. Pool lock held. */
static struct sop__block *
heap_pick(struct sop_pool *pool, struct sop__sstream *ss, size_t size, bool *crowded)
{
	struct sop__block *b = split_fit(pool, &pool->heap, size), *h;
	unsigned own = HOME_PROBES, nobodys = HOME_PROBES;

	*crowded = false;
	if (!b || b->seg->home == ss || size > HOME_MAX ||
	    !atomic_load_explicit(&pool->threads_met, memory_order_relaxed))
		return b;
	h = sop__bins_scan(&pool->heap, size, &own, pick_own, ss);
	if (!h && (h = sop__bins_scan(&pool->heap, size, &nobodys, pick_nobodys, ss)))
		h->seg->home = ss;
	if (h)
		return h;
	/* Only another stream's, as far as the search went. Once threads meet in the pool,
	 * sharing a segment with a stream that may be on another thread costs every split and
	 * merge of both a contended lock: if the search saw every candidate, growing is better. */
	*crowded = own && nobodys;
	return b;
}

/* The better of the fits in the stream's cache and in the heap (heap_pick): the smaller, or,
 * where split_fit looks for low addresses, the lower; but a heap fit in another stream's
 * segment (crowded) never beats one in the cache, which is the stream's own memory already and
 * costs no growth. Taken out of its bins; *from says which (NULL: the heap). Pool lock held. */
static struct sop__block *
best_take_locked(struct sop_pool *pool, struct sop__sstream *ss, size_t size,
		 struct sop__sstream **from, bool *crowded)
{
	struct sop__block *mine, *any = heap_pick(pool, ss, size, crowded);
	bool low = place_low(pool, size);

	mine = split_fit(pool, &ss->cache, size);
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
 * segments that their successors do not count as theirs. Pool lock held, no stream's lock. */
static bool
affinity_affordable(struct sop_pool *pool)
{
	return atomic_load_explicit(&pool->reserved, memory_order_relaxed) <=
	       2 * sop__pool_used(pool, false);
}

static CUresult
alloc_slow(struct sop_pool *pool, struct sop__sstream *ss, uint64_t id, CUstream stream,
	   size_t size, size_t req, void **ptr)
{
	struct sop__sstream *from = NULL;
	struct sop__block *b = NULL;
	CUresult r = CUDA_SUCCESS;
	bool stale = false, crowded = false;

	pthread_mutex_lock(&pool->lock);
	if (atomic_load(&pool->dead)) {
		/* Torn down since the caller found it: nothing to allocate from, or to grow. */
		pthread_mutex_unlock(&pool->lock);
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
		pthread_mutex_unlock(&pool->lock);
		return CUDA_ERROR_NOT_FOUND; /* caller looks the stream up again */
	}
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
	    (b->size > close_limit(size) && size >= POLL_MIN && worth_asking(pool, ss, size))) {
		size_t close = b ? size : 0;

		if (b)
			put_back(pool, b, from);
		own_flush(ss);
		if (atomic_load(&pool->reuse_opportunistic))
			flush_observed(pool, ss, close);
		b = best_take(pool, ss, size, &from, &crowded);
	}
	/* Free memory in another stream's segment, once threads meet in the pool: a segment of
	 * this stream's own, if the pool can grow, costs a step of memory once and keeps this
	 * thread's splits and merges off the other's lock from then on; not once that would take
	 * the pool past twice its live memory (affinity_affordable). */
	if (b && crowded && affinity_affordable(pool)) {
		/* Back first: growth may join the new memory with it. */
		put_back(pool, b, from);
		if (sop__heap_grow(pool, ss, size, &b, &from) != CUDA_SUCCESS)
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
	/* 3. Before paying for growth, leave a probe on this stream, so that the next time its
	 * pending frees can be known complete, merged and reshaped (step 1): only memory known
	 * complete may be unmapped. */
	if (!b) {
		uint64_t last;
		sop__lock_take(&ss->lock);
		last = ss->cache.n_blocks ? ss->last_seq : 0;
		sop__lock_drop(&ss->lock);
		if (last)
			sop__stream_probe(ss->st, stream, last);
	}
	/* 4. More physical memory, next to free memory where that maps less, in place of idle
	 * pieces too small or too scattered to serve the request. */
	if (!b) {
		note_starved(pool, ss, size);
		r = sop__heap_grow(pool, ss, size, &b, &from);
		if (r == CUDA_ERROR_OUT_OF_MEMORY && atomic_load(&pool->reserved)) {
			/* 5. Idle pieces given back to make room for one that fits. */
			if (sop__heap_release(pool, 0, 0) == CUDA_SUCCESS)
				r = sop__heap_grow(pool, ss, size, &b, &from);
		}
		if (r != CUDA_SUCCESS)
			b = NULL;
		if (r == CUDA_ERROR_OUT_OF_MEMORY) {
			atomic_store(&pool->pressure, true);
		}
	}
	/* 6. Memory still pending on another stream, with a wait inserted. */
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
			sop__lock_take(&ss->lock);
			sop__block_carve(pool, b, size, from, true);
		}
		block_hand_out(ss, b, req, ptr);
		sop__lock_drop(&ss->lock);
		r = CUDA_SUCCESS;
	} else if (r == CUDA_SUCCESS) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_unlock(&pool->lock);
	return r;
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
 * have met in the pool, for a request below POLL_MIN: the slow path would only weigh the heap's
 * fit against the cache's, and the heap's counts there only in the stream's own segments or
 * nobody's (heap_pick), which the bitmap cannot tell from the others' small pieces and growth
 * left-overs. Asked anyway, it sent one allocation in fifty of sixteen threads on their own
 * streams through the pool lock (simulated driver), where nineteen in twenty took the cache's
 * fit after all. */
static inline bool
heap_may_beat(struct sop_pool *pool, size_t size, size_t have)
{
	if (size < POLL_MIN && atomic_load_explicit(&pool->threads_met, memory_order_relaxed))
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
			b = sop__bins_find_close(&ss->cache, size, close_limit(size));
			if (b) {
				sop__bins_remove(&ss->cache, b);
			} else {
				/* Else it splits the stream's own memory, the first fit in its
				 * cache (which its frees keep merged), unless the heap may hold a
				 * tighter fit: then the slow path weighs both. */
				b = split_fit(pool, &ss->cache, size);
				if (b && (heap_may_beat(pool, size, b->size) ||
					  !sop__block_carve_own(pool, ss, b, size)))
					b = NULL;
			}
			if (b) {
				/* Out of the cache and ALLOC under the lock: a coalescing thread
				 * must never see a CACHED block that is in no bin. */
				block_hand_out(ss, b, req, ptr);
				sop__lock_drop(&ss->lock);
				return CUDA_SUCCESS;
			}
			sop__lock_drop(&ss->lock);
			r = alloc_slow(pool, ss, ref.id, stream, size, req, ptr);
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
				    memory_order_acq_rel, memory_order_acquire)) {
				sop__lock_drop(&ss->lock);
				return CUDA_ERROR_INVALID_VALUE;
			}
			sop__used_sub(b, ss);
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
				sop__stream_after_free(st, stream, seq, cover || pool_pressed(pool),
						       checked);
			return CUDA_SUCCESS;
		}
		sop__lock_drop(&ss->lock);
		tls_drop(pool, stream, ref.id);
	}
	return CUDA_ERROR_NOT_FOUND;
}
