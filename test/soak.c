/* soak.c - many threads, many streams, and a driver that fails now and then, for as long as
 * asked.
 *
 * Worker threads share a few pools, each with reuse policies and a release threshold drawn at
 * random (and drawn again, now and then, while the workers run), one of them capped. Each worker
 * has two streams, which it replaces now and then while they are busy (through sop or behind its
 * back), and runs a random mix of: allocations of random sizes, each filled with a tag by work on
 * its stream; frees, after work on the stream checks the tag, on the same stream or on the other
 * one after an event; synchronizations, trims, policy and threshold changes. Meanwhile the
 * simulated driver fails cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
 * cuEventRecord and cuStreamWaitEvent at a rate. Every call must answer with success or a clean code
 * (CUDA_ERROR_OUT_OF_MEMORY, or the code injected), and a failed call must change nothing: an
 * allocation that failed gave nothing, an event record or wait that failed ordered nothing (the
 * worker then synchronizes instead). Now and then the workers stop at a checkpoint, where every
 * pool passes sop__pool_check and uses exactly the bytes the workers hold. A watchdog fails the
 * test with a message if no worker makes progress for --watchdog seconds (a deadlock). At the
 * end everything is freed and destroyed: no tag was ever found overwritten (a block handed out
 * while in use), and the driver's objects are back where they started (nothing leaked).
 *
 * Usage: test-soak [--seconds S] [--threads N] [--seed N] [--rate R] [--mem-rate R]
 * [--watchdog S]: --rate for the event calls (default 0.02), --mem-rate for the memory calls,
 * which are far fewer (default 0.1). By hand: test-soak --seconds 600 --threads 16.
 * Needs the simulated driver.
 */
#include <string.h>
#include <time.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)
#define MAX_THREADS 64
#define N_POOLS 4
#define SLOTS 16
#define FAULT CUDA_ERROR_UNKNOWN
/* The probe events sop may hold (test/fuzz.c says how many). */
#define PROBES_MAX (SOP_PROBES * (2 * 256 + 64))

static int n_threads = 8;
/* The memory calls come a few hundred times a second, the event calls tens of thousands. */
static double seconds = 3.0, watchdog_s = 30.0, rate = 0.02, mem_rate = 0.1;
static uint64_t seed0 = 1;

static const char *const faulty[] = {"cuMemCreate",   "cuMemMap",      "cuMemSetAccess",
				     "cuMemUnmap",    "cuMemRelease",  "cuEventRecord",
				     "cuStreamWaitEvent"};
/* The first N_MEM_FAULTY are the memory calls, failed at --mem-rate. */
#define N_MEM_FAULTY 5
#define N_FAULTY (sizeof faulty / sizeof faulty[0])

static sop_pool_t pools[N_POOLS];
static CUcontext ctx0;
static atomic_ulong host_errors, n_ops, n_oom, n_fault, n_fallback, n_replaced, n_syncs;
static atomic_bool stop;

/* Checkpoints: the main thread asks, the workers park, the main thread checks, then lets them
 * go on. */
static pthread_mutex_t cp_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cp_cond = PTHREAD_COND_INITIALIZER;
static atomic_bool cp_wanted;
static int cp_parked;
static unsigned long cp_round;

struct block {
	void *p;
	size_t bytes;
	uint32_t tag;
	int pool, stream;
};

struct worker {
	int tid;
	CUstream s[2];
	struct block slot[SLOTS];
	uint64_t rng;
	atomic_ulong progress;
	_Atomic(const char *) doing; /* for the watchdog's message */
};

static struct worker *workers;

#define DOING(w, what) atomic_store_explicit(&(w)->doing, (what), memory_order_relaxed)

static uint64_t
rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* A code that a call may answer with while the driver fails: success, out of memory, or the
 * injected fault. Anything else fails the test. */
static CUresult
clean(CUresult r, const char *what, int tid)
{
	if (r == CUDA_SUCCESS)
		return r;
	if (r == CUDA_ERROR_OUT_OF_MEMORY) {
		atomic_fetch_add(&n_oom, 1);
		return r;
	}
	if (r == FAULT) {
		atomic_fetch_add(&n_fault, 1);
		return r;
	}
	fprintf(stderr, "soak: thread %d: %s returned %d, not a clean code\n", tid, what, (int)r);
	exit(1);
}

/* ---- Tags: a memset on the stream, and a check of the edges by a host function --------------- */

#define EDGE 64

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
fill(struct block *b, CUstream s)
{
	TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)b->p, b->tag, b->bytes / 4, s));
}

static void
check(struct block *b, CUstream s)
{
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

/* ---- The workers --------------------------------------------------------------------------- */

static void
op_alloc(struct worker *w, struct block *b)
{
	unsigned e = (unsigned)(rnd(&w->rng) % 13); /* 512 B .. 4 MiB, log-uniform */
	size_t bytes = ((size_t)512 << e) + (rnd(&w->rng) % ((size_t)512 << e));
	void *p = (void *)0x1;
	CUresult r;

	DOING(w, "sop_malloc_from_pool_async");
	bytes &= ~(size_t)3;
	b->pool = (int)(rnd(&w->rng) % N_POOLS);
	b->stream = (int)(rnd(&w->rng) % 2);
	r = clean(sop_malloc_from_pool_async(&p, bytes, pools[b->pool], w->s[b->stream]),
		  "sop_malloc_from_pool_async", w->tid);
	if (r != CUDA_SUCCESS) {
		TH_ASSERT(p == (void *)0x1); /* a failed call gave nothing */
		return;
	}
	b->p = p;
	b->bytes = bytes;
	b->tag = (uint32_t)rnd(&w->rng) | 1;
	fill(b, w->s[b->stream]);
}

/* Order `to` after the work enqueued on `from` so far: an event if the driver lets sop record
 * and wait on one, else a synchronization of `from`. */
static void
order_after(struct worker *w, CUstream from, CUstream to)
{
	CUevent ev;
	CUresult r;

	TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	DOING(w, "sop_event_record");
	r = clean(sop_event_record(ev, from), "sop_event_record", w->tid);
	if (r == CUDA_SUCCESS) {
		DOING(w, "sop_stream_wait_event");
		r = clean(sop_stream_wait_event(to, ev, 0), "sop_stream_wait_event", w->tid);
	}
	if (r != CUDA_SUCCESS) {
		atomic_fetch_add(&n_fallback, 1);
		DOING(w, "sop_stream_synchronize (fallback)");
		TH_OK(clean(sop_stream_synchronize(from), "sop_stream_synchronize", w->tid));
	}
	DOING(w, "sop_event_destroy");
	if (rnd(&w->rng) % 2)
		TH_OK(sop_event_destroy(ev));
	else
		TH_OK(th.cuEventDestroy(ev)); /* behind sop's back: the next event may get it */
}

static void
op_free(struct worker *w, struct block *b, bool same)
{
	CUstream s = w->s[b->stream], other = w->s[!b->stream];
	CUresult r;

	check(b, s);
	if (!same && rnd(&w->rng) % 100 >= 60) {
		order_after(w, s, other);
		s = other;
	}
	DOING(w, "sop_free_async");
	r = clean(sop_free_async(b->p, s), "sop_free_async", w->tid);
	if (r != CUDA_SUCCESS) {
		/* Still allocated: freed again later (the tag check has run by then). */
		sop_pool_t owner;
		TH_OK(sop_pointer_get_pool(&owner, b->p));
		TH_ASSERT(owner == pools[b->pool]);
		b->stream = (int)(s == w->s[1]);
		return;
	}
	b->p = NULL;
}

/* Free what the worker holds on one of its streams there, destroy it with that work still
 * running (through sop, or behind its back), and make another, which the driver may give the old
 * handle. */
static void
op_replace(struct worker *w, int which)
{
	CUstream old = w->s[which];
	int k;

	for (k = 0; k < SLOTS; k++) {
		struct block *b = &w->slot[k];
		while (b->p && b->stream == which)
			op_free(w, b, true);
	}
	DOING(w, "stream destroy");
	if (rnd(&w->rng) % 2)
		TH_OK(sop_stream_destroy(old));
	else
		th_stream_destroy(old);
	w->s[which] = th_stream();
	atomic_fetch_add(&n_replaced, 1);
}

static void
op_misc(struct worker *w)
{
	unsigned r = (unsigned)(rnd(&w->rng) % 1000);
	sop_pool_t pool = pools[rnd(&w->rng) % N_POOLS];

	if (r < 4) {
		op_replace(w, (int)(r % 2));
	} else if (r < 12) {
		DOING(w, "sop_stream_synchronize");
		TH_OK(clean(sop_stream_synchronize(w->s[r % 2]), "sop_stream_synchronize", w->tid));
		atomic_fetch_add(&n_syncs, 1);
	} else if (r < 13) {
		DOING(w, "sop_ctx_synchronize");
		TH_OK(clean(sop_ctx_synchronize(), "sop_ctx_synchronize", w->tid));
		atomic_fetch_add(&n_syncs, 1);
	} else if (r < 24) {
		/* Often, so that the pools grow again often, through the calls that fail. */
		DOING(w, "sop_trim_to");
		clean(sop_trim_to(pool, (size_t)(rnd(&w->rng) % 4) * 8 * MiB), "sop_trim_to",
		      w->tid);
	} else if (r < 26) {
		/* The policies and threshold change under the others' feet. */
		static const CUmemPool_attribute attrs[3] = {
			CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
			CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
			CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
		};
		int on = (int)(rnd(&w->rng) % 2);
		cuuint64_t t = rnd(&w->rng) % 4 == 0 ? UINT64_MAX : (rnd(&w->rng) % 4) * 8 * MiB;
		DOING(w, "sop_pool_set_attr");
		TH_OK(sop_pool_set_attr(pool, attrs[rnd(&w->rng) % 3], &on));
		TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
	}
}

static void
park(struct worker *w)
{
	DOING(w, "parked at a checkpoint");
	pthread_mutex_lock(&cp_lock);
	{
		unsigned long round = cp_round;
		cp_parked++;
		pthread_cond_broadcast(&cp_cond);
		while (cp_round == round)
			pthread_cond_wait(&cp_cond, &cp_lock);
	}
	pthread_mutex_unlock(&cp_lock);
}

static void *
worker_fn(void *arg)
{
	struct worker *w = arg;
	unsigned long ops = 0;
	int k;

	TH_OK(th.cuCtxSetCurrent(ctx0));
	w->s[0] = th_stream();
	w->s[1] = th_stream();
	while (!atomic_load(&stop)) {
		if (atomic_load(&cp_wanted))
			park(w);
		for (int i = 0; i < 32; i++, ops++) {
			struct block *b = &w->slot[rnd(&w->rng) % SLOTS];
			if (b->p)
				op_free(w, b, false);
			else
				op_alloc(w, b);
			op_misc(w);
			atomic_fetch_add_explicit(&w->progress, 1, memory_order_relaxed);
		}
	}
	DOING(w, "cleaning up");
	for (k = 0; k < SLOTS; k++)
		while (w->slot[k].p)
			op_free(w, &w->slot[k], true);
	atomic_fetch_add(&n_ops, ops);
	DOING(w, "done");
	return NULL;
}

/* ---- The main thread: checkpoints and the watchdog ----------------------------------------- */

static unsigned long
progress(void)
{
	unsigned long n = 0;
	int i;

	for (i = 0; i < n_threads; i++)
		n += atomic_load_explicit(&workers[i].progress, memory_order_relaxed);
	return n;
}

static _Noreturn void
stalled(const char *where)
{
	int i;

	fprintf(stderr, "soak: no progress for %.0f s %s: a deadlock?\n", watchdog_s, where);
	for (i = 0; i < n_threads; i++)
		fprintf(stderr, "  thread %d: %s\n", i, atomic_load(&workers[i].doing));
	exit(1);
}

/* Every pool consistent, and using exactly what the workers hold. */
static void
checkpoint(void)
{
	double t0 = th_seconds();
	int k, i, j;

	pthread_mutex_lock(&cp_lock);
	cp_parked = 0;
	atomic_store(&cp_wanted, true);
	while (cp_parked < n_threads) {
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 100000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&cp_cond, &cp_lock, &until);
		if (th_seconds() - t0 > watchdog_s)
			stalled("on the way to a checkpoint");
	}
	for (k = 0; k < N_POOLS; k++) {
		uint64_t held = 0;
		for (i = 0; i < n_threads; i++)
			for (j = 0; j < SLOTS; j++)
				if (workers[i].slot[j].p && workers[i].slot[j].pool == k)
					held += workers[i].slot[j].bytes;
		TH_CHECK(pools[k]);
		TH_EQ(th_attr(pools[k], CU_MEMPOOL_ATTR_USED_MEM_CURRENT), held);
	}
	atomic_store(&cp_wanted, false);
	cp_round++;
	pthread_cond_broadcast(&cp_cond);
	pthread_mutex_unlock(&cp_lock);
}

static void
run_workers(void)
{
	pthread_t t[MAX_THREADS];
	double start = th_seconds(), last_change = start, last_cp = start;
	unsigned long last = 0;
	int i;

	for (i = 0; i < n_threads; i++)
		TH_ASSERT(pthread_create(&t[i], NULL, worker_fn, &workers[i]) == 0);
	while (th_seconds() - start < seconds) {
		struct timespec nap = {0, 50000000};
		unsigned long p;
		nanosleep(&nap, NULL);
		p = progress();
		if (p != last) {
			last = p;
			last_change = th_seconds();
		} else if (th_seconds() - last_change > watchdog_s) {
			stalled("while running");
		}
		if (th_seconds() - last_cp > 0.5) {
			checkpoint();
			last_cp = last_change = th_seconds();
		}
	}
	atomic_store(&stop, true);
	/* The workers finish their round and clean up: that too must not hang. */
	{
		double t0 = th_seconds();
		for (;;) {
			int done = 0;
			struct timespec nap = {0, 50000000};
			for (i = 0; i < n_threads; i++)
				done += !strcmp(atomic_load(&workers[i].doing), "done");
			if (done == n_threads)
				break;
			if (th_seconds() - t0 > watchdog_s)
				stalled("while cleaning up");
			nanosleep(&nap, NULL);
		}
	}
	for (i = 0; i < n_threads; i++)
		pthread_join(t[i], NULL);
}

int
main(int argc, char **argv)
{
	struct sim_live base, end;
	unsigned long fails[N_FAULTY], calls[N_FAULTY], total_fails = 0;
	size_t gran;
	int i;

	for (i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--seconds"))
			seconds = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--threads"))
			n_threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--seed"))
			seed0 = strtoull(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--rate"))
			rate = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--mem-rate"))
			mem_rate = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--watchdog"))
			watchdog_s = atof(argv[i + 1]);
	}
	if (n_threads < 1 || n_threads > MAX_THREADS)
		n_threads = 8;
	th_init();
	th_require_sim();
	TH_OK(sop__drv.cuCtxGetCurrent(&ctx0));
	{
		sop_pool_t def;
		TH_OK(sop_device_get_default_pool(&def, 0));
		gran = TH_POOL(def)->granularity;
	}
	base = th_live();
	for (i = 0; i < (int)N_FAULTY; i++) {
		fails[i] = th.sim_fails(faulty[i]);
		calls[i] = th.sim_calls(faulty[i]);
	}
	{
		/* Policies and thresholds at random; the first pool capped, so that it runs out. */
		uint64_t s = seed0 * 0x9E3779B97F4A7C15u + 7;
		static const CUmemPool_attribute attrs[3] = {
			CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
			CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
			CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
		};
		for (i = 0; i < N_POOLS; i++) {
			cuuint64_t t = rnd(&s) % 3 == 0 ? UINT64_MAX : (rnd(&s) % 4) * 8 * MiB;
			pools[i] = th_pool(0, i == 0 ? 48 * MiB : 0);
			for (int k = 0; k < 3; k++) {
				int on = (int)(rnd(&s) % 2);
				TH_OK(sop_pool_set_attr(pools[i], attrs[k], &on));
			}
			TH_OK(sop_pool_set_attr(pools[i], CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
			TH_OK(sop_pool_set_compaction(pools[i], (int)(rnd(&s) % 2)));
		}
	}
	workers = calloc((size_t)n_threads, sizeof *workers);
	TH_ASSERT(workers);
	for (i = 0; i < n_threads; i++) {
		workers[i].tid = i;
		workers[i].rng =
			(seed0 + 1) * 0x9E3779B97F4A7C15u ^ (uint64_t)(i + 1) * 0xBF58476D1CE4E5B9u;
		DOING(&workers[i], "starting");
	}
	th.sim_fail_seed(seed0);
	/* cuMemCreate fails as a full device does; the others with a code of their own. */
	for (i = 0; i < (int)N_FAULTY; i++)
		th.sim_fail_rate(faulty[i], i < N_MEM_FAULTY ? mem_rate : rate,
				 i == 0 ? CUDA_ERROR_OUT_OF_MEMORY : FAULT);
	run_workers();
	th.sim_fail_clear();
	for (i = 0; i < (int)N_FAULTY; i++) {
		fails[i] = th.sim_fails(faulty[i]) - fails[i];
		calls[i] = th.sim_calls(faulty[i]) - calls[i];
		total_fails += fails[i];
	}
	TH_OK(sop_ctx_synchronize());
	printf("soak: %d threads, %.0f s, seed %llu, fault rates %g and %g: %lu operations, "
	       "%lu streams replaced busy, %lu synchronizations; the driver failed %lu calls "
	       "(cuMemCreate %lu of %lu, cuMemMap %lu of %lu, cuMemSetAccess %lu of %lu, "
	       "cuMemUnmap %lu of %lu, cuMemRelease %lu of %lu, cuEventRecord %lu of %lu, "
	       "cuStreamWaitEvent %lu of %lu); sop answered %lu out of "
	       "memory and %lu with the driver's code, %lu orderings fell back to a "
	       "synchronization; %lu tags overwritten\n",
	       n_threads, seconds, (unsigned long long)seed0, rate, mem_rate, atomic_load(&n_ops),
	       atomic_load(&n_replaced), atomic_load(&n_syncs), total_fails, fails[0], calls[0],
	       fails[1], calls[1], fails[2], calls[2], fails[3], calls[3], fails[4], calls[4],
	       fails[5], calls[5], fails[6], calls[6], atomic_load(&n_oom), atomic_load(&n_fault),
	       atomic_load(&n_fallback), atomic_load(&host_errors));
	TH_EQ(atomic_load(&host_errors), 0);
	if (rate > 0 || mem_rate > 0)
		TH_ASSERT(total_fails > 0); /* the faults fired */
	for (i = 0; i < N_POOLS; i++) {
		TH_CHECK(pools[i]);
		TH_EQ(th_attr(pools[i], CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
		TH_OK(sop_pool_destroy(pools[i]));
	}
	for (i = 0; i < n_threads; i++) {
		TH_OK(sop_stream_destroy(workers[i].s[0]));
		TH_OK(sop_stream_destroy(workers[i].s[1]));
	}
	TH_OK(sop_ctx_synchronize());
	{
		sop_pool_t def;
		TH_OK(sop_device_get_default_pool(&def, 0));
		TH_OK(sop_trim_to(def, 0));
	}
	/* Nothing leaked: the driver's objects as they were, but for an anchor of the default
	 * pool, the primary context sop retains for its probes, and probes not yet swept. */
	end = th_live();
	if (end.streams != base.streams || end.events > base.events + PROBES_MAX ||
	    end.reservations != base.reservations || end.handles > base.handles + 1 ||
	    end.mappings > base.mappings + 1 || end.phys_bytes > base.phys_bytes + gran ||
	    end.primary_ctx_refs > base.primary_ctx_refs + 1) {
		fprintf(stderr,
			"soak: driver objects leaked: streams %ld/%ld events %ld/%ld reservations "
			"%ld/%ld handles %ld/%ld mappings %ld/%ld bytes %zu/%zu primary refs "
			"%ld/%ld\n",
			end.streams, base.streams, end.events, base.events, end.reservations,
			base.reservations, end.handles, base.handles, end.mappings, base.mappings,
			end.phys_bytes, base.phys_bytes, end.primary_ctx_refs,
			base.primary_ctx_refs);
		return 1;
	}
	free(workers);
	return 0;
}
