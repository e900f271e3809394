/* stress.c - a stress test for data integrity across streams and threads, over the calls of
 * stress.h.
 *
 * Several threads, each with two streams of its own, share two pools (one capped, so that it
 * runs out and reuses through inserted dependencies). They run a random mix of: allocations of
 * random sizes, each filled with a tag by work on its stream; checks of that tag by later work on
 * the stream that uses the block, right before its free; frees on the allocating stream, on the
 * thread's other stream after an event, or by another thread after an event; stream, event and
 * context synchronizations; trims; and streams replaced while busy: a thread frees what it holds
 * on one of its streams, destroys the stream with that work still running and creates another,
 * which the driver may give the destroyed one's handle (and sometimes orders after it through an
 * event). Events are destroyed now through the allocator's layer and now directly, so that the
 * driver hands their handles to new events behind its back. A block handed out while work that
 * may still touch it can run shows up as a wrong tag, in the check of the block's earlier owner
 * or in its own.
 *
 * On a GPU the fill and the check are kernels (the fill spins a random while first, so that work
 * overlaps the host's calls). On the simulated driver they are a memset and a copy back checked
 * by a host function on the stream.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "stress.h"

#define SLOTS 24
#define BOX 64
#define EDGE 256 /* simulated driver: the first and last words copied back */

struct block {
	CUdeviceptr p;
	size_t bytes;
	uint32_t tag;
};

/* Blocks handed from one thread to the next, each with the event that orders it. */
struct mailbox {
	pthread_mutex_t lock;
	struct block b[BOX];
	CUevent ev[BOX];
	int n;
};

struct worker {
	struct stress *st;
	const struct stress_api *api;
	struct mailbox *boxes;
	int tid;
	CUstream s[2];
	struct block slot[SLOTS];
	int slot_stream[SLOTS]; /* which of s[] last used the block */
	uint64_t rng;
};

static uint64_t
rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static CUstream
stream_new(const struct stress_api *api)
{
	CUstream s;

	STRESS_OK(api->stream_create(&s, CU_STREAM_NON_BLOCKING));
	return s;
}

static CUevent
event_new(const struct stress_api *api)
{
	CUevent e;

	STRESS_OK(api->event_create(&e, CU_EVENT_DISABLE_TIMING));
	return e;
}

/* ---- Fill and check, by kernels or by the driver's memset and copies ---------------------- */

static void
fill(struct worker *w, struct block *b, CUstream s, long long spin)
{
	if (w->st->spin_fill) {
		unsigned long long n = b->bytes / 4;
		void *args[] = {&b->p, &n, &b->tag, &spin};
		STRESS_OK(w->api->launch(w->st->spin_fill, 32, 1, 1, 256, 1, 1, 0, s, args, NULL));
	} else {
		STRESS_OK(w->api->memset32(b->p, b->tag, b->bytes / 4, s));
	}
}

struct host_check {
	uint32_t words[2 * EDGE];
	size_t n;
	uint32_t tag;
	atomic_ulong *errors;
};

static void CUDA_CB
host_check_fn(void *arg)
{
	struct host_check *c = arg;
	size_t i;

	for (i = 0; i < c->n; i++) {
		if (c->words[i] != c->tag) {
			atomic_fetch_add(c->errors, 1);
			break;
		}
	}
	free(c);
}

static void
check(struct worker *w, struct block *b, CUstream s)
{
	if (w->st->check) {
		unsigned long long n = b->bytes / 4;
		unsigned *bad = w->st->dev_errors + w->tid;
		void *args[] = {&b->p, &n, &b->tag, &bad};
		STRESS_OK(w->api->launch(w->st->check, 32, 1, 1, 256, 1, 1, 0, s, args, NULL));
	} else {
		struct host_check *c = malloc(sizeof *c);
		size_t words = b->bytes / 4, edge = words < EDGE ? words : EDGE;

		if (!c)
			exit(1);
		c->tag = b->tag;
		c->n = 2 * edge;
		c->errors = &w->st->errors;
		STRESS_OK(w->api->copy_dtoh(c->words, b->p, edge * 4, s));
		STRESS_OK(w->api->copy_dtoh(c->words + edge, b->p + (words - edge) * 4, edge * 4, s));
		STRESS_OK(w->api->host_func(s, host_check_fn, c));
	}
}

/* ---- The workers --------------------------------------------------------------------------- */

static void
take_mail(struct worker *w)
{
	struct mailbox *box = &w->boxes[w->tid];

	pthread_mutex_lock(&box->lock);
	while (box->n > 0) {
		struct block b;
		CUevent ev;
		box->n--;
		b = box->b[box->n];
		ev = box->ev[box->n];
		/* Ordered after the sender's work, then checked and freed here. */
		STRESS_OK(w->api->stream_wait_event(w->s[0], ev, 0));
		check(w, &b, w->s[0]);
		STRESS_OK(w->api->free(b.p, w->s[0]));
		STRESS_OK(w->api->event_destroy(ev));
	}
	pthread_mutex_unlock(&box->lock);
}

static void
op_alloc(struct worker *w, int k)
{
	struct block *b = &w->slot[k];
	int which = (int)(rnd(&w->rng) % 2);
	unsigned e = (unsigned)(rnd(&w->rng) % 14); /* 512 B .. 8 MiB, log-uniform */
	size_t bytes = ((size_t)512 << e) + (rnd(&w->rng) % ((size_t)512 << e));
	int pool;
	CUresult r;

	bytes &= ~(size_t)3;
	pool = (int)(rnd(&w->rng) % 2);
	r = w->api->alloc(&b->p, bytes, pool, w->s[which]);
	if (r == CUDA_ERROR_OUT_OF_MEMORY) {
		atomic_fetch_add(&w->st->oom, 1);
		b->p = 0;
		return;
	}
	STRESS_OK(r);
	if (w->api->allocated)
		w->api->allocated(b->p);
	b->bytes = bytes;
	b->tag = (uint32_t)rnd(&w->rng) | 1;
	w->slot_stream[k] = which;
	fill(w, b, w->s[which], (long long)(rnd(&w->rng) % 20000));
}

static void
op_free(struct worker *w, int k)
{
	const struct stress_api *api = w->api;
	struct block *b = &w->slot[k];
	CUstream s = w->s[w->slot_stream[k]], other = w->s[!w->slot_stream[k]];
	unsigned how = (unsigned)(rnd(&w->rng) % 100);
	int n_threads = w->st->n_threads;
	CUevent ev;

	check(w, b, s);
	if (how < 60) {
		STRESS_OK(api->free(b->p, s));
	} else if (how < 85 || n_threads == 1) {
		/* Freed on the other stream, ordered after this one. */
		ev = event_new(api);
		STRESS_OK(api->event_record(ev, s));
		STRESS_OK(api->stream_wait_event(other, ev, 0));
		STRESS_OK(api->free(b->p, other));
		/* Now and then behind the allocator's back: the next event may get this handle. */
		if (rnd(&w->rng) % 2)
			STRESS_OK(api->event_destroy(ev));
		else
			STRESS_OK(api->event_destroy_direct(ev));
	} else {
		/* Handed to the next thread, which checks it again and frees it. */
		struct mailbox *box = &w->boxes[(w->tid + 1) % n_threads];
		ev = event_new(api);
		STRESS_OK(api->event_record(ev, s));
		pthread_mutex_lock(&box->lock);
		if (box->n < BOX) {
			box->b[box->n] = *b;
			box->ev[box->n++] = ev;
			ev = NULL;
		}
		pthread_mutex_unlock(&box->lock);
		if (ev) {
			STRESS_OK(api->free(b->p, s));
			STRESS_OK(api->event_destroy(ev));
		} else {
			atomic_fetch_add(&w->st->handoffs, 1);
		}
	}
	b->p = 0;
}

/* Free what the thread holds on one of its streams there, destroy the stream with that work
 * still running, and make a new one, which the driver may give the old handle; half the time
 * the new stream is ordered after the old one's work through an event, as a program that hands
 * work on would do. */
static void
op_replace(struct worker *w, int which)
{
	const struct stress_api *api = w->api;
	CUstream old = w->s[which];
	bool chain = rnd(&w->rng) % 2;
	CUevent ev = NULL;
	int k;

	for (k = 0; k < SLOTS; k++) {
		struct block *b = &w->slot[k];
		if (b->p && w->slot_stream[k] == which) {
			check(w, b, old);
			STRESS_OK(api->free(b->p, old));
			b->p = 0;
		}
	}
	if (chain) {
		ev = event_new(api);
		STRESS_OK(api->event_record(ev, old));
	}
	STRESS_OK(api->stream_destroy(old));
	w->s[which] = stream_new(api);
	if (chain) {
		STRESS_OK(api->stream_wait_event(w->s[which], ev, 0));
		STRESS_OK(api->event_destroy(ev));
	}
	atomic_fetch_add(&w->st->replaced, 1);
}

static void
op_misc(struct worker *w)
{
	const struct stress_api *api = w->api;
	struct stress *st = w->st;
	unsigned r = (unsigned)(rnd(&w->rng) % 1000);

	if (r >= 1000 - st->replace_permille) {
		op_replace(w, (int)(rnd(&w->rng) % 2));
	} else if (r < 5) {
		STRESS_OK(api->stream_synchronize(w->s[r % 2]));
		atomic_fetch_add(&st->syncs, 1);
	} else if (r < 7) {
		CUevent ev = event_new(api);
		STRESS_OK(api->event_record(ev, w->s[r % 2]));
		STRESS_OK(api->event_synchronize(ev));
		STRESS_OK(api->event_destroy(ev));
		atomic_fetch_add(&st->syncs, 1);
	} else if (r < 8 && rnd(&w->rng) % 4 == 0) {
		STRESS_OK(api->ctx_synchronize());
		atomic_fetch_add(&st->syncs, 1);
	} else if (r < 11) {
		STRESS_OK(api->trim((int)(r % 2), (size_t)(rnd(&w->rng) % 4) * st->trim_step));
		atomic_fetch_add(&st->trims, 1);
	}
}

static void *
worker_fn(void *arg)
{
	struct worker *w = arg;
	double end = now_s() + w->st->seconds;
	unsigned long ops = 0;
	int k;

	STRESS_OK(w->api->ctx_set_current(w->st->ctx));
	w->s[0] = stream_new(w->api);
	w->s[1] = stream_new(w->api);
	while (now_s() < end) {
		for (int i = 0; i < 64; i++, ops++) {
			k = (int)(rnd(&w->rng) % SLOTS);
			if (w->slot[k].p)
				op_free(w, k);
			else
				op_alloc(w, k);
			op_misc(w);
		}
		take_mail(w);
	}
	for (k = 0; k < SLOTS; k++)
		if (w->slot[k].p)
			op_free(w, k);
	atomic_fetch_add(&w->st->ops, ops);
	return NULL;
}

bool
stress_option(struct stress *s, const char *name, const char *value)
{
	if (!strcmp(name, "--seconds"))
		s->seconds = atof(value);
	else if (!strcmp(name, "--threads"))
		s->n_threads = atoi(value);
	else if (!strcmp(name, "--seed"))
		s->seed = strtoull(value, NULL, 0);
	else if (!strcmp(name, "--replace"))
		s->replace_permille = (unsigned)atoi(value);
	else
		return false;
	if (s->n_threads < 1 || s->n_threads > STRESS_MAX_THREADS)
		s->n_threads = 4;
	return true;
}

void
stress_run(struct stress *st)
{
	struct mailbox boxes[STRESS_MAX_THREADS];
	struct worker *w = calloc(STRESS_MAX_THREADS, sizeof *w);
	pthread_t t[STRESS_MAX_THREADS];
	unsigned bad[STRESS_MAX_THREADS] = {0};
	int i, n = st->n_threads;

	if (!w || n < 1 || n > STRESS_MAX_THREADS)
		exit(1);
	memset(boxes, 0, sizeof boxes);
	for (i = 0; i < n; i++) {
		pthread_mutex_init(&boxes[i].lock, NULL);
		w[i].st = st;
		w[i].api = st->api;
		w[i].boxes = boxes;
		w[i].tid = i;
		w[i].rng = (st->seed + 1) * 0x9E3779B97F4A7C15u ^ (uint64_t)(i + 1) * 0xBF58476D1CE4E5B9u;
	}
	for (i = 0; i < n; i++)
		if (pthread_create(&t[i], NULL, worker_fn, &w[i]) != 0)
			exit(1);
	for (i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	/* What is still in the mailboxes, then everything settles. */
	for (i = 0; i < n; i++)
		take_mail(&w[i]);
	STRESS_OK(st->api->ctx_synchronize());
	if (st->dev_errors) {
		CUstream s = w[0].s[0];
		STRESS_OK(st->api->copy_dtoh(bad, (CUdeviceptr)(uintptr_t)st->dev_errors, sizeof bad, s));
		STRESS_OK(st->api->stream_synchronize(s));
		for (i = 0; i < n; i++)
			atomic_fetch_add(&st->errors, bad[i]);
	}
	for (i = 0; i < n; i++) {
		STRESS_OK(st->api->stream_destroy(w[i].s[0]));
		STRESS_OK(st->api->stream_destroy(w[i].s[1]));
		pthread_mutex_destroy(&boxes[i].lock);
	}
	free(w);
}
