/* policies.c - cross-stream reuse: the three reuse policies, each on and off, every
 * synchronization point, and the release threshold, with the driver's answers to its basic
 * scenarios (shared/ANCHORS.md). A stream is kept busy by a host function that waits for the
 * test (a gate); each scenario checks which block an allocation on another stream gets, and
 * never one that work still running may touch. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)

static CUstream s1, s2, s3;

static void
policies(sop_pool_t pool, int follow, int opportunistic, int internal)
{
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &follow));
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &opportunistic));
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
				&internal));
}

/* A fresh pool that keeps its memory, so that reuse is visible as the same address. */
static sop_pool_t
fresh(size_t max_size, int follow, int opportunistic, int internal)
{
	sop_pool_t pool = th_pool(0, max_size);
	cuuint64_t keep = UINT64_MAX;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	policies(pool, follow, opportunistic, internal);
	return pool;
}

static void
done(sop_pool_t pool)
{
	TH_OK(sop_ctx_synchronize());
	TH_CHECK(pool);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	TH_OK(sop_pool_destroy(pool));
}

/* Wait until a stream has run dry, without telling sop (a raw query is no synchronization). */
static void
drain_quietly(CUstream s)
{
	while (th.cuStreamQuery(s) == CUDA_ERROR_NOT_READY)
		;
}

/* A: busy s1 frees, s2 allocates the same size: a different block, all policies on. */
static void
scenario_a(void)
{
	sop_pool_t pool = fresh(0, 1, 1, 1);
	struct th_gate g;
	void *a, *b;

	th_gate_init(&g);
	th_gate_block(&g, s1);
	TH_OK(sop_malloc_from_pool_async(&a, 4 * MiB, pool, s1));
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_malloc_from_pool_async(&b, 4 * MiB, pool, s2));
	TH_ASSERT(b != a);
	th_gate_open(&g);
	TH_OK(sop_free_async(b, s2));
	done(pool);
}

/* B: s1's work has finished but nobody synchronized: opportunistic reuse takes the block; with
 * opportunistic off it does not, until s1 is synchronized. */
static void
scenario_b(int opportunistic)
{
	sop_pool_t pool = fresh(0, 1, opportunistic, 1);
	void *a, *b, *c;

	TH_OK(sop_malloc_from_pool_async(&a, 4 * MiB, pool, s1));
	TH_OK(sop_free_async(a, s1));
	drain_quietly(s1);
	TH_OK(sop_malloc_from_pool_async(&b, 4 * MiB, pool, s2));
	TH_EQ(b == a, opportunistic);
	if (!opportunistic) {
		TH_OK(sop_stream_synchronize(s1));
		TH_OK(sop_malloc_from_pool_async(&c, 4 * MiB, pool, s2));
		TH_ASSERT(c == a);
		TH_OK(sop_free_async(c, s2));
	}
	TH_OK(sop_free_async(b, s2));
	done(pool);
}

/* C: all policies off: a synchronization point still makes the free reusable by anyone. */
static void
scenario_c(int how)
{
	sop_pool_t pool = fresh(0, 0, 0, 0);
	struct th_gate g;
	CUevent ev;
	void *a, *b;

	th_gate_init(&g);
	th_gate_block(&g, s1);
	TH_OK(sop_malloc_from_pool_async(&a, 4 * MiB, pool, s1));
	TH_OK(sop_free_async(a, s1));
	TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	TH_OK(sop_event_record(ev, s1));
	TH_OK(sop_malloc_from_pool_async(&b, 4 * MiB, pool, s2));
	TH_ASSERT(b != a);
	TH_OK(sop_free_async(b, s2));
	th_gate_open(&g);
	if (how == 0)
		TH_OK(sop_stream_synchronize(s1));
	else if (how == 1)
		TH_OK(sop_event_synchronize(ev));
	else
		TH_OK(sop_ctx_synchronize());
	TH_OK(sop_malloc_from_pool_async(&b, 4 * MiB, pool, s3));
	TH_ASSERT(b == a);
	TH_OK(sop_free_async(b, s3));
	TH_OK(sop_event_destroy(ev));
	done(pool);
}

/* D: busy s1 frees, records an event after the free; s2 waits on it: with follow-event
 * dependencies s2 reuses the block at once, while s1 is still blocked; without, it does not.
 * Dependencies compose: s3 waiting on an event s2 recorded after its wait reuses too. */
static void
scenario_d(int follow)
{
	sop_pool_t pool = fresh(0, follow, 1, 1);
	struct th_gate g;
	CUevent e1, e2;
	void *a, *b, *c;

	TH_OK(th.cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING));
	TH_OK(th.cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING));
	th_gate_init(&g);
	th_gate_block(&g, s1);
	TH_OK(sop_malloc_from_pool_async(&a, 4 * MiB, pool, s1));
	TH_OK(sop_malloc_from_pool_async(&c, 4 * MiB, pool, s1));
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_free_async(c, s1));
	TH_OK(sop_event_record(e1, s1));
	TH_OK(sop_stream_wait_event(s2, e1, 0));
	TH_OK(sop_malloc_from_pool_async(&b, 4 * MiB, pool, s2));
	TH_EQ(b == a || b == c, follow);
	/* Through s2 to s3. */
	TH_OK(sop_event_record(e2, s2));
	TH_OK(sop_stream_wait_event(s3, e2, 0));
	{
		void *d;
		TH_OK(sop_malloc_from_pool_async(&d, 4 * MiB, pool, s3));
		TH_EQ(d == a || d == c, follow);
		TH_ASSERT(d != b);
		/* s3 writes its block: it runs only after s1's gate opens (the waits order it). */
		th_fill(d, 4 * MiB, 0x33333333, s3);
		TH_OK(sop_free_async(d, s3));
	}
	/* An event recorded before the free carries nothing for it. */
	{
		void *x, *y;
		CUstream s4 = th_stream();
		TH_OK(sop_malloc_from_pool_async(&x, 6 * MiB, pool, s1));
		TH_OK(sop_event_record(e1, s1));
		TH_OK(sop_free_async(x, s1));
		TH_OK(sop_stream_wait_event(s4, e1, 0));
		TH_OK(sop_malloc_from_pool_async(&y, 6 * MiB, pool, s4));
		TH_ASSERT(y != x);
		TH_OK(sop_free_async(y, s4));
		th_gate_open(&g);
		TH_OK(sop_stream_synchronize(s4));
		th_stream_destroy(s4);
	}
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop_event_destroy(e1));
	TH_OK(sop_event_destroy(e2));
	done(pool);
}

/* E: the same stream reuses at once, all policies off, stream busy. */
static void
scenario_e(void)
{
	sop_pool_t pool = fresh(0, 0, 0, 0);
	struct th_gate g;
	void *a, *b;

	th_gate_init(&g);
	th_gate_block(&g, s1);
	TH_OK(sop_malloc_from_pool_async(&a, 4 * MiB, pool, s1));
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_malloc_from_pool_async(&b, 4 * MiB, pool, s1));
	TH_ASSERT(b == a);
	th_gate_open(&g);
	TH_OK(sop_free_async(b, s1));
	done(pool);
}

/* F: a pool capped at 64 MiB; busy s1 frees 64 MiB; s2 asks for 64 MiB. With internal
 * dependencies: the same block, at once (the host does not block), and s2's later work waits
 * for s1. Without: out of memory at once. */
static atomic_int s2_ran;

static void CUDA_CB
mark_s2(void *arg)
{
	(void)arg;
	atomic_store(&s2_ran, 1);
}

static void
scenario_f(int internal)
{
	sop_pool_t pool = fresh(64 * MiB, 1, 1, internal);
	struct th_gate g;
	void *a, *b = (void *)0x1;

	th_gate_init(&g);
	th_gate_block(&g, s1);
	TH_OK(sop_malloc_from_pool_async(&a, 64 * MiB, pool, s1));
	TH_OK(sop_free_async(a, s1));
	if (!internal) {
		TH_EQ(sop_malloc_from_pool_async(&b, 64 * MiB, pool, s2), CUDA_ERROR_OUT_OF_MEMORY);
		TH_ASSERT(b == (void *)0x1);
		th_gate_open(&g);
		done(pool);
		return;
	}
	TH_OK(sop_malloc_from_pool_async(&b, 64 * MiB, pool, s2));
	TH_ASSERT(b == a);
	atomic_store(&s2_ran, 0);
	TH_OK(th.cuLaunchHostFunc(s2, mark_s2, NULL));
	/* s1 is still blocked, so s2 must be too. */
	th_gate_wait_reached(&g);
	for (int i = 0; i < 1000; i++)
		sched_yield();
	TH_EQ(atomic_load(&s2_ran), 0);
	th_gate_open(&g);
	TH_OK(sop_stream_synchronize(s2));
	TH_EQ(atomic_load(&s2_ran), 1);
	TH_OK(sop_free_async(b, s2));
	done(pool);
}

/* G: the release threshold applies only at a synchronization point that covers the frees:
 * not while idle, not at a query, not at an unrelated stream's synchronization. */
static void
scenario_g(int how)
{
	sop_pool_t pool = fresh(0, 1, 1, 1);
	cuuint64_t thr = 16 * MiB;
	struct th_gate g;
	CUevent ev;
	void *p[8];
	int i;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
	TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	th_gate_init(&g);
	th_gate_block(&g, s1);
	for (i = 0; i < 8; i++)
		TH_OK(sop_malloc_from_pool_async(&p[i], 32 * MiB, pool, s1));
	for (i = 0; i < 8; i++)
		TH_OK(sop_free_async(p[i], s1));
	TH_OK(sop_event_record(ev, s1));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 256 * MiB);
	th_gate_open(&g);
	drain_quietly(s1);
	TH_OK(sop_stream_synchronize(s2));
	TH_EQ(th.cuEventQuery(ev), CUDA_SUCCESS);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 256 * MiB);
	if (how == 0)
		TH_OK(sop_stream_synchronize(s1));
	else if (how == 1)
		TH_OK(sop_event_synchronize(ev));
	else
		TH_OK(sop_ctx_synchronize());
	TH_ASSERT(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) <= 16 * MiB);
	TH_OK(sop_event_destroy(ev));
	done(pool);
}

/* K: a stream destroyed right after its last free (its work still pending). sop never touches
 * it again; the memory is not reused before its work has finished, by another stream or by a
 * new stream that takes over the destroyed one's handle value, and is reusable after the next
 * synchronization point that covers it. */
struct newcomers {
	sop_pool_t pool;
	CUstream gone;
	void *a;
	struct th_gate *g;
	CUcontext ctx;
	atomic_int created, same, done;
};

/* New streams while the destroyed one's work is pending; one that has its handle allocates. On
 * two H100s the driver's creation of the 32nd new stream waited for that work (on one H100 it
 * did not), so this runs beside the test, which opens the gate if it waits too long. */
static void *
newcomers(void *arg)
{
	struct newcomers *n = arg;
	CUstream s[32];
	int i;

	TH_OK(th.cuCtxSetCurrent(n->ctx));
	for (i = 0; i < 32; i++) {
		s[i] = th_stream();
		atomic_fetch_add(&n->created, 1);
		if (s[i] == n->gone) {
			void *x;

			atomic_fetch_add(&n->same, 1);
			TH_OK(sop_malloc_from_pool_async(&x, 8 * MiB, n->pool, s[i]));
			/* The block may be the old one only once the old work may have finished. */
			TH_ASSERT(x != n->a || th_gate_is_open(n->g));
			TH_OK(sop_free_async(x, s[i]));
		}
	}
	for (i = 0; i < 32; i++) {
		TH_OK(sop_stream_synchronize(s[i]));
		th_stream_destroy(s[i]);
	}
	atomic_store(&n->done, 1);
	return NULL;
}

static void
scenario_k(void)
{
	sop_pool_t pool = fresh(0, 1, 1, 1);
	CUstream s = th_stream();
	struct th_gate g;
	struct newcomers n = {.pool = pool, .g = &g};
	pthread_t t;
	double until;
	void *a, *b;

	th_gate_init(&g);
	th_gate_block(&g, s);
	TH_OK(sop_malloc_from_pool_async(&a, 8 * MiB, pool, s));
	th_fill(a, 8 * MiB, 0x77777777, s);
	TH_OK(sop_free_async(a, s));
	th_stream_destroy(s);
	TH_OK(sop_malloc_from_pool_async(&b, 8 * MiB, pool, s2));
	TH_ASSERT(b != a);
	TH_OK(sop_free_async(b, s2));
	TH_OK(sop__drv.cuCtxGetCurrent(&n.ctx));
	n.gone = s;
	n.a = a;
	TH_EQ(pthread_create(&t, NULL, newcomers, &n), 0);
	until = th_seconds() + 3;
	while (!atomic_load(&n.done) && th_seconds() < until)
		usleep(1000);
	if (atomic_load(&n.done))
		printf("policies: a destroyed stream's handle came back %d times in 32 new streams "
		       "while its work was pending\n", atomic_load(&n.same));
	else
		printf("policies: creating a stream waited for a destroyed stream's pending work "
		       "(%d of 32 created in 3 s; the handle came back %d times)\n", atomic_load(&n.created),
		       atomic_load(&n.same));
	th_gate_open(&g);
	TH_EQ(pthread_join(t, NULL), 0);
	TH_OK(sop_ctx_synchronize());
	TH_OK(sop_malloc_from_pool_async(&b, 8 * MiB, pool, s2));
	TH_ASSERT(b == a);
	TH_OK(sop_free_async(b, s2));
	done(pool);
}

/* L: the legacy and per-thread default streams take part like any other. */
static void
scenario_l(void)
{
	sop_pool_t pool = fresh(0, 1, 1, 1);
	CUevent ev;
	void *a, *b;

	TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	TH_OK(sop_malloc_from_pool_async(&a, MiB, pool, CU_STREAM_LEGACY));
	TH_OK(sop_free_async(a, CU_STREAM_LEGACY));
	TH_OK(sop_event_record(ev, NULL));
	TH_OK(sop_stream_wait_event(CU_STREAM_PER_THREAD, ev, 0));
	TH_OK(sop_malloc_from_pool_async(&b, MiB, pool, CU_STREAM_PER_THREAD));
	TH_ASSERT(b == a);
	TH_OK(sop_free_async(b, CU_STREAM_PER_THREAD));
	TH_OK(sop_stream_synchronize(CU_STREAM_PER_THREAD));
	TH_OK(sop_event_destroy(ev));
	done(pool);
}

/* M: a stream that had to grow the pool while another held enough memory not known complete
 * gets it next time: that stream's frees of large blocks are covered by probes at once for a
 * while, so that once its work has finished (nobody synchronizes) the first stream takes them
 * instead of growing again. */
static void
scenario_m(void)
{
	sop_pool_t pool = fresh(0, 1, 1, 1);
	struct th_gate g;
	void *a, *b, *c, *d, *e;

	th_gate_init(&g);
	th_gate_block(&g, s1);
	/* Two 32 MiB steps, both taken whole: s1's a and c, then s2's b and e. */
	TH_OK(sop_malloc_from_pool_async(&a, 8 * MiB, pool, s1));
	TH_OK(sop_malloc_from_pool_async(&c, 24 * MiB, pool, s1));
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_malloc_from_pool_async(&b, 8 * MiB, pool, s2)); /* a is pending: grows */
	TH_ASSERT(b != a);
	TH_OK(sop_malloc_from_pool_async(&e, 24 * MiB, pool, s2));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 64 * MiB);
	TH_OK(sop_free_async(c, s1));
	th_gate_open(&g);
	drain_quietly(s1);
	TH_OK(sop_malloc_from_pool_async(&d, 24 * MiB, pool, s2));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 64 * MiB);
	TH_ASSERT((char *)d >= (char *)a && (char *)d < (char *)a + 32 * MiB);
	TH_OK(sop_free_async(d, s2));
	TH_OK(sop_free_async(e, s2));
	TH_OK(sop_free_async(b, s2));
	done(pool);
}

int
main(void)
{
	th_init();
	s1 = th_stream();
	s2 = th_stream();
	s3 = th_stream();
	/* Let sop see all three streams before the scenarios. */
	TH_OK(sop_stream_synchronize(s1));
	TH_OK(sop_stream_synchronize(s2));
	TH_OK(sop_stream_synchronize(s3));

	th_phase("scenario A");
	scenario_a();
	th_phase("scenario B, opportunistic on");
	scenario_b(1);
	th_phase("scenario B, opportunistic off");
	scenario_b(0);
	for (int how = 0; how < 3; how++) {
		th_phase("scenario C, synchronization point %d", how);
		scenario_c(how);
	}
	th_phase("scenario D, follow on");
	scenario_d(1);
	th_phase("scenario D, follow off");
	scenario_d(0);
	th_phase("scenario E");
	scenario_e();
	th_phase("scenario F, internal on");
	scenario_f(1);
	th_phase("scenario F, internal off");
	scenario_f(0);
	for (int how = 0; how < 3; how++) {
		th_phase("scenario G, synchronization point %d", how);
		scenario_g(how);
	}
	th_phase("scenario K");
	scenario_k();
	th_phase("scenario L");
	scenario_l();
	th_phase("scenario M");
	scenario_m();
	th_stream_destroy(s1);
	th_stream_destroy(s2);
	th_stream_destroy(s3);
	printf("policies: ok\n");
	return 0;
}
