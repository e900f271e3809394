/* order.c - what sop knows of streams and their order: who a stream is, per-stream epochs,
 * probe events, and the dependencies that events carry from stream to stream.
 *
 * Who a stream is. The driver hands a destroyed stream's handle value to the next stream it
 * creates, at once, while the destroyed stream's work may still run, and a destroyed context's
 * handle to the next context: a handle value is not an identity. cuStreamGetId is (unique for the
 * process's lifetime, about 25 ns a call, and it scales across threads): a call that names a
 * stream asks it, and everything sop knows of a stream is keyed by it (stream.c has the one
 * exception, a free on the stream that allocated the block, and why it is safe). Contexts are
 * told apart by cuCtxGetId.
 *
 * Every stream sop has seen has one record here, shared by all pools. Its epoch is a counter
 * that frees read (a free on the stream is tagged with the epoch current at the call) and that
 * advances whenever sop marks a point in the stream: an event record, a probe, a
 * synchronization. The rule that makes this sound: the epoch advances *before* the driver call
 * that marks the point, so a free tagged with an epoch up to the marked one was called before
 * the mark, and its work was enqueued before the point.
 *
 * What sop learns, it learns in epochs:
 *  - `done`: frees on the stream up to this epoch are complete, seen by querying a probe event
 *    sop recorded on the stream, or by a synchronization of the stream or its context;
 *  - `deps`: streams and epochs this stream's future work is ordered after because sop made it
 *    wait for one of their probes (internal dependencies, and claims it followed);
 *  - `claims`: streams and epochs this stream's future work is ordered after according to events
 *    recorded with sop_event_record and waited on with sop_stream_wait_event. An event carries
 *    the recording stream's own epoch plus what that stream was ordered after, so dependencies
 *    compose the way stream order composes. A claim is only a claim: the application may have
 *    recorded the event again behind sop's back, or destroyed it and made a new event that the
 *    driver gave the same handle. sop acts on a claim only once one of its own probes proves it:
 *    it follows a claim by making the stream wait for a probe that covers the free (redundant, and
 *    free on the GPU, when the claim is true), and an event synchronization makes frees reusable
 *    only as far as the probes it then finds complete.
 *
 * Probes are sop's own events, recorded only inside a call that names the stream (so never on a
 * stream the application may have destroyed), and only on streams of a device's primary
 * context, which sop keeps alive (sop__driver_primary): an event lives and dies with its
 * context, and sop queries and waits on its probes long after the call that recorded them. A
 * stream of a context the application created gets no probes: its frees become reusable by
 * other streams at synchronizations of the stream or of its context.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* ---- Identity ----------------------------------------------------------------------------- */

CUresult
sop__stream_id(CUstream stream, uint64_t *id)
{
	unsigned long long v = 0;
	CUresult r = SOP_DRV(cuStreamGetId)(stream, &v);

	if (SOP_LIKELY(r == CUDA_SUCCESS)) {
		*id = v;
		return CUDA_SUCCESS;
	}
	/* A special handle names a stream of the current context: say so when there is none. */
	if (sop__stream_special(stream)) {
		CUcontext cur = NULL;
		if (SOP_DRV(cuCtxGetCurrent)(&cur) == CUDA_SUCCESS && !cur)
			return CUDA_ERROR_INVALID_CONTEXT;
	}
	return r;
}

/* ---- Stream records ----------------------------------------------------------------------- */

#define STREAM_BUCKETS 256

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sop__stream *streams[STREAM_BUCKETS];
static atomic_uint n_streams;

static unsigned
stream_bucket(uint64_t id)
{
	return (unsigned)(id * 0x9E3779B97F4A7C15u >> 56) % STREAM_BUCKETS;
}

/* What the driver says of a stream seen for the first time: its context, the context's id and
 * device, and whether it is the device's primary context (probes are recorded only there). */
static CUresult
stream_describe(CUstream stream, struct sop__stream *st)
{
	unsigned long long ctx_id = 0;
	CUcontext ctx = NULL, primary = NULL, popped;
	CUdevice device = 0;
	CUresult r;

	r = SOP_DRV(cuStreamGetCtx)(stream, &ctx);
	if (r == CUDA_SUCCESS)
		r = SOP_DRV(cuCtxGetId)(ctx, &ctx_id);
	if (r == CUDA_SUCCESS)
		r = SOP_DRV(cuCtxPushCurrent)(ctx);
	if (r != CUDA_SUCCESS)
		return r;
	r = SOP_DRV(cuCtxGetDevice)(&device);
	SOP_DRV(cuCtxPopCurrent)(&popped);
	if (r == CUDA_SUCCESS)
		r = sop__driver_primary(device, &primary);
	if (r != CUDA_SUCCESS)
		return r;
	st->ctx = ctx;
	st->ctx_id = ctx_id;
	st->device = device;
	st->probes_ok = primary == ctx;
	return CUDA_SUCCESS;
}

static struct sop__stream *
stream_find_locked(uint64_t id)
{
	struct sop__stream *st;

	for (st = streams[stream_bucket(id)]; st; st = st->hash_next)
		if (st->id == id)
			return st;
	return NULL;
}

/* The record of the stream with this id (which stream names now), made on first sight. */
static CUresult
stream_record(CUstream stream, uint64_t id, struct sop__stream **out)
{
	struct sop__stream *st, *had;
	unsigned h = stream_bucket(id);
	CUresult r;

	pthread_mutex_lock(&streams_lock);
	st = stream_find_locked(id);
	pthread_mutex_unlock(&streams_lock);
	if (st) {
		*out = st;
		return CUDA_SUCCESS;
	}
	/* First sight: ask the driver without the lock, then publish unless another thread did. */
	st = calloc(1, sizeof *st);
	if (!st)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = stream_describe(stream, st);
	if (r != CUDA_SUCCESS) {
		free(st);
		return r;
	}
	st->id = id;
	atomic_init(&st->epoch, 1);
	pthread_mutex_init(&st->lock, NULL);
	pthread_mutex_lock(&streams_lock);
	had = stream_find_locked(id);
	if (!had) {
		st->hash_next = streams[h];
		streams[h] = st;
		atomic_fetch_add(&n_streams, 1);
	}
	pthread_mutex_unlock(&streams_lock);
	if (had) {
		pthread_mutex_destroy(&st->lock);
		free(st);
		st = had;
	}
	*out = st;
	return CUDA_SUCCESS;
}

/* This thread's cache of records by stream id, direct-mapped: events and synchronizations name
 * streams on every call, and the table's lock would be taken on each. Records live for the
 * process, so an entry never dangles. */
#define REC_CACHE_LOG2 6

struct rec_cache {
	struct {
		uint64_t id;
		struct sop__stream *st;
	} e[1u << REC_CACHE_LOG2];
};

static __thread struct rec_cache *rcache __attribute__((tls_model("initial-exec")));
static pthread_key_t rcache_key;
static pthread_once_t rcache_once = PTHREAD_ONCE_INIT;

static void
rcache_key_make(void)
{
	pthread_key_create(&rcache_key, free);
}

static struct rec_cache *
rcache_get(void)
{
	struct rec_cache *c = rcache;

	if (SOP_LIKELY(c != NULL))
		return c;
	pthread_once(&rcache_once, rcache_key_make);
	c = calloc(1, sizeof *c);
	if (c) {
		pthread_setspecific(rcache_key, c); /* freed when the thread exits */
		rcache = c;
	}
	return c;
}

CUresult
sop__stream_of(CUstream stream, uint64_t id, struct sop__stream **out)
{
	struct rec_cache *c = rcache_get();
	unsigned slot = (unsigned)(id * 0x9E3779B97F4A7C15u >> (64 - REC_CACHE_LOG2));
	CUresult r;

	if (c && c->e[slot].id == id && c->e[slot].st) {
		*out = c->e[slot].st;
		return CUDA_SUCCESS;
	}
	r = stream_record(stream, id, out);
	if (r == CUDA_SUCCESS && c) {
		c->e[slot].id = id;
		c->e[slot].st = *out;
	}
	return r;
}

CUresult
sop__stream_lookup(CUstream stream, struct sop__stream **out)
{
	uint64_t id;
	CUresult r = sop__stream_id(stream, &id);

	return r == CUDA_SUCCESS ? sop__stream_of(stream, id, out) : r;
}

struct sop__stream **
sop__stream_all(uint64_t ctx_id, size_t *n)
{
	struct sop__stream **v, *st;
	size_t k = 0, cap = atomic_load(&n_streams), i;

	*n = 0;
	pthread_mutex_lock(&streams_lock);
	v = cap ? malloc(cap * sizeof *v) : NULL;
	for (i = 0; v && i < STREAM_BUCKETS; i++)
		for (st = streams[i]; st && k < cap; st = st->hash_next)
			if (st->ctx_id == ctx_id)
				v[k++] = st;
	pthread_mutex_unlock(&streams_lock);
	*n = k;
	return v;
}

bool
sop__streams_interact(void)
{
	return atomic_load_explicit(&n_streams, memory_order_relaxed) > 1;
}

uint64_t
sop__stream_mark(struct sop__stream *st)
{
	return atomic_fetch_add(&st->epoch, 1);
}

/* ---- Probes ------------------------------------------------------------------------------- */

/* One probe every this many frees on a stream, or sooner (see sop__stream_after_free). */
#define PROBE_EVERY 64

/* Record the next probe on st, which handle names in the current call (checked by the caller).
 * st's lock held. */
static CUresult
probe_record(struct sop__stream *st, CUstream handle)
{
	struct sop__probe *p = &st->probe[st->next_probe];
	CUcontext popped;
	CUresult r;

	if (!p->ev) {
		r = SOP_DRV(cuCtxPushCurrent)(st->ctx);
		if (r != CUDA_SUCCESS)
			return r;
		r = SOP_DRV(cuEventCreate)(&p->ev, CU_EVENT_DISABLE_TIMING);
		SOP_DRV(cuCtxPopCurrent)(&popped);
		if (r != CUDA_SUCCESS) {
			p->ev = NULL;
			return r;
		}
	}
	/* The epoch first: frees tagged up to it were called before the record. */
	p->epoch = sop__stream_mark(st);
	r = SOP_DRV(cuEventRecord)(p->ev, handle);
	if (r != CUDA_SUCCESS) {
		p->pending = false;
		p->epoch = 0;
		return r;
	}
	p->pending = true;
	atomic_store(&st->newest, p->epoch);
	st->next_probe = (st->next_probe + 1) % SOP_PROBES;
	atomic_store_explicit(&st->frees_since, 0, memory_order_relaxed);
	return CUDA_SUCCESS;
}

/* Record a probe unless one recorded since covers seq. With checked false, the caller has not
 * asked the driver who handle is in this call (a free on the stream that allocated the block,
 * stream.c): ask now, so that a probe never lands on a new stream that took a destroyed
 * stream's handle while counting as the old one's. */
static void
probe_if_uncovered(struct sop__stream *st, CUstream handle, uint64_t seq, bool checked)
{
	uint64_t id;

	if (!st->probes_ok)
		return;
	if (!checked && (sop__stream_id(handle, &id) != CUDA_SUCCESS || id != st->id))
		return;
	pthread_mutex_lock(&st->lock);
	if (atomic_load(&st->newest) < seq)
		(void)probe_record(st, handle); /* a failure only loses a chance to reuse early */
	pthread_mutex_unlock(&st->lock);
}

void
sop__stream_after_free(struct sop__stream *st, CUstream handle, uint64_t seq, bool pressure,
		       bool checked)
{
	uint64_t newest = atomic_load_explicit(&st->newest, memory_order_relaxed);
	/* A load and a store, not an atomic add: frees racing on one stream may lose a count,
	 * which only puts off a probe, and a locked add stalled every free on its line. */
	unsigned since = atomic_load_explicit(&st->frees_since, memory_order_relaxed) + 1;
	bool due;

	atomic_store_explicit(&st->frees_since, since, memory_order_relaxed);
	if (newest >= seq)
		return; /* a probe recorded since covers this free */
	/* Also when the newest probe is known complete and the stream has been marked since (a
	 * synchronization or an event): then the stream went quiet after a burst, and this free
	 * would otherwise wait 64 more for a probe. Completions learnt between marks, by queries,
	 * never trigger this: they would turn every free into a probe. */
	due = pressure       /* a full pool: cover every free, for internal dependencies */
	      || !newest     /* never probed: the first free gets one */
	      || since >= PROBE_EVERY ||
	      (atomic_load_explicit(&st->done, memory_order_relaxed) >= newest &&
	       atomic_load_explicit(&st->epoch, memory_order_relaxed) > newest + 1);
	if (due)
		probe_if_uncovered(st, handle, seq, checked);
}

void
sop__stream_probe(struct sop__stream *st, CUstream handle, uint64_t seq)
{
	probe_if_uncovered(st, handle, seq, true);
}

/* Query the pending probes, oldest first, and stop at the first still running: probes on one
 * stream complete in order. Stream lock held. */
static void
probes_poll_locked(struct sop__stream *st)
{
	unsigned i, k;

	for (i = 0; i < SOP_PROBES; i++) {
		struct sop__probe *p = NULL;
		uint64_t best = UINT64_MAX;
		/* The oldest pending probe. */
		for (k = 0; k < SOP_PROBES; k++) {
			if (st->probe[k].pending && st->probe[k].epoch < best) {
				best = st->probe[k].epoch;
				p = &st->probe[k];
			}
		}
		if (!p)
			return;
		if (SOP_DRV(cuEventQuery)(p->ev) != CUDA_SUCCESS)
			return;
		p->pending = false;
		sop__stream_completed(st, p->epoch);
	}
}

void
sop__stream_completed(struct sop__stream *st, uint64_t epoch)
{
	uint64_t done = atomic_load(&st->done);

	while (done < epoch && !atomic_compare_exchange_weak(&st->done, &done, epoch))
		;
}

/* A probe seen still running is not asked again for this long: a query costs as much as the
 * allocation it serves, and the answer rarely changes faster. */
#define POLL_BACKOFF_NS 4000

uint64_t
sop__now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

uint64_t
sop__stream_poll(struct sop__stream *st)
{
	uint64_t done = atomic_load(&st->done), t;

	/* Nothing to learn, or asked a moment ago. */
	if (atomic_load(&st->newest) <= done)
		return done;
	t = sop__now_ns();
	if (t < atomic_load_explicit(&st->next_poll_ns, memory_order_relaxed))
		return done;
	pthread_mutex_lock(&st->lock);
	probes_poll_locked(st);
	if (atomic_load(&st->newest) > atomic_load(&st->done))
		atomic_store_explicit(&st->next_poll_ns, t + POLL_BACKOFF_NS, memory_order_relaxed);
	pthread_mutex_unlock(&st->lock);
	return atomic_load(&st->done);
}

uint64_t
sop__stream_prove(struct sop__stream *st)
{
	if (atomic_load(&st->newest) > atomic_load(&st->done)) {
		pthread_mutex_lock(&st->lock);
		probes_poll_locked(st);
		pthread_mutex_unlock(&st->lock);
	}
	return atomic_load(&st->done);
}

/* ---- Dependencies -------------------------------------------------------------------------- */

/* A clock holds up to SOP_DEPS entries and mostly one or two: copy those only. */
static inline void
clock_copy(struct sop__clock *to, const struct sop__clock *from)
{
	to->n = from->n;
	memcpy(to->e, from->e, from->n * sizeof from->e[0]);
}

/* Add (s, epoch) to a clock of at most SOP_DEPS entries; when it is full the entry with the
 * oldest epoch goes, which only forgets an opportunity. */
static void
deps_add(struct sop__clock *c, struct sop__stream *s, uint64_t epoch)
{
	unsigned i, victim = 0;

	for (i = 0; i < c->n; i++) {
		if (c->e[i].s == s) {
			if (epoch > c->e[i].epoch)
				c->e[i].epoch = epoch;
			return;
		}
	}
	if (c->n < SOP_DEPS) {
		c->e[c->n].s = s;
		c->e[c->n++].epoch = epoch;
		return;
	}
	for (i = 1; i < c->n; i++)
		if (c->e[i].epoch < c->e[victim].epoch)
			victim = i;
	c->e[victim].s = s;
	c->e[victim].epoch = epoch;
}

void
sop__stream_order(struct sop__stream *t, struct sop__clock *deps, struct sop__clock *claims)
{
	/* Most streams never wait on anything: the slow path asks on every allocation. */
	if (!atomic_load_explicit(&t->n_order, memory_order_acquire)) {
		deps->n = 0;
		claims->n = 0;
		return;
	}
	pthread_mutex_lock(&t->lock);
	clock_copy(deps, &t->deps);
	clock_copy(claims, &t->claims);
	pthread_mutex_unlock(&t->lock);
}

/* Note that t's clocks changed. t's lock held. */
static void
order_publish(struct sop__stream *t)
{
	atomic_store_explicit(&t->n_order, t->deps.n + t->claims.n, memory_order_release);
}

CUresult
sop__stream_wait_for(struct sop__stream *t, CUstream t_handle, struct sop__stream *s, uint64_t seq)
{
	struct sop__probe *best = NULL;
	CUresult r = CUDA_ERROR_NOT_FOUND;
	uint64_t covered = 0;
	unsigned k;

	pthread_mutex_lock(&s->lock);
	for (k = 0; k < SOP_PROBES; k++) {
		struct sop__probe *p = &s->probe[k];
		if (p->ev && p->epoch >= seq && (!best || p->epoch < best->epoch))
			best = p;
	}
	if (best) {
		covered = best->epoch;
		/* Under s's lock: the probe cannot be re-recorded between reading its epoch and the
		 * wait, which takes the event as it is now. */
		r = SOP_DRV(cuStreamWaitEvent)(t_handle, best->ev, 0);
	}
	pthread_mutex_unlock(&s->lock);
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&t->lock);
	deps_add(&t->deps, s, covered);
	order_publish(t);
	pthread_mutex_unlock(&t->lock);
	return CUDA_SUCCESS;
}

/* ---- Events --------------------------------------------------------------------------------- */

/* What an event claims, by handle, as last recorded with sop_event_record. */
struct event_entry {
	CUevent ev;
	struct sop__clock clock;
	struct event_entry *next;
};

#define EVENT_SHARDS 16
#define EVENT_BUCKETS 64

static struct {
	pthread_mutex_t lock;
	struct event_entry *bucket[EVENT_BUCKETS];
} events[EVENT_SHARDS] = {
#define SOP_EV_INIT {PTHREAD_MUTEX_INITIALIZER, {0}}
	SOP_EV_INIT, SOP_EV_INIT, SOP_EV_INIT, SOP_EV_INIT, SOP_EV_INIT, SOP_EV_INIT,
	SOP_EV_INIT, SOP_EV_INIT, SOP_EV_INIT, SOP_EV_INIT, SOP_EV_INIT, SOP_EV_INIT,
	SOP_EV_INIT, SOP_EV_INIT, SOP_EV_INIT, SOP_EV_INIT,
#undef SOP_EV_INIT
};

static unsigned
event_hash(CUevent ev)
{
	uintptr_t h = (uintptr_t)ev * 0x9E3779B97F4A7C15u;

	return (unsigned)(h >> 40);
}

/* Find (or make, if create) the entry of ev; its shard's lock is held on return. */
static struct event_entry *
event_find(CUevent ev, bool create, unsigned *shard)
{
	unsigned h = event_hash(ev);
	struct event_entry *e, **bucket;

	*shard = h % EVENT_SHARDS;
	pthread_mutex_lock(&events[*shard].lock);
	bucket = &events[*shard].bucket[(h / EVENT_SHARDS) % EVENT_BUCKETS];
	for (e = *bucket; e; e = e->next)
		if (e->ev == ev)
			return e;
	if (!create)
		return NULL;
	e = calloc(1, sizeof *e);
	if (e) {
		e->ev = ev;
		e->next = *bucket;
		*bucket = e;
	}
	return e;
}

CUresult
sop__event_record(CUevent ev, CUstream stream)
{
	struct sop__clock clock, claims;
	struct sop__stream *st;
	struct event_entry *e;
	unsigned shard, i;
	CUresult r;

	r = sop__stream_lookup(stream, &st);
	if (r == CUDA_ERROR_OUT_OF_MEMORY)
		return SOP_DRV(cuEventRecord)(ev, stream); /* no host memory: no dependency */
	if (r != CUDA_SUCCESS)
		return r;
	/* So that what the event claims can be proven: a probe before it, covering the frees on
	 * the stream so far, which the event's completion then implies (sop__sync_event), and which
	 * a stream that follows the claim can wait for (stream.c, take_followed). */
	if (atomic_load(&st->newest) < atomic_load_explicit(&st->last_free, memory_order_relaxed))
		probe_if_uncovered(st, stream, atomic_load(&st->last_free), true);
	/* What the stream is ordered after, proven or claimed, it passes on as claims. A stream
	 * that never waited (most) carries only its own position: no lock. A wait another thread
	 * enqueues at the same moment has no order against this record. */
	sop__stream_order(st, &clock, &claims);
	for (i = 0; i < claims.n; i++)
		deps_add(&clock, claims.e[i].s, claims.e[i].epoch);
	deps_add(&clock, st, sop__stream_mark(st));
	r = SOP_DRV(cuEventRecord)(ev, stream);
	e = event_find(ev, r == CUDA_SUCCESS, &shard);
	if (e) {
		if (r == CUDA_SUCCESS)
			clock_copy(&e->clock, &clock);
		else
			e->clock.n = 0; /* the event's state is unknown: it carries nothing */
	}
	pthread_mutex_unlock(&events[shard].lock);
	return r;
}

bool
sop__event_clock(CUevent ev, struct sop__clock *out)
{
	struct event_entry *e;
	unsigned shard;

	e = event_find(ev, false, &shard);
	if (e)
		clock_copy(out, &e->clock);
	pthread_mutex_unlock(&events[shard].lock);
	return e != NULL;
}

void
sop__event_forget(CUevent ev)
{
	unsigned h = event_hash(ev), shard = h % EVENT_SHARDS;
	struct event_entry **pp, *e;

	pthread_mutex_lock(&events[shard].lock);
	for (pp = &events[shard].bucket[(h / EVENT_SHARDS) % EVENT_BUCKETS]; (e = *pp);
	     pp = &e->next) {
		if (e->ev == ev) {
			*pp = e->next;
			free(e);
			break;
		}
	}
	pthread_mutex_unlock(&events[shard].lock);
}

CUresult
sop__event_wait(CUstream stream, CUevent ev, unsigned int flags)
{
	struct sop__clock clock;
	struct sop__stream *t;
	unsigned i;
	bool known;
	CUresult r;

	known = sop__event_clock(ev, &clock);
	r = SOP_DRV(cuStreamWaitEvent)(stream, ev, flags);
	if (r != CUDA_SUCCESS || !known || !clock.n)
		return r;
	/* The wait is enqueued: if the event is what sop last saw recorded on it, the stream's
	 * later work is ordered after the event's clock. A claim, until a probe proves it. */
	if (sop__stream_lookup(stream, &t) != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&t->lock);
	for (i = 0; i < clock.n; i++)
		if (clock.e[i].s != t)
			deps_add(&t->claims, clock.e[i].s, clock.e[i].epoch);
	order_publish(t);
	pthread_mutex_unlock(&t->lock);
	return r;
}
