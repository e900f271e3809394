/* churn.c - pools, streams, events and threads made and let go by the thousand, as a server
 * that runs for months does (a pool per tenant, a stream per request, an event per handoff, a
 * thread per task). sop's host memory must stay within a bound whatever the count:
 *  - a torn-down pool's object, stream states, descriptors and block map are freed once no call
 *    can be reading them (epoch.c), and the handle table keeps a slot per pool alive at one
 *    time; a handle kept past its pool's destruction must be refused by every call that takes
 *    a pool, whether the pool is destroyed with allocations still live, torn down, freed, or
 *    its slot names a new pool: CUDA_ERROR_INVALID_VALUE, out-parameters untouched, the new pool
 *    untouched;
 *  - a pool keeps states for the streams used lately and those holding memory (stream.c), and
 *    the process records for streams held or used lately (order.c), whether the driver hands
 *    out a destroyed stream's handle again (as it does) or a fresh one, and whether the program
 *    synchronizes a stream before destroying it or destroys it busy with sop_stream_destroy;
 *  - the claims of events destroyed behind sop's back are forgotten past a fixed number;
 *  - a thread's caches go with it.
 * Everything at once, from several threads, last.
 *
 * test-churn [count] [threads]: pools per phase (default 20000; a tenth under the sanitizers,
 * whose allocators also keep freed memory on purpose, so that the bounds on host memory are
 * checked only without them; streams, events and threads scale with it), threads of the
 * threaded phases (default 4). */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#ifdef __GLIBC__
#include <malloc.h>
#endif

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#define POOLS_DEFAULT 2000
#else
#define SANITIZED 0
#define POOLS_DEFAULT 20000
#endif

/* Between two readings, a round of thousands of pools (streams, events, threads) after a warm-up,
 * with no pool waiting to be freed (before reclamation, 20000 pools took 200 MiB), the memory the
 * allocator has handed out and not had back may grow this much: a leak of 200 bytes a pool (or
 * stream, event, thread) fails it. It counts what the driver allocates too, and nothing of what
 * the allocator keeps of freed memory: over six runs on two H200s it moved by 436 KiB at most in
 * any phase (bench/results/2026-11-28-2xh200-churn-heap/). */
#define HEAP_SLACK (2 * MiB)
/* Resident memory may grow this much. It also counts what sop maps itself (a pool's block map
 * directory: a page kept per pool is 40 MiB over 10000 pools), and what the allocator keeps of
 * freed memory and cannot give back: with threads, each thread's arena keeps pieces of what was
 * freed in it, how much depending on how the threads interleave, from nothing to 5 MiB over 10000
 * pools, and 11 MiB once on two H200s. */
#define RSS_SLACK (2 * MiB)
#define RSS_SLACK_THREADS (16 * MiB)

/* Resident memory, once the allocator has given back what it can: what it keeps of freed
 * memory, in each thread's arena, is not memory sop keeps. */
static size_t
rss(void)
{
	long pages = 0, resident = 0;
	FILE *f;

#ifdef __GLIBC__
	malloc_trim(0);
#endif
	f = fopen("/proc/self/statm", "r");

	TH_ASSERT(f);
	TH_ASSERT(fscanf(f, "%ld %ld", &pages, &resident) == 2);
	fclose(f);
	return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* The process's host memory at a reading: resident, and handed out by the allocator and not
 * given back (0 where the C library does not say). */
struct mem {
	size_t rss, heap;
};

static struct mem
mem_now(void)
{
	struct mem m = {rss(), 0};

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
	struct mallinfo2 mi = mallinfo2();

	m.heap = mi.uordblks + mi.hblkhd;
#endif
	return m;
}

/* "resident A KiB -> B KiB, heap C KiB -> D KiB", for the phases' reports. */
static const char *
mem_report(struct mem before, struct mem after)
{
	static char line[128];

	snprintf(line, sizeof line, "resident %zu KiB -> %zu KiB, heap %zu KiB -> %zu KiB",
		 before.rss / KiB, after.rss / KiB, before.heap / KiB, after.heap / KiB);
	return line;
}

/* Nothing kept from one reading to the next beyond the slacks. Not under the sanitizers, whose
 * allocators keep freed memory on purpose. */
static void
mem_bounded(struct mem before, struct mem after, size_t rss_slack)
{
	TH_ASSERT(SANITIZED || after.heap <= before.heap + HEAP_SLACK);
	TH_ASSERT(SANITIZED || after.rss <= before.rss + rss_slack);
}

static CUmemPoolProps
props_of(int device)
{
	CUmemPoolProps props;

	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = device;
	return props;
}

static unsigned
slot_of(sop_pool_t pool)
{
	return (unsigned)((uintptr_t)pool & ((1u << SOP_HANDLE_INDEX_BITS) - 1));
}

/* Every call that takes a pool refuses h, and leaves its out-parameters alone. */
static void
refused(sop_pool_t h, CUstream s)
{
	static const CUmemPool_attribute attrs[] = {
		CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
		CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,            CU_MEMPOOL_ATTR_USED_MEM_HIGH};
	CUmemAccessDesc desc = {{CU_MEM_LOCATION_TYPE_DEVICE, 1},
				CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	CUmemAccess_flags flags = (CUmemAccess_flags)77;
	cuuint64_t v = 12345;
	size_t largest = 7, total = 7, i;
	void *p = (void *)&v;
	int on = 7;

	for (i = 0; i < sizeof attrs / sizeof *attrs; i++) {
		TH_EQ(sop_pool_get_attr(h, attrs[i], &v), CUDA_ERROR_INVALID_VALUE);
		TH_EQ(v, 12345);
	}
	v = 0;
	TH_EQ(sop_pool_set_attr(h, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_set_attr(h, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_free_extents(h, &largest, &total), CUDA_ERROR_INVALID_VALUE);
	TH_ASSERT(largest == 7 && total == 7);
	TH_EQ(sop_pool_set_compaction(h, 1), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_compaction(h, &on), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(on, 7);
	TH_EQ(sop_trim_to(h, 0), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_set_access(h, &desc, 1), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_set_access(h, NULL, 0), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_access(&flags, h, &loc), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(flags, 77);
	TH_EQ(sop_device_set_pool(0, h), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_malloc_from_pool_async(&p, 4096, h, s), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_malloc_from_pool_async(&p, 0, h, s), CUDA_ERROR_INVALID_VALUE);
	TH_ASSERT(p == (void *)&v);
	TH_EQ(sop_pool_destroy(h), CUDA_ERROR_INVALID_VALUE);
}

/* A handle through each stage of its pool's end, and its slot's next pool. */
static void
stale_handles(CUstream s)
{
	CUmemPoolProps props = props_of(0);
	cuuint64_t keep = 64 * MiB, v = 0;
	sop_pool_t pool, next, cur, def, owner = NULL;
	size_t slots = sop__handles_used();
	void *a, *b, *c;

	TH_OK(sop_device_get_default_pool(&def, 0));
	TH_EQ(sop_pool_destroy(def), CUDA_ERROR_INVALID_VALUE);
	refused(NULL, s);
	refused((sop_pool_t)(uintptr_t)0x1234, s); /* a slot never given out */
	refused((sop_pool_t)(uintptr_t)-1, s);
	refused((sop_pool_t)(uintptr_t)slot_of(def), s); /* the default's slot, generation 0 */

	/* Destroyed with an allocation live: refused at once, the allocation stays usable. */
	TH_OK(sop_pool_create(&pool, &props));
	TH_OK(sop_device_set_pool(0, pool));
	TH_OK(sop_malloc_from_pool_async(&a, 3 * MiB, pool, s));
	TH_OK(sop_pool_destroy(pool));
	refused(pool, s);
	TH_OK(sop_device_get_pool(&cur, 0));
	TH_ASSERT(cur == def);
	th_fill(a, 3 * MiB, 0xfeedf00d, s);
	TH_ASSERT(th_verify(a, 3 * MiB, 0xfeedf00d, s));
	TH_OK(sop_pointer_get_pool(&owner, a));
	TH_ASSERT(owner == pool);
	TH_EQ(sop__handles_used(), slots + 1);

	/* Torn down at the synchronization that covers the last free, then freed (the
	 * synchronization reclaims once it has unpinned). */
	TH_OK(sop_free_async(a, s));
	TH_OK(sop_stream_synchronize(s));
	TH_EQ(sop__handles_used(), slots);
	TH_EQ(sop__epoch_retired(), 0);
	refused(pool, s);
	/* Its memory: the pointer is nobody's now. */
	owner = NULL;
	TH_EQ(sop_pointer_get_pool(&owner, a), CUDA_ERROR_INVALID_VALUE);
	TH_ASSERT(owner == NULL);
	TH_EQ(sop_free_async(a, s), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_free(a), CUDA_ERROR_INVALID_VALUE);

	/* The slot goes to the next pool, under a new generation: the old handle still names
	 * nothing, and calls with it leave the new pool as it was. */
	TH_OK(sop_pool_create(&next, &props));
	TH_ASSERT(next != pool);
	TH_EQ(slot_of(next), slot_of(pool));
	TH_OK(sop_pool_set_attr(next, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_malloc_from_pool_async(&b, 5 * MiB, next, s));
	TH_OK(sop_malloc_from_pool_async(&c, 40 * MiB, next, s));
	TH_OK(sop_free_async(c, s));
	TH_OK(sop_stream_synchronize(s));
	TH_ASSERT(th_attr(next, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) > 40 * MiB);
	v = th_attr(next, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
	refused(pool, s);
	TH_OK(sop_pool_get_attr(next, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_EQ(keep, 64 * MiB);
	TH_EQ(th_attr(next, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), v); /* no trim */
	TH_EQ(th_attr(next, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 5 * MiB);
	TH_OK(sop_device_get_pool(&cur, 0));
	TH_ASSERT(cur == def);
	{
		int on = 1;
		TH_OK(sop_pool_get_compaction(next, &on));
		TH_EQ(on, 0);
	}
	TH_OK(sop_pointer_get_pool(&owner, b));
	TH_ASSERT(owner == next);
	TH_CHECK(next);
	TH_OK(sop_free_async(b, s));
	TH_OK(sop_pool_destroy(next));
	TH_OK(sop_stream_synchronize(s));
	refused(next, s);
	refused(pool, s);
	TH_EQ(sop__handles_used(), slots);
	TH_EQ(sop__epoch_retired(), 0);
}

/* Make, use once and destroy n pools on one stream, as a job would. */
static void
churn(int n, CUstream s, int device)
{
	CUmemPoolProps props = props_of(device);
	int i;

	for (i = 0; i < n; i++) {
		sop_pool_t pool;
		void *p;

		TH_OK(sop_pool_create(&pool, &props));
		TH_OK(sop_malloc_from_pool_async(&p, MiB, pool, s));
		TH_OK(sop_free_async(p, s));
		TH_OK(sop_stream_synchronize(s));
		TH_OK(sop_pool_destroy(pool));
	}
}

static void
one_thread(int n, CUstream s)
{
	struct mem before, after;

	churn(n / 10, s, 0); /* warm: the allocator's arenas, the block map's directory */
	before = mem_now();
	churn(n, s, 0);
	after = mem_now();
	printf("churn: %d pools on one thread, %s\n", n, mem_report(before, after));
	mem_bounded(before, after, RSS_SLACK);
	TH_EQ(sop__epoch_retired(), 0);
}

/* Threads that churn, each on its own stream, while a prober calls pools they are about to
 * destroy: a handle found live a moment before its teardown, and a pointer found live before
 * its free. Every answer is a pool's or a refusal; the pinned calls keep the pool readable.
 * The threads stay for both rounds, a warm-up and the one measured, as a server's would: new
 * threads would bring new allocator arenas, which is not sop's memory. */
#define ROUNDS 2

struct shared {
	CUcontext ctx; /* device 0's, current on every thread */
	int n[ROUNDS], device;
	pthread_barrier_t start, done;
	_Atomic(uintptr_t) handle, ptr;
	atomic_bool stop;
	atomic_long probes, refusals, most_retired;
};

static void *
churner(void *arg)
{
	struct shared *sh = arg;
	CUmemPoolProps props = props_of(sh->device);
	CUstream s;
	int i, round;

	TH_OK(th.cuCtxSetCurrent(sh->ctx));
	s = th_stream();
	for (round = 0; round < ROUNDS; round++) {
		pthread_barrier_wait(&sh->start);
		for (i = 0; i < sh->n[round]; i++) {
			sop_pool_t pool;
			void *p;

			TH_OK(sop_pool_create(&pool, &props));
			TH_OK(sop_malloc_from_pool_async(&p, (size_t)(1 + i % 7) * 64 * KiB, pool,
							 s));
			atomic_store(&sh->handle, (uintptr_t)pool);
			atomic_store(&sh->ptr, (uintptr_t)p);
			TH_OK(sop_free_async(p, s));
			if (i % 3 == 0) {
				/* Destroyed before the free is known complete: torn down at the
				 * synchronization. */
				TH_OK(sop_pool_destroy(pool));
				TH_OK(sop_stream_synchronize(s));
			} else {
				TH_OK(sop_stream_synchronize(s));
				TH_OK(sop_pool_destroy(pool));
			}
		}
		pthread_barrier_wait(&sh->done);
	}
	th_stream_destroy(s);
	return NULL;
}

static void *
prober(void *arg)
{
	struct shared *sh = arg;
	long probes = 0, refusals = 0;

	while (!atomic_load(&sh->stop)) {
		sop_pool_t h = (sop_pool_t)atomic_load(&sh->handle), owner;
		void *p = (void *)atomic_load(&sh->ptr);
		size_t largest, total, waiting;
		cuuint64_t v;
		CUresult r;

		r = sop_pool_get_attr(h, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v);
		TH_ASSERT(r == CUDA_SUCCESS || r == CUDA_ERROR_INVALID_VALUE);
		refusals += r != CUDA_SUCCESS;
		r = sop_pool_get_free_extents(h, &largest, &total);
		TH_ASSERT(r == CUDA_SUCCESS || r == CUDA_ERROR_INVALID_VALUE);
		r = sop_trim_to(h, 0);
		TH_ASSERT(r == CUDA_SUCCESS || r == CUDA_ERROR_INVALID_VALUE);
		r = p ? sop_pointer_get_pool(&owner, p) : CUDA_ERROR_INVALID_VALUE;
		TH_ASSERT(r == CUDA_SUCCESS || r == CUDA_ERROR_INVALID_VALUE);
		probes++;
		waiting = sop__epoch_retired();
		if ((long)waiting > atomic_load(&sh->most_retired))
			atomic_store(&sh->most_retired, (long)waiting);
		sched_yield(); /* where CPUs are few, the churners come first */
	}
	atomic_store(&sh->probes, probes);
	atomic_store(&sh->refusals, refusals);
	return NULL;
}

static void
many_threads(int n, int threads)
{
	struct mem before = {0, 0}, after = {0, 0};
	size_t slots = sop__handles_used();
	pthread_t t[16], probe;
	struct shared sh;
	int k, round;

	memset(&sh, 0, sizeof sh);
	TH_OK(sop__drv.cuCtxGetCurrent(&sh.ctx));
	/* Pools of another device than the streams', where there is one. */
	sh.device = th_n_devices > 1 ? 1 : 0;
	sh.n[0] = n / threads / 8;
	sh.n[1] = n / threads / 2;
	TH_ASSERT(pthread_barrier_init(&sh.start, NULL, (unsigned)threads + 1) == 0);
	TH_ASSERT(pthread_barrier_init(&sh.done, NULL, (unsigned)threads + 1) == 0);
	TH_ASSERT(pthread_create(&probe, NULL, prober, &sh) == 0);
	for (k = 0; k < threads; k++)
		TH_ASSERT(pthread_create(&t[k], NULL, churner, &sh) == 0);
	for (round = 0; round < ROUNDS; round++) {
		pthread_barrier_wait(&sh.start);
		pthread_barrier_wait(&sh.done);
		/* The churners wait at a barrier, unpinned; the prober's calls are short: what
		 * was retired goes now, so that both readings count no pool waiting. */
		while (sop__epoch_reclaim(), sop__epoch_retired())
			sched_yield();
		if (round == 0)
			before = mem_now();
		else
			after = mem_now();
	}
	for (k = 0; k < threads; k++)
		TH_ASSERT(pthread_join(t[k], NULL) == 0);
	atomic_store(&sh.stop, true);
	TH_ASSERT(pthread_join(probe, NULL) == 0);
	pthread_barrier_destroy(&sh.start);
	pthread_barrier_destroy(&sh.done);
	printf("churn: %d pools on %d threads (%ld probes, %ld refused, at most %ld waiting to be "
	       "freed), %s\n",
	       sh.n[1] * threads, threads, atomic_load(&sh.probes), atomic_load(&sh.refusals),
	       atomic_load(&sh.most_retired), mem_report(before, after));
	mem_bounded(before, after, RSS_SLACK_THREADS);
	/* A creation waits while more are retired: each thread adds its own at most. */
	TH_ASSERT(atomic_load(&sh.most_retired) <= SOP_RETIRED_MAX + threads);
	/* Nobody is pinned now: whatever was retired went. */
	TH_EQ(sop__handles_used(), slots);
	sop__epoch_reclaim();
	TH_EQ(sop__epoch_retired(), 0);
}

/* ---- Streams, events and threads ---------------------------------------------------------- */

/* A request on a stream of its own: a few allocations of 1 B .. 1 MiB, written, freed, then the
 * stream destroyed: synchronized first and destroyed with the driver's call, or destroyed busy
 * through sop. */
static void
request(sop_pool_t pool, uint64_t *rng, bool busy)
{
	CUstream s = th_stream();
	void *p[8];
	int k;

	for (k = 0; k < 8; k++) {
		size_t bytes;
		*rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
		bytes = 1 + (size_t)(*rng >> 44) % MiB;
		TH_OK(sop_malloc_from_pool_async(&p[k], bytes, pool, s));
		TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)p[k], (unsigned)k, bytes / 4, s));
	}
	for (k = 0; k < 8; k++)
		TH_OK(sop_free_async(p[k], s));
	if (busy) {
		TH_OK(sop_stream_destroy(s));
	} else {
		TH_OK(sop_stream_synchronize(s));
		th_stream_destroy(s);
	}
}

/* What sop keeps for streams stays bounded: the pool's states, the process's records, and the
 * memory the pool reserves (streams destroyed busy give theirs back once their work is done). */
static void
streams(int n, bool recycle)
{
	sop_pool_t pool = th_pool(0, 0);
	size_t most_states = 0, most_records = 0;
	struct mem before, after;
	cuuint64_t keep = UINT64_MAX;
	uint64_t rng = 7;
	int i;

	if (th.sim_handles_recycle)
		th.sim_handles_recycle(recycle);
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	for (i = 0; i < n / 10; i++)
		request(pool, &rng, i % 2);
	before = mem_now();
	for (i = 0; i < n; i++) {
		request(pool, &rng, i % 2);
		if (TH_POOL(pool)->n_streams > most_states)
			most_states = TH_POOL(pool)->n_streams;
		if (sop__streams_live() > most_records)
			most_records = sop__streams_live();
	}
	after = mem_now();
	printf("churn: %d streams (%s handles), at most %zu states and %zu records, reserved %llu "
	       "MiB, %s\n",
	       n, recycle ? "recycled" : "fresh", most_states, most_records,
	       (unsigned long long)(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) / MiB),
	       mem_report(before, after));
	/* A pass when the states double past SOP_STATES_MIN; records likewise past 256 (some
	 * states and records of the busy streams wait for their work). */
	TH_ASSERT(most_states <= 4 * SOP_STATES_MIN);
	TH_ASSERT(most_records <= 1024);
	/* The live peak is 8 MiB: a growth step and then some, never a request's worth of memory
	 * per stream destroyed. */
	TH_ASSERT(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) <= 128 * MiB);
	mem_bounded(before, after, RSS_SLACK);
	TH_OK(sop_ctx_synchronize());
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	if (th.sim_handles_recycle)
		th.sim_handles_recycle(1);
}

/* The host memory once both streams ran what was queued on them: a driver's queue of work not
 * yet run is not memory sop keeps. On a loaded machine the simulated driver's workers fell
 * behind by thousands of records, each a node of its queue: 5.4 MiB before a round and 10.8
 * after it, once, beside the other tests. */
static struct mem
drained(CUstream a, CUstream b)
{
	TH_OK(sop_stream_synchronize(a));
	TH_OK(sop_stream_synchronize(b));
	return mem_now();
}

/* An event per handoff, recorded through sop, waited on, and destroyed with the driver's call:
 * sop's table of what events claim stays bounded. */
static void
events(int n)
{
	CUstream a = th_stream(), b = th_stream();
	struct mem before = {0, 0}, after;
	int i, round;

	for (round = 0; round < 2; round++) {
		if (round)
			before = drained(a, b);
		for (i = 0; i < n; i++) {
			CUevent ev;
			TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
			TH_OK(sop_event_record(ev, a));
			TH_OK(sop_stream_wait_event(b, ev, 0));
			if (i % 2)
				TH_OK(th.cuEventDestroy(ev));
			else
				TH_OK(sop_event_destroy(ev));
		}
	}
	after = drained(a, b);
	printf("churn: %d events, %zu claims kept, %s\n", 2 * n, sop__events_live(),
	       mem_report(before, after));
	TH_ASSERT(sop__events_live() <= 2048);
	/* sop's own table is counted exactly above. The resident size also holds what the allocator
	 * arenas of the simulated driver's stream workers, which run every record, keep of what
	 * they freed: on a loaded machine, with the other tests running beside it, 4.5 MiB once, as
	 * in the threaded round. */
	mem_bounded(before, after, RSS_SLACK_THREADS);
	TH_OK(sop_stream_synchronize(a));
	TH_OK(sop_stream_synchronize(b));
	th_stream_destroy(a);
	th_stream_destroy(b);
}

struct task {
	CUcontext ctx;
	sop_pool_t pool;
	uint64_t rng;
	int requests;
	bool pools; /* also make and destroy a pool per request */
};

/* A thread per task: a few requests, then the thread exits. */
static void *
task_fn(void *arg)
{
	struct task *t = arg;
	int i;

	TH_OK(th.cuCtxSetCurrent(t->ctx));
	for (i = 0; i < t->requests; i++) {
		if (t->pools) {
			sop_pool_t own = th_pool(0, 0);
			request(own, &t->rng, i % 2);
			TH_OK(sop_ctx_synchronize());
			TH_OK(sop_pool_destroy(own));
		}
		request(t->pool, &t->rng, i % 2);
		if (t->pools) {
			CUstream s = th_stream();
			CUevent ev;
			TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
			TH_OK(sop_event_record(ev, s));
			TH_OK(sop_stream_wait_event(s, ev, 0));
			TH_OK(th.cuEventDestroy(ev));
			TH_OK(sop_stream_destroy(s));
		}
	}
	return NULL;
}

/* Threads that come and go, in waves of `threads`, each a few requests long; with mixed, each
 * also makes a pool and an event per request. */
static void
threads_come_and_go(int n, int threads, bool mixed)
{
	sop_pool_t pool = th_pool(0, 0);
	struct task tasks[16];
	pthread_t t[16];
	struct mem before = {0, 0}, after;
	CUcontext ctx;
	int wave, k, waves = n / threads;

	TH_OK(sop__drv.cuCtxGetCurrent(&ctx));
	for (wave = 0; wave < waves; wave++) {
		if (wave == waves / 10) {
			/* Device memory is host memory on the simulated driver: not counted. */
			TH_OK(sop_ctx_synchronize());
			TH_OK(sop_trim_to(pool, 0));
			before = mem_now();
		}
		for (k = 0; k < threads; k++) {
			tasks[k] = (struct task){ctx, pool, (uint64_t)(wave * 16 + k + 1), mixed ? 2 : 4,
						 mixed};
			TH_ASSERT(pthread_create(&t[k], NULL, task_fn, &tasks[k]) == 0);
		}
		for (k = 0; k < threads; k++)
			TH_ASSERT(pthread_join(t[k], NULL) == 0);
		sop__epoch_reclaim();
	}
	TH_OK(sop_ctx_synchronize());
	TH_OK(sop_trim_to(pool, 0));
	after = mem_now();
	printf("churn: %d threads%s, %zu states, %zu records, reserved %llu MiB (high %llu), %s\n",
	       waves * threads, mixed ? " with pools, streams and events" : "",
	       TH_POOL(pool)->n_streams, sop__streams_live(),
	       (unsigned long long)(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) / MiB),
	       (unsigned long long)(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) / MiB),
	       mem_report(before, after));
	TH_ASSERT(TH_POOL(pool)->n_streams <= 4 * SOP_STATES_MIN);
	TH_ASSERT(sop__streams_live() <= 1024);
	mem_bounded(before, after, RSS_SLACK_THREADS);
	TH_OK(sop_ctx_synchronize());
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

int
main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : POOLS_DEFAULT;
	int threads = argc > 2 ? atoi(argv[2]) : 4;
	CUstream s;

	th_init();
	TH_ASSERT(n >= 10 && threads >= 1 && threads <= 16);
	s = th_stream();
	stale_handles(s);
	one_thread(n, s);
	many_threads(n, threads);
	stale_handles(s);
	streams(n / 4, true);
	if (th.sim_handles_recycle)
		streams(n / 4, false);
	events(n);
	threads_come_and_go(n / 20, threads, false);
	threads_come_and_go(n / 40, threads, true);
	th_stream_destroy(s);
	printf("churn: ok\n");
	return 0;
}
