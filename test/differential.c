/* differential.c - sop against the driver's own stream-ordered allocator, answer by answer.
 *
 * Each scenario runs twice in one process, on the same streams: first on a pool made with
 * cuMemPoolCreate and driven with the driver's calls, then on a sop pool driven with sop's. Every
 * step records the call's CUresult, a value where the step has one (did the allocation get the
 * block freed before it, a flag, an attribute read back), and the pool's USED_MEM_CURRENT and
 * RESERVED_MEM_CURRENT; the two runs are then printed side by side, one line a step, and any
 * difference fails the test. The scenarios are those of policies.c plus the bad-input,
 * accounting and trim cases whose driver answers shared/ANCHORS.md records.
 *
 * A busy stream is a gate (helpers.h). Each gate here also has a watchdog thread that opens it
 * after GATE_TIMEOUT_S, so that a call that blocks where it should not (on either side) is
 * reported instead of hanging the process, and an exit handler opens every gate, since a stream
 * still blocked at exit hangs it. Needs a driver that exports the cuMemPool* entry points: the
 * simulated one does not (exit 77).
 */
#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <time.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)
#define KEEP UINT64_MAX /* release threshold: never release at a synchronization */

#define MAX_STEPS 64       /* steps in one run of one scenario */
#define STEP_LABEL 64      /* bytes of a step's label */
#define MAX_GATES 64       /* gates in the whole program; each is used once */
#define GATE_TIMEOUT_S 30  /* a gate still closed after this long is opened by its watchdog */
#define DRAIN_TIMEOUT_S 30 /* a raw query loop gives up after this long */

/* ---- The driver's pool entry points (not in sop's table) -------------------------------- */

static struct {
	__typeof__(cuMemPoolCreate) *cuMemPoolCreate;
	__typeof__(cuMemPoolDestroy) *cuMemPoolDestroy;
	__typeof__(cuMemPoolSetAttribute) *cuMemPoolSetAttribute;
	__typeof__(cuMemPoolGetAttribute) *cuMemPoolGetAttribute;
	__typeof__(cuMemPoolTrimTo) *cuMemPoolTrimTo;
	__typeof__(cuMemAllocFromPoolAsync) *cuMemAllocFromPoolAsync;
	__typeof__(cuMemFreeAsync) *cuMemFreeAsync;
} dpool;

#define DF_STR2(x) #x
#define DF_STR(x) DF_STR2(x)

/* The names go through cuda.h's macros, as in helpers.c, so the symbol is the one cuda.h means. */
#define DF_LOAD(dl, name)                                                                          \
	do {                                                                                       \
		void *s_ = dlsym(dl, DF_STR(name));                                                \
		memcpy(&dpool.name, &s_, sizeof s_);                                               \
	} while (0)

/* Resolve the pool API in the library sop loaded; skip where it is missing (the simulated driver)
 * or where device 0 has no memory pools. */
static void
load_driver_pools(void)
{
	void *dl = sop__driver_handle();
	int supported = 0;

	TH_ASSERT(dl);
	DF_LOAD(dl, cuMemPoolCreate);
	DF_LOAD(dl, cuMemPoolDestroy);
	DF_LOAD(dl, cuMemPoolSetAttribute);
	DF_LOAD(dl, cuMemPoolGetAttribute);
	DF_LOAD(dl, cuMemPoolTrimTo);
	DF_LOAD(dl, cuMemAllocFromPoolAsync);
	DF_LOAD(dl, cuMemFreeAsync);
	if (!dpool.cuMemPoolCreate || !dpool.cuMemPoolDestroy || !dpool.cuMemPoolSetAttribute ||
	    !dpool.cuMemPoolGetAttribute || !dpool.cuMemPoolTrimTo ||
	    !dpool.cuMemAllocFromPoolAsync || !dpool.cuMemFreeAsync || !th.cuStreamQuery ||
	    !th.cuLaunchHostFunc || !th.cuEventCreate || !th.cuEventDestroy || !th.cuEventRecord ||
	    !th.cuStreamWaitEvent) {
		printf("skip: the driver does not export the stream-ordered allocator\n");
		exit(TH_SKIP);
	}
	TH_OK(sop__drv.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
					    0));
	if (!supported) {
		printf("skip: device 0 does not support memory pools\n");
		exit(TH_SKIP);
	}
}

/* ---- Gates with a watchdog ---------------------------------------------------------------- */

struct dgate {
	struct th_gate g;
	pthread_t watchdog;
	bool forced; /* opened by the watchdog; under g.lock */
	const char *side;
};

/* Gates live for the whole process and are never initialised twice: a host function may still
 * be returning from one after it was opened. */
static struct dgate gates[MAX_GATES];
static int n_gates;
static int n_broken; /* failures that are not a step: a forced gate, a failed cleanup call */

static void *
watchdog_main(void *arg)
{
	struct dgate *d = arg;
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until); /* the condition variable's clock */
	until.tv_sec += GATE_TIMEOUT_S;
	pthread_mutex_lock(&d->g.lock);
	while (!d->g.open) {
		if (pthread_cond_timedwait(&d->g.cond, &d->g.lock, &until) == ETIMEDOUT &&
		    !d->g.open) {
			d->g.open = true;
			d->forced = true;
			pthread_cond_broadcast(&d->g.cond);
		}
	}
	pthread_mutex_unlock(&d->g.lock);
	return NULL;
}

/* At exit, whatever path led there (a TH_OK that failed included), no stream stays blocked. */
static void
gates_open_all(void)
{
	for (int i = 0; i < n_gates; i++)
		th_gate_open(&gates[i].g);
}

static struct dgate *
gate_block(const char *side, CUstream s)
{
	struct dgate *d;

	TH_ASSERT(n_gates < MAX_GATES);
	d = &gates[n_gates];
	th_gate_init(&d->g);
	d->forced = false;
	d->side = side;
	TH_EQ(pthread_create(&d->watchdog, NULL, watchdog_main, d), 0);
	n_gates++; /* counted once the watchdog runs: gates_open_all may touch it from now on */
	th_gate_block(&d->g, s);
	return d;
}

static bool
gate_is_open(struct dgate *d)
{
	bool open;

	pthread_mutex_lock(&d->g.lock);
	open = d->g.open;
	pthread_mutex_unlock(&d->g.lock);
	return open;
}

static void
gate_open(struct dgate *d)
{
	th_gate_open(&d->g);
	TH_EQ(pthread_join(d->watchdog, NULL), 0);
	if (d->forced) {
		printf("%s: a call blocked while a stream was held; the watchdog opened its gate "
		       "after %d s\n",
		       d->side, GATE_TIMEOUT_S);
		n_broken++;
	}
}

/* Wait until a stream has run dry without telling either side: a raw query is no
 * synchronization point for the driver's pool (ANCHORS.md) nor for sop. */
static CUresult
drain_quietly(CUstream s)
{
	struct timespec t0, t;
	CUresult r;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while ((r = th.cuStreamQuery(s)) == CUDA_ERROR_NOT_READY) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > DRAIN_TIMEOUT_S)
			break;
	}
	return r;
}

/* ---- Sides: the same operations on a driver pool or on a sop pool ------------------------- */

enum {
	ST_STATS = 1, /* the step read USED_MEM_CURRENT and RESERVED_MEM_CURRENT after the call */
	/* sop's reserved memory is documented to differ here (doc/differences.md): not compared */
	ST_RESERVED_DIFFERS = 2,
};

struct answer {
	char label[STEP_LABEL];
	CUresult r;
	const char *vname; /* what v says ("same", "null", ...); NULL: the step has no value */
	long long v;
	unsigned flags;
	uint64_t used, reserved;
};

struct side {
	const char *name;
	bool is_sop;
	sop_pool_t sp; /* the open pool, on sop's side */
	CUmemoryPool dp; /* the open pool, on the driver's side */
	bool live;
	struct answer ans[MAX_STEPS];
	int n;
};

static struct side drv_side = {.name = "driver", .is_sop = false};
static struct side sop_side = {.name = "sop", .is_sop = true};

static CUstream s1, s2, s3;

static CUresult
x_alloc_raw(struct side *x, CUdeviceptr *out, size_t size, CUstream s)
{
	void *p;
	CUresult r;

	if (!x->is_sop)
		return dpool.cuMemAllocFromPoolAsync(out, size, x->dp, s);
	p = (void *)(uintptr_t)*out;
	r = sop_malloc_from_pool_async(&p, size, x->sp, s);
	*out = (CUdeviceptr)(uintptr_t)p;
	return r;
}

static CUresult
x_free(struct side *x, CUdeviceptr p, CUstream s)
{
	return x->is_sop ? sop_free_async((void *)(uintptr_t)p, s) : dpool.cuMemFreeAsync(p, s);
}

static CUresult
x_set(struct side *x, CUmemPool_attribute attr, void *value)
{
	return x->is_sop ? sop_pool_set_attr(x->sp, attr, value)
			 : dpool.cuMemPoolSetAttribute(x->dp, attr, value);
}

static CUresult
x_get(struct side *x, CUmemPool_attribute attr, cuuint64_t *value)
{
	return x->is_sop ? sop_pool_get_attr(x->sp, attr, value)
			 : dpool.cuMemPoolGetAttribute(x->dp, attr, value);
}

static CUresult
x_trim(struct side *x, size_t keep)
{
	return x->is_sop ? sop_trim_to(x->sp, keep) : dpool.cuMemPoolTrimTo(x->dp, keep);
}

static CUresult
x_record(struct side *x, CUevent ev, CUstream s)
{
	return x->is_sop ? sop_event_record(ev, s) : th.cuEventRecord(ev, s);
}

static CUresult
x_wait(struct side *x, CUstream s, CUevent ev)
{
	return x->is_sop ? sop_stream_wait_event(s, ev, 0) : th.cuStreamWaitEvent(s, ev, 0);
}

static CUresult
x_stream_sync(struct side *x, CUstream s)
{
	return x->is_sop ? sop_stream_synchronize(s) : sop__drv.cuStreamSynchronize(s);
}

static CUresult
x_event_sync(struct side *x, CUevent ev)
{
	return x->is_sop ? sop_event_synchronize(ev) : sop__drv.cuEventSynchronize(ev);
}

static CUresult
x_ctx_sync(struct side *x)
{
	return x->is_sop ? sop_ctx_synchronize() : sop__drv.cuCtxSynchronize();
}

static CUresult
x_event_destroy(struct side *x, CUevent ev)
{
	/* sop must forget the dependency it attached to the handle (sop.h). */
	return x->is_sop ? sop_event_destroy(ev) : th.cuEventDestroy(ev);
}

enum { SYNC_STREAM, SYNC_EVENT, SYNC_CTX };

static const char *const sync_label[] = {
	"s1: stream sync",
	"event sync (event recorded on s1 after the free)",
	"context sync",
};

/* The synchronization point `how` that covers s1's frees: s1 itself, an event recorded on s1
 * after them, or the context. */
static CUresult
x_sync(struct side *x, int how, CUevent ev)
{
	switch (how) {
	case SYNC_STREAM:
		return x_stream_sync(x, s1);
	case SYNC_EVENT:
		return x_event_sync(x, ev);
	default:
		return x_ctx_sync(x);
	}
}

/* ---- Steps ---------------------------------------------------------------------------------- */

static void
step(struct side *x, const char *label, CUresult r, const char *vname, long long v, unsigned flags)
{
	struct answer *a;
	cuuint64_t used = 0, reserved = 0;

	TH_ASSERT(x->n < MAX_STEPS);
	a = &x->ans[x->n++];
	snprintf(a->label, sizeof a->label, "%s", label);
	a->r = r;
	a->vname = vname;
	a->v = v;
	a->flags = flags;
	if (flags & ST_STATS) {
		TH_ASSERT(x->live);
		if (x_get(x, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != CUDA_SUCCESS ||
		    x_get(x, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS) {
			printf("%s: %s: reading the pool's statistics failed\n", x->name, label);
			n_broken++;
		}
	}
	a->used = used;
	a->reserved = reserved;
}

/* A call whose answer is its CUresult and the pool's statistics after it. */
static void
call_step(struct side *x, const char *label, CUresult r)
{
	step(x, label, r, NULL, 0, ST_STATS);
}

/* An observation that is not a call. */
static void
flag_step(struct side *x, const char *label, const char *vname, bool v)
{
	step(x, label, CUDA_SUCCESS, vname, v, 0);
}

/* Allocate; the pointer, or 0 when the call failed (so that later frees of it are harmless). */
static CUdeviceptr
alloc_step(struct side *x, const char *label, size_t size, CUstream s)
{
	CUdeviceptr p = 0;
	CUresult r = x_alloc_raw(x, &p, size, s);

	call_step(x, label, r);
	return r == CUDA_SUCCESS ? p : 0;
}

/* Allocate, and record whether the block is the one freed at `freed`. */
static CUdeviceptr
alloc_reuse_step(struct side *x, const char *label, size_t size, CUstream s, CUdeviceptr freed)
{
	CUdeviceptr p = 0;
	CUresult r = x_alloc_raw(x, &p, size, s);

	if (r != CUDA_SUCCESS)
		p = 0;
	step(x, label, r, "same", p && p == freed, ST_STATS);
	return p;
}

static void
free_step(struct side *x, const char *label, CUdeviceptr p, CUstream s)
{
	call_step(x, label, x_free(x, p, s));
}

/* Write an attribute, then read it back. */
static void
attr_step(struct side *x, const char *label, CUmemPool_attribute attr, cuuint64_t value)
{
	cuuint64_t back = 0;
	CUresult r = x_set(x, attr, &value);

	if (x_get(x, attr, &back) != CUDA_SUCCESS) {
		printf("%s: %s: reading the attribute back failed\n", x->name, label);
		n_broken++;
	}
	step(x, label, r, "reads", (long long)back, ST_STATS);
}

/* Free memory that a step expected not to exist (an allocation that should have failed), so that
 * nothing outlives the pool; not a step, since only a side that differed gets here. */
static void
release(struct side *x, CUdeviceptr p, CUstream s)
{
	CUresult r;

	if (!p)
		return;
	r = x_free(x, p, s);
	if (r != CUDA_SUCCESS) {
		printf("%s: freeing an unexpected allocation failed (%d)\n", x->name, (int)r);
		n_broken++;
	}
}

/* A fresh pool on device 0 with these settings; a pool that cannot be made ends the test. */
static void
pool_open(struct side *x, size_t max_size, cuuint64_t threshold, int follow, int opportunistic,
	  int internal)
{
	static const CUmemPool_attribute policy_attr[3] = {
		CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
		CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
		CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
	};
	int policy[3] = {follow, opportunistic, internal};
	CUmemPoolProps props;
	CUresult r;

	TH_ASSERT(!x->live);
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = 0;
	props.maxSize = max_size;
	r = x->is_sop ? sop_pool_create(&x->sp, &props) : dpool.cuMemPoolCreate(&x->dp, &props);
	if (r != CUDA_SUCCESS) {
		printf("%s: creating a pool failed (%d); cannot go on\n", x->name, (int)r);
		exit(1);
	}
	x->live = true;
	r = x_set(x, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
	for (int i = 0; i < 3 && r == CUDA_SUCCESS; i++)
		r = x_set(x, policy_attr[i], &policy[i]);
	call_step(x, "create the pool, set threshold and policies", r);
}

/* Synchronize the context (every free done, every gate already open), destroy the event if
 * any, then the pool. */
static void
pool_close(struct side *x, CUevent ev)
{
	CUresult r;

	call_step(x, "context sync (end of the scenario)", x_ctx_sync(x));
	if (ev)
		call_step(x, "destroy the event", x_event_destroy(x, ev));
	r = x->is_sop ? sop_pool_destroy(x->sp) : dpool.cuMemPoolDestroy(x->dp);
	x->live = false;
	step(x, "destroy the pool", r, NULL, 0, 0);
}

static CUevent
event_new(void)
{
	CUevent ev;

	TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	return ev;
}

/* ---- Scenarios -------------------------------------------------------------------------------
 * Each takes the side to run on and one argument (a policy, a synchronization variant), and
 * takes the same steps on either side whatever the answers, so that the runs line up. */

/* 0: every stream used once on each side, so that no scenario pays for a first use. */
static void
scenario_first_use(struct side *x, int arg)
{
	CUstream s[3] = {s1, s2, s3};
	static const char *const alloc_label[3] = {"s1: alloc 1 byte", "s2: alloc 1 byte",
						   "s3: alloc 1 byte"};
	static const char *const free_label[3] = {"s1: free it", "s2: free it", "s3: free it"};
	static const char *const sync_label_s[3] = {"s1: stream sync", "s2: stream sync",
						    "s3: stream sync"};

	(void)arg;
	pool_open(x, 0, KEEP, 1, 1, 1);
	for (int i = 0; i < 3; i++) {
		CUdeviceptr p = alloc_step(x, alloc_label[i], 1, s[i]);
		free_step(x, free_label[i], p, s[i]);
		call_step(x, sync_label_s[i], x_stream_sync(x, s[i]));
	}
	pool_close(x, NULL);
}

/* A: busy s1 frees, s2 allocates the same size, all policies on: a different block (the pool has
 * room, so no dependency is worth inserting). */
static void
scenario_a(struct side *x, int arg)
{
	struct dgate *g;
	CUdeviceptr a, b;

	(void)arg;
	pool_open(x, 0, KEEP, 1, 1, 1);
	g = gate_block(x->name, s1);
	a = alloc_step(x, "s1: alloc 4 MiB", 4 * MiB, s1);
	free_step(x, "s1: free it (s1 busy)", a, s1);
	b = alloc_reuse_step(x, "s2: alloc 4 MiB", 4 * MiB, s2, a);
	gate_open(g);
	free_step(x, "s2: free its block", b, s2);
	pool_close(x, NULL);
}

/* B: s1's work has finished but nobody synchronized: opportunistic reuse takes the block; with
 * opportunistic off it does not, until s1 is synchronized. */
static void
scenario_b(struct side *x, int opportunistic)
{
	CUdeviceptr a, b, c;

	pool_open(x, 0, KEEP, 1, opportunistic, 1);
	a = alloc_step(x, "s1: alloc 4 MiB", 4 * MiB, s1);
	free_step(x, "s1: free it", a, s1);
	call_step(x, "s1: raw query until idle", drain_quietly(s1));
	b = alloc_reuse_step(x, "s2: alloc 4 MiB", 4 * MiB, s2, a);
	if (!opportunistic) {
		call_step(x, "s1: stream sync", x_stream_sync(x, s1));
		c = alloc_reuse_step(x, "s2: alloc 4 MiB after s1's sync", 4 * MiB, s2, a);
		free_step(x, "s2: free the second block", c, s2);
	}
	free_step(x, "s2: free its block", b, s2);
	pool_close(x, NULL);
}

/* C: all policies off: a synchronization point that covers the free still makes it reusable by
 * any stream. s2's block stays live until s3 has allocated, so that s1's is the only free block
 * of its size (and the answer does not hang on the allocator's choice between two). */
static void
scenario_c(struct side *x, int how)
{
	CUevent ev = event_new();
	CUdeviceptr a, b, c;
	struct dgate *g;

	pool_open(x, 0, KEEP, 0, 0, 0);
	g = gate_block(x->name, s1);
	a = alloc_step(x, "s1: alloc 4 MiB", 4 * MiB, s1);
	free_step(x, "s1: free it (s1 busy)", a, s1);
	call_step(x, "s1: record an event after the free", x_record(x, ev, s1));
	b = alloc_reuse_step(x, "s2: alloc 4 MiB (s1 busy)", 4 * MiB, s2, a);
	gate_open(g);
	call_step(x, sync_label[how], x_sync(x, how, ev));
	c = alloc_reuse_step(x, "s3: alloc 4 MiB after the sync", 4 * MiB, s3, a);
	free_step(x, "s2: free its block", b, s2);
	free_step(x, "s3: free its block", c, s3);
	pool_close(x, ev);
}

/* D: busy s1 frees and records an event after the free; s2 waits on it: with
 * follow-event-dependencies s2 reuses the block at once, while s1 is still blocked. */
static void
scenario_d(struct side *x, int follow)
{
	CUevent ev = event_new();
	struct dgate *g;
	CUdeviceptr a, b;

	pool_open(x, 0, KEEP, follow, 1, 1);
	g = gate_block(x->name, s1);
	a = alloc_step(x, "s1: alloc 4 MiB", 4 * MiB, s1);
	free_step(x, "s1: free it (s1 busy)", a, s1);
	call_step(x, "s1: record an event after the free", x_record(x, ev, s1));
	call_step(x, "s2: wait on the event", x_wait(x, s2, ev));
	b = alloc_reuse_step(x, "s2: alloc 4 MiB (s1 busy)", 4 * MiB, s2, a);
	gate_open(g);
	free_step(x, "s2: free its block", b, s2);
	pool_close(x, ev);
}

/* E: the freeing stream reuses at once, all policies off, while it is busy. */
static void
scenario_e(struct side *x, int arg)
{
	struct dgate *g;
	CUdeviceptr a, b;

	(void)arg;
	pool_open(x, 0, KEEP, 0, 0, 0);
	g = gate_block(x->name, s1);
	a = alloc_step(x, "s1: alloc 4 MiB", 4 * MiB, s1);
	free_step(x, "s1: free it (s1 busy)", a, s1);
	b = alloc_reuse_step(x, "s1: alloc 4 MiB again", 4 * MiB, s1, a);
	gate_open(g);
	free_step(x, "s1: free it", b, s1);
	pool_close(x, NULL);
}

/* F: a pool capped at 64 MiB; busy s1 frees all of it; s2 asks for 64 MiB. With internal
 * dependencies: the same block, returned while s1 is still held (the host does not block), and
 * s2's later work waits for s1. Without: out of memory at once.
 * 64 MiB is more than 32 MiB, where sop's reserved memory may differ (doc/differences.md), but it
 * is a whole number of the driver's 32 MiB chunks and of the 2 MiB granularity, so both reserve
 * exactly 64 MiB: reserved is compared. */
static atomic_int s2_ran;

static void CUDA_CB
mark_s2(void *arg)
{
	(void)arg;
	atomic_store(&s2_ran, 1);
}

static void
scenario_f(struct side *x, int internal)
{
	const struct timespec pause = {0, 50 * 1000 * 1000};
	struct dgate *g;
	CUdeviceptr a, b;

	pool_open(x, 64 * MiB, KEEP, 1, 1, internal);
	g = gate_block(x->name, s1);
	a = alloc_step(x, "s1: alloc 64 MiB (the whole pool)", 64 * MiB, s1);
	free_step(x, "s1: free it (s1 busy)", a, s1);
	b = alloc_reuse_step(x, "s2: alloc 64 MiB", 64 * MiB, s2, a);
	/* If the call had blocked on s1, only the watchdog could have let it return. */
	flag_step(x, "s2's alloc returned while s1 is held", "held", !gate_is_open(g));
	if (internal) {
		atomic_store(&s2_ran, 0);
		TH_OK(th.cuLaunchHostFunc(s2, mark_s2, NULL));
		th_gate_wait_reached(&g->g);
		nanosleep(&pause, NULL);
		flag_step(x, "s2's later work waits for s1", "waits", !atomic_load(&s2_ran));
		gate_open(g);
		call_step(x, "s2: stream sync", x_stream_sync(x, s2));
		flag_step(x, "s2's later work has run", "ran", atomic_load(&s2_ran));
		free_step(x, "s2: free its block", b, s2);
	} else {
		gate_open(g);
		release(x, b, s2);
	}
	pool_close(x, NULL);
}

/* G: the release threshold (16 MiB) applies only at a synchronization point that covers the
 * frees: not at an unrelated stream's synchronization, not when a raw query shows s1 idle. */
static void
scenario_g(struct side *x, int how)
{
	CUevent ev = event_new();
	char label[STEP_LABEL];
	CUdeviceptr p[8];
	struct dgate *g;
	int i;

	pool_open(x, 0, 16 * MiB, 1, 1, 1);
	g = gate_block(x->name, s1);
	for (i = 0; i < 8; i++) {
		snprintf(label, sizeof label, "s1: alloc 32 MiB (%d of 8)", i + 1);
		p[i] = alloc_step(x, label, 32 * MiB, s1);
	}
	for (i = 0; i < 8; i++) {
		snprintf(label, sizeof label, "s1: free 32 MiB (%d of 8, s1 busy)", i + 1);
		free_step(x, label, p[i], s1);
	}
	call_step(x, "s1: record an event after the frees", x_record(x, ev, s1));
	call_step(x, "s2: stream sync (unrelated stream)", x_stream_sync(x, s2));
	gate_open(g);
	call_step(x, "s1: raw query until idle", drain_quietly(s1));
	/* Both should now hold nothing: 0 <= 16 MiB, compared exactly. */
	call_step(x, sync_label[how], x_sync(x, how, ev));
	pool_close(x, ev);
}

/* H: bad input and accounting. The 1 PiB request comes first, on an empty pool, so that neither
 * side has idle memory it might release while trying to serve it. */
static void
scenario_h(struct side *x, int arg)
{
	CUdeviceptr p, one, thousand;
	CUresult r;

	(void)arg;
	pool_open(x, 0, KEEP, 1, 1, 1);
	p = 0x1000; /* not NULL: the call must write NULL */
	r = x_alloc_raw(x, &p, 0, s1);
	step(x, "s1: alloc 0 bytes", r, "null", p == 0, ST_STATS);
	if (r == CUDA_SUCCESS && p != 0x1000)
		release(x, p, s1);
	call_step(x, "s1: free NULL", x_free(x, 0, s1));
	release(x, alloc_step(x, "s1: alloc 1 PiB", (size_t)1 << 50, s1), s1);

	p = alloc_step(x, "s1: alloc 4 MiB", 4 * MiB, s1);
	call_step(x, "s1: free an interior pointer (+4 KiB)", x_free(x, p + 4096, s1));
	free_step(x, "s1: free the 4 MiB", p, s1);
	call_step(x, "s1: free it again (double free)", x_free(x, p, s1));

	attr_step(x, "write 0 to USED_MEM_HIGH (reset)", CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0);
	one = alloc_step(x, "s1: alloc 1 byte", 1, s1);
	thousand = alloc_step(x, "s1: alloc 1000 bytes", 1000, s1);
	free_step(x, "s1: free the 1000 bytes", thousand, s1);
	{
		cuuint64_t high = 0;
		r = x_get(x, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &high);
		step(x, "read USED_MEM_HIGH", r, "reads", (long long)high, ST_STATS);
	}
	attr_step(x, "write 0 to USED_MEM_HIGH (reset)", CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0);
	attr_step(x, "write 1 to USED_MEM_HIGH", CU_MEMPOOL_ATTR_USED_MEM_HIGH, 1);
	attr_step(x, "write 0 to RESERVED_MEM_HIGH (reset)", CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0);
	attr_step(x, "write 1 to RESERVED_MEM_HIGH", CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 1);
	attr_step(x, "write 0 to USED_MEM_CURRENT (read-only)", CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
		  0);
	free_step(x, "s1: free the byte", one, s1);
	pool_close(x, NULL);
}

/* T: trimming. Frees pending on a held stream are in use: nothing is released. Once they are
 * synchronized, TrimTo(50 MiB) keeps 64 MiB (whole 32 MiB pieces, never below what was asked),
 * and TrimTo(0) releases the rest. */
static void
scenario_t(struct side *x, int arg)
{
	char label[STEP_LABEL];
	CUdeviceptr p[4];
	struct dgate *g;
	int i;

	(void)arg;
	pool_open(x, 0, KEEP, 1, 1, 1);
	g = gate_block(x->name, s1);
	for (i = 0; i < 4; i++) {
		snprintf(label, sizeof label, "s1: alloc 32 MiB (%d of 4)", i + 1);
		p[i] = alloc_step(x, label, 32 * MiB, s1);
	}
	for (i = 0; i < 4; i++) {
		snprintf(label, sizeof label, "s1: free 32 MiB (%d of 4, s1 busy)", i + 1);
		free_step(x, label, p[i], s1);
	}
	call_step(x, "trim to 0 (the frees still pending)", x_trim(x, 0));
	gate_open(g);
	call_step(x, "s1: stream sync", x_stream_sync(x, s1));
	call_step(x, "trim to 50 MiB", x_trim(x, 50 * MiB));
	call_step(x, "trim to 0", x_trim(x, 0));
	pool_close(x, NULL);
}

/* ---- Running and comparing ----------------------------------------------------------------- */

static int n_steps, n_same, n_diff;

/* The names of the codes these scenarios can meet; NULL for others. */
static const char *
result_name(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return "CUDA_SUCCESS";
	case CUDA_ERROR_INVALID_VALUE:
		return "CUDA_ERROR_INVALID_VALUE";
	case CUDA_ERROR_OUT_OF_MEMORY:
		return "CUDA_ERROR_OUT_OF_MEMORY";
	case CUDA_ERROR_NOT_READY:
		return "CUDA_ERROR_NOT_READY";
	case CUDA_ERROR_NOT_SUPPORTED:
		return "CUDA_ERROR_NOT_SUPPORTED";
	case CUDA_ERROR_INVALID_CONTEXT:
		return "CUDA_ERROR_INVALID_CONTEXT";
	case CUDA_ERROR_INVALID_HANDLE:
		return "CUDA_ERROR_INVALID_HANDLE";
	default:
		return NULL;
	}
}

static void
describe(const struct answer *a, char *buf, size_t size)
{
	size_t k;

	if (!a) {
		snprintf(buf, size, "(no such step)");
		return;
	}
	if (result_name(a->r))
		snprintf(buf, size, "%s", result_name(a->r));
	else
		snprintf(buf, size, "CUresult %d", (int)a->r);
	k = strlen(buf);
	if (a->vname && k < size)
		snprintf(buf + k, size - k, " %s=%lld", a->vname, a->v);
	k = strlen(buf);
	if ((a->flags & ST_STATS) && k < size)
		snprintf(buf + k, size - k, " used=%llu reserved=%llu%s",
			 (unsigned long long)a->used, (unsigned long long)a->reserved,
			 a->flags & ST_RESERVED_DIFFERS ? " (not compared)" : "");
}

static bool
answers_match(const struct answer *d, const struct answer *s)
{
	if (strcmp(d->label, s->label) != 0 || d->r != s->r || d->flags != s->flags)
		return false;
	if ((d->vname == NULL) != (s->vname == NULL) || (d->vname && d->v != s->v))
		return false;
	if (d->flags & ST_STATS) {
		if (d->used != s->used)
			return false;
		if (!(d->flags & ST_RESERVED_DIFFERS) && d->reserved != s->reserved)
			return false;
	}
	return true;
}

/* Run fn on the driver's side, then on sop's, and print the two runs step by step. */
static void
run(const char *tag, const char *what, void (*fn)(struct side *, int), int arg)
{
	char dbuf[160], sbuf[160];
	int n, i;

	printf("-- %s: %s\n", tag, what);
	drv_side.n = 0;
	fn(&drv_side, arg);
	sop_side.n = 0;
	fn(&sop_side, arg);
	n = drv_side.n > sop_side.n ? drv_side.n : sop_side.n;
	for (i = 0; i < n; i++) {
		const struct answer *d = i < drv_side.n ? &drv_side.ans[i] : NULL;
		const struct answer *s = i < sop_side.n ? &sop_side.ans[i] : NULL;
		bool same = d && s && answers_match(d, s);

		describe(d, dbuf, sizeof dbuf);
		describe(s, sbuf, sizeof sbuf);
		printf("%-5s %-50s driver: %-62s sop: %-62s %s\n", tag, d ? d->label : s->label,
		       dbuf, sbuf, same ? "same" : "DIFFERENT");
		n_steps++;
		if (same)
			n_same++;
		else
			n_diff++;
	}
}

int
main(void)
{
	th_init();
	load_driver_pools();
	TH_EQ(atexit(gates_open_all), 0);
	s1 = th_stream();
	s2 = th_stream();
	s3 = th_stream();

	run("0", "first use of s1, s2 and s3 on each side", scenario_first_use, 0);
	run("A", "busy s1 frees, s2 allocates; all policies on", scenario_a, 0);
	run("B/on", "s1 done but not synchronized, s2 allocates; opportunistic on", scenario_b, 1);
	run("B/off", "s1 done but not synchronized, s2 allocates; opportunistic off", scenario_b,
	    0);
	run("C/str", "all policies off; s1's stream sync makes its free reusable", scenario_c,
	    SYNC_STREAM);
	run("C/ev", "all policies off; an event sync makes s1's free reusable", scenario_c,
	    SYNC_EVENT);
	run("C/ctx", "all policies off; a context sync makes s1's free reusable", scenario_c,
	    SYNC_CTX);
	run("D/on", "s2 waits on an event after busy s1's free; follow-event-dependencies on",
	    scenario_d, 1);
	run("D/off", "s2 waits on an event after busy s1's free; follow-event-dependencies off",
	    scenario_d, 0);
	run("E", "busy s1 frees and allocates again; all policies off", scenario_e, 0);
	run("F/on", "pool capped at 64 MiB, all pending on busy s1; internal dependencies on",
	    scenario_f, 1);
	run("F/off", "pool capped at 64 MiB, all pending on busy s1; internal dependencies off",
	    scenario_f, 0);
	run("G/str", "release threshold 16 MiB, 256 MiB freed; released at s1's stream sync",
	    scenario_g, SYNC_STREAM);
	run("G/ev", "release threshold 16 MiB, 256 MiB freed; released at an event sync",
	    scenario_g, SYNC_EVENT);
	run("G/ctx", "release threshold 16 MiB, 256 MiB freed; released at a context sync",
	    scenario_g, SYNC_CTX);
	run("H", "bad input, exact used memory, watermarks", scenario_h, 0);
	run("T", "trim with pending frees, then after a sync", scenario_t, 0);

	TH_OK(sop_ctx_synchronize());
	th_stream_destroy(s1);
	th_stream_destroy(s2);
	th_stream_destroy(s3);
	if (n_broken)
		printf("differential: %d failures outside the compared steps (see above)\n",
		       n_broken);
	printf("differential: %d steps, %d same, %d different\n", n_steps, n_same, n_diff);
	return n_diff || n_broken ? 1 : 0;
}
