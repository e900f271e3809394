/* order.c - what sop knows of stream order: per-stream epochs, probe events, and the
 * dependencies that events carry from stream to stream.
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
 *    sop recorded on the stream (the opportunistic policy);
 *  - `dep[]`: the streams and epochs this stream's future work is ordered after, through events
 *    recorded with sop_event_record and waited on with sop_stream_wait_event (the
 *    follow-event-dependencies policy), or through waits sop inserted itself (the internal
 *    dependencies policy). An event carries the recording stream's own epoch plus its deps, so
 *    dependencies compose the way stream order composes.
 *
 * sop records on a stream only inside a call that names it, so it never touches a stream the
 * application may have destroyed; it queries and waits only on its own probe events.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* ---- Stream records ----------------------------------------------------------------------- */

#define STREAM_BUCKETS 256

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sop__stream *streams[STREAM_BUCKETS];
static atomic_uint n_streams;

struct sop__stream *
sop__stream_record(uint64_t id, CUcontext ctx)
{
	struct sop__stream *st;
	unsigned h = (unsigned)(id * 0x9E3779B97F4A7C15u >> 56) % STREAM_BUCKETS;

	pthread_mutex_lock(&streams_lock);
	for (st = streams[h]; st; st = st->hash_next)
		if (st->id == id)
			goto out;
	st = calloc(1, sizeof *st);
	if (!st)
		goto out;
	st->id = id;
	st->ctx = ctx;
	atomic_init(&st->epoch, 1);
	pthread_mutex_init(&st->lock, NULL);
	st->hash_next = streams[h];
	streams[h] = st;
	atomic_fetch_add(&n_streams, 1);
out:
	pthread_mutex_unlock(&streams_lock);
	return st;
}

struct sop__stream **
sop__stream_all(CUcontext ctx, size_t *n)
{
	struct sop__stream **v, *st;
	size_t k = 0, cap = atomic_load(&n_streams), i;

	*n = 0;
	pthread_mutex_lock(&streams_lock);
	v = cap ? malloc(cap * sizeof *v) : NULL;
	for (i = 0; v && i < STREAM_BUCKETS; i++)
		for (st = streams[i]; st && k < cap; st = st->hash_next)
			if (st->ctx == ctx)
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

void
sop__stream_after_free(struct sop__stream *st, CUstream handle, uint64_t seq, bool pressure)
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
	if (!due)
		return;
	pthread_mutex_lock(&st->lock);
	if (atomic_load(&st->newest) < seq)
		(void)probe_record(st, handle); /* a failure only loses a chance to reuse early */
	pthread_mutex_unlock(&st->lock);
}

void
sop__stream_probe(struct sop__stream *st, CUstream handle, uint64_t seq)
{
	pthread_mutex_lock(&st->lock);
	if (atomic_load(&st->newest) < seq)
		(void)probe_record(st, handle);
	pthread_mutex_unlock(&st->lock);
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

/* ---- Dependencies -------------------------------------------------------------------------- */

/* A clock holds up to SOP_DEPS entries (264 bytes) and mostly one or two: copy those only. */
static inline void
clock_copy(struct sop__clock *to, const struct sop__clock *from)
{
	to->n = from->n;
	memcpy(to->e, from->e, from->n * sizeof from->e[0]);
}

/* Add (s, epoch) to a dependency list of at most SOP_DEPS entries; when it is full the entry
 * with the oldest epoch goes, which only forgets an opportunity. */
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
sop__stream_deps(struct sop__stream *t, struct sop__clock *out)
{
	/* Most streams never wait on an event: the slow path asks on every allocation. */
	if (!atomic_load_explicit(&t->n_deps, memory_order_acquire)) {
		out->n = 0;
		return;
	}
	pthread_mutex_lock(&t->lock);
	clock_copy(out, &t->deps);
	pthread_mutex_unlock(&t->lock);
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
	atomic_store_explicit(&t->n_deps, t->deps.n, memory_order_release);
	pthread_mutex_unlock(&t->lock);
	return CUDA_SUCCESS;
}

/* ---- Events --------------------------------------------------------------------------------- */

/* The dependency an event carries, by handle, as last recorded with sop_event_record. */
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
	struct sop__clock clock;
	struct sop__stream *st;
	struct event_entry *e;
	unsigned shard;
	CUresult r;

	r = sop__stream_lookup(stream, &st);
	if (r == CUDA_ERROR_OUT_OF_MEMORY)
		return SOP_DRV(cuEventRecord)(ev, stream); /* no host memory: no dependency */
	if (r != CUDA_SUCCESS)
		return r;
	/* A stream that never waited on an event (most) carries only its own position: no lock.
	 * A wait another thread enqueues at the same moment has no order against this record. */
	if (atomic_load_explicit(&st->n_deps, memory_order_acquire)) {
		pthread_mutex_lock(&st->lock);
		clock_copy(&clock, &st->deps);
		pthread_mutex_unlock(&st->lock);
	} else {
		clock.n = 0;
	}
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
	/* The wait is enqueued: the stream's later work is ordered after the event's clock. */
	if (sop__stream_lookup(stream, &t) != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&t->lock);
	for (i = 0; i < clock.n; i++)
		if (clock.e[i].s != t)
			deps_add(&t->deps, clock.e[i].s, clock.e[i].epoch);
	atomic_store_explicit(&t->n_deps, t->deps.n, memory_order_release);
	pthread_mutex_unlock(&t->lock);
	return r;
}
