/* tasks.c - what a task that brings a stream of its own costs: the per-task work of the threads
 * workload's stream-per-task variant (bench/workloads.c), counted rather than timed, since the
 * counts do not depend on how many cores the machine has.
 *
 * A task makes a stream, keeps 32 blocks of random sizes from 1 B to 1 MiB live through 256
 * replacements, frees them, synchronizes the stream and destroys it. Once a thread pool has run
 * a few hundred tasks, what a task asks of the driver beyond its allocations and frees is the
 * stream's context and the context's id, for its record: no probe events made or destroyed
 * (spares of earlier records serve), no context pushed to ask its device (cached by context id).
 * And a task's synchronization and destruction take no lock of a pool it did not use: another
 * pool's lock, held by this thread meanwhile, does not stop a thread running tasks. Once
 * threads have met in the pool, a task's stream takes memory from the heap a refill at a time,
 * and sixteen tasks at once (interleaved on one thread) hold little more than they keep live.
 *
 *   test-tasks [--report] [--tasks N]   (--report: driver calls per task, by entry point)
 */
#include <string.h>
#include <time.h>

#include "helpers.h"

#define TASK_LIVE 32
#define TASK_STEPS 256
#define MAX_SIZE ((size_t)1 << 20)

static struct {
	bool report;
	int tasks;
} opt = {.tasks = 600};

static uint64_t
splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15u);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
	return z ^ (z >> 31);
}

struct task {
	CUstream s;
	uint64_t rng;
	int i, delay;
	void *p[TASK_LIVE];
	size_t size[TASK_LIVE];
};

/* One step of task t: its stream made and its first allocation, an allocation (and, past the
 * first TASK_LIVE, a free before it), or its end: every block freed, the stream synchronized
 * and destroyed. A new task's number comes from *next; *live and *peak count its bytes. */
static void
task_step(sop_pool_t pool, struct task *t, long *next, size_t *live, size_t *peak)
{
	uint64_t x;
	int k;

	if (t->delay) {
		t->delay--;
		return;
	}
	if (!t->s) {
		t->s = th_stream();
		t->rng = 0x7a5c0000u + (uint64_t)(*next)++;
		t->i = 0;
	}
	if (t->i == TASK_LIVE + TASK_STEPS) {
		for (k = 0; k < TASK_LIVE; k++) {
			TH_OK(sop_free_async(t->p[k], t->s));
			*live -= t->size[k];
		}
		TH_OK(sop_stream_synchronize(t->s));
		TH_OK(sop_stream_destroy(t->s));
		t->s = NULL;
		return;
	}
	x = splitmix(&t->rng);
	k = t->i;
	if (t->i >= TASK_LIVE) {
		k = (int)(x % TASK_LIVE);
		TH_OK(sop_free_async(t->p[k], t->s));
		*live -= t->size[k];
	}
	t->size[k] = 1 + (x >> 20) % MAX_SIZE;
	TH_OK(sop_malloc_from_pool_async(&t->p[k], t->size[k], pool, t->s));
	*live += t->size[k];
	if (*live > *peak)
		*peak = *live;
	t->i++;
}

/* A task whole, on this thread. */
static void
task_run(sop_pool_t pool, long task)
{
	struct task t;
	size_t live = 0, peak = 0;

	memset(&t, 0, sizeof t);
	do
		task_step(pool, &t, &task, &live, &peak);
	while (t.s);
}

#define MAX_ENTRIES 128

struct counts {
	const char *names[MAX_ENTRIES];
	unsigned long long n[MAX_ENTRIES];
	size_t k;
};

static void
counts_get(struct counts *c)
{
	c->k = MAX_ENTRIES;
	TH_OK(sop_driver_calls(c->names, c->n, &c->k));
}

static unsigned long long
per(const struct counts *a, const struct counts *b, const char *name)
{
	size_t i;

	for (i = 0; i < b->k; i++)
		if (!strcmp(b->names[i], name))
			return b->n[i] - a->n[i];
	TH_ASSERT(!"no such entry point");
	return 0;
}

/* Cache bytes of every stream state of the pool. */
static size_t
cached_bytes(sop_pool_t pool)
{
	struct sop_pool *p = TH_POOL(pool);
	struct sop__sstream *ss;
	size_t n = 0;

	sop__mutex_take(&p->lock, SOP_RANK_POOL);
	for (ss = p->streams; ss; ss = ss->next)
		n += sop__sstream_cached(ss);
	sop__mutex_drop(&p->lock);
	return n;
}

/* Once threads have met in a pool, a stream that takes heap memory for a small request takes a
 * little more into its cache, so that its next requests leave the pool lock alone: a task then
 * takes the pool lock (each time twice exchanging its thread's capture mode) for fewer than half
 * of the 40 requests that found its cache short before. What it took has nothing pending: its
 * synchronization gives it back, and so does an idle pass once its stream is gone unsynchronized,
 * however little the probes know. */
static void
refills(void)
{
	sop_pool_t pool = th_pool(0, 0);
	uint64_t max = UINT64_MAX;
	struct counts a, b;
	CUstream s;
	void *p;
	int t, pass;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
	atomic_store(&TH_POOL(pool)->threads_met, true);
	for (t = 0; t < 20; t++)
		task_run(pool, 5000 + t);
	counts_get(&a);
	for (t = 0; t < 200; t++)
		task_run(pool, 6000 + t);
	counts_get(&b);
	TH_ASSERT(per(&a, &b, "cuThreadExchangeStreamCaptureMode") <= 200 * 2 * 20);
	TH_EQ(cached_bytes(pool), 0);
	TH_CHECK(pool);

	/* A stream destroyed without a synchronization, its block still live: the rest of its
	 * refill goes at the second idle pass. (A block freed there would join the rest and make
	 * it wait for the probe that covers the free.) */
	s = th_stream();
	TH_OK(sop_malloc_from_pool_async(&p, 4096, pool, s));
	TH_ASSERT(cached_bytes(pool) > 0);
	th_stream_destroy(s);
	for (pass = 0; pass < 2; pass++) {
		sop__mutex_take(&TH_POOL(pool)->lock, SOP_RANK_POOL);
		sop__sstream_retire_idle(TH_POOL(pool));
		sop__mutex_drop(&TH_POOL(pool)->lock);
	}
	TH_EQ(cached_bytes(pool), 0);
	TH_CHECK(pool);
	s = th_stream();
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
	th_stream_destroy(s);
	TH_OK(sop_pool_destroy(pool));
	printf("refills: ok\n");
}

/* Sixteen tasks at once, interleaved on this thread one operation at a time, their starts
 * spread over a task's length, as sixteen threads of a pool run them: each stream's segments
 * are its own once threads have met, so each stream's growth maps what it keeps, not a whole
 * step that no other stream uses while it lives. Deterministic: it holds the memory, not the
 * timing, of the threads. */
#define CROWD_TASKS 16
#define CROWD_ROUNDS 3000

static void
crowded_tasks(void)
{
	sop_pool_t pool = th_pool(0, 0);
	uint64_t max = UINT64_MAX, high;
	struct task t[CROWD_TASKS];
	size_t live = 0, peak = 0;
	long next = 20000, r;
	int j;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
	atomic_store(&TH_POOL(pool)->threads_met, true);
	memset(t, 0, sizeof t);
	for (j = 0; j < CROWD_TASKS; j++)
		t[j].delay = j * (TASK_LIVE + TASK_STEPS) / CROWD_TASKS;
	for (r = 0; r < CROWD_ROUNDS; r++)
		for (j = 0; j < CROWD_TASKS; j++)
			task_step(pool, &t[j], &next, &live, &peak);
	for (j = 0; j < CROWD_TASKS; j++)
		while (t[j].s)
			task_step(pool, &t[j], &next, &live, &peak);
	high = th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
	printf("crowded tasks: %ld tasks, live peak %.1f MiB, reserved-high %.1f MiB (%.3fx)\n",
	       next - 20000, (double)peak / (1 << 20), (double)high / (1 << 20),
	       (double)high / (double)peak);
	/* Was 512 MiB for 265 MiB live (1.93x): a 32 MiB step per stream. */
	TH_ASSERT(high <= 2 * peak + ((size_t)32 << 20));
	TH_ASSERT((double)high <= 1.65 * (double)peak);
	TH_EQ(cached_bytes(pool), 0);
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

/* Tasks run by a thread of their own while the main thread holds another pool's lock. */
struct runner {
	CUcontext ctx;
	sop_pool_t pool;
	long first, n;
	atomic_bool done;
};

static void *
runner_main(void *arg)
{
	struct runner *r = arg;
	long t;

	TH_OK(th.cuCtxSetCurrent(r->ctx));
	for (t = 0; t < r->n; t++)
		task_run(r->pool, r->first + t);
	atomic_store(&r->done, true);
	return NULL;
}

/* A task takes no lock of a pool it did not use: run some while holding another pool's. */
static void
other_pool_untouched(sop_pool_t pool)
{
	sop_pool_t other = th_pool(0, 0);
	uint64_t max = UINT64_MAX;
	struct runner r = {.pool = pool, .first = 100000, .n = 50};
	struct timespec ts = {0, 1000000};
	CUstream s = th_stream();
	pthread_t thread;
	void *p;
	int ms;

	/* Memory and a stream state in it, within its threshold: nothing for a synchronization
	 * of another stream to do there. */
	TH_OK(sop_pool_set_attr(other, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
	TH_OK(sop_malloc_from_pool_async(&p, 4096, other, s));
	TH_OK(sop__drv.cuCtxGetCurrent(&r.ctx));
	sop__mutex_take(&TH_POOL(other)->lock, SOP_RANK_POOL);
	TH_EQ(pthread_create(&thread, NULL, runner_main, &r), 0);
	for (ms = 0; ms < 20000 && !atomic_load(&r.done); ms++)
		nanosleep(&ts, NULL);
	if (!atomic_load(&r.done)) {
		fprintf(stderr, "tasks on one pool wait for another pool's lock\n");
		exit(1);
	}
	sop__mutex_drop(&TH_POOL(other)->lock);
	TH_EQ(pthread_join(thread, NULL), 0);
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
	th_stream_destroy(s);
	TH_OK(sop_pool_destroy(other));
}

/* A stream a millisecond old gets its probes by count again: 64 frees record one. */
static void
old_stream_probes(sop_pool_t pool)
{
	CUstream s = th_stream();
	struct counts x, y;
	struct timespec ms2 = {0, 2000000};
	void *p;
	int i;

	TH_OK(sop_malloc_from_pool_async(&p, 4096, pool, s));
	TH_OK(sop_free_async(p, s)); /* the first free's probe */
	nanosleep(&ms2, NULL);
	counts_get(&x);
	for (i = 0; i < 80; i++) {
		TH_OK(sop_malloc_from_pool_async(&p, 4096, pool, s));
		TH_OK(sop_free_async(p, s));
	}
	counts_get(&y);
	TH_ASSERT(per(&x, &y, "cuEventRecord") >= 1);
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_stream_destroy(s));
}

/* What a thread does while the main thread holds its pool's lock (own_pool_lock). */
struct locked_run {
	CUcontext ctx;
	sop_pool_t pool;
	atomic_bool ready, go, done;
};

static void *
locked_run_main(void *arg)
{
	struct locked_run *r = arg;
	CUstream s, s2;
	void *p;

	TH_OK(th.cuCtxSetCurrent(r->ctx));
	/* s2: a 4 KiB block cached on it. s: a task's end, its stream synchronized with nothing
	 * cached, so that no segment is its own. */
	s2 = th_stream();
	TH_OK(sop_malloc_from_pool_async(&p, 4096, r->pool, s2));
	TH_OK(sop_free_async(p, s2));
	s = th_stream();
	TH_OK(sop_malloc_from_pool_async(&p, 4096, r->pool, s));
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
	atomic_store(&r->ready, true);
	while (!atomic_load(&r->go))
		sched_yield();
	/* Under the held lock: the destruction marks s's state gone, and s2's state, which the
	 * thread's cache no longer trusts (the generation moved on, as after a retirement pass),
	 * is found again by walking the pool's states; its cache serves the request. */
	TH_OK(sop_stream_destroy(s));
	TH_OK(sop_malloc_from_pool_async(&p, 4096, r->pool, s2));
	atomic_store(&r->done, true);
	TH_OK(sop_free_async(p, s2));
	TH_OK(sop_stream_synchronize(s2));
	TH_OK(sop_stream_destroy(s2));
	return NULL;
}

/* A task's end and a stream's next request, where its state exists, take no pool lock: with
 * sixteen threads whose tasks each make a stream, each acquisition cost about 30 us of waiting
 * on the H100. Run them in a thread while holding the pool's lock. */
static void
own_pool_lock(sop_pool_t pool)
{
	struct locked_run r = {.pool = pool};
	struct timespec ts = {0, 1000000};
	struct sop_pool *p = TH_POOL(pool);
	pthread_t thread;
	int ms;

	TH_OK(sop__drv.cuCtxGetCurrent(&r.ctx));
	TH_EQ(pthread_create(&thread, NULL, locked_run_main, &r), 0);
	while (!atomic_load(&r.ready))
		nanosleep(&ts, NULL);
	sop__mutex_take(&p->lock, SOP_RANK_POOL);
	atomic_fetch_add(&p->states_gen, 1);
	atomic_store(&r.go, true);
	for (ms = 0; ms < 20000 && !atomic_load(&r.done); ms++)
		nanosleep(&ts, NULL);
	if (!atomic_load(&r.done)) {
		fprintf(stderr, "a stream's end or a known stream's request waits for the pool lock\n");
		exit(1);
	}
	sop__mutex_drop(&p->lock);
	TH_EQ(pthread_join(thread, NULL), 0);
}

int
main(int argc, char **argv)
{
	struct counts a, b;
	sop_pool_t pool;
	uint64_t max = UINT64_MAX;
	long t, young = 0;
	double n;
	size_t i;
	int k;

	for (k = 1; k < argc; k++) {
		if (!strcmp(argv[k], "--report"))
			opt.report = true;
		else if (!strcmp(argv[k], "--tasks") && k + 1 < argc)
			opt.tasks = atoi(argv[++k]);
	}
	th_init();
	pool = th_pool(0, 0);
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
	/* Warm: the pool grown, the first records' events made (each task records one; those
	 * held by the pool's retired stream states come back only as states are reaped). */
	for (t = 0; t < 400; t++)
		task_run(pool, t);
	counts_get(&a);
	for (t = 0; t < opt.tasks; t++) {
		struct counts x, y;
		double t0 = th_seconds();

		counts_get(&x);
		task_run(pool, 1000 + t);
		counts_get(&y);
		/* A task that ran within a millisecond (most, unless under a sanitizer) records
		 * one probe, at its first free: its stream was younger than that at its 64th,
		 * 128th, ... free. */
		if (th_seconds() - t0 < 0.9e-3) {
			TH_EQ(per(&x, &y, "cuEventRecord"), 1);
			young++;
		}
	}
	counts_get(&b);
	n = opt.tasks;
	if (opt.report) {
		for (i = 0; i < b.k; i++)
			if (b.n[i] != a.n[i])
				printf("%-36s %8.3f per task\n", b.names[i],
				       (double)(b.n[i] - a.n[i]) / n);
	}
	/* The record: the stream's context and its id, once. */
	TH_ASSERT(per(&a, &b, "cuStreamGetCtx") <= (unsigned long long)opt.tasks);
	TH_ASSERT(per(&a, &b, "cuCtxGetId") <= (unsigned long long)opt.tasks);
	/* Its device and primary context come from the cache of contexts. */
	TH_ASSERT(per(&a, &b, "cuCtxGetDevice") == 0);
	/* Probes: at the first free and, once the stream is a millisecond old, every 64 frees
	 * after it (288 a task); none after the synchronization, which showed every free
	 * complete (was 6 records a task: event records on streams that come and go slow the
	 * driver's stream creation and destruction in every thread, by about 2 us each at sixteen
	 * threads on the H100). Where most tasks took longer than a millisecond (a sanitizer, a
	 * loaded machine), a stream may have freed less than once in 100 us over a pacing window,
	 * and a slow stream gets a probe at each of its next frees (order.c, sop__stream_pace). */
	if (young * 2 >= n)
		TH_ASSERT(per(&a, &b, "cuEventRecord") <= 5 * n);
	if (opt.report)
		printf("%ld of %d tasks within a millisecond\n", young, opt.tasks);
	/* Probe events come from spares, which the records of destroyed streams give back (was 4
	 * made and about 4 destroyed a task), and so no push and pop of the context to make them
	 * (was 5). */
	TH_ASSERT(per(&a, &b, "cuEventCreate") <= n / 16);
	TH_ASSERT(per(&a, &b, "cuEventDestroy") <= n / 16);
	TH_ASSERT(per(&a, &b, "cuCtxPushCurrent") <= n / 16);
	/* One synchronization and one destruction, each the task's own. */
	TH_EQ(per(&a, &b, "cuStreamSynchronize"), opt.tasks);
	TH_EQ(per(&a, &b, "cuStreamDestroy"), opt.tasks);
	old_stream_probes(pool);
	TH_CHECK(pool);
	other_pool_untouched(pool);
	TH_CHECK(pool);
	own_pool_lock(pool);
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	refills();
	crowded_tasks();
	return 0;
}
