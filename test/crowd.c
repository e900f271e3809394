/* crowd.c - worker threads that each bring a stream of their own to one pool, as the workers of
 * a serving process do: each creates a non-blocking stream, keeps 256 live blocks of random
 * sizes from 1 B to 1 MiB and replaces a random one at each step (a free, then an allocation,
 * on its stream), then frees everything, synchronizes its stream and destroys it. Release
 * threshold UINT64_MAX, so nothing is given back. Unlike the threads workload of bench/, the
 * threads start at once with no barrier between filling and stepping, on streams and a pool no
 * run has warmed.
 *
 * Rounds run one after another on the same pool (--rounds 1,4: one thread, then four); in a
 * round the threads start at once, or one by one (--stagger MS between starts); --lives N gives
 * each thread N streams in turn, one after the other; --keep N leaves a thread's first N blocks
 * allocated when its stream goes (freed with sop_free once the round is over); --no-sync
 * destroys the streams without synchronizing them. Each round prints the pool's
 * reserved-high, the live peak (the workers' live bytes summed as they change, every 16 steps:
 * the pool's own used-high may add the peaks of streams that did not peak at the same time,
 * since the last synchronization), their ratio, the pieces mapped, the free memory and the
 * throughput. With --check it fails when reserved-high passes twice the live peak plus a growth
 * step. --seeds N runs seeds 1..N, a fresh pool each.
 *
 *   test-crowd [--rounds 2,4] [--seconds S] [--seed N | --seeds N] [--stagger MS] [--lives N]
 *              [--keep N] [--no-sync] [--check] [--driver]
 *
 * --driver runs the same program on the driver's own pool (a real GPU), for comparison. */
#include <dlfcn.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#define LIVE 256
#define MAX_SIZE ((size_t)1 << 20)
#define STEP ((uint64_t)32 << 20) /* the growth step, sop's and the driver's */
#define MAX_ROUNDS 16
#define MAX_THREADS 64
#define MiB ((double)(1 << 20))

static struct {
	int rounds[MAX_ROUNDS], n_rounds, lives, keep;
	double seconds, stagger_ms;
	uint64_t seed, seeds;
	bool check, driver, no_sync;
} opt = {.seconds = 1.0, .seed = 1, .lives = 1};

static CUcontext ctx0;
static sop_pool_t pool;

/* The driver's own pool, for --driver. */
static struct {
	__typeof__(cuMemPoolCreate) *cuMemPoolCreate;
	__typeof__(cuMemPoolDestroy) *cuMemPoolDestroy;
	__typeof__(cuMemPoolSetAttribute) *cuMemPoolSetAttribute;
	__typeof__(cuMemPoolGetAttribute) *cuMemPoolGetAttribute;
	__typeof__(cuMemAllocFromPoolAsync) *cuMemAllocFromPoolAsync;
	__typeof__(cuMemFreeAsync) *cuMemFreeAsync;
} dp;
static CUmemoryPool dpool;

struct worker {
	_Alignas(64) uint64_t live; /* bytes, as the worker last published them (publish) */
	atomic_bool done;
	pthread_t t;
	uint64_t seed;
	int tid;
	uint64_t ops;
	double ns;
	void *kept[LIVE]; /* --keep: blocks left allocated when the stream goes, freed at the end */
	int n_kept;
	uint64_t kept_bytes;
};

static uint64_t
splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15u);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
	return z ^ (z >> 31);
}

static double
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void *
alloc(size_t n, CUstream s)
{
	void *p;

	if (opt.driver) {
		CUdeviceptr d;
		TH_OK(dp.cuMemAllocFromPoolAsync(&d, n, dpool, s));
		return (void *)(uintptr_t)d;
	}
	TH_OK(sop_malloc_from_pool_async(&p, n, pool, s));
	return p;
}

static void
release(void *p, CUstream s)
{
	if (opt.driver)
		TH_OK(dp.cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, s));
	else
		TH_OK(sop_free_async(p, s));
}

/* The live bytes of the round's workers together, and the most they reached: each worker adds
 * what its own count moved by, where it publishes it. A sampler reading the workers' counts
 * missed the peak on a loaded machine (two workers, each holding 140 MiB at once, seen as
 * 140 MiB at most), and the check then failed a pool that held 1.14x. */
static _Alignas(64) _Atomic uint64_t live_total;
static _Alignas(64) _Atomic uint64_t live_max;

static void
publish(struct worker *w, uint64_t bytes)
{
	uint64_t now = atomic_fetch_add(&live_total, bytes - w->live) + (bytes - w->live);
	uint64_t max = atomic_load_explicit(&live_max, memory_order_relaxed);

	w->live = bytes;
	while (now > max && !atomic_compare_exchange_weak(&live_max, &max, now))
		;
}

/* One life of a worker: a stream of its own, 256 blocks, steps for seconds, then everything
 * freed, the stream synchronized and destroyed. */
static void
worker_life(struct worker *w, uint64_t *rng, double seconds)
{
	void *live[LIVE];
	size_t sizes[LIVE];
	uint64_t ops = 0, bytes = 0;
	double t0, t1, end;
	CUstream s = th_stream();
	int i;

	for (i = 0; i < LIVE; i++) {
		sizes[i] = 1 + splitmix(rng) % MAX_SIZE;
		live[i] = alloc(sizes[i], s);
		bytes += sizes[i];
		publish(w, w->kept_bytes + bytes);
	}
	t0 = now_ns();
	end = t0 + seconds * 1e9;
	do {
		for (i = 0; i < 16; i++) {
			uint64_t x = splitmix(rng);
			int k = (int)(x % LIVE);

			release(live[k], s);
			bytes -= sizes[k];
			sizes[k] = 1 + (x >> 20) % MAX_SIZE;
			live[k] = alloc(sizes[k], s);
			bytes += sizes[k];
		}
		publish(w, w->kept_bytes + bytes);
		ops += 16;
		t1 = now_ns();
	} while (t1 < end);
	for (i = 0; i < LIVE; i++) {
		if (w->n_kept < opt.keep) {
			w->kept[w->n_kept++] = live[i];
			w->kept_bytes += sizes[i];
			continue;
		}
		release(live[i], s);
	}
	publish(w, w->kept_bytes);
	if (opt.driver)
		TH_OK(sop__drv.cuStreamSynchronize(s));
	else if (!opt.no_sync)
		TH_OK(sop_stream_synchronize(s));
	th_stream_destroy(s);
	w->ops += ops;
	w->ns += t1 - t0;
}

static void *
worker_main(void *arg)
{
	struct worker *w = arg;
	uint64_t rng = w->seed;
	int i;

	TH_OK(th.cuCtxSetCurrent(ctx0));
	if (opt.stagger_ms > 0)
		usleep((useconds_t)(opt.stagger_ms * 1e3 * w->tid));
	for (i = 0; i < opt.lives; i++)
		worker_life(w, &rng, opt.seconds / opt.lives);
	atomic_store(&w->done, true);
	return NULL;
}

static uint64_t
pool_attr(CUmemPool_attribute attr)
{
	cuuint64_t v = 0;

	if (opt.driver)
		TH_OK(dp.cuMemPoolGetAttribute(dpool, attr, &v));
	else
		v = th_attr(pool, attr);
	return v;
}

static unsigned long long
calls(const char *name)
{
	const char *names[64];
	unsigned long long counts[64];
	size_t n = 64, i;

	TH_OK(sop_driver_calls(names, counts, &n));
	for (i = 0; i < n && i < 64; i++)
		if (!strcmp(names[i], name))
			return counts[i];
	return 0;
}

/* One round of n threads. Returns pairs per second (all pairs over the slowest thread's
 * time); *peak is the most live bytes seen at once. */
static double
round_run(uint64_t seed, int round, int n, uint64_t *peak)
{
	static struct worker w[MAX_THREADS];
	double total = 0, slowest = 0;
	bool running = true;
	int i;

	atomic_store(&live_total, 0);
	atomic_store(&live_max, 0);
	for (i = 0; i < n; i++) {
		memset(&w[i], 0, sizeof w[i]);
		w[i].tid = i;
		w[i].seed = seed * 1000003u + (uint64_t)round * 1009u + (uint64_t)i;
		TH_ASSERT(pthread_create(&w[i].t, NULL, worker_main, &w[i]) == 0);
	}
	while (running) {
		running = false;
		for (i = 0; i < n; i++)
			running |= !atomic_load(&w[i].done);
		usleep(200);
	}
	*peak = atomic_load(&live_max);
	for (i = 0; i < n; i++) {
		int k;

		pthread_join(w[i].t, NULL);
		for (k = 0; k < w[i].n_kept; k++) {
			if (opt.driver) {
				CUstream s = th_stream();
				release(w[i].kept[k], s);
				TH_OK(sop__drv.cuStreamSynchronize(s));
				th_stream_destroy(s);
			} else {
				TH_OK(sop_free(w[i].kept[k]));
			}
		}
		total += (double)w[i].ops;
		if (w[i].ns > slowest)
			slowest = w[i].ns;
	}
	return total / slowest * 1e9;
}

static void
driver_pool_make(void)
{
	void *dl = sop__driver_handle();
	CUmemPoolProps props;
	cuuint64_t v = UINT64_MAX;

#define CROWD_STR2(x) #x
#define CROWD_STR(x) CROWD_STR2(x)
#define CROWD_LOAD(name)                                                                           \
	do {                                                                                       \
		void *s_ = dlsym(dl, CROWD_STR(name));                                             \
		memcpy(&dp.name, &s_, sizeof s_);                                                  \
	} while (0)
	CROWD_LOAD(cuMemPoolCreate);
	CROWD_LOAD(cuMemPoolDestroy);
	CROWD_LOAD(cuMemPoolSetAttribute);
	CROWD_LOAD(cuMemPoolGetAttribute);
	CROWD_LOAD(cuMemAllocFromPoolAsync);
	CROWD_LOAD(cuMemFreeAsync);
	if (!dp.cuMemPoolCreate || !dp.cuMemAllocFromPoolAsync) {
		printf("skip: the driver has no pools\n");
		exit(TH_SKIP);
	}
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = 0;
	TH_OK(dp.cuMemPoolCreate(&dpool, &props));
	TH_OK(dp.cuMemPoolSetAttribute(dpool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
}

/* Every round on a fresh pool; false if --check found too much reserved. */
static bool
run_seed(uint64_t seed)
{
	uint64_t peak_all = 0;
	bool ok = true;
	int r;

	if (opt.driver) {
		driver_pool_make();
	} else {
		cuuint64_t v = UINT64_MAX;
		pool = th_pool(0, 0);
		TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
	}
	for (r = 0; r < opt.n_rounds; r++) {
		unsigned long long made = calls("cuMemCreate");
		uint64_t peak, rh;
		size_t largest = 0, total = 0;
		double rate = round_run(seed, r, opt.rounds[r], &peak);

		if (peak > peak_all)
			peak_all = peak;
		rh = pool_attr(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
		if (!opt.driver)
			TH_OK(sop_pool_get_free_extents(pool, &largest, &total));
		printf("seed %llu round %d: %2d thread%s%s%s: reserved-high %7.1f MiB, live peak "
		       "%6.1f MiB, ratio %5.2f (used-high %6.1f MiB); pieces mapped %llu; free "
		       "%.1f MiB (largest %.1f); %.2f M pairs/s\n",
		       (unsigned long long)seed, r + 1, opt.rounds[r], opt.rounds[r] > 1 ? "s" : "",
		       opt.stagger_ms > 0 ? " one by one" : " at once",
		       opt.lives > 1 ? ", several lives" : "", (double)rh / MiB,
		       (double)peak / MiB, (double)rh / (double)peak_all,
		       (double)pool_attr(CU_MEMPOOL_ATTR_USED_MEM_HIGH) / MiB,
		       calls("cuMemCreate") - made, (double)total / MiB, (double)largest / MiB,
		       rate / 1e6);
		if (opt.check && rh > 2 * peak_all + STEP) {
			printf("seed %llu round %d: reserved-high %.1f MiB passes twice the live "
			       "peak %.1f MiB plus a step\n",
			       (unsigned long long)seed, r + 1, (double)rh / MiB,
			       (double)peak_all / MiB);
			ok = false;
		}
	}
	if (opt.driver) {
		TH_OK(dp.cuMemPoolDestroy(dpool));
	} else {
		TH_CHECK(pool);
		TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
		TH_OK(sop_pool_destroy(pool));
	}
	return ok;
}

static void
usage(void)
{
	fprintf(stderr, "usage: test-crowd [--rounds N,N...] [--seconds S] [--seed N | --seeds N] "
			"[--stagger MS] [--lives N] [--keep N] [--no-sync] [--check] [--driver]\n");
	exit(2);
}

static void
parse(int argc, char **argv)
{
	int i;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--check")) {
			opt.check = true;
			continue;
		}
		if (!strcmp(a, "--driver")) {
			opt.driver = true;
			continue;
		}
		if (!strcmp(a, "--no-sync")) {
			opt.no_sync = true;
			continue;
		}
		if (!v)
			usage();
		i++;
		if (!strcmp(a, "--rounds")) {
			char *end = (char *)v;
			opt.n_rounds = 0;
			while (*end && opt.n_rounds < MAX_ROUNDS) {
				long n = strtol(end, &end, 10);
				if (n < 1 || n > MAX_THREADS)
					usage();
				opt.rounds[opt.n_rounds++] = (int)n;
				if (*end == ',')
					end++;
				else if (*end)
					usage();
			}
		} else if (!strcmp(a, "--seconds")) {
			opt.seconds = atof(v);
		} else if (!strcmp(a, "--seed")) {
			opt.seed = strtoull(v, NULL, 0);
		} else if (!strcmp(a, "--seeds")) {
			opt.seeds = strtoull(v, NULL, 0);
		} else if (!strcmp(a, "--stagger")) {
			opt.stagger_ms = atof(v);
		} else if (!strcmp(a, "--keep")) {
			opt.keep = atoi(v);
			if (opt.keep < 0 || opt.keep > LIVE)
				usage();
		} else if (!strcmp(a, "--lives")) {
			opt.lives = atoi(v);
			if (opt.lives < 1)
				usage();
		} else {
			usage();
		}
	}
	if (!opt.n_rounds)
		opt.rounds[opt.n_rounds++] = 2;
}

int
main(int argc, char **argv)
{
	bool ok = true;
	uint64_t seed;

	parse(argc, argv);
	th_init();
	TH_OK(sop__drv.cuCtxGetCurrent(&ctx0));
	if (opt.seeds)
		for (seed = 1; seed <= opt.seeds; seed++)
			ok &= run_seed(seed);
	else
		ok = run_seed(opt.seed);
	printf("crowd: %s\n", ok ? "ok" : "FAILED");
	return ok ? 0 : 1;
}
