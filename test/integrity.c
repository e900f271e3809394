/* integrity.c - a stress test for data integrity across streams and threads.
 *
 * Several threads, each with two streams of its own, share two pools (one capped, so that it
 * runs out and reuses through inserted dependencies; one that releases everything at every
 * synchronization point, so that it regrows). They run a random mix of: allocations of random
 * sizes, each filled with a tag by work on its stream; checks of that tag by later work on the
 * stream that uses the block, right before its free; frees on the allocating stream, on the
 * thread's other stream after an event, or by another thread after an event; stream, event and
 * context synchronizations; trims; and streams replaced while busy: a thread frees what it
 * holds on one of its streams, destroys the stream with that work still running and creates
 * another, which the driver may give the destroyed one's handle (and sometimes orders after it
 * through an event). Events are destroyed now through sop and now directly, so that the driver
 * hands their handles to new events behind sop's back. A block handed out while work that may
 * still touch it can run shows up as a wrong tag, in the check of the block's earlier owner or
 * in its own.
 *
 * On a GPU the fill and the check are kernels (the fill spins a random while first, so that work
 * overlaps the host's calls). On the simulated driver they are a memset and a copy back checked
 * by a host function on the stream.
 *
 * Usage: test-integrity [--seconds N] [--threads N] [--seed N] [--replace PERMILLE]
 */
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "kernels.ptx.h"

#define MiB ((size_t)1 << 20)
#define MAX_THREADS 16
#define SLOTS 24
#define BOX 64

static int n_threads = 4;
static double seconds = 2.0;
static uint64_t seed0 = 1;
static bool gpu;

static sop_pool_t pools[2];
static CUcontext ctx0;
static CUfunction k_spin_fill, k_check;
static unsigned *dev_errors; /* GPU: one counter per thread */
static unsigned replace_permille = 2; /* of operations that replace one of a thread's streams */
static atomic_ulong host_errors, n_ops, n_oom, n_handoffs, n_syncs, n_trims, n_replaced;

struct block {
	void *p;
	size_t bytes;
	uint32_t tag;
	int pool;
};

/* Blocks handed from one thread to the next, each with the event that orders it. */
struct mailbox {
	pthread_mutex_t lock;
	struct block b[BOX];
	CUevent ev[BOX];
	int n;
};
static struct mailbox boxes[MAX_THREADS];

static uint64_t
rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* ---- Fill and check, by kernels or by the driver's memset and copies ---------------------- */

static void
launch(CUfunction f, CUstream s, void **args)
{
	TH_OK(th.cuLaunchKernel(f, 32, 1, 1, 256, 1, 1, 0, s, args, NULL));
}

static void
fill(struct block *b, CUstream s, long long spin)
{
	if (gpu) {
		unsigned long long n = b->bytes / 4;
		void *args[] = {&b->p, &n, &b->tag, &spin};
		launch(k_spin_fill, s, args);
	} else {
		TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)b->p, b->tag, b->bytes / 4, s));
	}
}

/* Simulated driver: the first and last words copied back, checked by a host function. */
#define EDGE 256

struct host_check {
	uint32_t words[2 * EDGE];
	size_t n;
	uint32_t tag;
};

static void CUDA_CB
host_check_fn(void *arg)
{
	struct host_check *c = arg;
	size_t i;

	for (i = 0; i < c->n; i++) {
		if (c->words[i] != c->tag) {
			atomic_fetch_add(&host_errors, 1);
			break;
		}
	}
	free(c);
}

static void
check(struct block *b, CUstream s, int tid)
{
	if (gpu) {
		unsigned long long n = b->bytes / 4;
		unsigned *bad = dev_errors + tid;
		void *args[] = {&b->p, &n, &b->tag, &bad};
		launch(k_check, s, args);
	} else {
		struct host_check *c = malloc(sizeof *c);
		size_t words = b->bytes / 4, edge = words < EDGE ? words : EDGE;
		CUdeviceptr d = (CUdeviceptr)(uintptr_t)b->p;

		TH_ASSERT(c);
		c->tag = b->tag;
		c->n = 2 * edge;
		TH_OK(th.cuMemcpyDtoHAsync(c->words, d, edge * 4, s));
		TH_OK(th.cuMemcpyDtoHAsync(c->words + edge, d + (words - edge) * 4, edge * 4, s));
		TH_OK(th.cuLaunchHostFunc(s, host_check_fn, c));
	}
}

/* ---- The workers --------------------------------------------------------------------------- */

struct worker {
	int tid;
	CUstream s[2];
	struct block slot[SLOTS];
	int slot_stream[SLOTS]; /* which of s[] last used the block */
	uint64_t rng;
};

static void
take_mail(struct worker *w)
{
	struct mailbox *box = &boxes[w->tid];

	pthread_mutex_lock(&box->lock);
	while (box->n > 0) {
		struct block b;
		CUevent ev;
		box->n--;
		b = box->b[box->n];
		ev = box->ev[box->n];
		/* Ordered after the sender's work, then checked and freed here. */
		TH_OK(sop_stream_wait_event(w->s[0], ev, 0));
		check(&b, w->s[0], w->tid);
		TH_OK(sop_free_async(b.p, w->s[0]));
		TH_OK(sop_event_destroy(ev));
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
	CUresult r;

	bytes &= ~(size_t)3;
	b->pool = (int)(rnd(&w->rng) % 2);
	r = sop_malloc_from_pool_async(&b->p, bytes, pools[b->pool], w->s[which]);
	if (r == CUDA_ERROR_OUT_OF_MEMORY) {
		atomic_fetch_add(&n_oom, 1);
		b->p = NULL;
		return;
	}
	TH_OK(r);
	b->bytes = bytes;
	b->tag = (uint32_t)rnd(&w->rng) | 1;
	w->slot_stream[k] = which;
	fill(b, w->s[which], (long long)(rnd(&w->rng) % 20000));
}

static void
op_free(struct worker *w, int k)
{
	struct block *b = &w->slot[k];
	CUstream s = w->s[w->slot_stream[k]], other = w->s[!w->slot_stream[k]];
	unsigned how = (unsigned)(rnd(&w->rng) % 100);
	CUevent ev;

	check(b, s, w->tid);
	if (how < 60) {
		TH_OK(sop_free_async(b->p, s));
	} else if (how < 85 || n_threads == 1) {
		/* Freed on the other stream, ordered after this one. */
		TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
		TH_OK(sop_event_record(ev, s));
		TH_OK(sop_stream_wait_event(other, ev, 0));
		TH_OK(sop_free_async(b->p, other));
		/* Now and then behind sop's back: the next event may get this handle. */
		if (rnd(&w->rng) % 2)
			TH_OK(sop_event_destroy(ev));
		else
			TH_OK(th.cuEventDestroy(ev));
	} else {
		/* Handed to the next thread, which checks it again and frees it. */
		struct mailbox *box = &boxes[(w->tid + 1) % n_threads];
		TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
		TH_OK(sop_event_record(ev, s));
		pthread_mutex_lock(&box->lock);
		if (box->n < BOX) {
			box->b[box->n] = *b;
			box->ev[box->n++] = ev;
			ev = NULL;
		}
		pthread_mutex_unlock(&box->lock);
		if (ev) {
			TH_OK(sop_free_async(b->p, s));
			TH_OK(sop_event_destroy(ev));
		} else {
			atomic_fetch_add(&n_handoffs, 1);
		}
	}
	b->p = NULL;
}

/* Free what the thread holds on one of its streams there, destroy the stream with that work
 * still running, and make a new one, which the driver may give the old handle; half the time
 * the new stream is ordered after the old one's work through an event, as a program that hands
 * work on would do. */
static void
op_replace(struct worker *w, int which)
{
	CUstream old = w->s[which];
	bool chain = rnd(&w->rng) % 2;
	CUevent ev = NULL;
	int k;

	for (k = 0; k < SLOTS; k++) {
		struct block *b = &w->slot[k];
		if (b->p && w->slot_stream[k] == which) {
			check(b, old, w->tid);
			TH_OK(sop_free_async(b->p, old));
			b->p = NULL;
		}
	}
	if (chain) {
		TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
		TH_OK(sop_event_record(ev, old));
	}
	th_stream_destroy(old);
	w->s[which] = th_stream();
	if (chain) {
		TH_OK(sop_stream_wait_event(w->s[which], ev, 0));
		TH_OK(sop_event_destroy(ev));
	}
	atomic_fetch_add(&n_replaced, 1);
}

static void
op_misc(struct worker *w)
{
	unsigned r = (unsigned)(rnd(&w->rng) % 1000);

	if (r >= 1000 - replace_permille) {
		op_replace(w, (int)(rnd(&w->rng) % 2));
	} else if (r < 5) {
		TH_OK(sop_stream_synchronize(w->s[r % 2]));
		atomic_fetch_add(&n_syncs, 1);
	} else if (r < 7) {
		CUevent ev;
		TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
		TH_OK(sop_event_record(ev, w->s[r % 2]));
		TH_OK(sop_event_synchronize(ev));
		TH_OK(sop_event_destroy(ev));
		atomic_fetch_add(&n_syncs, 1);
	} else if (r < 8 && rnd(&w->rng) % 4 == 0) {
		TH_OK(sop_ctx_synchronize());
		atomic_fetch_add(&n_syncs, 1);
	} else if (r < 11) {
		TH_OK(sop_trim_to(pools[r % 2], (size_t)(rnd(&w->rng) % 4) * 32 * MiB));
		atomic_fetch_add(&n_trims, 1);
	}
}

static void *
worker_fn(void *arg)
{
	struct worker *w = arg;
	double end = th_seconds() + seconds;
	unsigned long ops = 0;
	int k;

	TH_OK(th.cuCtxSetCurrent(ctx0));
	w->s[0] = th_stream();
	w->s[1] = th_stream();
	while (th_seconds() < end) {
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
	atomic_fetch_add(&n_ops, ops);
	return NULL;
}

int
main(int argc, char **argv)
{
	struct worker *w;
	pthread_t t[MAX_THREADS];
	unsigned host_bad[MAX_THREADS] = {0};
	cuuint64_t zero = 0;
	sop_pool_t aux;
	int i;

	for (i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--seconds"))
			seconds = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--threads"))
			n_threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--seed"))
			seed0 = strtoull(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--replace"))
			replace_permille = (unsigned)atoi(argv[i + 1]);
	}
	if (n_threads < 1 || n_threads > MAX_THREADS)
		n_threads = 4;
	gpu = !th_init();
	TH_OK(sop__drv.cuCtxGetCurrent(&ctx0));
	if (gpu) {
		CUmodule mod;
		TH_OK(th.cuModuleLoadData(&mod, sop_kernels_ptx));
		TH_OK(th.cuModuleGetFunction(&k_spin_fill, mod, "sop_spin_fill"));
		TH_OK(th.cuModuleGetFunction(&k_check, mod, "sop_check"));
	}
	pools[0] = th_pool(0, 64 * MiB);
	pools[1] = th_pool(0, 0);
	TH_OK(sop_pool_set_attr(pools[1], CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero));
	aux = th_pool(0, 0);
	{
		CUstream s = th_stream();
		TH_OK(sop_malloc_from_pool_async((void **)&dev_errors, 4 * MAX_THREADS, aux, s));
		TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)dev_errors, 0, MAX_THREADS, s));
		TH_OK(sop_stream_synchronize(s));
		th_stream_destroy(s);
	}
	w = calloc((size_t)n_threads, sizeof *w);
	TH_ASSERT(w);
	for (i = 0; i < n_threads; i++) {
		pthread_mutex_init(&boxes[i].lock, NULL);
		w[i].tid = i;
		w[i].rng = (seed0 + 1) * 0x9E3779B97F4A7C15u ^ (uint64_t)(i + 1) * 0xBF58476D1CE4E5B9u;
	}
	for (i = 0; i < n_threads; i++)
		TH_ASSERT(pthread_create(&t[i], NULL, worker_fn, &w[i]) == 0);
	for (i = 0; i < n_threads; i++)
		pthread_join(t[i], NULL);
	/* What is still in the mailboxes, then everything settles. */
	for (i = 0; i < n_threads; i++)
		take_mail(&w[i]);
	TH_OK(sop_ctx_synchronize());
	if (gpu) {
		CUstream s = w[0].s[0];
		TH_OK(th.cuMemcpyDtoHAsync(host_bad, (CUdeviceptr)(uintptr_t)dev_errors,
					   sizeof host_bad, s));
		TH_OK(sop_stream_synchronize(s));
		for (i = 0; i < n_threads; i++)
			atomic_fetch_add(&host_errors, host_bad[i]);
	}
	printf("integrity: %s, %d threads, %.0f s, seed %llu: %lu operations, %lu handoffs, "
	       "%lu synchronizations, %lu trims, %lu streams replaced busy, %lu out of memory, "
	       "%lu errors\n",
	       gpu ? "GPU" : "simulated driver", n_threads, seconds, (unsigned long long)seed0,
	       atomic_load(&n_ops), atomic_load(&n_handoffs), atomic_load(&n_syncs),
	       atomic_load(&n_trims), atomic_load(&n_replaced), atomic_load(&n_oom),
	       atomic_load(&host_errors));
	TH_EQ(atomic_load(&host_errors), 0);
	for (i = 0; i < 2; i++) {
		TH_CHECK(pools[i]);
		TH_EQ(th_attr(pools[i], CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
		TH_OK(sop_pool_destroy(pools[i]));
	}
	for (i = 0; i < n_threads; i++) {
		th_stream_destroy(w[i].s[0]);
		th_stream_destroy(w[i].s[1]);
	}
	TH_OK(sop_free_async(dev_errors, NULL));
	TH_OK(sop_ctx_synchronize());
	TH_OK(sop_pool_destroy(aux));
	free(w);
	return 0;
}
