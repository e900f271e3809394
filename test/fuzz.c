/* fuzz.c - the public API under hostile input, on the simulated driver.
 *
 * A seeded random driver of every public call, with arguments valid and invalid: pools live,
 * destroyed (with allocations still live, or gone), default, NULL and made-up handles; pointers
 * live, freed, freed twice, interior, foreign and NULL; attributes unknown, read-only, and
 * watermarks written with values other than 0; access descriptors of every kind; NULL
 * out-pointers; sizes 0, huge and SIZE_MAX; streams live, destroyed (through sop and behind its
 * back), destroyed and their handle value given to a new stream, of the other device's primary
 * context and of a context made with cuCtxCreate (destroyed in turn, which takes its streams and
 * events with it), the special streams with and without a current context; events live,
 * destroyed under use, recycled, of other contexts; trims, compaction, free extents, current
 * pools. A model keeps what must be true: the live allocations (no two overlap, each readable
 * and writable by the host, its pool found from any address inside), each pool's used bytes and
 * attributes, which handles name anything. After every call the library must agree with it:
 * the return code (exactly, where the API documents one; any failure, untouched out-parameters
 * and nothing changed, where only the driver knows), the pools' invariants (sop__pool_check on
 * every pool, destroyed ones waiting for their last allocation included), and the simulated
 * driver's live objects (streams and contexts exactly the fuzzer's, events no more than the
 * fuzzer's plus the probes sop may hold, physical memory between what the pools report and that
 * plus an anchor each). At the end, everything destroyed, the driver's objects are back where
 * they started. With --threads N, N fuzzers run at once on pools, streams and events of their
 * own (the default and current pools and made contexts stay out of it; a handle dead to one
 * fuzzer may name another's stream, so calls on it may go either way), and the driver's counts
 * are checked at the end.
 *
 * Usage: test-fuzz [--seed N] [--seeds N] [--ops N] [--seconds S] [--threads N] [--trace]
 * A failure prints the seed and the last calls made. CI runs a fixed set of seeds; by hand,
 * test-fuzz --seconds 300 --seed N runs seed after seed from N for five minutes. Built with
 * SOP_FUZZ_LIBFUZZER (test-fuzz-libfuzzer, clang), libFuzzer's input makes the choices instead.
 */
#include <limits.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)
#define N_POOLS 8 /* 0 and 1: the default pools of devices 0 and 1 */
#define N_STREAMS 10
#define N_EVENTS 8
#define LIVE 96
#define STALE 16
#define FREED 16
#define TRACE 48
/* The probe events sop may hold: SOP_PROBES per stream record, and order.c keeps records of
 * streams gone until a sweep, which comes every 256 new records or more (twice what is held). */
#define PROBES_MAX (SOP_PROBES * (2 * 256 + 64))

enum ctx_kind { CTX_DEV0, CTX_DEV1, CTX_MADE, CTX_KINDS };
enum pool_state { P_NONE, P_LIVE, P_DESTROYED };

struct pool_slot {
	sop_pool_t h;
	enum pool_state state;
	int dev;
	size_t cap; /* rounded up to the granularity; 0: none */
	int reuse[3];
	cuuint64_t threshold;
	int compact;
	bool peer; /* the other device has access */
};

struct stream_slot {
	CUstream h;
	bool live;
	enum ctx_kind ctx;
};

struct event_slot {
	CUevent h;
	bool live;
	enum ctx_kind ctx;
};

struct alloc {
	unsigned char *p;
	size_t size;
	int pool;
	unsigned char tag;
};

/* A stream as the fuzzer names it: a handle, and what the model says it is. */
struct pick {
	CUstream h;
	bool valid;   /* names a stream the call must accept */
	bool unknown; /* not valid, but may name another fuzzer's stream now (--threads) */
	bool special; /* NULL, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD */
	enum ctx_kind ctx;
};

/* One fuzzer: its model and its random sequence. */
struct fuzzer {
	uint64_t rng, seed;
	/* Under libFuzzer the choices come from its input instead, until it runs out. */
	const uint8_t *data;
	size_t left;
	bool exhausted;
	unsigned long op;
	bool shared; /* other fuzzers run at once: stay off shared state */
	struct pool_slot pools[N_POOLS];
	struct stream_slot streams[N_STREAMS];
	struct event_slot events[N_EVENTS];
	struct alloc live[LIVE];
	int n_live;
	sop_pool_t stale[STALE];
	int n_stale;
	void *freed[FREED];
	int n_freed;
	int cur[2]; /* the model's current pool of each device (single fuzzer only) */
	CUcontext ctx[CTX_KINDS];
	bool made; /* ctx[CTX_MADE] is live */
	char trace[TRACE][96];
	unsigned n_trace;
	bool print_trace;
};

static size_t granularity;
static CUcontext prim[2];
static int n_devices;

static uint64_t
rnd(struct fuzzer *f)
{
	if (f->data) {
		uint64_t v = 0;
		/* Two bytes a choice: enough for every choice the fuzzer makes but sizes and
		 * made-up addresses, and a short input still drives many calls. */
		if (f->left < 2) {
			f->exhausted = true;
			return 0;
		}
		memcpy(&v, f->data, 2);
		f->data += 2;
		f->left -= 2;
		return v * 0x9E3779B97F4A7C15u; /* high bits too, for sizes and addresses */
	}
	f->rng ^= f->rng << 13;
	f->rng ^= f->rng >> 7;
	f->rng ^= f->rng << 17;
	return f->rng;
}

static unsigned
pick_n(struct fuzzer *f, unsigned n)
{
	return (unsigned)(rnd(f) % n);
}

static void
note(struct fuzzer *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
note(struct fuzzer *f, const char *fmt, ...)
{
	va_list ap;
	char *line = f->trace[f->n_trace++ % TRACE];

	va_start(ap, fmt);
	vsnprintf(line, sizeof f->trace[0], fmt, ap);
	va_end(ap);
	if (f->print_trace)
		fprintf(stderr, "[%llu] %lu: %s\n", (unsigned long long)f->seed, f->op, line);
}

static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;

static _Noreturn void
fail(struct fuzzer *f, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static _Noreturn void
fail(struct fuzzer *f, int line, const char *fmt, ...)
{
	va_list ap;
	unsigned i, first = f->n_trace > TRACE ? f->n_trace - TRACE : 0;

	pthread_mutex_lock(&fail_lock);
	fprintf(stderr, "fuzz.c:%d: seed %llu, operation %lu: ", line, (unsigned long long)f->seed,
		f->op);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nthe last calls, oldest first:\n");
	for (i = first; i < f->n_trace; i++)
		fprintf(stderr, "  %s\n", f->trace[i % TRACE]);
	exit(1);
}

#define EXPECT(f, cond, ...)                                                                       \
	do {                                                                                       \
		if (!(cond))                                                                       \
			fail(f, __LINE__, __VA_ARGS__);                                            \
	} while (0)
#define EXPECT_RC(f, got, want)                                                                    \
	do {                                                                                       \
		CUresult g_ = (got), w_ = (want);                                                  \
		EXPECT(f, g_ == w_, "%s returned %d, expected %d", #got, (int)g_, (int)w_);        \
	} while (0)

/* ---- The model's view of handles ------------------------------------------------------------ */

/* Handle values are recycled: a value names whatever live object has it now. */
static struct stream_slot *
stream_named(struct fuzzer *f, CUstream h)
{
	int i;

	for (i = 0; i < N_STREAMS; i++)
		if (f->streams[i].live && f->streams[i].h == h)
			return &f->streams[i];
	return NULL;
}

static struct event_slot *
event_named(struct fuzzer *f, CUevent h)
{
	int i;

	for (i = 0; i < N_EVENTS; i++)
		if (f->events[i].live && f->events[i].h == h)
			return &f->events[i];
	return NULL;
}

static struct pick
any_stream(struct fuzzer *f)
{
	struct pick p = {NULL, true, false, true, CTX_DEV0};
	unsigned r = pick_n(f, 16);

	if (r < 3) {
		/* The special streams name streams of the current context, device 0's. */
		p.h = r == 0 ? NULL : r == 1 ? CU_STREAM_LEGACY : CU_STREAM_PER_THREAD;
		return p;
	}
	p.special = false;
	p.h = f->streams[pick_n(f, N_STREAMS)].h;
	if (!p.h)
		p.h = (CUstream)(uintptr_t)0x7e0000000040; /* never handed out yet, maybe never */
	{
		struct stream_slot *s = stream_named(f, p.h);
		p.valid = s != NULL;
		p.unknown = !s && f->shared;
		p.ctx = s ? s->ctx : CTX_DEV0;
	}
	/* A destroyed stream's handle, named on purpose for the code sop passes on: the driver
	 * faults there (the program's doing, with or without sop); the simulated driver answers
	 * this thread's calls on it with an error, and still faults on any other such handle,
	 * which sop would have asked about on its own. */
	if (!p.valid)
		th.sim_stream_dead_ok(p.h);
	return p;
}

/* A live stream of any context, or the legacy stream. */
static struct pick
live_stream(struct fuzzer *f)
{
	struct pick p = {NULL, true, false, true, CTX_DEV0};
	int i, n = 0, which;

	for (i = 0; i < N_STREAMS; i++)
		n += f->streams[i].live;
	which = n ? (int)pick_n(f, (unsigned)n + 1) : 0;
	for (i = 0; i < N_STREAMS && which; i++) {
		if (f->streams[i].live && --which == 0) {
			p.h = f->streams[i].h;
			p.special = false;
			p.ctx = f->streams[i].ctx;
		}
	}
	return p;
}

static bool
is_stale(struct fuzzer *f, sop_pool_t h)
{
	int i;

	for (i = 0; i < f->n_stale; i++)
		if (f->stale[i] == h)
			return true;
	return false;
}

/* A handle no call may accept: NULL, one whose pool was destroyed, or made up. */
static sop_pool_t
bad_pool(struct fuzzer *f)
{
	switch (pick_n(f, 4)) {
	case 0:
		return NULL;
	case 1:
		/* A slot that exists, with a generation no pool had yet. */
		return (sop_pool_t)(uintptr_t)((f->pools[0].h ? (uintptr_t)f->pools[0].h : 1) +
					       ((uintptr_t)0x7777777 << 20));
	case 2:
		return (sop_pool_t)(uintptr_t)(rnd(f) | (uint64_t)1 << 63);
	default:
		return f->n_stale ? f->stale[pick_n(f, (unsigned)f->n_stale)] : NULL;
	}
}

static int
any_live_pool(struct fuzzer *f)
{
	int i, n = 0, which;

	for (i = f->shared ? 2 : 0; i < N_POOLS; i++)
		n += f->pools[i].state == P_LIVE;
	if (!n)
		return -1;
	which = (int)pick_n(f, (unsigned)n);
	for (i = f->shared ? 2 : 0; i < N_POOLS; i++)
		if (f->pools[i].state == P_LIVE && which-- == 0)
			return i;
	return -1;
}

static uint64_t
model_used(struct fuzzer *f, int pool)
{
	uint64_t u = 0;
	int i;

	for (i = 0; i < f->n_live; i++)
		if (f->live[i].pool == pool)
			u += f->live[i].size;
	return u;
}

static int
live_index(struct fuzzer *f, const void *p)
{
	int i;

	for (i = 0; i < f->n_live; i++)
		if ((const unsigned char *)p >= f->live[i].p &&
		    (const unsigned char *)p < f->live[i].p + f->live[i].size)
			return i;
	return -1;
}

static void
remember_freed(struct fuzzer *f, void *p)
{
	if (f->n_freed < FREED)
		f->freed[f->n_freed++] = p;
	else
		f->freed[pick_n(f, FREED)] = p;
}

/* ---- Pools ---------------------------------------------------------------------------------- */

static void
op_pool_create(struct fuzzer *f)
{
	CUmemPoolProps props;
	sop_pool_t h = (sop_pool_t)(uintptr_t)0x5a5a;
	int slot, bad = (int)pick_n(f, 24);
	CUresult r;

	for (slot = 2; slot < N_POOLS && f->pools[slot].state != P_NONE; slot++)
		;
	if (slot == N_POOLS)
		bad = 1 + (int)pick_n(f, 9); /* full: only hostile calls */
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = (int)pick_n(f, (unsigned)n_devices);
	switch (pick_n(f, 4)) {
	case 0:
		props.maxSize = 0;
		break;
	case 1:
		props.maxSize = (size_t)(1 + pick_n(f, 8)) * 4 * MiB + pick_n(f, 4096);
		break;
	case 2:
		props.maxSize = (size_t)(1 + pick_n(f, 64)) * MiB;
		break;
	default:
		/* A cap above any device, up to one that overflows when rounded up. */
		props.maxSize = pick_n(f, 4) ? (size_t)1 << (30 + pick_n(f, 34))
					     : SIZE_MAX - pick_n(f, 4 * (unsigned)MiB);
		break;
	}
	if (pick_n(f, 4) == 0)
		props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	switch (bad) {
	case 1:
		props.allocType = pick_n(f, 2) ? CU_MEM_ALLOCATION_TYPE_MANAGED
					       : (CUmemAllocationType)(3 + pick_n(f, 1000));
		break;
	case 2:
		/* Host pools exist; a pool at "the calling thread's node" does not. */
		props.location.type = pick_n(f, 2) ? CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT
						   : (CUmemLocationType)(99 + pick_n(f, 1000));
		break;
	case 3:
		props.location.id =
			pick_n(f, 2) ? -1 - (int)pick_n(f, 100) : n_devices + (int)pick_n(f, 100);
		break;
	case 4:
		props.reserved[pick_n(f, sizeof props.reserved)] =
			(unsigned char)(1 + pick_n(f, 255));
		break;
	case 5:
		props.handleTypes = (CUmemAllocationHandleType)(1u << (4 + pick_n(f, 20)));
		break;
	case 6:
		props.usage = (unsigned short)(1 + pick_n(f, 100));
		break;
	case 7:
		props.win32SecurityAttributes = &props;
		break;
	}
	if (bad == 8) {
		note(f, "sop_pool_create(NULL, props)");
		EXPECT_RC(f, sop_pool_create(NULL, &props), CUDA_ERROR_INVALID_VALUE);
		return;
	}
	if (bad == 9) {
		note(f, "sop_pool_create(&h, NULL)");
		EXPECT_RC(f, sop_pool_create(&h, NULL), CUDA_ERROR_INVALID_VALUE);
		EXPECT(f, h == (sop_pool_t)(uintptr_t)0x5a5a, "out-parameter written");
		return;
	}
	r = sop_pool_create(&h, &props);
	note(f, "sop_pool_create(dev %d, max %zu, bad %d) = %d, %p", props.location.id,
	     props.maxSize, bad, (int)r, (void *)h);
	if (bad >= 1 && bad <= 7) {
		EXPECT(f, r != CUDA_SUCCESS, "bad props (%d) accepted", bad);
		EXPECT(f, r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED,
		       "bad props (%d) gave %d", bad, (int)r);
		EXPECT(f, h == (sop_pool_t)(uintptr_t)0x5a5a, "out-parameter written");
		return;
	}
	if (r == CUDA_ERROR_OUT_OF_MEMORY) {
		/* A cap above the device's memory reserves addresses for it, up to 2 TiB, which a
		 * process may not have (ThreadSanitizer keeps most of them). */
		EXPECT(f, props.maxSize > (size_t)1 << 30, "out of memory for a pool of %zu",
		       props.maxSize);
		EXPECT(f, h == (sop_pool_t)(uintptr_t)0x5a5a, "out-parameter written");
		return;
	}
	EXPECT_RC(f, r, CUDA_SUCCESS);
	EXPECT(f, h != NULL && !is_stale(f, h), "a new pool got NULL or an old handle");
	{
		struct pool_slot *p = &f->pools[slot];
		memset(p, 0, sizeof *p);
		p->h = h;
		p->state = P_LIVE;
		p->dev = props.location.id;
		/* A cap past SIZE_MAX once rounded caps nothing. */
		p->cap = props.maxSize ? sop__round_up(props.maxSize, granularity) : 0;
		p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
	}
}

static void
pool_gone(struct fuzzer *f, int slot)
{
	int i;

	for (i = 0; i < f->n_live; i++)
		if (f->live[i].pool == slot)
			return;
	f->pools[slot].state = P_NONE;
}

static void
op_pool_destroy(struct fuzzer *f)
{
	int slot = any_live_pool(f);
	sop_pool_t h;
	int d;

	if (slot < 2 || pick_n(f, 4) == 0) {
		h = pick_n(f, 2) || f->shared ? bad_pool(f) : f->pools[pick_n(f, 2)].h;
		note(f, "sop_pool_destroy(bad %p)", (void *)h);
		EXPECT_RC(f, sop_pool_destroy(h), CUDA_ERROR_INVALID_VALUE);
		return;
	}
	h = f->pools[slot].h;
	note(f, "sop_pool_destroy(%p) with %llu bytes live", (void *)h,
	     (unsigned long long)model_used(f, slot));
	EXPECT_RC(f, sop_pool_destroy(h), CUDA_SUCCESS);
	f->pools[slot].state = P_DESTROYED;
	if (f->n_stale < STALE)
		f->stale[f->n_stale++] = h;
	else
		f->stale[pick_n(f, STALE)] = h;
	for (d = 0; d < 2 && !f->shared; d++)
		if (f->cur[d] == slot)
			f->cur[d] = d;
	pool_gone(f, slot);
	/* Refused at once by every call. */
	EXPECT_RC(f, sop_pool_destroy(h), CUDA_ERROR_INVALID_VALUE);
}

/* Every call that takes a pool refuses one that is not there, out-parameters untouched. */
static void
op_bad_pool_calls(struct fuzzer *f)
{
	sop_pool_t h = bad_pool(f);
	cuuint64_t v = 12345;
	size_t a = 1, b = 2;
	int e = 7;
	void *p = (void *)0x1;
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemAccess_flags fl = (CUmemAccess_flags)77;
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	struct pick s = live_stream(f);

	note(f, "every call with bad pool %p", (void *)h);
	EXPECT_RC(f, sop_pool_get_attr(h, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
		  CUDA_ERROR_INVALID_VALUE);
	EXPECT_RC(f, sop_pool_set_attr(h, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v),
		  CUDA_ERROR_INVALID_VALUE);
	EXPECT_RC(f, sop_trim_to(h, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_RC(f, sop_pool_set_access(h, &d, 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT_RC(f, sop_pool_get_access(&fl, h, &loc), CUDA_ERROR_INVALID_VALUE);
	EXPECT_RC(f, sop_pool_get_free_extents(h, &a, &b), CUDA_ERROR_INVALID_VALUE);
	EXPECT_RC(f, sop_pool_set_compaction(h, 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT_RC(f, sop_pool_get_compaction(h, &e), CUDA_ERROR_INVALID_VALUE);
	EXPECT_RC(f, sop_malloc_from_pool_async(&p, 4096, h, s.h), CUDA_ERROR_INVALID_VALUE);
	EXPECT_RC(f, sop_malloc_from_pool_async(&p, 0, h, s.h), CUDA_ERROR_INVALID_VALUE);
	if (!f->shared)
		EXPECT_RC(f, sop_device_set_pool(0, h), CUDA_ERROR_INVALID_VALUE);
	EXPECT(f, v == 12345 && a == 1 && b == 2 && e == 7 && p == (void *)0x1 && fl == 77,
	       "an out-parameter was written by a failed call");
}

static const CUmemPool_attribute reuse_attrs[3] = {
	CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
	CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
	CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
};

static void
op_attr(struct fuzzer *f)
{
	int slot = any_live_pool(f), k;
	struct pool_slot *p;
	cuuint64_t v = 0x1234, w;
	int i = 0x1234;

	if (slot < 0)
		return;
	p = &f->pools[slot];
	switch (pick_n(f, 9)) {
	case 0:
		k = (int)pick_n(f, 3);
		i = pick_n(f, 2) ? (int)pick_n(f, 2) : (int)rnd(f);
		note(f, "set reuse %d of %p to %d", k, (void *)p->h, i);
		EXPECT_RC(f, sop_pool_set_attr(p->h, reuse_attrs[k], &i), CUDA_SUCCESS);
		p->reuse[k] = i != 0;
		break;
	case 1:
		v = pick_n(f, 3) == 0 ? UINT64_MAX : pick_n(f, 2) ? 0 : rnd(f) % (256 * MiB);
		note(f, "set threshold of %p to %llu", (void *)p->h, (unsigned long long)v);
		EXPECT_RC(f, sop_pool_set_attr(p->h, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v),
			  CUDA_SUCCESS);
		p->threshold = v;
		break;
	case 2:
		/* The watermarks take 0 and nothing else. */
		v = pick_n(f, 2) ? 0 : 1 + rnd(f) % 1000;
		k = (int)pick_n(f, 2);
		note(f, "reset %s high of %p with %llu", k ? "used" : "reserved", (void *)p->h,
		     (unsigned long long)v);
		EXPECT_RC(f,
			  sop_pool_set_attr(p->h,
					    k ? CU_MEMPOOL_ATTR_USED_MEM_HIGH
					      : CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
					    &v),
			  v ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS);
		break;
	case 3:
		/* Read-only and unknown attributes. */
		v = 0;
		note(f, "set read-only or unknown attributes of %p", (void *)p->h);
		EXPECT_RC(f, sop_pool_set_attr(p->h, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
			  CUDA_ERROR_INVALID_VALUE);
		EXPECT_RC(f, sop_pool_set_attr(p->h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v),
			  CUDA_ERROR_INVALID_VALUE);
		EXPECT_RC(f,
			  sop_pool_set_attr(p->h, (CUmemPool_attribute)(9 + pick_n(f, 1000)), &v),
			  CUDA_ERROR_INVALID_VALUE);
		EXPECT_RC(f, sop_pool_set_attr(p->h, (CUmemPool_attribute)-1, &v),
			  CUDA_ERROR_INVALID_VALUE);
		w = 77;
		EXPECT_RC(f,
			  sop_pool_get_attr(p->h, (CUmemPool_attribute)(15 + pick_n(f, 1000)), &w),
			  CUDA_ERROR_INVALID_VALUE);
		EXPECT(f, w == 77, "out-parameter written");
		break;
	case 4:
		note(f, "attributes of %p with NULL values", (void *)p->h);
		EXPECT_RC(f, sop_pool_set_attr(p->h, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, NULL),
			  CUDA_ERROR_INVALID_VALUE);
		EXPECT_RC(f, sop_pool_get_attr(p->h, reuse_attrs[pick_n(f, 3)], NULL),
			  CUDA_ERROR_INVALID_VALUE);
		break;
	case 5:
		/* What was set reads back. */
		note(f, "read the attributes of %p", (void *)p->h);
		for (k = 0; k < 3; k++) {
			i = 0x55;
			EXPECT_RC(f, sop_pool_get_attr(p->h, reuse_attrs[k], &i), CUDA_SUCCESS);
			EXPECT(f, i == p->reuse[k], "reuse %d reads %d, set %d", k, i, p->reuse[k]);
		}
		EXPECT_RC(f, sop_pool_get_attr(p->h, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v),
			  CUDA_SUCCESS);
		EXPECT(f, v == p->threshold, "threshold reads %llu, set %llu",
		       (unsigned long long)v, (unsigned long long)p->threshold);
		break;
	case 6:
		i = pick_n(f, 3) ? (int)pick_n(f, 2) : (int)rnd(f) | 2;
		note(f, "set compaction of %p to %d", (void *)p->h, i);
		EXPECT_RC(f, sop_pool_set_compaction(p->h, i),
			  i == 0 || i == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
		if (i == 0 || i == 1)
			p->compact = i;
		i = 0x55;
		EXPECT_RC(f, sop_pool_get_compaction(p->h, &i), CUDA_SUCCESS);
		EXPECT(f, i == p->compact, "compaction reads %d, set %d", i, p->compact);
		EXPECT_RC(f, sop_pool_get_compaction(p->h, NULL), CUDA_ERROR_INVALID_VALUE);
		break;
	case 7: {
		size_t largest = 1, total = 2;
		cuuint64_t reserved;
		note(f, "free extents of %p", (void *)p->h);
		EXPECT_RC(f, sop_pool_get_free_extents(p->h, pick_n(f, 2) ? NULL : &largest, NULL),
			  CUDA_ERROR_INVALID_VALUE);
		EXPECT_RC(f, sop_pool_get_free_extents(p->h, NULL, &total),
			  CUDA_ERROR_INVALID_VALUE);
		EXPECT(f, largest == 1 && total == 2, "out-parameter written");
		EXPECT_RC(f, sop_pool_get_free_extents(p->h, &largest, &total), CUDA_SUCCESS);
		EXPECT_RC(f,
			  sop_pool_get_attr(p->h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
			  CUDA_SUCCESS);
		EXPECT(f, largest <= total && total <= reserved,
		       "free extents: largest %zu, total %zu, reserved %llu", largest, total,
		       (unsigned long long)reserved);
		break;
	}
	default: {
		cuuint64_t before, after;
		size_t keep = pick_n(f, 4) == 0 ? SIZE_MAX : (size_t)(rnd(f) % (64 * MiB));
		EXPECT_RC(f, sop_pool_get_attr(p->h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &before),
			  CUDA_SUCCESS);
		note(f, "sop_trim_to(%p, %zu) holding %llu", (void *)p->h, keep,
		     (unsigned long long)before);
		EXPECT_RC(f, sop_trim_to(p->h, keep), CUDA_SUCCESS);
		EXPECT_RC(f, sop_pool_get_attr(p->h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &after),
			  CUDA_SUCCESS);
		EXPECT(f, after <= before, "a trim grew the pool from %llu to %llu",
		       (unsigned long long)before, (unsigned long long)after);
		break;
	}
	}
}

static void
op_access(struct fuzzer *f)
{
	int slot = any_live_pool(f), i, n;
	struct pool_slot *p;
	CUmemAccessDesc d[3];
	CUresult want = CUDA_SUCCESS, r;
	bool peer;
	CUmemAccess_flags fl;
	CUmemLocation loc;

	if (slot < 0)
		return;
	p = &f->pools[slot];
	peer = p->peer;
	n = (int)pick_n(f, 4);
	memset(d, 0, sizeof d);
	for (i = 0; i < n; i++) {
		CUresult e = CUDA_SUCCESS;
		d[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		d[i].location.id = (int)pick_n(f, 2);
		d[i].flags = pick_n(f, 2) ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
					  : CU_MEM_ACCESS_FLAGS_PROT_NONE;
		switch (pick_n(f, 10)) {
		case 0:
			d[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
			e = CUDA_ERROR_NOT_SUPPORTED;
			break;
		case 1:
			d[i].location.type = CU_MEM_LOCATION_TYPE_HOST;
			e = CUDA_ERROR_NOT_SUPPORTED;
			break;
		case 2:
			d[i].location.id = pick_n(f, 2) ? -1 : n_devices + (int)pick_n(f, 1000);
			e = CUDA_ERROR_INVALID_DEVICE;
			break;
		case 3:
			d[i].flags = (CUmemAccess_flags)(4 + pick_n(f, 100));
			e = CUDA_ERROR_INVALID_VALUE;
			break;
		default:
			if (d[i].location.id == p->dev &&
			    d[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE)
				e = CUDA_ERROR_INVALID_DEVICE;
		}
		if (want == CUDA_SUCCESS)
			want = e;
		if (e == CUDA_SUCCESS && d[i].location.id != p->dev)
			peer = d[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	}
	if (pick_n(f, 10) == 0 && n) {
		note(f, "sop_pool_set_access(%p, NULL, %d)", (void *)p->h, n);
		EXPECT_RC(f, sop_pool_set_access(p->h, NULL, (size_t)n), CUDA_ERROR_INVALID_VALUE);
	} else {
		r = sop_pool_set_access(p->h, d, (size_t)n);
		note(f, "sop_pool_set_access(%p, %d descriptors) = %d", (void *)p->h, n, (int)r);
		EXPECT_RC(f, r, want);
		if (r == CUDA_SUCCESS)
			p->peer = peer;
	}
	/* Either all or none applied. */
	for (i = 0; i < 2; i++) {
		loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
		loc.id = i;
		EXPECT_RC(f, sop_pool_get_access(&fl, p->h, &loc), CUDA_SUCCESS);
		EXPECT(f,
		       fl == (i == p->dev || p->peer ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
						    : CU_MEM_ACCESS_FLAGS_PROT_NONE),
		       "device %d has access %d to pool %p", i, (int)fl, (void *)p->h);
	}
	fl = (CUmemAccess_flags)77;
	loc.id = 1000;
	EXPECT(f, sop_pool_get_access(&fl, p->h, &loc) != CUDA_SUCCESS && fl == 77,
	       "access of a device that does not exist");
	EXPECT_RC(f, sop_pool_get_access(NULL, p->h, &loc), CUDA_ERROR_INVALID_VALUE);
	EXPECT_RC(f, sop_pool_get_access(&fl, p->h, NULL), CUDA_ERROR_INVALID_VALUE);
}

static void
op_device_pools(struct fuzzer *f)
{
	sop_pool_t h = (sop_pool_t)(uintptr_t)0x99;
	int dev = (int)pick_n(f, 2), slot;
	int bad_dev = pick_n(f, 2) ? -1 - (int)pick_n(f, 3) : n_devices + (int)pick_n(f, 1000);

	note(f, "device pools, device %d, bad device %d", dev, bad_dev);
	EXPECT_RC(f, sop_device_get_default_pool(NULL, dev), CUDA_ERROR_INVALID_VALUE);
	EXPECT(f, sop_device_get_default_pool(&h, bad_dev) != CUDA_SUCCESS, "bad device");
	EXPECT_RC(f, sop_device_set_pool(bad_dev, f->pools[dev].h), CUDA_ERROR_INVALID_DEVICE);
	EXPECT(f, sop_device_get_pool(&h, bad_dev) != CUDA_SUCCESS, "bad device");
	EXPECT_RC(f, sop_device_get_pool(NULL, dev), CUDA_ERROR_INVALID_VALUE);
	EXPECT(f, h == (sop_pool_t)(uintptr_t)0x99, "out-parameter written");
	EXPECT_RC(f, sop_device_get_default_pool(&h, dev), CUDA_SUCCESS);
	EXPECT(f, h == f->pools[dev].h, "default pool changed");
	if (f->shared)
		return;
	slot = any_live_pool(f);
	if (slot >= 0 && pick_n(f, 2)) {
		CUresult want = f->pools[slot].dev == dev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
		note(f, "sop_device_set_pool(%d, %p)", dev, (void *)f->pools[slot].h);
		EXPECT_RC(f, sop_device_set_pool(dev, f->pools[slot].h), want);
		if (want == CUDA_SUCCESS)
			f->cur[dev] = slot;
	}
	EXPECT_RC(f, sop_device_get_pool(&h, dev), CUDA_SUCCESS);
	EXPECT(f, h == f->pools[f->cur[dev]].h, "device %d's pool is %p, expected %p", dev,
	       (void *)h, (void *)f->pools[f->cur[dev]].h);
}

/* ---- Allocation and free -------------------------------------------------------------------- */

static size_t
any_size(struct fuzzer *f, bool *huge)
{
	unsigned e;

	*huge = true;
	switch (pick_n(f, 32)) {
	case 0:
		*huge = false;
		return 0;
	case 1:
		return SIZE_MAX;
	case 2:
		return SIZE_MAX - pick_n(f, 4096);
	case 3:
		return (size_t)1 << (41 + pick_n(f, 22));
	case 4:
		return ((size_t)1 << 41) + 1;
	}
	*huge = false;
	e = pick_n(f, 24); /* 1 B .. 16 MiB, log-uniform */
	return ((size_t)1 << e) + rnd(f) % ((size_t)1 << e);
}

static void
alloc_done(struct fuzzer *f, int slot, void *ptr, size_t size, size_t cap_used)
{
	unsigned char *p = ptr;
	int i;

	EXPECT(f, p != NULL && ((uintptr_t)p & 511) == 0, "bad pointer %p", ptr);
	for (i = 0; i < f->n_live; i++)
		EXPECT(f, p + size <= f->live[i].p || f->live[i].p + f->live[i].size <= p,
		       "%p (%zu bytes) overlaps the live %p (%zu bytes)", ptr, size,
		       (void *)f->live[i].p, f->live[i].size);
	if (f->pools[slot].cap)
		EXPECT(f, cap_used + size <= f->pools[slot].cap,
		       "pool %p, capped at %zu, serves %zu bytes with %zu in use",
		       (void *)f->pools[slot].h, f->pools[slot].cap, size, cap_used);
	/* Mapped, readable and writable: the first and last bytes carry a tag until the free. */
	f->live[f->n_live].tag = (unsigned char)(rnd(f) | 1);
	p[0] = p[size - 1] = f->live[f->n_live].tag;
	f->live[f->n_live].p = p;
	f->live[f->n_live].size = size;
	f->live[f->n_live].pool = slot;
	f->n_live++;
}

static void
op_alloc(struct fuzzer *f)
{
	bool huge, null_out = pick_n(f, 24) == 0, current = !f->shared && pick_n(f, 4) == 0;
	size_t size = any_size(f, &huge);
	struct pick s = pick_n(f, 4) ? live_stream(f) : any_stream(f);
	void *p = (void *)0x1;
	int slot;
	CUresult r;

	if (f->n_live == LIVE)
		return;
	if (current) {
		/* The current pool of the stream's device. */
		int dev = s.ctx == CTX_DEV1 ? 1 : 0;
		slot = f->cur[dev];
		r = sop_malloc_async(null_out ? NULL : &p, size, s.h);
		note(f, "sop_malloc_async(%zu, stream %p%s) = %d, %p", size, (void *)s.h,
		     s.valid ? "" : " dead", (int)r, p);
		if (null_out) {
			EXPECT_RC(f, r, CUDA_ERROR_INVALID_VALUE);
			return;
		}
	} else {
		sop_pool_t h;
		slot = any_live_pool(f);
		if (slot < 0 || pick_n(f, 16) == 0) {
			slot = -1;
			h = bad_pool(f);
		} else {
			h = f->pools[slot].h;
		}
		r = sop_malloc_from_pool_async(null_out ? NULL : &p, size, h, s.h);
		note(f, "sop_malloc_from_pool_async(%zu, %p, stream %p%s) = %d, %p", size,
		     (void *)h, (void *)s.h, s.valid ? "" : " dead", (int)r, p);
		if (null_out || slot < 0) {
			EXPECT_RC(f, r, CUDA_ERROR_INVALID_VALUE);
			EXPECT(f, p == (void *)0x1, "out-parameter written");
			return;
		}
		if (size == 0) {
			/* Before the stream is looked at. */
			EXPECT_RC(f, r, CUDA_SUCCESS);
			EXPECT(f, p == NULL, "size 0 gave %p", p);
			return;
		}
	}
	if (!s.valid && (r != CUDA_SUCCESS || !s.unknown)) {
		EXPECT(f, r != CUDA_SUCCESS, "a dead stream %p was accepted", (void *)s.h);
		EXPECT(f, p == (void *)0x1, "out-parameter written");
		return;
	}
	if (size == 0) {
		EXPECT_RC(f, r, CUDA_SUCCESS);
		EXPECT(f, p == NULL, "size 0 gave %p", p);
		return;
	}
	if (huge) {
		EXPECT_RC(f, r, CUDA_ERROR_OUT_OF_MEMORY);
		EXPECT(f, p == (void *)0x1, "out-parameter written");
		return;
	}
	if (r == CUDA_ERROR_OUT_OF_MEMORY) {
		EXPECT(f, p == (void *)0x1, "out-parameter written");
		return;
	}
	EXPECT_RC(f, r, CUDA_SUCCESS);
	alloc_done(f, slot, p, size, (size_t)model_used(f, slot));
}

/* Before the free (after it, the memory may be gone): nobody else was given the block. */
static void
tag_check(struct fuzzer *f, int i)
{
	struct alloc a = f->live[i];

	EXPECT(f, a.p[0] == a.tag && a.p[a.size - 1] == a.tag,
	       "the tag of %p (%zu bytes) changed: someone else was given it", (void *)a.p, a.size);
}

static void
free_done(struct fuzzer *f, int i)
{
	struct alloc a = f->live[i];

	f->live[i] = f->live[--f->n_live];
	remember_freed(f, a.p);
	if (f->pools[a.pool].state == P_DESTROYED)
		pool_gone(f, a.pool);
}

static void
op_free(struct fuzzer *f)
{
	int i;
	struct pick s;
	CUresult r;

	if (!f->n_live)
		return;
	i = (int)pick_n(f, (unsigned)f->n_live);
	tag_check(f, i);
	if (pick_n(f, 10) == 0) {
		/* sop_free: the caller vouches nothing uses it, true here (nothing ever does). */
		note(f, "sop_free(%p)", (void *)f->live[i].p);
		EXPECT_RC(f, sop_free(f->live[i].p), CUDA_SUCCESS);
		free_done(f, i);
		return;
	}
	s = pick_n(f, 8) ? live_stream(f) : any_stream(f);
	r = sop_free_async(f->live[i].p, s.h);
	note(f, "sop_free_async(%p, stream %p%s) = %d", (void *)f->live[i].p, (void *)s.h,
	     s.valid ? "" : " dead", (int)r);
	if (s.valid) {
		EXPECT_RC(f, r, CUDA_SUCCESS);
	} else if (r != CUDA_SUCCESS) {
		/* Refused, and the block is still allocated. */
		sop_pool_t owner;
		EXPECT_RC(f, sop_pointer_get_pool(&owner, f->live[i].p), CUDA_SUCCESS);
		return;
	}
	free_done(f, i);
}

static void
op_bad_free(struct fuzzer *f)
{
	static char host_static[64];
	char host_stack[16];
	struct pick s = any_stream(f);
	void *p = NULL;
	int i;

	switch (pick_n(f, 7)) {
	case 0:
		/* Freed already, and not handed out again since (by this fuzzer: with others
		 * running, a pool of theirs may have the addresses now). */
		if (!f->n_freed || f->shared)
			return;
		p = f->freed[pick_n(f, (unsigned)f->n_freed)];
		if (live_index(f, p) >= 0)
			return;
		break;
	case 1:
		if (!f->n_live)
			return;
		i = (int)pick_n(f, (unsigned)f->n_live);
		p = f->live[i].p + 1 + rnd(f) % (f->live[i].size > 1 ? f->live[i].size - 1 : 1);
		if (f->live[i].size == 1)
			p = f->live[i].p + 512; /* past the end, inside the block's rounding */
		break;
	case 2:
		p = pick_n(f, 2) ? (void *)host_stack : (void *)(host_static + pick_n(f, 64));
		break;
	case 3:
		p = (void *)(uintptr_t)(rnd(f) & ~(uint64_t)511);
		break;
	case 4:
		p = (void *)(uintptr_t)((uint64_t)1 << 63 | (rnd(f) & ~(uint64_t)511));
		break;
	case 5:
		p = (void *)(uintptr_t)(UINTPTR_MAX - (rnd(f) & 4095));
		break;
	default:
		/* Inside a pool's reservation, at a block boundary that is no block start. */
		if (!f->n_live)
			return;
		i = (int)pick_n(f, (unsigned)f->n_live);
		p = f->live[i].p + ((f->live[i].size + 511) & ~(size_t)511) +
		    512 * (size_t)pick_n(f, 8192);
		break;
	}
	if (!p)
		return; /* freeing NULL is fine */
	for (i = 0; i < f->n_live; i++)
		if (f->live[i].p == p)
			return; /* a live allocation's start: that free would be good */
	{
		/* A pointer that is no allocation's start, on any stream, by either free. */
		bool sync = pick_n(f, 4) == 0;
		CUresult r = sync ? sop_free(p) : sop_free_async(p, s.h);
		sop_pool_t owner = (sop_pool_t)(uintptr_t)0x42;
		note(f, "bad %s(%p) = %d", sync ? "sop_free" : "sop_free_async", p, (int)r);
		/* A dead stream may be refused first, with the driver's code. */
		if (sync || s.valid)
			EXPECT_RC(f, r, CUDA_ERROR_INVALID_VALUE);
		else
			EXPECT(f, r != CUDA_SUCCESS, "a bad free was accepted");
		r = sop_pointer_get_pool(&owner, p);
		if (live_index(f, p) < 0) {
			EXPECT_RC(f, r, CUDA_ERROR_INVALID_VALUE);
			EXPECT(f, owner == (sop_pool_t)(uintptr_t)0x42, "out-parameter written");
		} else {
			EXPECT_RC(f, r, CUDA_SUCCESS);
		}
	}
}

static void
op_lookup(struct fuzzer *f)
{
	sop_pool_t owner = NULL;
	struct alloc *a;
	CUresult r;

	if (!f->n_live) {
		EXPECT_RC(f, sop_pointer_get_pool(&owner, NULL), CUDA_ERROR_INVALID_VALUE);
		return;
	}
	a = &f->live[pick_n(f, (unsigned)f->n_live)];
	EXPECT_RC(f, sop_pointer_get_pool(NULL, a->p), CUDA_ERROR_INVALID_VALUE);
	r = sop_pointer_get_pool(&owner, a->p + rnd(f) % a->size);
	note(f, "sop_pointer_get_pool(inside %p) = %d, %p", (void *)a->p, (int)r, (void *)owner);
	if (f->pools[a->pool].state == P_LIVE) {
		EXPECT_RC(f, r, CUDA_SUCCESS);
		EXPECT(f, owner == f->pools[a->pool].h, "owner %p, expected %p", (void *)owner,
		       (void *)f->pools[a->pool].h);
	} else {
		/* A destroyed pool's last allocations: its old handle, or none. */
		EXPECT(f, r == CUDA_ERROR_INVALID_VALUE || owner == f->pools[a->pool].h,
		       "owner of an allocation of a destroyed pool: %d, %p", (int)r, (void *)owner);
	}
}

/* ---- Streams, events, contexts -------------------------------------------------------------- */

static CUresult
in_ctx(struct fuzzer *f, enum ctx_kind k)
{
	return th.cuCtxPushCurrent(f->ctx[k]);
}

static void
out_ctx(void)
{
	CUcontext c;

	TH_OK(th.cuCtxPopCurrent(&c));
}

static void
op_stream(struct fuzzer *f)
{
	struct stream_slot *s = &f->streams[pick_n(f, N_STREAMS)];
	struct pick p;
	CUresult r;

	switch (pick_n(f, 6)) {
	case 0:
	case 1:
		if (s->live) {
			bool by_sop = pick_n(f, 3) != 0;
			/* Busy or not, through sop or behind its back. */
			r = by_sop ? sop_stream_destroy(s->h) : th.cuStreamDestroy(s->h);
			note(f, "%s(%p) = %d", by_sop ? "sop_stream_destroy" : "cuStreamDestroy",
			     (void *)s->h, (int)r);
			EXPECT_RC(f, r, CUDA_SUCCESS);
			s->live = false;
		} else {
			enum ctx_kind k = (enum ctx_kind)pick_n(f, f->made ? 3 : 2);
			if (k == CTX_DEV1 && n_devices < 2)
				k = CTX_DEV0;
			TH_OK(in_ctx(f, k));
			TH_OK(th.cuStreamCreate(&s->h, pick_n(f, 2) ? CU_STREAM_NON_BLOCKING
								      : CU_STREAM_DEFAULT));
			out_ctx();
			{
				unsigned long long id = 0;
				TH_OK(sop__drv.cuStreamGetId(s->h, &id));
				note(f, "new stream %p in context %d, id %llu", (void *)s->h,
				     (int)k, id);
			}
			s->live = true;
			s->ctx = k;
		}
		break;
	case 2:
		/* Destroying what is not a stream (any more). */
		p = any_stream(f);
		if ((p.valid || p.unknown) && !p.special)
			return;
		r = sop_stream_destroy(p.h);
		note(f, "sop_stream_destroy(%p, not a stream) = %d", (void *)p.h, (int)r);
		EXPECT(f, r != CUDA_SUCCESS, "a dead or special stream was destroyed");
		break;
	case 3:
	case 4:
		p = any_stream(f);
		r = sop_stream_synchronize(p.h);
		note(f, "sop_stream_synchronize(%p%s) = %d", (void *)p.h, p.valid ? "" : " dead",
		     (int)r);
		if (p.valid)
			EXPECT_RC(f, r, CUDA_SUCCESS);
		else if (!p.unknown)
			EXPECT(f, r != CUDA_SUCCESS, "a dead stream was synchronized");
		break;
	default:
		note(f, "sop_ctx_synchronize()");
		EXPECT_RC(f, sop_ctx_synchronize(), CUDA_SUCCESS);
		break;
	}
}

static void
op_event(struct fuzzer *f)
{
	struct event_slot *e = &f->events[pick_n(f, N_EVENTS)];
	struct event_slot *named = e->h ? event_named(f, e->h) : NULL;
	struct pick s = any_stream(f);
	CUresult r;

	if (!named)
		th.sim_event_dead_ok(e->h); /* named on purpose, as any_stream's streams */

	switch (pick_n(f, 8)) {
	case 0:
		if (e->live) {
			bool by_sop = pick_n(f, 2) != 0;
			/* Recorded and waited on, maybe still pending: destroyed under use. */
			r = by_sop ? sop_event_destroy(e->h) : th.cuEventDestroy(e->h);
			note(f, "%s(%p) = %d", by_sop ? "sop_event_destroy" : "cuEventDestroy",
			     (void *)e->h, (int)r);
			EXPECT_RC(f, r, CUDA_SUCCESS);
			e->live = false;
		} else {
			enum ctx_kind k = (enum ctx_kind)pick_n(f, f->made ? 3 : 2);
			if (k == CTX_DEV1 && n_devices < 2)
				k = CTX_DEV0;
			TH_OK(in_ctx(f, k));
			TH_OK(th.cuEventCreate(&e->h, CU_EVENT_DISABLE_TIMING));
			out_ctx();
			note(f, "new event %p in context %d", (void *)e->h, (int)k);
			e->live = true;
			e->ctx = k;
		}
		break;
	case 1:
	case 2:
	case 3:
		/* Not on a dead handle: the driver may have given it to one of sop's own events,
		 * which a program that records it has no business touching. */
		if (!named)
			return;
		r = sop_event_record(e->h, s.h);
		note(f, "sop_event_record(%p, %p%s) = %d", (void *)e->h, (void *)s.h,
		     s.valid ? "" : " dead", (int)r);
		if (s.valid && named->ctx == s.ctx)
			EXPECT_RC(f, r, CUDA_SUCCESS);
		else if (!s.unknown)
			EXPECT(f, r != CUDA_SUCCESS, "a bad record was accepted");
		break;
	case 4:
	case 5: {
		unsigned flags = pick_n(f, 8) == 0 ? 2u + pick_n(f, 100) : 0;
		if (!e->h)
			return;
		/* A dead handle may name one of sop's events now: any answer but a crash. */
		r = sop_stream_wait_event(s.h, e->h, flags);
		note(f, "sop_stream_wait_event(%p%s, %p%s, %u) = %d", (void *)s.h,
		     s.valid ? "" : " dead", (void *)e->h, named ? "" : " dead", flags, (int)r);
		if (named && s.valid && !flags)
			EXPECT_RC(f, r, CUDA_SUCCESS);
		else if (flags || (named && !s.unknown))
			EXPECT(f, r != CUDA_SUCCESS, "a bad wait was accepted");
		break;
	}
	case 6:
		if (!e->h)
			return;
		r = sop_event_synchronize(e->h);
		note(f, "sop_event_synchronize(%p%s) = %d", (void *)e->h, named ? "" : " dead",
		     (int)r);
		if (named)
			EXPECT_RC(f, r, CUDA_SUCCESS);
		break;
	default:
		/* Recorded, waited on and destroyed at once, under use; the value may go to the
		 * next event made, whose records must not be taken for this one's. */
		if (!named || !s.valid || named->ctx != s.ctx)
			return;
		note(f, "event %p recorded on %p, waited on, destroyed", (void *)e->h, (void *)s.h);
		EXPECT_RC(f, sop_event_record(e->h, s.h), CUDA_SUCCESS);
		EXPECT_RC(f, sop_stream_wait_event(live_stream(f).h, e->h, 0), CUDA_SUCCESS);
		EXPECT_RC(f, pick_n(f, 2) ? sop_event_destroy(e->h) : th.cuEventDestroy(e->h),
			  CUDA_SUCCESS);
		named->live = false; /* e may be a dead slot whose value a live one has now */
		break;
	}
}

/* A context made with cuCtxCreate, or destroyed with its streams and events. */
static void
op_context(struct fuzzer *f)
{
	int i;

	if (!f->made) {
		TH_OK(th.cuCtxCreate(&f->ctx[CTX_MADE], NULL, 0, 0));
		out_ctx(); /* cuCtxCreate made it current */
		f->made = true;
		note(f, "cuCtxCreate: %p", (void *)f->ctx[CTX_MADE]);
		return;
	}
	/* sop learns that the frees on the context's streams are complete at a synchronization
	 * of the context (it records no probes there, order.c): without it, they would stay
	 * pending for good once the context is gone. */
	note(f, "sop_ctx_synchronize in %p, then cuCtxDestroy", (void *)f->ctx[CTX_MADE]);
	TH_OK(in_ctx(f, CTX_MADE));
	EXPECT_RC(f, sop_ctx_synchronize(), CUDA_SUCCESS);
	out_ctx();
	TH_OK(th.cuCtxDestroy(f->ctx[CTX_MADE]));
	f->made = false;
	for (i = 0; i < N_STREAMS; i++)
		if (f->streams[i].ctx == CTX_MADE)
			f->streams[i].live = false;
	for (i = 0; i < N_EVENTS; i++)
		if (f->events[i].ctx == CTX_MADE)
			f->events[i].live = false;
}

/* Calls with another current context, or none. */
static void
op_current(struct fuzzer *f)
{
	void *p = (void *)0x1;
	int slot = any_live_pool(f);
	CUresult r;

	if (pick_n(f, 2)) {
		TH_OK(th.cuCtxSetCurrent(NULL));
		note(f, "no current context");
		EXPECT_RC(f, sop_malloc_async(&p, 4096, NULL), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT_RC(f, sop_malloc_async(&p, 4096, CU_STREAM_PER_THREAD),
			  CUDA_ERROR_INVALID_CONTEXT);
		if (slot >= 0) {
			EXPECT_RC(f, sop_malloc_from_pool_async(&p, 4096, f->pools[slot].h,
								CU_STREAM_LEGACY),
				  CUDA_ERROR_INVALID_CONTEXT);
		}
		EXPECT(f, p == (void *)0x1, "out-parameter written");
		if (f->n_live) {
			int i = (int)pick_n(f, (unsigned)f->n_live);
			EXPECT(f, sop_free_async(f->live[i].p, NULL) != CUDA_SUCCESS,
			       "a free on the legacy stream of no context");
		}
		EXPECT(f, sop_ctx_synchronize() != CUDA_SUCCESS, "synchronized no context");
		EXPECT(f, sop_stream_synchronize(NULL) != CUDA_SUCCESS, "synchronized no stream");
		/* A stream names its context: no current one needed. */
		if (slot >= 0 && f->n_live < LIVE) {
			struct pick s = live_stream(f);
			if (!s.special) {
				size_t size = 1 + pick_n(f, 100000);
				r = sop_malloc_from_pool_async(&p, size, f->pools[slot].h, s.h);
				note(f, "no context: alloc %zu on %p = %d", size, (void *)s.h,
				     (int)r);
				if (r != CUDA_ERROR_OUT_OF_MEMORY) {
					EXPECT_RC(f, r, CUDA_SUCCESS);
					alloc_done(f, slot, p, size, (size_t)model_used(f, slot));
				}
			}
		}
		TH_OK(th.cuCtxSetCurrent(prim[0]));
		return;
	}
	{
		/* The special streams of another context: device 1's primary, or a made one. */
		enum ctx_kind k = f->made && pick_n(f, 2) ? CTX_MADE : CTX_DEV1;
		int dev = k == CTX_DEV1 ? 1 : 0;
		CUstream special = pick_n(f, 2) ? NULL : CU_STREAM_PER_THREAD;

		if ((k == CTX_DEV1 && n_devices < 2) || f->n_live == LIVE)
			return;
		TH_OK(in_ctx(f, k));
		if (f->shared || pick_n(f, 2)) {
			if (slot < 0) {
				out_ctx();
				return;
			}
			r = sop_malloc_from_pool_async(&p, 4096, f->pools[slot].h, special);
		} else {
			slot = f->cur[dev];
			r = sop_malloc_async(&p, 4096, special);
		}
		note(f, "in context %d: alloc from %p on %p = %d", (int)k, (void *)f->pools[slot].h,
		     (void *)special, (int)r);
		if (r != CUDA_ERROR_OUT_OF_MEMORY) {
			EXPECT_RC(f, r, CUDA_SUCCESS);
			alloc_done(f, slot, p, 4096, (size_t)model_used(f, slot));
			if (pick_n(f, 2)) {
				/* And back on the same special stream, of the same context. */
				tag_check(f, f->n_live - 1);
				EXPECT_RC(f, sop_free_async(p, special), CUDA_SUCCESS);
				free_done(f, f->n_live - 1);
			}
		}
		out_ctx();
	}
}

static void
op_misc(struct fuzzer *f)
{
	size_t n = 0;
	const char *names[4];
	unsigned long long counts[4];

	switch (pick_n(f, 3)) {
	case 0:
		EXPECT_RC(f, sop_driver_calls(NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
		n = 4;
		EXPECT_RC(f, sop_driver_calls(NULL, counts, &n), CUDA_ERROR_INVALID_VALUE);
		EXPECT_RC(f, sop_driver_calls(names, NULL, &n), CUDA_ERROR_INVALID_VALUE);
		n = 0;
		EXPECT_RC(f, sop_driver_calls(NULL, NULL, &n), CUDA_SUCCESS);
		EXPECT(f, n > 4, "sop uses %zu entry points", n);
		n = 4;
		EXPECT_RC(f, sop_driver_calls(names, counts, &n), CUDA_SUCCESS);
		break;
	default:
		op_bad_pool_calls(f);
		break;
	}
}

/* ---- After every step ----------------------------------------------------------------------- */

static int
count_live_streams(struct fuzzer *f)
{
	int i, n = 0;

	for (i = 0; i < N_STREAMS; i++)
		n += f->streams[i].live;
	return n;
}

static int
count_live_events(struct fuzzer *f)
{
	int i, n = 0;

	for (i = 0; i < N_EVENTS; i++)
		n += f->events[i].live;
	return n;
}

/* Physical memory of every pool sop still has (destroyed ones waiting for their last frees
 * too), and how many there are. */
static void
pools_held(size_t *reserved, long *n)
{
	struct sop__pin *pin = sop__pin();
	struct sop_pool **all;
	size_t i, count;

	all = sop__registry_snapshot(&count);
	*reserved = 0;
	for (i = 0; i < count; i++)
		*reserved += atomic_load(&all[i]->reserved);
	*n = (long)count;
	free(all);
	sop__unpin(pin);
}

static void
agree(struct fuzzer *f)
{
	int k, line;

	for (k = f->shared ? 2 : 0; k < N_POOLS; k++) {
		struct pool_slot *p = &f->pools[k];
		struct sop_pool *sp;
		if (p->state == P_NONE)
			continue;
		sp = TH_POOL(p->h);
		if (p->state == P_LIVE)
			EXPECT(f, sp != NULL, "live pool %p not found", (void *)p->h);
		line = sop__pool_check(sp);
		EXPECT(f, !line, "pool %p: check failed at check.c:%d", (void *)p->h, line);
		if (p->state == P_LIVE) {
			cuuint64_t used = 0, high = 0, reserved = 0;
			EXPECT_RC(f,
				  sop_pool_get_attr(p->h, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used),
				  CUDA_SUCCESS);
			EXPECT(f, used == model_used(f, k),
			       "pool %p uses %llu bytes, the model %llu", (void *)p->h,
			       (unsigned long long)used, (unsigned long long)model_used(f, k));
			EXPECT_RC(f, sop_pool_get_attr(p->h, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &high),
				  CUDA_SUCCESS);
			EXPECT(f, high >= used, "used high %llu below used %llu",
			       (unsigned long long)high, (unsigned long long)used);
			EXPECT_RC(f,
				  sop_pool_get_attr(p->h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
						    &reserved),
				  CUDA_SUCCESS);
			EXPECT(f, !p->cap || reserved <= p->cap,
			       "pool %p holds %llu over its cap %zu", (void *)p->h,
			       (unsigned long long)reserved, p->cap);
		}
	}
	if (f->n_stale) {
		cuuint64_t v = 99;
		sop_pool_t h = f->stale[pick_n(f, (unsigned)f->n_stale)];
		EXPECT_RC(f, sop_pool_get_attr(h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v),
			  CUDA_ERROR_INVALID_VALUE);
		EXPECT(f, v == 99, "out-parameter written");
	}
	if (!f->shared) {
		/* The driver's objects: the fuzzer's streams and contexts exactly (sop makes
		 * none), events no more than the fuzzer's and four probes per stream record sop
		 * may keep, memory as the pools say plus an anchor each. */
		struct sim_live l = th_live();
		size_t reserved;
		long n_pools;

		if (l.streams != count_live_streams(f))
			for (k = 0; k < N_STREAMS; k++)
				fprintf(stderr, "stream slot %d: %p live %d ctx %d\n", k,
					(void *)f->streams[k].h, f->streams[k].live,
					(int)f->streams[k].ctx);
		EXPECT(f, l.streams == count_live_streams(f),
		       "the driver has %ld streams, the fuzzer %d", l.streams,
		       count_live_streams(f));
		EXPECT(f, l.contexts == (long)f->made, "the driver has %ld contexts", l.contexts);
		EXPECT(f, l.events >= count_live_events(f) &&
			   l.events <= count_live_events(f) + PROBES_MAX,
		       "the driver has %ld events, the fuzzer %d", l.events, count_live_events(f));
		pools_held(&reserved, &n_pools);
		EXPECT(f,
		       l.phys_bytes >= reserved &&
			       l.phys_bytes <= reserved + (size_t)n_pools * granularity,
		       "the driver holds %zu bytes, %ld pools %zu", l.phys_bytes, n_pools,
		       reserved);
		EXPECT(f, l.reservations == n_pools,
		       "the driver has %ld reservations, sop %ld pools", l.reservations, n_pools);
		EXPECT(f, l.mappings >= l.handles - n_pools && l.mappings <= l.handles + n_pools,
		       "the driver has %ld mappings of %ld handles", l.mappings, l.handles);
	}
}

/* ---- A run ---------------------------------------------------------------------------------- */

static void
fuzzer_init(struct fuzzer *f, uint64_t seed, bool shared)
{
	memset(f, 0, sizeof *f);
	f->seed = seed;
	f->shared = shared;
	f->rng = 0x9E3779B97F4A7C15u * (seed + 1) ^ 0xD1B54A32D192ED03u;
	f->ctx[CTX_DEV0] = prim[0];
	f->ctx[CTX_DEV1] = prim[n_devices > 1];
	for (int d = 0; d < 2; d++) {
		struct pool_slot *p = &f->pools[d];
		TH_OK(sop_device_get_default_pool(&p->h, d < n_devices ? d : 0));
		p->state = P_LIVE;
		p->dev = d;
		p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
		f->cur[d] = d;
		if (!shared) {
			/* The defaults as new, whatever an earlier seed left. */
			cuuint64_t zero = 0;
			int one = 1;
			for (int k = 0; k < 3; k++)
				TH_OK(sop_pool_set_attr(p->h, reuse_attrs[k], &one));
			TH_OK(sop_pool_set_attr(p->h, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero));
			TH_OK(sop_pool_set_compaction(p->h, 0));
			TH_OK(sop_device_set_pool(d, p->h));
			if (n_devices > 1) {
				CUmemAccessDesc none = {{CU_MEM_LOCATION_TYPE_DEVICE, !d},
							CU_MEM_ACCESS_FLAGS_PROT_NONE};
				TH_OK(sop_pool_set_access(p->h, &none, 1));
			}
		}
	}
}

/* What sop still holds, for a leak's report. */
static void
dump_pools(void)
{
	struct sop__pin *pin = sop__pin();
	size_t n, k;
	struct sop_pool **all = sop__registry_snapshot(&n);

	for (k = 0; k < n; k++) {
		struct sop__sstream *ss;
		fprintf(stderr, "pool %p, device %d, destroyed %d: reserved %zu, used %lld\n",
			(void *)(uintptr_t)all[k]->handle, all[k]->device, (int)all[k]->destroyed,
			(size_t)atomic_load(&all[k]->reserved),
			(long long)sop__pool_used(all[k], false));
		for (ss = all[k]->streams; ss; ss = ss->next)
			if (ss->cache.n_bytes)
				fprintf(stderr,
					"  stream id %llu holds %zu bytes of pending frees%s\n",
					(unsigned long long)ss->id, ss->cache.n_bytes,
					ss->gone ? " (stream gone)" : "");
	}
	free(all);
	sop__unpin(pin);
}

/* Free, destroy and synchronize everything the fuzzer made. */
static void
fuzzer_end(struct fuzzer *f)
{
	int i;

	f->op++;
	note(f, "the end");
	while (f->n_live) {
		struct pick s = live_stream(f);
		tag_check(f, f->n_live - 1);
		EXPECT_RC(f, sop_free_async(f->live[f->n_live - 1].p, s.h), CUDA_SUCCESS);
		free_done(f, f->n_live - 1);
	}
	for (i = 2; i < N_POOLS; i++)
		if (f->pools[i].state == P_LIVE)
			EXPECT_RC(f, sop_pool_destroy(f->pools[i].h), CUDA_SUCCESS);
	for (i = 0; i < N_EVENTS; i++)
		if (f->events[i].live)
			EXPECT_RC(f, sop_event_destroy(f->events[i].h), CUDA_SUCCESS);
	for (i = 0; i < N_STREAMS; i++)
		if (f->streams[i].live)
			EXPECT_RC(f, sop_stream_destroy(f->streams[i].h), CUDA_SUCCESS);
	if (f->made)
		op_context(f);
	EXPECT_RC(f, sop_ctx_synchronize(), CUDA_SUCCESS);
	if (n_devices > 1) {
		TH_OK(in_ctx(f, CTX_DEV1));
		EXPECT_RC(f, sop_ctx_synchronize(), CUDA_SUCCESS);
		out_ctx();
	}
	if (!f->shared)
		for (i = 0; i < 2; i++)
			EXPECT_RC(f, sop_trim_to(f->pools[i].h, 0), CUDA_SUCCESS);
}

static unsigned long
fuzz_run(struct fuzzer *f, unsigned long ops)
{
	for (f->op = 0; f->op < ops && !f->exhausted; f->op++) {
		unsigned r = pick_n(f, 100);

		/* No dead handle named on purpose yet. */
		th.sim_stream_dead_ok(NULL);
		th.sim_event_dead_ok(NULL);
		if (r < 30)
			op_alloc(f);
		else if (r < 52)
			op_free(f);
		else if (r < 58)
			op_bad_free(f);
		else if (r < 62)
			op_lookup(f);
		else if (r < 70)
			op_stream(f);
		else if (r < 80)
			op_event(f);
		else if (r < 81 && !f->shared)
			/* Not with other fuzzers: one may free on a stream of this one's context
			 * (at a handle dead to it), after the synchronization before the
			 * context's destruction, and sop learns of that free's completion at a
			 * synchronization of the context only (order.c). */
			op_context(f);
		else if (r < 83)
			op_current(f);
		else if (r < 85)
			op_pool_create(f);
		else if (r < 87)
			op_pool_destroy(f);
		else if (r < 94)
			op_attr(f);
		else if (r < 96)
			op_access(f);
		else if (r < 98)
			op_device_pools(f);
		else
			op_misc(f);
		agree(f);
	}
	fuzzer_end(f);
	return ops;
}

#ifndef SOP_FUZZ_LIBFUZZER
/* --threads: one fuzzer a thread. */
struct thread_arg {
	struct fuzzer f;
	unsigned long ops;
};

static void *
thread_fn(void *arg)
{
	struct thread_arg *a = arg;

	TH_OK(th.cuCtxSetCurrent(prim[0]));
	fuzz_run(&a->f, a->ops);
	return NULL;
}

#endif

static struct sim_live base;

/* The driver, both devices' primary contexts and default pools, and the baseline of its live
 * objects. */
static void
setup(void)
{
	th_init();
	th_require_sim();
	n_devices = th_n_devices < 2 ? th_n_devices : 2;
	TH_OK(sop__drv.cuDevicePrimaryCtxRetain(&prim[0], 0));
	prim[1] = prim[0];
	if (n_devices > 1)
		TH_OK(sop__drv.cuDevicePrimaryCtxRetain(&prim[1], 1));
	{
		sop_pool_t def;
		TH_OK(sop_device_get_default_pool(&def, 0));
		granularity = TH_POOL(def)->granularity;
		if (n_devices > 1)
			TH_OK(sop_device_get_default_pool(&def, 1));
	}
	base = th_live();
}

/* Everything gone: the driver's objects are back where they started, but for an anchor each
 * default pool may keep, the primary context sop retains for its probes on each device, and the
 * probes of stream records not yet swept. */
static bool
nothing_leaked(uint64_t seed)
{
	struct sim_live end = th_live();

	if (end.streams != base.streams || end.events > base.events + PROBES_MAX ||
	    end.contexts != base.contexts || end.reservations != base.reservations ||
	    end.handles > base.handles + n_devices || end.mappings > base.mappings + n_devices ||
	    end.phys_bytes > base.phys_bytes + (size_t)n_devices * granularity ||
	    end.primary_ctx_refs > base.primary_ctx_refs + n_devices) {
		fprintf(stderr,
			"seed %llu: driver objects leaked: streams %ld/%ld events %ld/%ld "
			"contexts %ld/%ld reservations %ld/%ld handles %ld/%ld mappings "
			"%ld/%ld bytes %zu/%zu primary refs %ld/%ld\n",
			(unsigned long long)seed, end.streams, base.streams, end.events,
			base.events, end.contexts, base.contexts, end.reservations,
			base.reservations, end.handles, base.handles, end.mappings, base.mappings,
			end.phys_bytes, base.phys_bytes, end.primary_ctx_refs,
			base.primary_ctx_refs);
		dump_pools();
		return false;
	}
	return true;
}

#ifdef SOP_FUZZ_LIBFUZZER
/* libFuzzer's entry point (meson: test-fuzz-libfuzzer, clang only): the input is the sequence
 * of choices; each input runs from a fresh model to the end and its leak check. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct fuzzer f;
	static bool ready;

	if (!ready) {
		setup();
		ready = true;
	}
	fuzzer_init(&f, 0, false);
	f.data = data;
	f.left = size;
	fuzz_run(&f, ULONG_MAX);
	if (!nothing_leaked(0))
		abort();
	return 0;
}
#else
int
main(int argc, char **argv)
{
	unsigned long ops = 3000, seeds = 1, done = 0, total = 0;
	uint64_t seed = 1;
	double seconds = 0, start;
	int threads = 1, i;
	bool trace = false;
	static struct fuzzer f;

	for (i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : "0";
		if (!strcmp(argv[i], "--ops"))
			ops = strtoul(v, NULL, 0), i++;
		else if (!strcmp(argv[i], "--seed"))
			seed = strtoull(v, NULL, 0), i++;
		else if (!strcmp(argv[i], "--seeds"))
			seeds = strtoul(v, NULL, 0), i++;
		else if (!strcmp(argv[i], "--seconds"))
			seconds = atof(v), i++;
		else if (!strcmp(argv[i], "--threads"))
			threads = atoi(v), i++;
		else if (!strcmp(argv[i], "--trace"))
			trace = true;
	}
	setup();
	start = th_seconds();
	do {
		if (threads <= 1) {
			fuzzer_init(&f, seed + done, false);
			f.print_trace = trace;
			total += fuzz_run(&f, ops);
		} else {
			pthread_t t[64];
			struct thread_arg *a = calloc((size_t)threads, sizeof *a);
			TH_ASSERT(a && threads <= 64);
			for (i = 0; i < threads; i++) {
				fuzzer_init(&a[i].f, (seed + done) * 1000 + (uint64_t)i, true);
				a[i].f.print_trace = trace;
				a[i].ops = ops;
			}
			for (i = 0; i < threads; i++)
				TH_ASSERT(pthread_create(&t[i], NULL, thread_fn, &a[i]) == 0);
			for (i = 0; i < threads; i++)
				pthread_join(t[i], NULL);
			free(a);
			total += ops * (unsigned long)threads;
		}
		done++;
		if (!nothing_leaked(seed + done - 1))
			return 1;
	} while (seconds > 0 ? th_seconds() - start < seconds : done < seeds);
	printf("fuzz: seeds %llu..%llu, %d thread%s, %lu operations in %.1f s: the library agreed "
	       "with the model\n",
	       (unsigned long long)seed, (unsigned long long)(seed + done - 1), threads,
	       threads == 1 ? "" : "s", total, th_seconds() - start);
	return 0;
}
#endif
