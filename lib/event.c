/* event.c - what a stream's future work is ordered after: dependencies sop made (a wait for a
 * probe) and claims that events carry from stream to stream (order.c's top says what each
 * proves and when sop acts on a claim).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- Dependencies -------------------------------------------------------------------------- */

/* A clock holds up to SOP_DEPS entries and mostly one or two: copy those only. */
static inline void
clock_copy(struct sop__clock *to, const struct sop__clock *from)
{
	to->n = from->n;
	memcpy(to->e, from->e, from->n * sizeof from->e[0]);
}

/* Add (st, epoch) to a clock of at most SOP_DEPS entries; when it is full the entry with the
 * oldest epoch goes, which only forgets an opportunity. */
static void
deps_add(struct sop__clock *c, uint64_t id, uint64_t gen, uint64_t epoch)
{
	unsigned i, victim = 0;

	for (i = 0; i < c->n; i++) {
		if (c->e[i].gen == gen) {
			if (epoch > c->e[i].epoch)
				c->e[i].epoch = epoch;
			return;
		}
	}
	if (c->n < SOP_DEPS) {
		c->e[c->n].id = id;
		c->e[c->n].gen = gen;
		c->e[c->n++].epoch = epoch;
		return;
	}
	for (i = 1; i < c->n; i++)
		if (c->e[i].epoch < c->e[victim].epoch)
			victim = i;
	c->e[victim].id = id;
	c->e[victim].gen = gen;
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
	sop__mutex_take(&t->lock, SOP_RANK_RECORD);
	clock_copy(deps, &t->deps);
	clock_copy(claims, &t->claims);
	sop__mutex_drop(&t->lock);
}

/* Note that t's clocks changed. t's lock held. */
static void
order_publish(struct sop__stream *t)
{
	SOP_HELD(&t->lock);
	atomic_store_explicit(&t->n_order, t->deps.n + t->claims.n, memory_order_release);
}

CUresult
sop__stream_wait_for(struct sop__stream *t, CUstream t_handle, struct sop__stream *s, uint64_t seq)
{
	struct sop__probe *best = NULL;
	CUresult r = CUDA_ERROR_NOT_FOUND;
	uint64_t covered = 0;
	unsigned k;

	sop__mutex_take(&s->lock, SOP_RANK_RECORD);
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
	sop__mutex_drop(&s->lock);
	if (r != CUDA_SUCCESS)
		return r;
	sop__mutex_take(&t->lock, SOP_RANK_RECORD);
	deps_add(&t->deps, s->id, s->gen, covered);
	order_publish(t);
	sop__mutex_drop(&t->lock);
	return CUDA_SUCCESS;
}

/* ---- Events --------------------------------------------------------------------------------- */

/* What an event claims, by handle, as last recorded with sop_event_record. An event destroyed
 * with the driver's call leaves its entry behind (until an event at the same handle is recorded
 * through sop), so the table is bounded: past EVENTS_PER_SHARD entries a shard forgets its oldest,
 * which only loses what a wait on that event would have claimed. */
struct event_entry {
	CUevent ev;
	struct event_entry *next;               /* in its bucket */
	struct event_entry *older, *newer;      /* in its shard, by when they were made */
	struct sop__clock clock;
};

#define EVENT_SHARDS 16
#define EVENT_BUCKETS 64
#define EVENTS_PER_SHARD 128

static struct {
	pthread_mutex_t lock;
	struct event_entry *bucket[EVENT_BUCKETS];
	struct event_entry *oldest, *newest;
	unsigned n;
} events[EVENT_SHARDS] = {
#define SOP_EV_INIT {PTHREAD_MUTEX_INITIALIZER, {0}, NULL, NULL, 0}
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

static struct event_entry **
event_bucket(CUevent ev, unsigned *shard)
{
	unsigned h = event_hash(ev);

	*shard = h % EVENT_SHARDS;
	return &events[*shard].bucket[(h / EVENT_SHARDS) % EVENT_BUCKETS];
}

/* Take e out of its shard and free it. Shard lock held. */
static void
event_drop(unsigned shard, struct event_entry *e)
{
	struct event_entry **pp;
	unsigned s2;

	for (pp = event_bucket(e->ev, &s2); *pp != e; pp = &(*pp)->next)
		;
	*pp = e->next;
	if (e->older)
		e->older->newer = e->newer;
	else
		events[shard].oldest = e->newer;
	if (e->newer)
		e->newer->older = e->older;
	else
		events[shard].newest = e->older;
	events[shard].n--;
	free(e);
}

/* Find (or make, if create) the entry of ev; its shard's lock is held on return. */
static struct event_entry *
event_find(CUevent ev, bool create, unsigned *shard)
{
	struct event_entry *e, **bucket = event_bucket(ev, shard);

	sop__mutex_take(&events[*shard].lock, SOP_RANK_EVENT);
	for (e = *bucket; e; e = e->next)
		if (e->ev == ev)
			return e;
	if (!create)
		return NULL;
	if (events[*shard].n >= EVENTS_PER_SHARD)
		event_drop(*shard, events[*shard].oldest);
	e = calloc(1, sizeof *e);
	if (e) {
		e->ev = ev;
		e->next = *bucket;
		*bucket = e;
		e->older = events[*shard].newest;
		if (e->older)
			e->older->newer = e;
		else
			events[*shard].oldest = e;
		events[*shard].newest = e;
		events[*shard].n++;
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

	r = sop__stream_lookup(stream, false, &st);
	/* Recorded into a graph: the event then carries nothing sop knows (a wait on it joins the
	 * waiting stream to the capture). */
	if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
		sop__event_forget(ev);
	if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
		return SOP_DRV(cuEventRecord)(ev, stream); /* no host memory: no dependency either */
	if (r != CUDA_SUCCESS)
		return r;
	/* So that what the event claims can be proven: a probe before it, covering the frees on
	 * the stream so far, which the event's completion then implies (sop__sync_event), and which
	 * a stream that follows the claim can wait for (reuse.c, take_followed). */
	sop__probe_all_frees(st, stream);
	/* What the stream is ordered after, proven or claimed, it passes on as claims. A stream
	 * that never waited (most) carries only its own position: no lock. A wait another thread
	 * enqueues at the same moment has no order against this record. */
	sop__stream_order(st, &clock, &claims);
	for (i = 0; i < claims.n; i++)
		deps_add(&clock, claims.e[i].id, claims.e[i].gen, claims.e[i].epoch);
	deps_add(&clock, st->id, st->gen, sop__stream_mark(st));
	r = SOP_DRV(cuEventRecord)(ev, stream);
	e = event_find(ev, r == CUDA_SUCCESS, &shard);
	if (e) {
		if (r == CUDA_SUCCESS)
			clock_copy(&e->clock, &clock);
		else
			e->clock.n = 0; /* the event's state is unknown: it carries nothing */
	}
	sop__mutex_drop(&events[shard].lock);
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
	sop__mutex_drop(&events[shard].lock);
	return e != NULL;
}

void
sop__event_forget(CUevent ev)
{
	struct event_entry *e;
	unsigned shard;

	e = event_find(ev, false, &shard);
	if (e)
		event_drop(shard, e);
	sop__mutex_drop(&events[shard].lock);
}

size_t
sop__events_live(void)
{
	size_t n = 0;
	unsigned i;

	for (i = 0; i < EVENT_SHARDS; i++) {
		sop__mutex_take(&events[i].lock, SOP_RANK_EVENT);
		n += events[i].n;
		sop__mutex_drop(&events[i].lock);
	}
	return n;
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
	if (sop__stream_lookup(stream, false, &t) != CUDA_SUCCESS)
		return r;
	sop__mutex_take(&t->lock, SOP_RANK_RECORD);
	for (i = 0; i < clock.n; i++)
		if (clock.e[i].gen != t->gen)
			deps_add(&t->claims, clock.e[i].id, clock.e[i].gen, clock.e[i].epoch);
	order_publish(t);
	sop__mutex_drop(&t->lock);
	return r;
}
