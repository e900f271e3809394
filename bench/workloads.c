/* workloads.c - every workload but replay (replay.c).
 *
 * Each workload opens the sides it compares, warms every one with an untimed run of its own
 * case, then times the case `reps` times, the sides taking turns inside each repetition (sop,
 * then the driver's pool, then the default pool), so that drift in clocks or in the machine
 * touches every side alike. The same random seed gives every side the same sequence of
 * requests. Counts and sizes are set for a full run of all workloads in a few minutes on an
 * H100 (the driver's pool is the slow side: ~1 us a call, and it serializes threads); --quick
 * and --smoke shrink them, --scale and the list options change them.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

#define ALL_POOLS (SIDE_BIT(SIDE_SOP) | SIDE_BIT(SIDE_POOL) | SIDE_BIT(SIDE_DEFAULT))
#define SOP_AND_POOL (SIDE_BIT(SIDE_SOP) | SIDE_BIT(SIDE_POOL))
#define N_OF(a) ((int)(sizeof(a) / sizeof *(a)))

static void *
xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);

	if (!p) {
		fprintf(stderr, "sop-bench: out of host memory\n");
		exit(1);
	}
	return p;
}

/* At most 1/divisor of the memory that was free at start, and at most cap. */
static size_t
mem_cap(size_t cap, size_t divisor)
{
	size_t m = env.free_mem / divisor;

	return m < cap ? m : cap;
}

/* ---- pair ----------------------------------------------------------------------------------- */

static void
pair_run(const struct side *sd, size_t size, long n, CUstream s)
{
	void *p;
	long i;

	if (sd->kind == SIDE_SOP) {
		/* sop's calls made directly, as an application makes them. */
		for (i = 0; i < n; i++) {
			CHECK(sop_malloc_from_pool_async(&p, size, sd->sop, s));
			CHECK(sop_free_async(p, s));
		}
		return;
	}
	for (i = 0; i < n; i++) {
		CHECK(side_alloc(sd, &p, size, s));
		CHECK(side_free(sd, p, s));
	}
}

void
wl_pair(void)
{
	static const size_t sizes_all[] = {256, 4 * KiB, 64 * KiB, MiB, 64 * MiB};
	struct list sizes = list_pick(&opts.sizes, sizes_all, N_OF(sizes_all), sizes_all,
				      N_OF(sizes_all), sizes_all, N_OF(sizes_all));
	long iters = scaled(100000, 20000, 200);
	struct side sd[N_SIDES];
	int n = sides_open(sd, ALL_POOLS, UINT64_MAX, 0);
	CUstream s = stream_new();
	char label[32];
	int c, r, i;

	describe("One stream, one thread: allocate and free the same size, %ld pairs per run after "
		 "%ld untimed; the stream is synchronized between runs.",
		 iters, iters / 10 + 1);
	for (c = 0; c < sizes.n && budget_left("pair"); c++) {
		size_t size = sizes.v[c];
		struct metric *m = metric_new("pair", "", fmt_size(label, sizeof label, size),
					      "latency", "ns/pair", (double)size, false);

		for (i = 0; i < n; i++) {
			pair_run(&sd[i], size, iters / 10 + 1, s);
			CHECK(side_sync(&sd[i], s));
		}
		for (r = 0; r < opts.reps; r++) {
			for (i = 0; i < n; i++) {
				struct span sp;

				span_begin(&sp, sd[i].kind);
				pair_run(&sd[i], size, iters, s);
				metric_add(m, sd[i].kind,
					   span_end(&sp, m, (double)iters) / (double)iters);
				CHECK(side_sync(&sd[i], s));
			}
		}
		metric_done(m);
	}
	sides_close(sd, n);
	stream_free(s);
}

/* ---- settling ------------------------------------------------------------------------------- */

/* The H200 machines run both sides about half as fast for seconds at a time, and a process's
 * first seconds were such in five of the six runs of record there before this phase: the pair's
 * first case (256 B) ran at 7.15x in the one at 0898152, where the sizes after it ran at
 * 8.22-8.74x, and at 8.86x when timed later in a process
 * (results/2026-11-29-h200-a58f5ed-suite/pair-order.txt). So a full run starts with SETTLE_S
 * seconds of untimed 4 KiB pairs, sop's pool and the driver's by turns, and its report notes
 * their times in the first and the last second. Slow seconds later in a run remain, in the
 * min-max ranges and in a case's median where they last (the 1 MiB pair of
 * results/2026-11-29-h200-d09c008/). The cold costs a program pays are the growth workload's,
 * on fresh pools. */
#define SETTLE_S 10

void
wl_settle(void)
{
	double settle_s = opts.level == LEVEL_FULL ? SETTLE_S : opts.level == LEVEL_QUICK ? 2 : 0;
	double first[N_SIDES] = {0}, last[N_SIDES] = {0}, t0, t;
	long sec_pairs[N_SIDES] = {0};
	double sec_ns[N_SIDES] = {0};
	struct side sd[N_SIDES];
	int n, i, sec = 0;
	CUstream s;

	if (settle_s <= 0)
		return;
	n = sides_open(sd, SOP_AND_POOL, UINT64_MAX, 0);
	s = stream_new();
	t0 = now_ns();
	do {
		for (i = 0; i < n; i++) {
			double a = now_ns();

			pair_run(&sd[i], 4 * KiB, 2000, s);
			CHECK(side_sync(&sd[i], s));
			sec_ns[i] += now_ns() - a;
			sec_pairs[i] += 2000;
		}
		t = now_ns();
		if (t - t0 >= (sec + 1) * 1e9) {
			for (i = 0; i < n; i++) {
				if (!sec)
					first[i] = sec_ns[i] / (double)sec_pairs[i];
				last[i] = sec_ns[i] / (double)sec_pairs[i];
				sec_ns[i] = 0;
				sec_pairs[i] = 0;
			}
			sec++;
		}
	} while (t - t0 < settle_s * 1e9);
	{
		char what[256];
		int k = 0;

		for (i = 0; i < n; i++)
			k += snprintf(what + k, sizeof what - (size_t)k,
				      "%s%s %.1f ns a pair in the first second, %.1f in the last",
				      i ? "; " : "", side_names[sd[i].kind], first[i], last[i]);
		note("settling: %.0f s of untimed 4 KiB pairs, the sides by turns, before the "
		     "first workload: %s",
		     settle_s, what);
	}
	sides_close(sd, n);
	stream_free(s);
}

/* ---- batch ---------------------------------------------------------------------------------- */

static void
batch_run(const struct side *sd, size_t size, size_t k, long iters, void **p, CUstream s)
{
	long it;
	size_t i;

	for (it = 0; it < iters; it++) {
		for (i = 0; i < k; i++)
			CHECK(side_alloc(sd, &p[i], size, s));
		for (i = 0; i < k; i++)
			CHECK(side_free(sd, p[i], s));
	}
}

void
wl_batch(void)
{
	static const size_t ks[] = {64, 1024};
	static const size_t sizes_full[] = {4 * KiB, MiB};
	static const size_t sizes_smoke[] = {4 * KiB};
	struct list kl = list_pick(&opts.batch, ks, N_OF(ks), ks, N_OF(ks), ks, N_OF(ks));
	long pairs = scaled(65536, 16384, 2048);
	struct side sd[N_SIDES];
	int n = sides_open(sd, ALL_POOLS, UINT64_MAX, 0);
	CUstream s = stream_new();
	char label[32], cas[32];
	int a, b, r, i;

	describe("One stream: k allocations of one size, then their k frees in the same order, "
		 "about %ld pairs per run after one untimed batch.",
		 pairs);
	for (a = 0; a < N_OF(sizes_full); a++) {
		size_t size = sizes_full[a];

		if (opts.level == LEVEL_SMOKE && a >= N_OF(sizes_smoke))
			break;
		for (b = 0; b < kl.n && budget_left("batch"); b++) {
			size_t k = kl.v[b];
			long iters = pairs / (long)k > 0 ? pairs / (long)k : 1;
			void **p = xcalloc(k, sizeof *p);
			struct metric *m;

			snprintf(cas, sizeof cas, "k=%zu", k);
			m = metric_new("batch", fmt_size(label, sizeof label, size), cas, "latency",
				       "ns/pair", (double)k, false);
			for (i = 0; i < n; i++) {
				batch_run(&sd[i], size, k, 1, p, s);
				CHECK(side_sync(&sd[i], s));
			}
			for (r = 0; r < opts.reps; r++) {
				for (i = 0; i < n; i++) {
					double ops = (double)iters * (double)k;
					struct span sp;

					span_begin(&sp, sd[i].kind);
					batch_run(&sd[i], size, k, iters, p, s);
					metric_add(m, sd[i].kind, span_end(&sp, m, ops) / ops);
					CHECK(side_sync(&sd[i], s));
				}
			}
			metric_done(m);
			free(p);
		}
	}
	sides_close(sd, n);
	stream_free(s);
}

/* ---- random: RMM's random_allocations ------------------------------------------------------ */

struct live {
	void *p;
	size_t size;
};

struct random_state {
	struct live *live;
	long n_live;
	long failed;
	size_t peak;
};

/* RMM's loop: 2N iterations; each draws a size, then (if anything is live) an operation:
 * allocate when op < 73, fewer than N allocations were made and the live bytes stay under the
 * cap; otherwise free a random live allocation. A failed allocation turns into a free, as in
 * RMM. Leftovers stay live for the caller to free outside the timed region. */
static void
random_run(const struct side *sd, long n_allocs, size_t max_size, size_t max_usage,
	   struct random_state *st, CUstream s)
{
	struct rng rng = {20240601};
	long i, allocs = 0;
	size_t bytes = 0;

	st->n_live = 0;
	for (i = 0; i < 2 * n_allocs; i++) {
		size_t size = 1 + rng_below(&rng, max_size);
		bool alloc = st->n_live == 0 || rng_below(&rng, 100) < 73;

		if (alloc && allocs < n_allocs && bytes + size < max_usage) {
			struct live *l = &st->live[st->n_live];
			CUresult r = side_alloc(sd, &l->p, size, s);

			if (r == CUDA_SUCCESS) {
				l->size = size;
				st->n_live++;
				allocs++;
				bytes += size;
				if (bytes > st->peak)
					st->peak = bytes;
				continue;
			}
			if (r != CUDA_ERROR_OUT_OF_MEMORY)
				CHECK(r);
			st->failed++;
		}
		if (st->n_live) {
			long j = (long)(rng_below(&rng, (uint64_t)n_allocs) % (uint64_t)st->n_live);

			CHECK(side_free(sd, st->live[j].p, s));
			bytes -= st->live[j].size;
			st->live[j] = st->live[--st->n_live];
		}
	}
}

static void
random_leftovers(const struct side *sd, struct random_state *st, CUstream s)
{
	while (st->n_live)
		CHECK(side_free(sd, st->live[--st->n_live].p, s));
	CHECK(side_sync(sd, s));
}

/* One case of wl_random: fresh pools (sop alone with compaction on, if compact), an untimed
 * run for the memory ratio, then the timed repetitions. */
static void
random_case(struct random_state *st, long n_allocs, size_t max_mib, size_t max_usage,
	    size_t pool_cap, bool compact, CUstream s)
{
	size_t max_size = max_mib * MiB;
	struct side sd[N_SIDES];
	int n = sides_open(sd, compact ? SIDE_BIT(SIDE_SOP) : SOP_AND_POOL, UINT64_MAX, pool_cap);
	struct metric *m, *mem;
	long failed[N_SIDES] = {0};
	char cas[48];
	int r, i;

	snprintf(cas, sizeof cas, "sizes 1 B..%zu MiB%s", max_mib, compact ? ", sop compacting" : "");
	m = metric_new("random", "", cas, "throughput", "M ops/s", (double)max_mib, true);
	mem = metric_new("random", "", cas, "reserved-high / peak live", "x", (double)max_mib,
			 false);
	for (i = 0; i < n; i++)
		if (compact)
			CHECK(sop_pool_set_compaction(sd[i].sop, 1));
	/* The untimed warm run, on fresh pools, gives the memory figure. */
	for (i = 0; i < n; i++) {
		st->peak = 0;
		st->failed = 0;
		random_run(&sd[i], n_allocs, max_size, max_usage, st, s);
		random_leftovers(&sd[i], st, s);
		metric_add(mem, sd[i].kind,
			   (double)side_attr(&sd[i], CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) /
			       (double)(st->peak ? st->peak : 1));
		failed[sd[i].kind] += st->failed;
	}
	for (r = 0; r < opts.reps; r++) {
		for (i = 0; i < n; i++) {
			double ops = 2.0 * (double)n_allocs;
			struct span sp;
			double t;

			st->failed = 0;
			span_begin(&sp, sd[i].kind);
			random_run(&sd[i], n_allocs, max_size, max_usage, st, s);
			t = span_end(&sp, m, ops);
			metric_add(m, sd[i].kind, ops / t * 1e3);
			failed[sd[i].kind] += st->failed;
			random_leftovers(&sd[i], st, s);
		}
	}
	metric_done(m);
	metric_done(mem);
	for (i = 0; i < n; i++)
		if (failed[sd[i].kind])
			note("random %s: %ld allocations failed on %s (out of memory), "
			     "turned into frees as in RMM",
			     cas, failed[sd[i].kind], side_names[sd[i].kind]);
	sides_close(sd, n);
}

void
wl_random(void)
{
	static const size_t m_full[] = {1, 64, 1024};
	static const size_t m_smoke[] = {1, 64};
	struct list ml = list_pick(&opts.max_mib, m_full, N_OF(m_full), m_full, N_OF(m_full),
				   m_smoke, N_OF(m_smoke));
	long n_allocs = scaled(10000, 2000, 200);
	/* RMM caps live bytes at 16000 MiB. Here two pools stay warm side by side: live bytes
	 * take at most an eighth of the free memory, and each pool may hold at most 40% of it
	 * (maxSize), so that the pool measured first cannot starve the other; what each does at
	 * its cap is its own policy. */
	size_t max_usage = mem_cap(16000 * MiB, 8);
	size_t pool_cap = env.free_mem / 5 * 2 / (32 * MiB) * (32 * MiB);
	struct random_state st;
	CUstream s = stream_new();
	int c;

	memset(&st, 0, sizeof st);
	st.live = xcalloc((size_t)n_allocs, sizeof *st.live);
	describe("RMM's random_allocations on one stream: N = %ld allocations in 2N operations, "
		 "sizes uniform in 1 B..M MiB, live bytes capped at %zu MiB (RMM: 16000 MiB; here "
		 "two warm pools share the device, each with maxSize %zu MiB), a fixed splitmix64 "
		 "sequence (not libstdc++'s minstd_rand0). Fresh pools per case; the untimed first "
		 "run on them gives the memory ratio. The compacting case, after the others, is sop "
		 "alone with sop_pool_set_compaction on, at the largest size up to 64 MiB.",
		 n_allocs, max_usage / MiB, pool_cap / MiB);
	for (c = 0; c < ml.n && budget_left("random"); c++)
		random_case(&st, n_allocs, ml.v[c], max_usage, pool_cap, false, s);
	/* What compaction costs a pool that stays at its cap. */
	for (c = ml.n - 1; c >= 0; c--)
		if (ml.v[c] <= 64 && side_allowed(SIDE_SOP) && budget_left("random")) {
			random_case(&st, n_allocs, ml.v[c], max_usage, pool_cap, true, s);
			break;
		}
	free(st.live);
	stream_free(s);
}

/* ---- threads -------------------------------------------------------------------------------- */

#define THREAD_LIVE 256
#define THREAD_MAX 256

struct thr {
	const struct side *sd;
	CUstream s;
	pthread_barrier_t *bar;
	double box_ns;
	size_t max_size;
	size_t fixed; /* every allocation this size; 0: random sizes up to max_size */
	int tid;
	long ops;
	double ns;
};

/* Fill 256 live blocks, then until the time box ends: free a random one, allocate a new random
 * size (1 B..1 MiB) in its place, as anchor.c's mt_scaling does. */
static void *
thr_main(void *arg)
{
	struct thr *t = arg;
	struct rng rng = {0x5eed0000u + (uint64_t)t->tid};
	void *live[THREAD_LIVE];
	double t0, t1;
	long ops = 0;
	int i;

	CHECK(drv.cuCtxSetCurrent(env.ctx));
	for (i = 0; i < THREAD_LIVE; i++)
		CHECK(side_alloc(t->sd, &live[i],
				 t->fixed ? t->fixed : 1 + rng_below(&rng, t->max_size), t->s));
	pthread_barrier_wait(t->bar); /* filled: the main thread reads the counters */
	pthread_barrier_wait(t->bar); /* go */
	t0 = now_ns();
	do {
		for (i = 0; i < 16; i++) {
			uint64_t x = rng_next(&rng);
			int k = (int)(x % THREAD_LIVE);

			CHECK(side_free(t->sd, live[k], t->s));
			CHECK(side_alloc(t->sd, &live[k],
					 t->fixed ? t->fixed : 1 + (x >> 20) % t->max_size, t->s));
		}
		ops += 16;
		t1 = now_ns();
	} while (t1 - t0 < t->box_ns);
	t->ops = ops;
	t->ns = t1 - t0;
	pthread_barrier_wait(t->bar); /* done: the counters again */
	for (i = 0; i < THREAD_LIVE; i++)
		CHECK(side_free(t->sd, live[i], t->s));
	CHECK(side_sync(t->sd, t->s));
	return NULL;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void
threads_run(const struct side *sd, int n_threads, double box_ns, size_t max_size, size_t fixed,
	    const CUstream *streams, struct metric *agg, struct metric *lat)
{
	pthread_t th[THREAD_MAX];
	struct thr t[THREAD_MAX];
	double per[THREAD_MAX];
	pthread_barrier_t bar;
	struct calls c0, c1;
	double total = 0, slowest = 0;
	int i;

	pthread_barrier_init(&bar, NULL, (unsigned)n_threads + 1);
	for (i = 0; i < n_threads; i++) {
		t[i] = (struct thr){.sd = sd,
				    .s = streams[i],
				    .bar = &bar,
				    .box_ns = box_ns,
				    .max_size = max_size,
				    .fixed = fixed,
				    .tid = i};
		if (pthread_create(&th[i], NULL, thr_main, &t[i])) {
			fprintf(stderr, "sop-bench: cannot start thread %d\n", i);
			exit(1);
		}
	}
	pthread_barrier_wait(&bar);
	if (agg)
		calls_read(&c0);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	if (agg)
		calls_read(&c1);
	for (i = 0; i < n_threads; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&bar);
	if (!agg)
		return;
	for (i = 0; i < n_threads; i++) {
		total += (double)t[i].ops;
		if (t[i].ns > slowest)
			slowest = t[i].ns;
		per[i] = t[i].ns / (double)t[i].ops;
	}
	qsort(per, (size_t)n_threads, sizeof *per, cmp_double);
	metric_add(agg, sd->kind, total / slowest * 1e3);
	metric_add(lat, sd->kind,
		   n_threads % 2 ? per[n_threads / 2]
				 : (per[n_threads / 2 - 1] + per[n_threads / 2]) / 2);
	if (sd->kind == SIDE_SOP)
		metric_calls(agg, &c0, &c1, total);
}

/* ---- threads as programs start them: cold, one by one, a stream per task -------------------
 *
 * The warmed loop above starts every thread on a stream and a pool that an untimed run has
 * grown, behind a barrier between filling and stepping. Programs do not start that way: their
 * threads start on a fresh pool with nothing behind them, arrive one after another on a pool
 * that threads before them used, or run tasks from a queue that each bring a stream of their
 * own. Each variant runs on a fresh pool every repetition (sop's, then the driver's, made with
 * the same properties and release threshold UINT64_MAX), and reports its throughput and its
 * reserved-high over the live peak: the most requested bytes live at once across threads, as
 * the main thread samples it (the pools' used-high would add the peaks of streams that never
 * lived at the same time). */

#define TASK_LIVE 32
#define TASK_STEPS 256
#define SAMPLE_NS 100e3

enum variant { VAR_COLD, VAR_ARRIVING, VAR_TASKS, N_VARIANTS };

static const char *const variant_names[N_VARIANTS] = {"cold start", "arriving one by one",
						      "a stream per task"};

/* One run of a variant on one side: what its threads share. */
struct crowd {
	const struct side *sd;
	double box_ns;
	size_t max_size;
	pthread_barrier_t bar;
	/* The queue: tasks are numbered and a task's number seeds its sizes. On a cache line
	 * apart from the fields above, which every operation reads. */
	_Alignas(64) atomic_long next_task;
	atomic_int running;
	long max_tasks; /* tasks: stop once this many were taken (0: the box alone) */
	/* A run of a fixed work (the driver's) counts the bytes live exactly, on a line of its
	 * own, and its threads hold their blocks until all of them made their operations
	 * (worker_replace). Not in the time box: every operation would then write one line from
	 * every thread, which would slow the threads it times. */
	bool exact;
	pthread_barrier_t held;
	_Alignas(64) _Atomic uint64_t live_now;
	_Atomic uint64_t live_peak;
};

/* One thread of a run. live sits on a cache line of its own: the thread writes it at every
 * operation, the sampler reads it. */
struct worker {
	_Alignas(64) _Atomic uint64_t live; /* requested bytes live now */
	/* For the rate with every thread running: the operations made so far, and where the
	 * thread is (0 not in its box yet, 1 in it, 2 past it); on live's line. */
	_Atomic long done;
	_Atomic int phase;
	struct crowd *cr;
	pthread_t th;
	uint64_t seed;
	double delay_ns; /* from the start of the run to this thread's start */
	long ops;        /* allocations and frees in the timed region */
	long max_ops;    /* stop once this many were made (0: the box alone) */
	double t0, t1;   /* the timed region */
	bool short_fill; /* the time box ended before THREAD_LIVE blocks were live */
};

/* w's requested bytes live are now bytes, delta more than before: for the sampler, and in a run
 * of a fixed work for the exact count. */
static void
live_note(struct worker *w, uint64_t bytes, int64_t delta)
{
	struct crowd *cr = w->cr;
	uint64_t now, peak;

	atomic_store_explicit(&w->live, bytes, memory_order_relaxed);
	if (!cr->exact)
		return;
	now = atomic_fetch_add(&cr->live_now, (uint64_t)delta) + (uint64_t)delta;
	peak = atomic_load(&cr->live_peak);
	while (now > peak && !atomic_compare_exchange_weak(&cr->live_peak, &peak, now))
		;
}

static void
sleep_ns(double ns)
{
	struct timespec ts = {(time_t)(ns / 1e9), (long)(ns - (double)(time_t)(ns / 1e9) * 1e9)};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* Cold start and arriving: a stream of its own; until the time box ends, allocate until
 * THREAD_LIVE blocks are live, then free a random one and allocate a new size in its place;
 * then free everything, synchronize the stream and destroy it. The box times the loop: from
 * the first allocation, after the stream is made, to the last. */
static void *
worker_replace(void *arg)
{
	struct worker *w = arg;
	struct crowd *cr = w->cr;
	const struct side *sd = cr->sd;
	struct rng rng = {w->seed};
	void *p[THREAD_LIVE];
	size_t size[THREAD_LIVE];
	uint64_t bytes = 0;
	long ops = 0;
	int n = 0, i;
	CUstream s;

	CHECK(drv.cuCtxSetCurrent(env.ctx));
	pthread_barrier_wait(&w->cr->bar);
	if (w->delay_ns > 0)
		sleep_ns(w->delay_ns);
	s = stream_new();
	w->t0 = now_ns();
	atomic_store_explicit(&w->phase, 1, memory_order_relaxed);
	do {
		for (i = 0; i < 16; i++) {
			uint64_t x = rng_next(&rng);
			int k = n;

			if (n < THREAD_LIVE) {
				n++;
			} else {
				k = (int)(x % THREAD_LIVE);
				CHECK(side_free(sd, p[k], s));
				bytes -= size[k];
				live_note(w, bytes, -(int64_t)size[k]);
				ops++;
			}
			size[k] = 1 + (x >> 20) % cr->max_size;
			CHECK(side_alloc(sd, &p[k], size[k], s));
			bytes += size[k];
			ops++;
			live_note(w, bytes, (int64_t)size[k]);
			atomic_store_explicit(&w->done, ops, memory_order_relaxed);
			if (ops == w->max_ops)
				break;
		}
		w->t1 = now_ns();
	} while (w->t1 - w->t0 < cr->box_ns && ops != w->max_ops);
	atomic_store_explicit(&w->phase, 2, memory_order_relaxed);
	w->ops = ops;
	w->short_fill = n < THREAD_LIVE;
	/* The count follows each free, here as in the loop: left at its last value while the
	 * frees ran, it counted blocks already given back, which the other threads' allocations
	 * may be using, and the driver's pool, whose frees take microseconds each at sixteen
	 * threads, seemed to hold less than its live peak. In a run of a fixed work, each thread
	 * keeps its blocks until all have made theirs, as where every box ends at once: sop's
	 * threads make the driver's few operations in microseconds, and the first to finish would
	 * free before the last had started. */
	if (cr->exact)
		pthread_barrier_wait(&cr->held);
	for (i = 0; i < n; i++) {
		CHECK(side_free(sd, p[i], s));
		bytes -= size[i];
		live_note(w, bytes, -(int64_t)size[i]);
	}
	CHECK(side_sync(sd, s));
	CHECK(side_stream_destroy(sd, s));
	atomic_fetch_sub(&w->cr->running, 1);
	return NULL;
}

/* One task: a stream of its own, TASK_LIVE blocks, then TASK_STEPS times free a random one
 * and allocate a new size in its place, then free them all, synchronize the stream and destroy
 * it. Its number seeds its sizes, so that both sides run the same tasks. With no allocator
 * (SIDE_IDEAL), the stream's creation, synchronization and destruction alone: the floor. */
static void
task_run(struct worker *w, long task)
{
	const struct side *sd = w->cr->sd;
	struct rng rng = {0x7a5c0000u + (uint64_t)task};
	void *p[TASK_LIVE];
	size_t size[TASK_LIVE];
	uint64_t bytes = 0;
	CUstream s = stream_new();
	int i;

	if (sd->kind == SIDE_IDEAL) {
		CHECK(drv.cuStreamSynchronize(s));
		CHECK(drv.cuStreamDestroy(s));
		return;
	}
	for (i = 0; i < TASK_LIVE + TASK_STEPS; i++) {
		uint64_t x = rng_next(&rng);
		int k = i;

		if (i >= TASK_LIVE) {
			k = (int)(x % TASK_LIVE);
			CHECK(side_free(sd, p[k], s));
			bytes -= size[k];
			live_note(w, bytes, -(int64_t)size[k]);
		}
		size[k] = 1 + (x >> 20) % w->cr->max_size;
		CHECK(side_alloc(sd, &p[k], size[k], s));
		bytes += size[k];
		live_note(w, bytes, (int64_t)size[k]);
	}
	for (i = 0; i < TASK_LIVE; i++) { /* the count follows each free (worker_replace) */
		CHECK(side_free(sd, p[i], s));
		bytes -= size[i];
		live_note(w, bytes, -(int64_t)size[i]);
	}
	CHECK(side_sync(sd, s));
	CHECK(side_stream_destroy(sd, s));
}

/* A long-lived worker of a thread pool: until the time box ends, take the next task from the
 * queue and run it. The box times every task whole, stream creation and destruction included. */
static void *
worker_tasks(void *arg)
{
	struct worker *w = arg;
	long tasks = 0;

	CHECK(drv.cuCtxSetCurrent(env.ctx));
	pthread_barrier_wait(&w->cr->bar);
	w->t0 = now_ns();
	w->t1 = w->t0;
	do {
		long t = atomic_fetch_add(&w->cr->next_task, 1);

		if (w->cr->max_tasks && t >= w->cr->max_tasks)
			break;
		task_run(w, t);
		tasks++;
		w->t1 = now_ns();
	} while (w->t1 - w->t0 < w->cr->box_ns);
	w->ops = tasks * 2 * (TASK_LIVE + TASK_STEPS);
	atomic_fetch_sub(&w->cr->running, 1);
	return NULL;
}

/* Start n threads of fn on cr, all at once (thread i stagger_ns * i after the others when
 * stagger_ns > 0), sample the requested bytes live across them until they are done, and join
 * them. Thread i stops after max_ops[i] operations if max_ops is given, and ops[i] gets the
 * operations it made if ops is. Returns the span from the first thread's start to the last
 * one's end; *pairs gets the pairs made in it, *peak the most bytes seen live at once (if
 * more), *short_fill the threads whose box ended before their blocks were all live. With
 * worker_replace, *full gets the pairs per nanosecond while every thread was in its box: from
 * the first sample that finds them all there to the last one before any has left it (0 if
 * fewer than ten samples lie between). */
static double
crowd_run(struct crowd *cr, struct worker *w, int n, void *(*fn)(void *), uint64_t seed,
	  double stagger_ns, const long *max_ops, long *ops_out, double *pairs, uint64_t *peak,
	  long *short_fill, double *full)
{
	double first = 0, last = 0, t_in = 0, t_last = 0;
	long ops = 0, done_in = 0, done_last = 0;
	int i, samples = -1;

	atomic_store(&cr->running, n);
	atomic_store(&cr->live_now, 0);
	atomic_store(&cr->live_peak, 0);
	pthread_barrier_init(&cr->bar, NULL, (unsigned)n + 1);
	if (cr->exact)
		pthread_barrier_init(&cr->held, NULL, (unsigned)n);
	for (i = 0; i < n; i++) {
		memset(&w[i], 0, sizeof w[i]);
		atomic_init(&w[i].live, 0);
		atomic_init(&w[i].done, 0);
		atomic_init(&w[i].phase, 0);
		w[i].cr = cr;
		w[i].seed = seed + (uint64_t)i;
		w[i].delay_ns = stagger_ns * i;
		w[i].max_ops = max_ops ? max_ops[i] : 0;
		if (pthread_create(&w[i].th, NULL, fn, &w[i])) {
			fprintf(stderr, "sop-bench: cannot start thread %d\n", i);
			exit(1);
		}
	}
	pthread_barrier_wait(&cr->bar);
	while (atomic_load(&cr->running) > 0) {
		uint64_t sum = 0;
		long done = 0;
		int in = 0;
		double t = now_ns();

		for (i = 0; i < n; i++) {
			sum += atomic_load_explicit(&w[i].live, memory_order_relaxed);
			done += atomic_load_explicit(&w[i].done, memory_order_relaxed);
			in += atomic_load_explicit(&w[i].phase, memory_order_relaxed) == 1;
		}
		if (sum > *peak)
			*peak = sum;
		if (in == n) {
			if (samples < 0) {
				t_in = t;
				done_in = done;
			}
			t_last = t;
			done_last = done;
			samples++;
		}
		sleep_ns(SAMPLE_NS);
	}
	*full = samples >= 10 ? (double)(done_last - done_in) / 2 / (t_last - t_in) : 0;
	for (i = 0; i < n; i++) {
		pthread_join(w[i].th, NULL);
		ops += w[i].ops;
		if (ops_out)
			ops_out[i] = w[i].ops;
		*short_fill += w[i].short_fill;
		if (!i || w[i].t0 < first)
			first = w[i].t0;
		if (!i || w[i].t1 > last)
			last = w[i].t1;
	}
	if (atomic_load(&cr->live_peak) > *peak)
		*peak = atomic_load(&cr->live_peak);
	pthread_barrier_destroy(&cr->bar);
	if (cr->exact)
		pthread_barrier_destroy(&cr->held);
	*pairs = (double)ops / 2;
	return last - first;
}

/* The work of a run: each thread's operations (both sets of the arriving variant) and the tasks
 * taken, so that another run can be made to do exactly that. */
struct work {
	long ops[2][THREAD_MAX];
	long tasks;
};

/* One run of variant v on a fresh pool of side sd: in its time box, or, with limit, the work
 * limit describes (its box then only a guard). *done gets the work made, *full the timed
 * threads' pairs per nanosecond while all of them were in their boxes (crowd_run). Returns
 * the span. */
static double
variant_run(enum variant v, struct side *sd, struct worker *w, int n_threads, double box_ns,
	    size_t max_size, const struct work *limit, struct work *done, struct calls *c0,
	    struct calls *c1, double *pairs, uint64_t *peak, long *short_fill, double *full)
{
	struct crowd cr;
	double span, ignored;

	memset(&cr, 0, sizeof cr);
	cr.sd = sd;
	cr.box_ns = limit ? box_ns * 100 : box_ns;
	cr.max_size = max_size;
	cr.max_tasks = limit ? limit->tasks : 0;
	cr.exact = limit != NULL;
	atomic_init(&cr.next_task, 0);
	atomic_init(&cr.running, 0);
	atomic_init(&cr.live_now, 0);
	atomic_init(&cr.live_peak, 0);
	/* Arriving: a first set of threads, the same program, runs to its end on the pool
	 * before the new ones come; its peak counts, its pairs do not. */
	if (v == VAR_ARRIVING)
		crowd_run(&cr, w, n_threads, worker_replace, 0xa1100000u, 0,
			  limit ? limit->ops[0] : NULL, done->ops[0], pairs, peak, short_fill,
			  &ignored);
	calls_read(c0);
	span = crowd_run(&cr, w, n_threads, v == VAR_TASKS ? worker_tasks : worker_replace,
			 v == VAR_COLD ? 0xc01d0000u : 0xa1200000u,
			 v == VAR_ARRIVING ? box_ns / 32 : 0, limit ? limit->ops[1] : NULL,
			 done->ops[1], pairs, peak, short_fill, full);
	calls_read(c1);
	done->tasks = atomic_load(&cr.next_task);
	if (limit && done->tasks > limit->tasks)
		done->tasks = limit->tasks; /* the claims past the end ran nothing */
	return span;
}

/* One case of a variant: every repetition, a fresh pool for sop, then one for the driver, then
 * sop again on a fresh pool doing exactly the driver's work: the driver's pool runs a fraction
 * of sop's operations in the box, which fragments its memory less, and only the same program
 * compares memory. */
static void
variant_case(enum variant v, int n_threads, double box_ns, size_t max_size)
{
	/* Tasks also run with no allocator: what creating, synchronizing and destroying a stream
	 * per task leaves for any allocator to reach. */
	static const enum side_kind kinds[] = {SIDE_SOP, SIDE_POOL, SIDE_IDEAL};
	size_t bytes = sizeof(struct worker) * (size_t)n_threads;
	struct worker *w = aligned_alloc(_Alignof(struct worker), bytes);
	struct work *drv_work = calloc(1, sizeof *drv_work), *scratch = calloc(1, sizeof *scratch);
	long short_fill[N_SIDES] = {0};
	struct metric *agg, *all = NULL, *mem, *same;
	char cas[32];
	int r, k;

	if (!w || !drv_work || !scratch) {
		fprintf(stderr, "sop-bench: out of host memory\n");
		exit(1);
	}
	snprintf(cas, sizeof cas, "%d thread%s", n_threads, n_threads > 1 ? "s" : "");
	agg = metric_new("threads", variant_names[v], cas, "aggregate", "M pairs/s", n_threads,
			 true);
	if (v != VAR_TASKS)
		all = metric_new("threads", variant_names[v], cas, "aggregate, all threads in their box",
				 "M pairs/s", n_threads, true);
	mem = metric_new("threads", variant_names[v], cas, "reserved-high / live peak", "x",
			 n_threads, false);
	same = metric_new("threads", variant_names[v], cas,
			  "reserved-high / live peak, the driver's work", "x", n_threads, false);
	for (r = 0; r < opts.reps; r++) {
		bool drv_ran = false;

		for (k = 0; k < N_OF(kinds); k++) {
			struct side sd;
			struct calls c0, c1;
			uint64_t peak = 0, used;
			double pairs, span, ratio, full = 0;

			if ((kinds[k] == SIDE_IDEAL && v != VAR_TASKS) || !side_allowed(kinds[k]) ||
			    !side_open(&sd, kinds[k], UINT64_MAX, 0))
				continue;
			span = variant_run(v, &sd, w, n_threads, box_ns, max_size, NULL,
					   sd.kind == SIDE_POOL ? drv_work : scratch, &c0, &c1, &pairs,
					   &peak, &short_fill[sd.kind], &full);
			metric_add(agg, sd.kind, pairs / span * 1e3);
			if (all && full > 0)
				metric_add(all, sd.kind, full * 1e3);
			if (sd.kind == SIDE_IDEAL) {
				sides_close(&sd, 1);
				continue;
			}
			ratio = (double)side_attr(&sd, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) /
				(double)(peak ? peak : 1);
			metric_add(mem, sd.kind, ratio);
			if (sd.kind == SIDE_SOP)
				metric_calls(agg, &c0, &c1, pairs);
			if (sd.kind == SIDE_POOL) {
				metric_add(same, sd.kind, ratio);
				drv_ran = true;
			}
			used = side_attr(&sd, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
			if (used)
				note("threads %s, %s: %s still had %llu bytes in use after every "
				     "thread freed its blocks and synchronized",
				     variant_names[v], cas, side_names[sd.kind],
				     (unsigned long long)used);
			sides_close(&sd, 1);
		}
		if (drv_ran && side_allowed(SIDE_SOP)) {
			struct side sd;
			struct calls c0, c1;
			uint64_t peak = 0;
			double pairs, full;
			long ignored = 0;

			if (side_open(&sd, SIDE_SOP, UINT64_MAX, 0)) {
				variant_run(v, &sd, w, n_threads, box_ns, max_size, drv_work,
					    scratch, &c0, &c1, &pairs, &peak, &ignored, &full);
				metric_add(same, SIDE_SOP,
					   (double)side_attr(&sd, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) /
						   (double)(peak ? peak : 1));
				sides_close(&sd, 1);
			}
		}
	}
	metric_done(agg);
	if (all)
		metric_done(all);
	metric_done(mem);
	metric_done(same);
	for (k = 0; k < N_OF(kinds); k++)
		if (short_fill[kinds[k]])
			note("threads %s, %s: on %s, %ld thread runs ended their time box before "
			     "%d blocks were live",
			     variant_names[v], cas, side_names[kinds[k]], short_fill[kinds[k]],
			     THREAD_LIVE);
	free(scratch);
	free(drv_work);
	free(w);
}

void
wl_threads(void)
{
	static const size_t counts[] = {1, 2, 4, 8, 16};
	static const size_t counts_quick[] = {1, 4, 16};
	struct list tl = list_pick(&opts.threads, counts, N_OF(counts), counts, N_OF(counts),
				   counts, N_OF(counts));
	struct list vl = list_pick(&opts.threads, counts, N_OF(counts), counts_quick,
				   N_OF(counts_quick), counts, N_OF(counts));
	/* A time box, not a count: the driver's pool falls to ~0.1 M pairs/s with 16 threads
	 * and a fixed count would take it minutes. */
	double box_ns = (double)scaled(100, 30, 5) * 1e6;
	struct side sd[N_SIDES];
	int n = sides_open(sd, ALL_POOLS, UINT64_MAX, 0);
	CUstream streams[THREAD_MAX];
	size_t max_size, var_size;
	int max_t = 1, var_t = 1, c, r, i, v;
	char cas[32];

	for (c = 0; c < tl.n; c++)
		if ((int)tl.v[c] > max_t)
			max_t = (int)tl.v[c];
	for (c = 0; c < vl.n; c++)
		if ((int)vl.v[c] > var_t)
			var_t = (int)vl.v[c];
	for (i = 0; i < max_t; i++)
		streams[i] = stream_new();
	/* Sizes up to 1 MiB, unless every side's blocks would not fit at once (the simulated
	 * driver's 1 GiB): the mean block is half the largest. */
	max_size = mem_cap(MiB, (size_t)max_t * THREAD_LIVE * (size_t)(n > 0 ? n : 1));
	if (max_size < KiB)
		max_size = KiB;
	if (max_size < MiB)
		note("threads: sizes up to %zu KiB, not 1 MiB, to fit the device", max_size / KiB);
	/* The variants run one pool at a time, but arriving threads may find a pool that holds
	 * what the first set left and grow it as much again: room for four times their blocks. */
	var_size = mem_cap(MiB, (size_t)var_t * THREAD_LIVE * 4);
	if (var_size < KiB)
		var_size = KiB;
	if (var_size < MiB)
		note("threads variants: sizes up to %zu KiB, not 1 MiB, to fit the device",
		     var_size / KiB);
	describe(
	    "Warmed (groups random sizes, 4 KiB): each thread on its own stream, all on one pool: "
	    "256 live blocks of 1 B..%zu KiB, then free a random one and allocate a new random "
	    "size in its place until a time box of %.0f ms ends; then the same with every size "
	    "4 KiB. Aggregate = all pairs / the slowest thread's time; latency = the median "
	    "thread's time per pair.\n\n"
	    "Then three variants, sop and the driver's pool only, each repetition on fresh pools, "
	    "sizes 1 B..%zu KiB. Cold start: the threads start together, each makes its stream "
	    "and at once allocates until 256 blocks are live, then replaces random ones, until a "
	    "box of %.0f ms ends; then frees everything, synchronizes its stream and destroys it. "
	    "Arriving one by one: a first set of as many threads does that to its end, then the "
	    "new threads start %.2f ms apart and do the same. A stream per task: the threads are "
	    "workers that take numbered tasks from a queue until the box ends; a task makes a "
	    "stream, keeps %d blocks live through %d replacements, frees them, synchronizes and "
	    "destroys the stream; no-alloc runs the same tasks with no allocator (the stream's "
	    "creation, synchronization and destruction alone), counted as the same pairs: the "
	    "ceiling any allocator has there. Aggregate = the pairs (allocations and frees in the box / 2) "
	    "of the timed threads (arriving: the new ones) / the time from the first one's start "
	    "to the last one's end (tasks: stream creation and destruction included); all threads "
	    "in their box: their pairs from the first sample (every %.0f us) that finds every timed "
	    "thread in its box to the last one before any has left it, over that time. Live peak "
	    "= the most requested bytes live at once across threads, sampled every %.0f us "
	    "(arriving: over both sets); reserved-high is the pool's "
	    "CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH at the end. In its box the driver's pool makes a "
	    "fraction of sop's operations, which fragments less: 'the driver's work' runs sop again, "
	    "on a fresh pool, for exactly the operations each of the driver's threads made (tasks: "
	    "the driver's tasks), the same program on both sides; its threads keep their blocks until "
	    "all of them made their operations, as where the boxes end together, and it counts the "
	    "live bytes exactly, not by samples (sop makes those operations in microseconds). "
	    "sop calls/op: sop's driver calls from "
	    "the timed threads' start to their end, teardown included, over the pairs counted.",
	    max_size / KiB, box_ns / 1e6, var_size / KiB, box_ns / 1e6, box_ns / 32 / 1e6,
	    TASK_LIVE, TASK_STEPS, SAMPLE_NS / 1e3, SAMPLE_NS / 1e3);
	/* Random sizes first (the case), then one fixed size: the latter keeps every
	 * thread on its stream's hot path and shows how that path alone scales. */
	for (int fixed_case = 0; fixed_case < 2; fixed_case++) {
		size_t fixed = fixed_case ? 4 * KiB : 0;
		for (c = 0; c < tl.n && budget_left("threads"); c++) {
			int n_threads = (int)tl.v[c];
			struct metric *agg, *lat;

			snprintf(cas, sizeof cas, "%d thread%s", n_threads, n_threads > 1 ? "s" : "");
			const char *group = fixed ? "4 KiB" : "random sizes";
			agg = metric_new("threads", group, cas, "aggregate", "M pairs/s", n_threads,
					 true);
			lat = metric_new("threads", group, cas, "per-thread latency", "ns/pair",
					 n_threads, false);
			for (i = 0; i < n; i++)
				threads_run(&sd[i], n_threads, box_ns / 4, max_size, fixed, streams,
					    NULL, NULL);
			for (r = 0; r < opts.reps; r++)
				for (i = 0; i < n; i++)
					threads_run(&sd[i], n_threads, box_ns, max_size, fixed,
						    streams, agg, lat);
			metric_done(agg);
			metric_done(lat);
		}
	}
	sides_close(sd, n);
	for (i = 0; i < max_t; i++)
		stream_free(streams[i]);
	/* The variants, on pools of their own. */
	for (v = 0; v < N_VARIANTS; v++)
		for (c = 0; c < vl.n && budget_left("threads"); c++)
			variant_case((enum variant)v, (int)vl.v[c], box_ns, var_size);
}

/* ---- streams: RMM's multi_stream_allocations ------------------------------------------------ */

/* One iteration: K times, on stream i % S, allocate, launch a kernel that spins and then writes
 * to the memory, free; then synchronize the context. sd NULL: the same launches on a buffer
 * allocated beforehand, the ideal an allocator can only approach. */
static void
streams_run(const struct side *sd, int n_streams, int k, size_t size, long long cycles,
	    const CUstream *st, long iters, char *ideal)
{
	long it;
	int i;

	for (it = 0; it < iters; it++) {
		for (i = 0; i < k; i++) {
			CUstream s = st[i % n_streams];
			void *p = ideal + 8 * i;

			if (sd)
				CHECK(side_alloc(sd, &p, size, s));
			if (env.kernels)
				launch_spin(p, cycles, s);
			if (sd)
				CHECK(side_free(sd, p, s));
		}
		if (sd)
			CHECK(side_ctx_sync(sd));
		else
			CHECK(drv.cuCtxSynchronize());
	}
}

void
wl_streams(void)
{
	static const size_t counts[] = {1, 2, 4, 8, 16};
	static const size_t sizes_full[] = {8, MiB, 64 * MiB};
	static const size_t sizes_quick[] = {8, 64 * MiB};
	static const size_t sizes_smoke[] = {8, MiB};
	struct list sl = list_pick(&opts.streams, counts, N_OF(counts), counts, N_OF(counts),
				   counts, N_OF(counts));
	const size_t *sizes = opts.level == LEVEL_FULL    ? sizes_full
			      : opts.level == LEVEL_QUICK ? sizes_quick
							  : sizes_smoke;
	int n_sizes = opts.level == LEVEL_FULL    ? N_OF(sizes_full)
		      : opts.level == LEVEL_QUICK ? N_OF(sizes_quick)
						  : N_OF(sizes_smoke);
	int k = opts.level == LEVEL_FULL ? 64 : opts.level == LEVEL_QUICK ? 32 : 16;
	/* RMM's kernel spins 1,000,000 cycles, about 0.5 ms on an H100. */
	long long cycles = opts.level == LEVEL_SMOKE ? 100000 : 1000000;
	long iters = scaled(1, 1, 1);
	bool ideal_on = env.kernels && side_allowed(SIDE_IDEAL);
	struct side sd[N_SIDES], aux;
	int n = sides_open(sd, SOP_AND_POOL, UINT64_MAX, 0);
	CUstream st[64];
	void *buf;
	char *ideal;
	int max_s = 1, a, c, r, i;
	char label[32], cas[32];

	for (c = 0; c < sl.n; c++)
		if ((int)sl.v[c] > max_s)
			max_s = (int)sl.v[c];
	for (i = 0; i < max_s; i++)
		st[i] = stream_new();
	/* The ideal run's buffer comes from a pool of its own, outside the pools measured. */
	side_open(&aux, SIDE_SOP, UINT64_MAX, 0);
	CHECK(side_alloc(&aux, &buf, 8 * (size_t)k, st[0]));
	ideal = buf;
	CHECK(side_sync(&aux, st[0]));

	describe(
	    "Per iteration, K = %d times on stream i %% S: allocate, launch a one-thread "
	    "kernel that spins %lld cycles and writes the memory, free; then synchronize the "
	    "context (%ld iteration%s per run). no-alloc runs the same launches on a buffer "
	    "allocated beforehand: the ideal, ceil(K / S) kernel times when streams overlap.%s",
	    k, cycles, iters, iters > 1 ? "s" : "",
	    env.kernels ? "" : " No kernels here: allocations and synchronization only.");
	for (a = 0; a < n_sizes; a++) {
		size_t size = sizes[a];

		fmt_size(label, sizeof label, size);
		for (c = 0; c < sl.n && budget_left("streams"); c++) {
			int n_streams = (int)sl.v[c];
			struct metric *wall, *rel = NULL;

			snprintf(cas, sizeof cas, "S=%d", n_streams);
			wall = metric_new("streams", label, cas, "wall per iteration", "ms",
					  n_streams, false);
			if (ideal_on)
				rel = metric_new("streams", label, cas, "wall / no-alloc wall", "x",
						 n_streams, false);
			for (i = 0; i < n; i++)
				streams_run(&sd[i], n_streams, k, size, cycles, st, 1, ideal);
			if (ideal_on)
				streams_run(NULL, n_streams, k, size, cycles, st, 1, ideal);
			for (r = 0; r < opts.reps; r++) {
				double t[N_SIDES] = {0}, t_ideal = 0;
				struct span sp;

				for (i = 0; i < n; i++) {
					span_begin(&sp, sd[i].kind);
					streams_run(&sd[i], n_streams, k, size, cycles, st, iters,
						    ideal);
					t[i] = span_end(&sp, wall, (double)(iters * k));
					metric_add(wall, sd[i].kind, t[i] / (double)iters / 1e6);
				}
				if (!ideal_on)
					continue;
				span_begin(&sp, SIDE_IDEAL);
				streams_run(NULL, n_streams, k, size, cycles, st, iters, ideal);
				t_ideal = span_end(&sp, NULL, 0);
				metric_add(wall, SIDE_IDEAL, t_ideal / (double)iters / 1e6);
				for (i = 0; i < n; i++)
					metric_add(rel, sd[i].kind, t[i] / t_ideal);
				metric_add(rel, SIDE_IDEAL, 1);
			}
			metric_done(wall);
			if (rel)
				metric_done(rel);
		}
	}
	sides_close(sd, n);
	CHECK(side_free(&aux, buf, st[0]));
	CHECK(side_sync(&aux, st[0]));
	side_close(&aux);
	for (i = 0; i < max_s; i++)
		stream_free(st[i]);
}

/* ---- handoff ------------------------------------------------------------------------------ */

#define HANDOFF_EVENTS 32
/* The host may run this many iterations ahead of the GPU: without a bound it queues thousands
 * of kernels, and both pools grow by a block for each one still pending. */
#define HANDOFF_AHEAD 128
/* Blocks that can be in flight: the iterations the host runs ahead, and the half step before
 * it waits. */
#define HANDOFF_RING (HANDOFF_AHEAD + HANDOFF_AHEAD / 2)

struct handoff_events {
	CUevent ev[HANDOFF_EVENTS];
	CUevent ahead[4];
};

/* Allocate on A, fill it there, record an event on A, make B wait on it, free on B. Every
 * HANDOFF_AHEAD / 2 iterations an event on B marks progress, and the host waits for the mark
 * two back: through the side's own event synchronize, which each allocator sees. sd NULL: the
 * same loop on buf[i % n_buf], allocated beforehand, through the driver's own calls and with no
 * allocator: the floor under every side. With one buffer the fill finds it in the GPU's cache;
 * with HANDOFF_RING, as many as can be in flight, it writes fresh memory each time, as it does
 * with any allocator that does not make A wait for B's frees. */
static void
handoff_run(const struct side *sd, const struct handoff_events *e, size_t size, long n, CUstream a,
	    CUstream b, void *const *buf, int n_buf, struct metric *host, struct metric *gpu,
	    long *stalls)
{
	const long step = HANDOFF_AHEAD / 2;
	enum side_kind kind = sd ? sd->kind : SIDE_IDEAL;
	struct span sp;
	CUresult r;
	double t;
	long i;

	span_begin(&sp, kind);
	for (i = 0; i < n; i++) {
		CUevent ev = e->ev[i % HANDOFF_EVENTS];
		void *p = n_buf ? buf[i % n_buf] : NULL;

		if (i % step == 0) {
			long mark = i / step;
			CUevent now = e->ahead[mark % 4];

			if (mark >= 2) {
				CUevent back = e->ahead[(mark - 2) % 4];

				CHECK(sd ? side_event_sync(sd, back)
					 : drv.cuEventSynchronize(back));
			}
			CHECK(sd ? side_record(sd, now, b) : drv.cuEventRecord(now, b));
		}
		if (sd) {
			r = side_alloc(sd, &p, size, a);
			if (r == CUDA_ERROR_OUT_OF_MEMORY) {
				/* Memory pending on B that the allocator could not reuse: wait
				 * for it rather than end the run, and say so in the report. */
				CHECK(side_ctx_sync(sd));
				(*stalls)++;
				r = side_alloc(sd, &p, size, a);
			}
			CHECK(r);
		}
		if (env.kernels)
			launch_fill(p, size, (unsigned)i, a);
		CHECK(sd ? side_record(sd, ev, a) : drv.cuEventRecord(ev, a));
		CHECK(sd ? side_wait(sd, b, ev) : drv.cuStreamWaitEvent(b, ev, 0));
		if (sd)
			CHECK(side_free(sd, p, b));
	}
	t = span_end(&sp, host, (double)n);
	CHECK(sd ? side_ctx_sync(sd) : drv.cuCtxSynchronize());
	if (host) {
		metric_add(host, kind, t / (double)n / 1e3);
		metric_add(gpu, kind, (now_ns() - sp.t0) / (double)n / 1e3);
	}
}

/* sd NULL: the floor's events, destroyed through the driver. */
static void
handoff_events(const struct side *sd, struct handoff_events *e, bool create)
{
	int i;

	for (i = 0; i < HANDOFF_EVENTS + 4; i++) {
		CUevent *ev = i < HANDOFF_EVENTS ? &e->ev[i] : &e->ahead[i - HANDOFF_EVENTS];

		if (create)
			CHECK(drv.cuEventCreate(ev, CU_EVENT_DISABLE_TIMING));
		else
			CHECK(sd ? side_event_destroy(sd, *ev) : drv.cuEventDestroy(*ev));
	}
}

void
wl_handoff(void)
{
	static const size_t sizes_full[] = {64 * KiB, 16 * MiB};
	static const size_t sizes_smoke[] = {64 * KiB};
	long iters = scaled(5000, 1000, 100);
	int n_sizes = opts.level == LEVEL_SMOKE ? N_OF(sizes_smoke) : N_OF(sizes_full);
	bool floor_on = side_allowed(SIDE_IDEAL);
	CUstream a = stream_new(), b = stream_new();
	struct side aux;
	char label[32];
	int c, r, i;

	describe("Per iteration: allocate on stream A, fill the block with a kernel on A, record "
		 "an event on A, make stream B wait on it, free on B; %ld iterations per run, the "
		 "host at most %d iterations ahead of the GPU. Host time is the loop; time to "
		 "completion runs until the context is synchronized. Fresh pools per size. "
		 "no-alloc runs the same loop on a buffer allocated beforehand: the floor the "
		 "allocators' loops sit on; a side's time minus it is the allocator's own share. "
		 "The rows 'on %d blocks' run it on that many buffers in turn, as many as can be "
		 "in flight: the floor of an allocator that hands out a different block while "
		 "earlier ones are in use (the one buffer stays in the GPU's cache).%s",
		 iters, HANDOFF_AHEAD, HANDOFF_RING, env.kernels ? "" : " No kernels here: no fill.");
	/* The floor's buffer comes from a pool of its own, outside the pools measured. */
	if (floor_on)
		side_open(&aux, SIDE_SOP, UINT64_MAX, 0);
	for (c = 0; c < n_sizes && budget_left("handoff"); c++) {
		size_t size = sizes_full[c];
		struct side sd[N_SIDES];
		struct handoff_events ev[N_SIDES], fev;
		int n = sides_open(sd, SOP_AND_POOL, UINT64_MAX, 0);
		struct metric *host, *gpu, *mem, *host_ring = NULL, *gpu_ring = NULL;
		long stalls[N_SIDES] = {0};
		void *ring[HANDOFF_RING];
		int k;

		fmt_size(label, sizeof label, size);
		host =
		    metric_new("handoff", "", label, "host time", "us/iter", (double)size, false);
		gpu = metric_new("handoff", "", label, "time to completion", "us/iter",
				 (double)size, false);
		mem = metric_new("handoff", "", label, "reserved-high", "MiB", (double)size, false);
		if (floor_on) {
			char what[64];

			snprintf(what, sizeof what, "host time on %d blocks", HANDOFF_RING);
			host_ring = metric_new("handoff", "", label, what, "us/iter", (double)size,
					       false);
			snprintf(what, sizeof what, "time to completion on %d blocks",
				 HANDOFF_RING);
			gpu_ring = metric_new("handoff", "", label, what, "us/iter", (double)size,
					      false);
		}
		for (i = 0; i < n; i++) {
			handoff_events(&sd[i], &ev[i], true);
			handoff_run(&sd[i], &ev[i], size, iters / 10 + 1, a, b, NULL, 0, NULL, NULL,
				    &stalls[sd[i].kind]);
		}
		if (floor_on) {
			for (k = 0; k < HANDOFF_RING; k++)
				CHECK(side_alloc(&aux, &ring[k], size, a));
			CHECK(side_sync(&aux, a));
			handoff_events(NULL, &fev, true);
			handoff_run(NULL, &fev, size, iters / 10 + 1, a, b, ring, 1, NULL, NULL, NULL);
			handoff_run(NULL, &fev, size, iters / 10 + 1, a, b, ring, HANDOFF_RING, NULL,
				    NULL, NULL);
		}
		for (r = 0; r < opts.reps; r++) {
			for (i = 0; i < n; i++)
				handoff_run(&sd[i], &ev[i], size, iters, a, b, NULL, 0, host, gpu,
					    &stalls[sd[i].kind]);
			if (floor_on) {
				handoff_run(NULL, &fev, size, iters, a, b, ring, 1, host, gpu, NULL);
				handoff_run(NULL, &fev, size, iters, a, b, ring, HANDOFF_RING,
					    host_ring, gpu_ring, NULL);
			}
		}
		for (i = 0; i < n; i++) {
			metric_add(mem, sd[i].kind,
				   (double)side_attr(&sd[i], CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) /
				       (double)MiB);
			handoff_events(&sd[i], &ev[i], false);
			if (stalls[sd[i].kind])
				note("handoff %s: %s ran out of memory %ld times and synchronized "
				     "the "
				     "context to go on",
				     label, side_names[sd[i].kind], stalls[sd[i].kind]);
		}
		if (floor_on) {
			handoff_events(NULL, &fev, false);
			for (k = 0; k < HANDOFF_RING; k++)
				CHECK(side_free(&aux, ring[k], a));
			CHECK(side_sync(&aux, a));
		}
		metric_done(host);
		metric_done(gpu);
		if (floor_on) {
			metric_done(host_ring);
			metric_done(gpu_ring);
		}
		metric_done(mem);
		sides_close(sd, n);
	}
	if (floor_on)
		side_close(&aux);
	stream_free(a);
	stream_free(b);
}

/* ---- fragmentation -------------------------------------------------------------------------- */

#define FRAG_SLOTS 512

/* anchor.c's mempool_behaviour: pick a random slot; free it if taken, else allocate a
 * log-uniform size, 2^e + U[0, 2^e) bytes for e in 0..26 (1 B..128 MiB), unless the live bytes
 * would pass the cap. The blocks still live at the end stay in slot. */
static void
frag_run(const struct side *sd, uint64_t seed, long iters, size_t cap, CUstream s,
	 struct live *slot, size_t *peak, long *failed)
{
	struct rng rng = {seed};
	size_t used = 0;
	long i;

	memset(slot, 0, FRAG_SLOTS * sizeof *slot);
	for (i = 0; i < iters; i++) {
		struct live *l = &slot[rng_below(&rng, FRAG_SLOTS)];
		unsigned e;
		size_t n;
		CUresult r;

		if (l->p) {
			CHECK(side_free(sd, l->p, s));
			used -= l->size;
			l->p = NULL;
			continue;
		}
		e = (unsigned)rng_below(&rng, 27);
		n = ((size_t)1 << e) + rng_below(&rng, (uint64_t)1 << e);
		if (used + n > cap)
			continue;
		r = side_alloc(sd, &l->p, n, s);
		if (r == CUDA_ERROR_OUT_OF_MEMORY) {
			l->p = NULL;
			(*failed)++;
			continue;
		}
		CHECK(r);
		l->size = n;
		used += n;
		if (used > *peak)
			*peak = used;
	}
}

void
wl_fragmentation(void)
{
	/* sop as it comes, sop with compaction on (a case of its own), the driver's pool. */
	static const struct {
		enum side_kind kind;
		bool compact;
	} runs[] = {{SIDE_SOP, false}, {SIDE_SOP, true}, {SIDE_POOL, false}};
	long iters = scaled(200000, 50000, 2000);
	size_t cap = mem_cap(8 * GiB, 4);
	/* Each repetition builds fresh pools from nothing: a few are enough. */
	int reps = opts.reps < 5 ? opts.reps : 5;
	CUstream s = stream_new();
	struct metric *ratio_m[2], *high_m[2], *time_m[2], *extent_m[2];
	long failed[N_SIDES] = {0}, failed_compact = 0;
	char cas[2][64], label[32];
	int r, i, c;

	snprintf(cas[0], sizeof cas[0], "<= %s live", fmt_size(label, sizeof label, cap));
	snprintf(cas[1], sizeof cas[1], "<= %s live, sop compacting", label);
	describe("anchor.c's mempool_behaviour on fresh pools: %ld steps over 512 slots, each "
		 "freeing a taken slot or filling an empty one with 2^e + U[0, 2^e) bytes (e in "
		 "0..26), live bytes capped; a new seed per repetition (at most 5). The largest "
		 "free extent over total free is read when the steps are done, before the blocks "
		 "still live are freed, from sop_pool_get_free_extents (free and pending memory "
		 "alike); the driver's pool has no way to tell it. The compacting case is sop "
		 "with sop_pool_set_compaction on, on the same seeds.",
		 iters);
	for (c = 0; c < 2; c++) {
		ratio_m[c] = metric_new("fragmentation", "", cas[c], "reserved-high / peak live", "x",
					0, false);
		high_m[c] = metric_new("fragmentation", "", cas[c], "reserved-high", "MiB", 0, false);
		time_m[c] = metric_new("fragmentation", "", cas[c], "time", "ns/op", 0, false);
		extent_m[c] = metric_new("fragmentation", "", cas[c],
					 "largest free extent / total free", "x", 0, true);
	}
	for (r = 0; r < reps && budget_left("fragmentation"); r++) {
		for (i = 0; i < N_OF(runs); i++) {
			struct side sd;
			struct span sp;
			struct live slot[FRAG_SLOTS];
			size_t peak = 0, largest, total;
			uint64_t high;
			int k;

			c = runs[i].compact;
			if (!side_allowed(runs[i].kind) || !side_open(&sd, runs[i].kind, UINT64_MAX, 0))
				continue;
			if (c)
				CHECK(sop_pool_set_compaction(sd.sop, 1));
			span_begin(&sp, sd.kind);
			frag_run(&sd, 1000 + (uint64_t)r, iters, cap, s, slot, &peak,
				 c ? &failed_compact : &failed[sd.kind]);
			metric_add(time_m[c], sd.kind,
				   span_end(&sp, time_m[c], (double)iters) / (double)iters);
			/* Before the blocks still live go. */
			if (sd.kind == SIDE_SOP) {
				CHECK(sop_pool_get_free_extents(sd.sop, &largest, &total));
				if (total)
					metric_add(extent_m[c], sd.kind,
						   (double)largest / (double)total);
			}
			for (k = 0; k < FRAG_SLOTS; k++)
				if (slot[k].p)
					CHECK(side_free(&sd, slot[k].p, s));
			CHECK(side_ctx_sync(&sd));
			high = side_attr(&sd, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
			metric_add(ratio_m[c], sd.kind, (double)high / (double)(peak ? peak : 1));
			metric_add(high_m[c], sd.kind, (double)high / (double)MiB);
			side_close(&sd);
		}
	}
	for (c = 0; c < 2; c++) {
		metric_done(ratio_m[c]);
		metric_done(high_m[c]);
		metric_done(time_m[c]);
		metric_done(extent_m[c]);
	}
	for (i = 0; i < N_SIDES; i++)
		if (failed[i])
			note("fragmentation: %ld allocations failed on %s (out of memory) and were "
			     "skipped",
			     failed[i], side_names[i]);
	if (failed_compact)
		note("fragmentation: %ld allocations failed on sop compacting (out of memory) and "
		     "were skipped",
		     failed_compact);
	stream_free(s);
}

/* ---- growth --------------------------------------------------------------------------------- */

/* The step both pools grow by: what the first allocation maps, and the regrow size. */
#define GROWTH_SEGMENT (32 * MiB)

static void
regrow_run(const struct side *sd, size_t size, long n, CUstream s)
{
	long i;

	for (i = 0; i < n; i++) {
		void *p;

		CHECK(side_alloc(sd, &p, size, s));
		CHECK(side_free(sd, p, s));
		CHECK(side_sync(sd, s));
	}
}

/* The floor of growth: the bare virtual memory calls that map and unmap one segment on a range
 * reserved beforehand, as any pool built on the public API must make them. */
struct vmm {
	CUmemAllocationProp prop;
	CUmemAccessDesc access;
	CUdeviceptr va;
	size_t size;
};

static void
vmm_reserve(struct vmm *v, size_t size)
{
	size_t gran;

	memset(v, 0, sizeof *v);
	v->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	v->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	v->prop.location.id = env.dev;
	v->access.location = v->prop.location;
	v->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CHECK(drv.cuMemGetAllocationGranularity(&gran, &v->prop,
						CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	v->size = (size + gran - 1) / gran * gran;
	CHECK(drv.cuMemAddressReserve(&v->va, v->size, gran, 0, 0));
}

static CUmemGenericAllocationHandle
vmm_map(const struct vmm *v)
{
	CUmemGenericAllocationHandle h;

	CHECK(drv.cuMemCreate(&h, v->size, &v->prop, 0));
	CHECK(drv.cuMemMap(v->va, v->size, 0, h, 0));
	CHECK(drv.cuMemSetAccess(v->va, v->size, &v->access, 1));
	return h;
}

static void
vmm_unmap(const struct vmm *v, CUmemGenericAllocationHandle h)
{
	CHECK(drv.cuMemUnmap(v->va, v->size));
	CHECK(drv.cuMemRelease(h));
}

/* What a pool with release threshold 0 must call per regrow_run iteration. */
static void
regrow_floor(const struct vmm *v, long n, CUstream s)
{
	long i;

	for (i = 0; i < n; i++) {
		CUmemGenericAllocationHandle h = vmm_map(v);

		CHECK(drv.cuStreamSynchronize(s));
		vmm_unmap(v, h);
	}
}

void
wl_growth(void)
{
	static const enum side_kind kinds[] = {SIDE_SOP, SIDE_POOL};
	long n = scaled(200, 50, 5);
	bool floor_on = side_allowed(SIDE_IDEAL);
	CUstream s = stream_new();
	struct metric *create, *first, *destroy, *regrow;
	struct side sd[N_SIDES];
	struct vmm v;
	int n_sides, r, i;

	describe("Fresh pool, release threshold UINT64_MAX: create it, time the first 1 MiB "
		 "allocation (which maps the first segment), free, synchronize, destroy. sop's "
		 "pools after the first take the address range the pool destroyed before them "
		 "left, from the third on with its anchor, as in any process that makes pools one "
		 "after another; all in one process, so the driver's pool may land where a range "
		 "was freed. Then, threshold 0: allocate 32 MiB, free, synchronize the stream, %ld times per run: "
		 "each synchronize hands the memory back and the next allocation maps it again. "
		 "no-alloc is the bare driver calls the step needs, on an address range reserved "
		 "beforehand: cuMemCreate, cuMemMap and cuMemSetAccess of one 32 MiB segment for "
		 "the first allocation; cuMemUnmap, cuMemRelease and cuMemAddressFree of it for "
		 "destroy; cuMemCreate, cuMemMap, cuMemSetAccess, cuStreamSynchronize, cuMemUnmap "
		 "and cuMemRelease per regrow iteration. It is the floor under any pool built on the "
		 "public virtual memory API. The sides and the floor take turns at every regrow "
		 "iteration.",
		 n);
	create = metric_new("growth", "fresh pool", "create", "pool create", "us", 0, false);
	first = metric_new("growth", "fresh pool", "first allocation (1 MiB)", "host time", "us", 0,
			   false);
	destroy = metric_new("growth", "fresh pool", "destroy", "pool destroy", "us", 0, false);
	/* Each repetition starts with another of the sides and the floor, so that none is always
	 * measured right after the same other one: the driver's mapping calls cost more or less
	 * from one moment to the next, and a fixed order could charge a side for its place. */
	for (r = 0; r < opts.reps && budget_left("growth"); r++) {
		CUmemGenericAllocationHandle h;
		struct span sp;
		int k;

		for (k = 0; k <= N_OF(kinds); k++) {
			struct side one;
			double t0;
			void *p;

			i = (r + k) % (N_OF(kinds) + 1);
			if (i == N_OF(kinds)) {
				if (!floor_on)
					continue;
				vmm_reserve(&v, GROWTH_SEGMENT);
				span_begin(&sp, SIDE_IDEAL);
				h = vmm_map(&v);
				metric_add(first, SIDE_IDEAL, span_end(&sp, NULL, 0) / 1e3);
				t0 = now_ns();
				vmm_unmap(&v, h);
				CHECK(drv.cuMemAddressFree(v.va, v.size));
				metric_add(destroy, SIDE_IDEAL, (now_ns() - t0) / 1e3);
				continue;
			}
			if (!side_allowed(kinds[i]))
				continue;
			t0 = now_ns();
			if (!side_open(&one, kinds[i], UINT64_MAX, 0))
				continue;
			metric_add(create, one.kind, (now_ns() - t0) / 1e3);
			span_begin(&sp, one.kind);
			CHECK(side_alloc(&one, &p, MiB, s));
			metric_add(first, one.kind, span_end(&sp, first, 1) / 1e3);
			CHECK(side_free(&one, p, s));
			CHECK(side_sync(&one, s));
			t0 = now_ns();
			side_close(&one);
			metric_add(destroy, kinds[i], (now_ns() - t0) / 1e3);
		}
	}
	metric_done(create);
	metric_done(first);
	metric_done(destroy);

	/* Release threshold 0: every synchronize hands the segment back, the next allocation
	 * maps a new one. */
	regrow = metric_new("growth", "threshold 0", "32 MiB alloc+free+sync", "regrow", "us/iter",
			    0, false);
	n_sides = sides_open(sd, SOP_AND_POOL, 0, 0);
	for (i = 0; i < n_sides; i++)
		regrow_run(&sd[i], GROWTH_SEGMENT, 2, s);
	if (floor_on) {
		vmm_reserve(&v, GROWTH_SEGMENT);
		regrow_floor(&v, 2, s);
	}
	/* The sides take turns at every iteration, each repetition's figure the mean of its
	 * iterations: the mapping calls' cost drifts by a quarter over seconds on the GPU machine,
	 * more than the differences measured, and blocks of iterations would charge it to
	 * whichever side ran while it was high. */
	for (r = 0; r < opts.reps && budget_left("growth"); r++) {
		double sum[N_SIDES + 1] = {0};
		long j;
		int k;

		for (j = 0; j < n; j++) {
			for (k = 0; k <= n_sides; k++) {
				struct span sp;

				i = (int)((r + j + k) % (n_sides + 1));
				if (i == n_sides) {
					if (!floor_on)
						continue;
					span_begin(&sp, SIDE_IDEAL);
					regrow_floor(&v, 1, s);
					sum[i] += span_end(&sp, NULL, 0);
					continue;
				}
				span_begin(&sp, sd[i].kind);
				regrow_run(&sd[i], GROWTH_SEGMENT, 1, s);
				sum[i] += span_end(&sp, regrow, 1);
			}
		}
		for (i = 0; i < n_sides; i++)
			metric_add(regrow, sd[i].kind, sum[i] / (double)n / 1e3);
		if (floor_on)
			metric_add(regrow, SIDE_IDEAL, sum[n_sides] / (double)n / 1e3);
	}
	if (floor_on)
		CHECK(drv.cuMemAddressFree(v.va, v.size));
	metric_done(regrow);
	sides_close(sd, n_sides);
	stream_free(s);
}

/* ---- host ----------------------------------------------------------------------------------- */

/* Pinned host memory, four ways: sop's host pool (SIDE_SOP), the driver's host-location pool
 * (SIDE_POOL), cuMemHostAlloc and cuMemFreeHost per use (SIDE_HOSTALLOC), and cuMemHostAlloc
 * blocks cached by hand the way frameworks do (SIDE_EVCACHE: sizes rounded up to a power of two,
 * one event recorded at each free, a block reused once its event has completed; PyTorch's
 * CachingHostAllocator). Copies also from pageable memory (SIDE_PAGEABLE). */

/* The event cache. */
struct evblock {
	void *p;
	size_t size;
	CUevent ev;
	bool busy;
};

struct evcache {
	struct evblock *b;
	size_t n, cap;
	size_t held; /* bytes pinned */
};

static CUresult
evcache_alloc(struct evcache *c, void **p, size_t size)
{
	size_t want = 1, i;
	CUresult r;

	while (want < size)
		want <<= 1;
	for (i = 0; i < c->n; i++) {
		struct evblock *b = &c->b[i];

		/* The event is asked only for a free block of the right size. */
		if (!b->busy && b->size == want && drv.cuEventQuery(b->ev) == CUDA_SUCCESS) {
			b->busy = true;
			*p = b->p;
			return CUDA_SUCCESS;
		}
	}
	if (c->n == c->cap) {
		c->cap = c->cap ? 2 * c->cap : 16;
		c->b = realloc(c->b, c->cap * sizeof *c->b);
		if (!c->b) {
			fprintf(stderr, "sop-bench: out of host memory\n");
			exit(1);
		}
	}
	r = drv.cuMemHostAlloc(p, want, 0);
	if (r != CUDA_SUCCESS)
		return r;
	r = drv.cuEventCreate(&c->b[c->n].ev, CU_EVENT_DISABLE_TIMING);
	if (r != CUDA_SUCCESS)
		return r;
	c->b[c->n].p = *p;
	c->b[c->n].size = want;
	c->b[c->n].busy = true;
	c->n++;
	c->held += want;
	return CUDA_SUCCESS;
}

static CUresult
evcache_free(struct evcache *c, void *p, CUstream s)
{
	size_t i;

	for (i = 0; i < c->n; i++) {
		if (c->b[i].p == p) {
			c->b[i].busy = false;
			return drv.cuEventRecord(c->b[i].ev, s);
		}
	}
	return CUDA_ERROR_INVALID_VALUE;
}

static void
evcache_drop(struct evcache *c)
{
	size_t i;

	CHECK(drv.cuCtxSynchronize());
	for (i = 0; i < c->n; i++) {
		CHECK(drv.cuEventDestroy(c->b[i].ev));
		CHECK(drv.cuMemFreeHost(c->b[i].p));
	}
	free(c->b);
	memset(c, 0, sizeof *c);
}

/* A host side of the workload, open for use. */
struct hside {
	enum side_kind kind;
	sop_pool_t sop;
	CUmemoryPool pool;
	struct evcache cache;
};

static bool
hostalloc_ok(void)
{
	return drv.cuMemHostAlloc && drv.cuMemFreeHost && drv.cuEventQuery;
}

/* Open a side; false where the machine lacks it. Pools keep what they reserve (threshold
 * UINT64_MAX) and do not make a stream wait for another's frees (internal dependencies off),
 * so that a block the CPU is handed is one whose last use has completed. Every device may reach
 * the memory of pools. */
static bool
hside_open(struct hside *h, enum side_kind kind)
{
	CUmemPoolProps props;
	CUmemAccessDesc d;
	cuuint64_t keep = UINT64_MAX;
	int off = 0;

	memset(h, 0, sizeof *h);
	h->kind = kind;
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_HOST;
	memset(&d, 0, sizeof d);
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = env.dev;
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	switch (kind) {
	case SIDE_SOP:
		if (sop_pool_create(&h->sop, &props) != CUDA_SUCCESS)
			return false;
		CHECK(sop_pool_set_attr(h->sop, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
		CHECK(sop_pool_set_attr(h->sop, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
					&off));
		CHECK(sop_pool_set_access(h->sop, &d, 1));
		return true;
	case SIDE_POOL:
		if (!env.pools || !(opts.sides & SIDE_BIT(SIDE_POOL)) || !drv.cuMemPoolSetAccess ||
		    drv.cuMemPoolCreate(&h->pool, &props) != CUDA_SUCCESS)
			return false;
		CHECK(drv.cuMemPoolSetAttribute(h->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
		CHECK(drv.cuMemPoolSetAttribute(
			h->pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off));
		CHECK(drv.cuMemPoolSetAccess(h->pool, &d, 1));
		return true;
	case SIDE_HOSTALLOC:
	case SIDE_EVCACHE:
		return hostalloc_ok();
	case SIDE_PAGEABLE:
		return true;
	default:
		return false;
	}
}

static void
hside_close(struct hside *h)
{
	CHECK(sop_ctx_synchronize());
	CHECK(drv.cuCtxSynchronize());
	if (h->kind == SIDE_SOP)
		CHECK(sop_pool_destroy(h->sop));
	else if (h->kind == SIDE_POOL)
		CHECK(drv.cuMemPoolDestroy(h->pool));
	else if (h->kind == SIDE_EVCACHE)
		evcache_drop(&h->cache);
}

/* Allocate for use on stream s (the CPU's use too, once s's work before it has completed). */
static CUresult
hside_alloc(struct hside *h, void **p, size_t size, CUstream s)
{
	CUdeviceptr d;
	CUresult r;

	switch (h->kind) {
	case SIDE_SOP:
		return sop_malloc_from_pool_async(p, size, h->sop, s);
	case SIDE_POOL:
		r = drv.cuMemAllocFromPoolAsync(&d, size, h->pool, s);
		if (r == CUDA_SUCCESS)
			*p = (void *)(uintptr_t)d;
		return r;
	case SIDE_HOSTALLOC:
		return drv.cuMemHostAlloc(p, size, 0);
	case SIDE_EVCACHE:
		return evcache_alloc(&h->cache, p, size);
	default:
		*p = malloc(size);
		return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
	}
}

/* Free after the work on s that uses p: in stream order, at the event, or (cuMemFreeHost,
 * malloc) once s has finished it. */
static CUresult
hside_free(struct hside *h, void *p, CUstream s)
{
	switch (h->kind) {
	case SIDE_SOP:
		return sop_free_async(p, s);
	case SIDE_POOL:
		return drv.cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, s);
	case SIDE_HOSTALLOC:
		CHECK(drv.cuStreamSynchronize(s));
		return drv.cuMemFreeHost(p);
	case SIDE_EVCACHE:
		return evcache_free(&h->cache, p, s);
	default:
		CHECK(drv.cuStreamSynchronize(s));
		free(p);
		return CUDA_SUCCESS;
	}
}

static CUresult
hside_sync(struct hside *h, CUstream s)
{
	return h->kind == SIDE_SOP ? sop_stream_synchronize(s) : drv.cuStreamSynchronize(s);
}

/* Bytes of pinned memory the side holds now. */
static double
hside_held(struct hside *h, size_t batch)
{
	cuuint64_t v = 0;

	switch (h->kind) {
	case SIDE_SOP:
		CHECK(sop_pool_get_attr(h->sop, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &v));
		return (double)v;
	case SIDE_POOL:
		CHECK(drv.cuMemPoolGetAttribute(h->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &v));
		return (double)v;
	case SIDE_EVCACHE:
		return (double)h->cache.held;
	default:
		return (double)batch;
	}
}

/* What a program pays for its first pinned buffer: a fresh pool's first allocation of 1 MiB
 * (the pool made beforehand, untimed), and the pinned memory it holds then. */
static void
host_first(CUstream s)
{
	static const enum side_kind kinds[] = {SIDE_SOP, SIDE_POOL, SIDE_HOSTALLOC};
	struct metric *m = metric_new("host", "fresh pool, first allocation", "1 MiB", "host time",
				      "us", (double)MiB, false);
	struct metric *held = metric_new("host", "fresh pool, first allocation", "1 MiB",
					 "pinned memory held", "MiB", (double)MiB, false);
	int r, k;

	for (r = 0; r < opts.reps; r++) {
		for (k = 0; k < N_OF(kinds); k++) {
			struct hside h;
			double t0;
			void *p;

			if (!hside_open(&h, kinds[k]))
				continue;
			t0 = now_ns();
			CHECK(hside_alloc(&h, &p, MiB, s));
			metric_add(m, h.kind, (now_ns() - t0) / 1e3);
			metric_add(held, h.kind, hside_held(&h, MiB) / (double)MiB);
			CHECK(hside_free(&h, p, s));
			CHECK(hside_sync(&h, s));
			hside_close(&h);
		}
	}
	metric_done(m);
	metric_done(held);
}

static void
host_pairs(CUstream s)
{
	static const size_t full[] = {4 * KiB, 64 * KiB, MiB, 16 * MiB, 256 * MiB};
	static const size_t quick[] = {4 * KiB, MiB, 64 * MiB};
	static const size_t smoke[] = {4 * KiB, MiB};
	static const enum side_kind kinds[] = {SIDE_SOP, SIDE_POOL, SIDE_HOSTALLOC, SIDE_EVCACHE};
	struct list sizes = list_pick(&opts.sizes, full, N_OF(full), quick, N_OF(quick), smoke,
				      N_OF(smoke));
	long iters = scaled(100000, 20000, 100);
	struct hside h[N_OF(kinds)];
	int n = 0, c, r, i, k;
	char label[32];

	for (k = 0; k < N_OF(kinds); k++)
		if (hside_open(&h[n], kinds[k]))
			n++;
	for (c = 0; c < sizes.n && budget_left("host"); c++) {
		size_t size = sizes.v[c];
		struct metric *m = metric_new("host", "alloc+free pair", fmt_size(label, sizeof label,
										    size),
					      "latency", "ns/pair", (double)size, false);

		for (r = -1; r < opts.reps; r++) {
			for (i = 0; i < n; i++) {
				/* cuMemHostAlloc pins at every call: milliseconds for large sizes,
				 * so it runs fewer pairs. */
				long it = h[i].kind == SIDE_HOSTALLOC
						  ? (size >= 16 * MiB ? 3 : size >= MiB ? 20 : 200)
						  : iters;
				struct span sp;
				void *p;
				long j;

				if (r < 0) /* untimed: the pools map, the cache fills */
					it = it / 10 + 1;
				span_begin(&sp, h[i].kind);
				for (j = 0; j < it; j++) {
					CHECK(hside_alloc(&h[i], &p, size, s));
					CHECK(hside_free(&h[i], p, s));
				}
				if (r >= 0)
					metric_add(m, h[i].kind,
						   span_end(&sp, m, (double)it) / (double)it);
				CHECK(hside_sync(&h[i], s));
			}
		}
		metric_done(m);
	}
	for (i = 0; i < n; i++)
		hside_close(&h[i]);
}

static void
host_copies(CUstream s, sop_pool_t dev_pool)
{
	static const size_t full[] = {MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, GiB};
	static const size_t quick[] = {MiB, 16 * MiB, 256 * MiB};
	static const size_t smoke[] = {MiB};
	static const enum side_kind kinds[] = {SIDE_SOP, SIDE_POOL, SIDE_HOSTALLOC, SIDE_PAGEABLE};
	struct list sizes = list_pick(&opts.sizes, full, N_OF(full), quick, N_OF(quick), smoke,
				      N_OF(smoke));
	struct hside h[N_OF(kinds)];
	int n = 0, c, r, i, k, dir;
	char label[32];

	for (k = 0; k < N_OF(kinds); k++)
		if (hside_open(&h[n], kinds[k]))
			n++;
	for (c = 0; c < sizes.n && budget_left("host"); c++) {
		size_t size = sizes.v[c];
		long copies = size >= 256 * MiB ? 4 : size >= 16 * MiB ? 16 : 64;
		void *host[N_OF(kinds)], *dev;

		if (opts.level == LEVEL_SMOKE)
			copies = 2;
		if (size > mem_cap(GiB, 4))
			break;
		CHECK(sop_malloc_from_pool_async(&dev, size, dev_pool, s));
		for (i = 0; i < n; i++) {
			CHECK(hside_alloc(&h[i], &host[i], size, s));
			CHECK(hside_sync(&h[i], s));
			memset(host[i], 0x5a, size); /* every page touched before timing */
		}
		for (dir = 0; dir < 2; dir++) {
			struct metric *m = metric_new(
				"host", dir ? "copy device-to-host" : "copy host-to-device",
				fmt_size(label, sizeof label, size), "bandwidth", "GB/s",
				(double)size, true);

			for (r = -1; r < opts.reps; r++) {
				for (i = 0; i < n; i++) {
					CUdeviceptr hp = (CUdeviceptr)(uintptr_t)host[i];
					CUdeviceptr dp = (CUdeviceptr)(uintptr_t)dev;
					double t0 = now_ns(), t;
					long j;

					for (j = 0; j < (r < 0 ? 1 : copies); j++)
						CHECK(drv.cuMemcpyAsync(dir ? hp : dp, dir ? dp : hp,
									size, s));
					CHECK(drv.cuStreamSynchronize(s));
					t = now_ns() - t0;
					if (r >= 0)
						metric_add(m, h[i].kind,
							   (double)size * (double)copies / t);
				}
			}
			metric_done(m);
		}
		for (i = 0; i < n; i++)
			CHECK(hside_free(&h[i], host[i], s));
		CHECK(sop_free_async(dev, s));
		CHECK(sop_stream_synchronize(s));
	}
	for (i = 0; i < n; i++)
		hside_close(&h[i]);
}

/* One batch of the staging pipeline: a pinned buffer, filled by the CPU, copied to the device
 * on s, freed after the copy. The pools allocate on hs, a stream of the CPU's that runs no work:
 * with internal dependencies off, a block freed on s comes back there only once its copy has
 * completed, so the CPU may fill it as soon as hs is synchronized (at once, with nothing on it);
 * s is then ordered after hs by an event. */
static void
staging_batch(struct hside *h, void *dev, size_t size, unsigned v, CUstream s, CUstream hs,
	      CUevent ev)
{
	bool pool = h->kind == SIDE_SOP || h->kind == SIDE_POOL;
	void *p;

	CHECK(hside_alloc(h, &p, size, pool ? hs : s));
	if (h->kind == SIDE_SOP)
		CHECK(sop_stream_synchronize(hs));
	else if (h->kind == SIDE_POOL)
		CHECK(drv.cuStreamSynchronize(hs));
	memset(p, (int)(v & 0xff), size);
	if (h->kind == SIDE_SOP) {
		CHECK(sop_event_record(ev, hs));
		CHECK(sop_stream_wait_event(s, ev, 0));
	} else if (h->kind == SIDE_POOL) {
		CHECK(drv.cuEventRecord(ev, hs));
		CHECK(drv.cuStreamWaitEvent(s, ev, 0));
	}
	CHECK(drv.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dev, (CUdeviceptr)(uintptr_t)p, size, s));
	CHECK(hside_free(h, p, s));
}

static void
host_staging(CUstream s, sop_pool_t dev_pool)
{
	static const size_t full[] = {MiB, 16 * MiB};
	static const size_t smoke[] = {MiB};
	static const enum side_kind kinds[] = {SIDE_SOP, SIDE_POOL, SIDE_HOSTALLOC, SIDE_EVCACHE};
	struct list sizes = list_pick(&opts.sizes, full, N_OF(full), full, N_OF(full), smoke,
				      N_OF(smoke));
	long batches = scaled(400, 100, 8);
	struct hside h[N_OF(kinds)];
	CUstream hs = stream_new();
	CUevent ev;
	int n = 0, c, r, i, k;
	char label[32];

	CHECK(drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	for (k = 0; k < N_OF(kinds); k++)
		if (hside_open(&h[n], kinds[k]))
			n++;
	for (c = 0; c < sizes.n && budget_left("host"); c++) {
		size_t size = sizes.v[c];
		struct metric *m = metric_new("host", "staging pipeline",
					      fmt_size(label, sizeof label, size), "wall time",
					      "us/batch", (double)size, false);
		struct metric *held = metric_new("host", "staging pipeline",
						 fmt_size(label, sizeof label, size),
						 "pinned memory held", "MiB", (double)size, false);
		void *dev;

		CHECK(sop_malloc_from_pool_async(&dev, size, dev_pool, s));
		CHECK(sop_stream_synchronize(s));
		for (r = -1; r < opts.reps; r++) {
			for (i = 0; i < n; i++) {
				long b, nb = h[i].kind == SIDE_HOSTALLOC && size >= 16 * MiB
						     ? batches / 10 + 1
						     : batches;
				struct span sp;

				if (r < 0)
					nb = nb / 10 + 1;
				span_begin(&sp, h[i].kind);
				for (b = 0; b < nb; b++)
					staging_batch(&h[i], dev, size, (unsigned)b, s, hs, ev);
				CHECK(hside_sync(&h[i], s));
				if (r >= 0) {
					metric_add(m, h[i].kind,
						   span_end(&sp, m, (double)nb) / (double)nb / 1e3);
					metric_add(held, h[i].kind,
						   hside_held(&h[i], size) / (double)MiB);
				}
			}
		}
		metric_done(m);
		metric_done(held);
		CHECK(sop_free_async(dev, s));
		CHECK(sop_stream_synchronize(s));
	}
	for (i = 0; i < n; i++)
		hside_close(&h[i]);
	CHECK(drv.cuEventDestroy(ev));
	stream_free(hs);
}

void
wl_host(void)
{
	CUmemPoolProps props;
	sop_pool_t probe, dev_pool;
	CUstream s;
	CUresult r;

	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_HOST;
	r = sop_pool_create(&probe, &props);
	if (r != CUDA_SUCCESS) {
		note("host: sop makes no host pool here (the driver gave %d): skipped", (int)r);
		return;
	}
	CHECK(sop_pool_destroy(probe));
	if (!hostalloc_ok())
		note("host: the driver lacks cuMemHostAlloc, cuMemFreeHost or cuEventQuery: "
		     "cuMemHostAlloc and the event cache left out");
	describe("Pinned host memory. First allocation: a fresh pool's first 1 MiB (the pool made "
		 "beforehand), and the pinned memory held then; cuMemHostAlloc pins at every call. "
		 "Pairs: one stream, allocate and free the same size; sop's "
		 "host pool and the driver's (release threshold UINT64_MAX) against "
		 "cuMemHostAlloc+cuMemFreeHost per pair and an event cache of cuMemHostAlloc "
		 "blocks (power-of-two sizes, an event recorded at each free, a block reused once "
		 "its event completed). Copies: cuMemcpyAsync host-to-device and device-to-host "
		 "between a device buffer and memory of sop's host pool, the driver's host pool, "
		 "cuMemHostAlloc and malloc (pageable), one size at a time, GB/s of 1e9 bytes. "
		 "Staging: per batch allocate a pinned buffer, fill it on the CPU, copy it to the "
		 "device on a stream and free it after the copy; the pools allocate on a second, "
		 "idle stream of the CPU's with internal dependencies off (a block comes back "
		 "there once its copy has completed) and order the copy after it with an event; "
		 "cuMemHostAlloc per batch synchronizes before cuMemFreeHost; the event cache "
		 "records an event at the free. Wall time per batch, and the pinned memory each "
		 "held at the end.");
	s = stream_new();
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = env.dev;
	CHECK(sop_pool_create(&dev_pool, &props));
	host_first(s);
	host_pairs(s);
	host_copies(s, dev_pool);
	host_staging(s, dev_pool);
	CHECK(sop_ctx_synchronize());
	CHECK(sop_pool_destroy(dev_pool));
	stream_free(s);
}
