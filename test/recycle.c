/* recycle.c - handle values the driver gives out again. The driver hands a destroyed stream's
 * handle to the next stream created at once, while the destroyed stream's work still runs, and
 * does the same with events and contexts: sop must never take a new stream, event or context for
 * the old one.
 *
 * Each scenario keeps a stream A busy behind a gate, with work queued after the gate that reads
 * a block (a copy of it into a snapshot), frees the block on A, and then does what a program may
 * do next: destroy A and create a stream that gets A's handle, or destroy an event sop saw
 * recorded on A and create one at its handle, or record that event again without sop. Then
 * another stream synchronizes or waits, allocates the same size and writes it. When the gate
 * opens, the snapshot must hold what A wrote: a block handed over early shows up as the other
 * stream's pattern, and one given back to the driver early (release threshold 0) faults (the
 * simulated driver's SIGSEGV, the GPU's illegal address). Each scenario runs with the release
 * threshold at 0 and at UINT64_MAX.
 *
 * Runs on the simulated driver (which recycles handles as the driver does unless
 * SOP_SIM_HANDLES=fresh) and on a GPU. Where the driver did not give the old handle back, the
 * scenario still runs and must still pass. */
#include <string.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)
#define N (16 * MiB)
#define PAT_A 0xA5A5A5A5u
#define PAT_B 0x5B5B5B5Bu

static sop_pool_t snaps; /* where snapshots live: never the pool under test */
static int reused, tries;
static bool sim;

/* A gate that, on a GPU, also opens by itself (helpers.h says why). */
static void
gate_init(struct th_gate *g)
{
	th_gate_init_timed(g, sim ? 0 : 300);
}

/* A busy stream: a filled block a on it, a gate, then a copy of a into a snapshot, then a's
 * free. */
struct busy {
	CUstream s;
	struct th_gate gate;
	void *a, *snap;
};

static void
busy_start(struct busy *w, sop_pool_t pool)
{
	w->s = th_stream();
	TH_OK(sop_malloc_from_pool_async(&w->a, N, pool, w->s));
	th_fill(w->a, N, PAT_A, w->s);
	TH_OK(sop_malloc_from_pool_async(&w->snap, N, snaps, w->s));
	gate_init(&w->gate);
	th_gate_block(&w->gate, w->s);
	TH_OK(th.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)w->snap, (CUdeviceptr)(uintptr_t)w->a,
				   N, w->s));
	TH_OK(sop_free_async(w->a, w->s));
}

/* Open the gate, let everything finish, and check that the copy read A's pattern. */
static void
busy_finish(struct busy *w, CUstream check_on)
{
	th_gate_open(&w->gate);
	TH_OK(sop_ctx_synchronize());
	TH_ASSERT(th_verify(w->snap, N, PAT_A, check_on));
	TH_OK(sop_free_async(w->snap, check_on));
}

/* Another stream takes the same size from the pool and writes it. */
static void
write_other(sop_pool_t pool, CUstream s)
{
	void *b;

	TH_OK(sop_malloc_from_pool_async(&b, N, pool, s));
	th_fill(b, N, PAT_B, s);
	TH_OK(sop_free_async(b, s));
}

static sop_pool_t
pool_with(cuuint64_t threshold)
{
	sop_pool_t pool = th_pool(0, 0);

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
	return pool;
}

static void
pool_done(sop_pool_t pool)
{
	TH_OK(sop_ctx_synchronize());
	TH_CHECK(pool);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	/* Everything was synchronized: all of it can go back. */
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	TH_OK(sop_pool_destroy(pool));
}

/* The program: A destroyed busy, B created at A's handle, B synchronized (which must not
 * count as A's synchronization), then B allocates and writes. */
static void
stream_reused(cuuint64_t threshold)
{
	sop_pool_t pool = pool_with(threshold);
	struct busy w;
	CUstream old, b;

	busy_start(&w, pool);
	old = w.s;
	th_stream_destroy(w.s);
	b = th_stream();
	reused += b == old;
	tries++;
	TH_OK(sop_stream_synchronize(b));
	write_other(pool, b);
	TH_OK(sop_stream_synchronize(b));
	TH_OK(sop_trim_to(pool, 0)); /* nothing pending may go */
	busy_finish(&w, b);
	th_stream_destroy(b);
	pool_done(pool);
}

/* A block allocated on A, A destroyed idle, and the block freed on the stream that took A's
 * handle: it becomes reusable at the context's synchronization. */
static void
stream_free_on_successor(cuuint64_t threshold)
{
	sop_pool_t pool = pool_with(threshold);
	CUstream a = th_stream(), b;
	void *p;

	TH_OK(sop_malloc_from_pool_async(&p, N, pool, a));
	th_fill(p, N, PAT_A, a);
	TH_OK(sop_stream_synchronize(a));
	th_stream_destroy(a);
	b = th_stream();
	reused += b == a;
	tries++;
	TH_OK(sop_free_async(p, b));
	TH_OK(sop_stream_synchronize(b));
	write_other(pool, b);
	th_stream_destroy(b);
	pool_done(pool);
}

/* sop saw an event recorded on busy A; the program destroyed it and made a new event, which the
 * driver gave the same handle, and recorded it on an idle stream without sop. A stream that waits
 * on it is not ordered after A. */
static void
event_reused_wait(cuuint64_t threshold)
{
	sop_pool_t pool = pool_with(threshold);
	CUstream idle = th_stream(), b = th_stream();
	CUevent ev, ev2;
	struct busy w;

	busy_start(&w, pool);
	TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	TH_OK(sop_event_record(ev, w.s));
	TH_OK(th.cuEventDestroy(ev));
	TH_OK(th.cuEventCreate(&ev2, CU_EVENT_DISABLE_TIMING));
	reused += ev2 == ev;
	tries++;
	TH_OK(th.cuEventRecord(ev2, idle));
	TH_OK(sop_stream_wait_event(b, ev2, 0));
	write_other(pool, b);
	/* Not b's synchronization: if b took the block, it waits for A. */
	TH_OK(sop_stream_synchronize(idle));
	TH_OK(sop_trim_to(pool, 0));
	busy_finish(&w, idle);
	TH_OK(sop_event_destroy(ev2));
	th_stream_destroy(w.s);
	th_stream_destroy(idle);
	th_stream_destroy(b);
	pool_done(pool);
}

/* The same event, destroyed and made again at its handle, then synchronized: it was never
 * recorded, so the synchronization returns at once and proves nothing about A. */
static void
event_reused_sync(cuuint64_t threshold)
{
	sop_pool_t pool = pool_with(threshold);
	CUstream b = th_stream();
	CUevent ev, ev2;
	struct busy w;

	busy_start(&w, pool);
	TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	TH_OK(sop_event_record(ev, w.s));
	TH_OK(th.cuEventDestroy(ev));
	TH_OK(th.cuEventCreate(&ev2, CU_EVENT_DISABLE_TIMING));
	reused += ev2 == ev;
	tries++;
	TH_OK(sop_event_synchronize(ev2));
	write_other(pool, b);
	TH_OK(sop_stream_synchronize(b));
	TH_OK(sop_trim_to(pool, 0));
	busy_finish(&w, b);
	TH_OK(sop_event_destroy(ev2));
	th_stream_destroy(w.s);
	th_stream_destroy(b);
	pool_done(pool);
}

/* The event recorded again on an idle stream with the driver's call, behind sop's back, then
 * synchronized and waited on through sop. */
static void
event_rerecorded(cuuint64_t threshold)
{
	sop_pool_t pool = pool_with(threshold);
	CUstream idle = th_stream(), b = th_stream();
	struct busy w;
	CUevent ev;

	busy_start(&w, pool);
	TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	TH_OK(sop_event_record(ev, w.s));
	TH_OK(th.cuEventRecord(ev, idle));
	TH_OK(sop_event_synchronize(ev));
	TH_OK(sop_stream_wait_event(b, ev, 0));
	write_other(pool, b);
	TH_OK(sop_stream_synchronize(idle));
	TH_OK(sop_trim_to(pool, 0));
	busy_finish(&w, idle);
	TH_OK(sop_event_destroy(ev));
	th_stream_destroy(w.s);
	th_stream_destroy(idle);
	th_stream_destroy(b);
	pool_done(pool);
}

/* The special handles name a different stream in each context: the legacy stream of device 1's
 * context is not that of device 0's, though both are NULL. */
static void
special_per_context(cuuint64_t threshold)
{
	sop_pool_t pool = pool_with(threshold);
	CUcontext ctx0, ctx1, popped;
	struct th_gate gate;
	void *a, *snap;

	if (th_n_devices < 2)
		return;
	TH_OK(sop__drv.cuDevicePrimaryCtxRetain(&ctx0, 0));
	TH_OK(sop__drv.cuDevicePrimaryCtxRetain(&ctx1, 1));
	/* Device 1's streams use device 0's pools here: they need access, as on GPUs. */
	{
		CUmemAccessDesc to1 = {{CU_MEM_LOCATION_TYPE_DEVICE, 1},
				       CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
		TH_OK(sop_pool_set_access(pool, &to1, 1));
		TH_OK(sop_pool_set_access(snaps, &to1, 1));
	}
	/* Device 0's legacy stream: a busy block. */
	TH_OK(sop_malloc_from_pool_async(&a, N, pool, NULL));
	th_fill(a, N, PAT_A, NULL);
	TH_OK(sop_malloc_from_pool_async(&snap, N, snaps, NULL));
	gate_init(&gate);
	th_gate_block(&gate, NULL);
	TH_OK(th.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)snap, (CUdeviceptr)(uintptr_t)a, N,
				   NULL));
	TH_OK(sop_free_async(a, NULL));
	/* Device 1's legacy stream, the same handle: another stream. */
	TH_OK(th.cuCtxPushCurrent(ctx1));
	write_other(pool, NULL);
	TH_OK(sop_stream_synchronize(NULL));
	TH_OK(sop_trim_to(pool, 0));
	TH_OK(th.cuCtxPopCurrent(&popped));
	th_gate_open(&gate);
	TH_OK(sop_stream_synchronize(NULL));
	TH_ASSERT(th_verify(snap, N, PAT_A, NULL));
	TH_OK(sop_free_async(snap, NULL));
	TH_OK(th.cuCtxPushCurrent(ctx1));
	TH_OK(sop_ctx_synchronize());
	TH_OK(th.cuCtxPopCurrent(&popped));
	pool_done(pool);
	TH_OK(sop__drv.cuDevicePrimaryCtxRelease(1));
	TH_OK(sop__drv.cuDevicePrimaryCtxRelease(0));
}

/* Contexts the program creates: each has its own legacy stream behind the one NULL handle, and
 * a destroyed context's handle goes to the next context created. A busy block on the legacy stream
 * of one context is not another context's to take; a context made at a destroyed one's handle
 * starts with nothing of it; and a context's synchronization covers its own streams only. */
static void
created_contexts(cuuint64_t threshold)
{
	sop_pool_t pool = pool_with(threshold);
	CUcontext c1, c2, c3, popped;
	struct th_gate gate;
	void *a, *snap;

	if (!th.cuCtxCreate)
		return;
	TH_OK(th.cuCtxCreate(&c1, NULL, 0, 0)); /* current now */
	TH_OK(sop_malloc_from_pool_async(&a, N, pool, NULL));
	th_fill(a, N, PAT_A, NULL);
	TH_OK(sop_malloc_from_pool_async(&snap, N, snaps, NULL));
	gate_init(&gate);
	th_gate_block(&gate, NULL);
	TH_OK(th.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)snap, (CUdeviceptr)(uintptr_t)a, N,
				   NULL));
	TH_OK(sop_free_async(a, NULL));
	/* Another context, current over the first: its legacy stream is another stream. */
	TH_OK(th.cuCtxCreate(&c2, NULL, 0, 0));
	write_other(pool, NULL);
	TH_OK(sop_stream_synchronize(NULL));
	TH_OK(sop_ctx_synchronize());
	TH_OK(sop_trim_to(pool, 0));
	TH_OK(th.cuCtxDestroy(c2));
	/* A third context, at the second one's handle where the driver reuses it. */
	TH_OK(th.cuCtxCreate(&c3, NULL, 0, 0));
	reused += c3 == c2;
	tries++;
	write_other(pool, NULL);
	TH_OK(sop_ctx_synchronize());
	TH_OK(sop_trim_to(pool, 0));
	TH_OK(th.cuCtxPopCurrent(&popped));
	TH_ASSERT(popped == c3);
	/* Back in the first context. */
	th_gate_open(&gate);
	TH_OK(sop_ctx_synchronize());
	TH_ASSERT(th_verify(snap, N, PAT_A, NULL));
	TH_OK(sop_free_async(snap, NULL));
	TH_OK(sop_ctx_synchronize());
	TH_OK(th.cuCtxDestroy(c3));
	TH_OK(th.cuCtxDestroy(c1));
	pool_done(pool);
}

/* A block allocated on a stream of a context the program created, that context destroyed (its
 * streams with it), and the block freed on a new stream that the driver gave the dead stream's
 * handle. Once that free is complete, the memory is the pool's to give back: the free belongs to
 * the new stream, and nothing can ever synchronize the dead one (its context is gone, and sop
 * records no probes there). Found by test-fuzz: the free was taken for one on the dead stream,
 * and the memory, and the pool holding it, stayed forever. */
static void
stream_of_destroyed_context(cuuint64_t threshold)
{
	sop_pool_t pool = pool_with(threshold);
	CUstream s, s2;
	CUcontext c, popped;
	void *a;

	if (!th.cuCtxCreate)
		return;
	TH_OK(th.cuCtxCreate(&c, NULL, 0, 0)); /* current now */
	s = th_stream();
	TH_OK(th.cuCtxPopCurrent(&popped));
	TH_OK(sop_malloc_from_pool_async(&a, N, pool, s));
	th_fill(a, N, PAT_A, s);
	TH_OK(sop_stream_synchronize(s));
	TH_OK(th.cuCtxDestroy(c));
	s2 = th_stream();
	reused += s2 == s;
	tries++;
	TH_OK(sop_free_async(a, s2));
	TH_OK(sop_stream_synchronize(s2));
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	th_stream_destroy(s2);
	pool_done(pool);
}

int
main(void)
{
	static const cuuint64_t thresholds[] = {0, UINT64_MAX};
	size_t i;

	sim = th_init();
	snaps = pool_with(UINT64_MAX);
	for (i = 0; i < 2; i++) {
		printf("recycle: release threshold %s\n", thresholds[i] ? "max" : "0");
		printf("recycle: stream reused\n");
		stream_reused(thresholds[i]);
		printf("recycle: stream free on successor\n");
		stream_free_on_successor(thresholds[i]);
		printf("recycle: event reused wait\n");
		event_reused_wait(thresholds[i]);
		printf("recycle: event reused sync\n");
		event_reused_sync(thresholds[i]);
		printf("recycle: event rerecorded\n");
		event_rerecorded(thresholds[i]);
		printf("recycle: special per context\n");
		special_per_context(thresholds[i]);
		printf("recycle: created contexts\n");
		created_contexts(thresholds[i]);
		printf("recycle: stream of a destroyed context\n");
		stream_of_destroyed_context(thresholds[i]);
	}
	TH_OK(sop_ctx_synchronize());
	TH_CHECK(snaps);
	TH_OK(sop_pool_destroy(snaps));
	printf("recycle: ok (the driver gave the old handle back %d of %d times)\n", reused, tries);
	return 0;
}
