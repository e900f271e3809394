/* order.c - what sop knows of streams and their order: who a stream is, per-stream epochs and
 * probe events. The dependencies that sop's waits and the application's events carry from
 * stream to stream, which this comment also describes, are event.c's.
 *
 * Who a stream is. The driver hands a destroyed stream's handle value to the next stream it
 * creates, at once, while the destroyed stream's work may still run, and a destroyed context's
 * handle to the next context: a handle value is not an identity. cuStreamGetId is (unique for the
 * process's lifetime, about 25 ns a call, and it scales across threads): a call that names a
 * stream asks it, and everything sop knows of a stream is keyed by it (stream.c has the one
 * exception, a free on the stream that allocated the block, and why it is safe; under the
 * interposer, which sees every destroy, a thread's last handle is answered from memory while no
 * stream was destroyed: sop__stream_id). Contexts are told apart by cuCtxGetId.
 *
 * Every stream sop has seen has one record here, shared by all pools. Its epoch is a counter
 * that frees read (a free on the stream is tagged with the epoch current at the call) and that
 * advances whenever sop marks a point in the stream: an event record, a probe, a
 * synchronization. The rule that makes this sound: the epoch advances *before* the driver call
 * that marks the point, so a free tagged with an epoch up to the marked one was called before
 * the mark, and its work was enqueued before the point.
 *
 * What sop learns, it learns in epochs:
 *  - `done`: frees on the stream up to this epoch are complete, seen by querying a probe event
 *    sop recorded on the stream, or by a synchronization of the stream or its context;
 *  - `deps`: streams and epochs this stream's future work is ordered after because sop made it
 *    wait for one of their probes (internal dependencies, and claims it followed);
 *  - `claims`: streams and epochs this stream's future work is ordered after according to events
 *    recorded with sop_event_record and waited on with sop_stream_wait_event. An event carries
 *    the recording stream's own epoch plus what that stream was ordered after, so dependencies
 *    compose the way stream order composes. A claim is only a claim: the application may have
 *    recorded the event again behind sop's back, or destroyed it and made a new event that the
 *    driver gave the same handle. sop acts on a claim only once one of its own probes proves it:
 *    it follows a claim by making the stream wait for a probe that covers the free (redundant, and
 *    free on the GPU, when the claim is true), and an event synchronization makes frees reusable
 *    only as far as the probes it then finds complete.
 *
 * Probes are sop's own events, recorded only inside a call that names the stream (so never on a
 * stream the application may have destroyed), and only on streams of a device's primary
 * context, which sop keeps alive (sop__driver_primary): an event lives and dies with its
 * context, and sop queries and waits on its probes long after the call that recorded them. A
 * stream of a context the application created gets no probes: its frees become reusable by
 * other streams at synchronizations of the stream or of its context.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* ---- Identity ----------------------------------------------------------------------------- */

/* A handle the driver refused: a special handle names a stream of the current context, so say
 * when there is none. */
static CUresult
stream_refused(CUstream stream, CUresult r)
{
	if (sop__stream_special(stream)) {
		CUcontext cur = NULL;
		if (SOP_DRV(cuCtxGetCurrent)(&cur) == CUDA_SUCCESS && !cur)
			return CUDA_ERROR_INVALID_CONTEXT;
	}
	return r;
}

static inline CUresult capturing_ask(CUstream stream, bool *capturing);

/* Under the interposer every call that destroys a stream, or a context with its streams, goes
 * through sop (sop_stream_destroy, or the interposer's hooks), which reports it before and after
 * the driver's call. A thread remembers the ids of the last few handles it asked about (a
 * compute stream and a copy stream, say), and answers them again without asking while no
 * destroy that could have given the handle to another stream has begun since: none of a context
 * (every handle), and none of a stream whose handle falls in the same one of DESTROY_SLOTS. A
 * thread pool whose tasks each make and destroy a stream destroys one every few microseconds;
 * counted all together, every thread's next call asked again after each, and asking slows
 * every other thread's stream creation and destruction (design.md, Known costs). An answer
 * asked while such a destroy was under way is not remembered. Without the interposer a program
 * may destroy a stream behind sop's back, and every call asks. */
struct destroys {
	_Alignas(64) _Atomic uint64_t begun;
	_Atomic uint64_t ended;
};

#define DESTROY_SLOTS 512

static atomic_bool destroys_watched;
static struct destroys destroys_all, destroys_of[DESTROY_SLOTS];

static struct destroys *
destroys_slot(CUstream handle)
{
	uint64_t x = (uint64_t)(uintptr_t)handle * 0x9E3779B97F4A7C15u;

	return &destroys_of[x >> 55]; /* the top 9 bits: DESTROY_SLOTS */
}

_Static_assert(DESTROY_SLOTS == 1 << 9, "destroys_slot takes 9 bits");

/* The destroys of c begun so far, if none is under way; UINT64_MAX if one is. Ended is read
 * first: then begun equal to it, read after, means none was under way in between. */
static uint64_t
destroys_settled(struct destroys *c)
{
	uint64_t ended = atomic_load_explicit(&c->ended, memory_order_acquire);
	uint64_t begun = atomic_load_explicit(&c->begun, memory_order_acquire);

	return begun == ended ? begun : UINT64_MAX;
}

#define ID_MEMOS 4
struct id_memo {
	CUstream handle;
	uint64_t id, all, one; /* destroys begun, of contexts and in the handle's slot */
};

/* This thread's cache of stream ids and their devices, direct-mapped: sop_malloc_async needs
 * the device on every call, and the table's lock would be taken on each. Ids are never reused,
 * so an entry is never wrong. */
#define DEV_CACHE_LOG2 5

/* What a thread remembers of streams: the ids of its last handles, and the devices of ids. Heap
 * memory behind one initial-exec pointer, as stream.c's cache: a library's own thread-local
 * arrays cost a __tls_get_addr call at each access. */
struct thread_memo {
	struct id_memo ids[ID_MEMOS];
	struct {
		uint64_t id;
		CUdevice device;
	} dev[1u << DEV_CACHE_LOG2];
};

static __thread struct thread_memo *tmemo __attribute__((tls_model("initial-exec")));
static pthread_key_t tmemo_key;
static pthread_once_t tmemo_once = PTHREAD_ONCE_INIT;

static void
tmemo_key_make(void)
{
	pthread_key_create(&tmemo_key, free);
}

static __attribute__((noinline)) struct thread_memo *
tmemo_slow(void)
{
	struct thread_memo *c;

	pthread_once(&tmemo_once, tmemo_key_make);
	c = calloc(1, sizeof *c);
	if (c) {
		pthread_setspecific(tmemo_key, c); /* freed when the thread exits */
		tmemo = c;
	}
	return c;
}

/* NULL where there is no host memory for it: then nothing is remembered. */
static inline struct thread_memo *
tmemo_get(void)
{
	struct thread_memo *c = tmemo;

	return SOP_LIKELY(c != NULL) ? c : tmemo_slow();
}

/* The id remembered for handle if no destroy that could change it has begun since (moved to
 * the front). */
static bool
id_recall(CUstream handle, uint64_t *id)
{
	struct thread_memo *c = tmemo_get();
	struct id_memo m, *id_memo;
	int i;

	if (!c)
		return false;
	id_memo = c->ids;
	for (i = 0; i < ID_MEMOS; i++)
		if (id_memo[i].handle == handle)
			break;
	if (i == ID_MEMOS ||
	    atomic_load_explicit(&destroys_all.begun, memory_order_acquire) != id_memo[i].all ||
	    atomic_load_explicit(&destroys_slot(handle)->begun, memory_order_acquire) !=
		id_memo[i].one)
		return false;
	m = id_memo[i];
	for (; i > 0; i--)
		id_memo[i] = id_memo[i - 1];
	id_memo[0] = m;
	*id = m.id;
	return true;
}

/* Remember handle's id, asked after destroys stood settled at all and one, in front of the
 * others (the least recent one, or handle's own older entry, goes). */
static void
id_remember(CUstream handle, uint64_t id, uint64_t all, uint64_t one)
{
	struct thread_memo *c = tmemo_get();
	struct id_memo *id_memo;
	int i;

	if (!c)
		return;
	id_memo = c->ids;
	for (i = 0; i < ID_MEMOS - 1; i++)
		if (id_memo[i].handle == handle)
			break;
	for (; i > 0; i--)
		id_memo[i] = id_memo[i - 1];
	id_memo[0] = (struct id_memo){handle, id, all, one};
}

void
sop__stream_destroys_watch(void)
{
	atomic_store(&destroys_watched, true);
}

void
sop__stream_destroy_begin(CUstream stream)
{
	atomic_fetch_add(&(stream ? destroys_slot(stream) : &destroys_all)->begun, 1);
}

void
sop__stream_destroy_end(CUstream stream)
{
	atomic_fetch_add_explicit(&(stream ? destroys_slot(stream) : &destroys_all)->ended, 1,
				  memory_order_release);
}

CUresult
sop__stream_id(CUstream stream, uint64_t *id)
{
	unsigned long long v = 0;
	uint64_t all = 0, one = 0;
	bool memo;
	CUresult r;

	/* The driver refuses cuStreamGetId on a capturing stream, and the refusal invalidates the
	 * capture, relaxed mode or not: where a capture may be in flight, ask first. */
	if (sop__capture_possible()) {
		bool capturing;

		r = capturing_ask(stream, &capturing);
		if (SOP_UNLIKELY(r != CUDA_SUCCESS))
			return stream_refused(stream, r);
		if (SOP_UNLIKELY(capturing))
			return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	}
	/* Not the special handles, which name a stream of whatever context is current. */
	memo = atomic_load_explicit(&destroys_watched, memory_order_relaxed) &&
	       !sop__stream_special(stream);
	if (memo) {
		if (SOP_LIKELY(id_recall(stream, id)))
			return CUDA_SUCCESS;
		/* Read before the driver is asked: a destroy that begins during the question
		 * leaves the answer unremembered, and so does one under way. */
		all = destroys_settled(&destroys_all);
		one = destroys_settled(destroys_slot(stream));
		memo = all != UINT64_MAX && one != UINT64_MAX;
	}
	r = SOP_DRV(cuStreamGetId)(stream, &v);
	if (SOP_LIKELY(r == CUDA_SUCCESS)) {
		if (memo)
			id_remember(stream, v, all, one);
		*id = v;
		return CUDA_SUCCESS;
	}
	return stream_refused(stream, r);
}

/* ---- Capture -------------------------------------------------------------------------------- */

/* A stream that is capturing records its work into a graph, launched later any number of times:
 * sop serves no allocation there (sop.c hands it to the driver's graph memory), takes no free of
 * its own memory there, and records no probe there (an event recorded in a capture cannot be
 * queried). Asking costs a driver call per call that names a stream; the interposer, which sees
 * every cuStreamBeginCapture and cuStreamEndCapture, counts the captures in flight, and while it
 * counts none nobody asks. A stream joins a capture by waiting on an event recorded in one: the
 * count covers it, since its capture began where the interposer saw it. */
static atomic_bool capture_watched;
static atomic_long captures_in_flight;
/* Some stream was found capturing: from then on frees ask too (sop__stream_capturing_seen). */
static atomic_bool captures_seen;

/* Ask the driver whether stream captures, noting it when one does. Inline in sop__stream_id
 * (declared above it): without the interposer every allocation asks. */
static inline CUresult
capturing_ask(CUstream stream, bool *capturing)
{
	CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
	CUresult r = SOP_DRV(cuStreamIsCapturing)(stream, &status);

	*capturing = r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
	if (SOP_UNLIKELY(*capturing) && !atomic_load_explicit(&captures_seen, memory_order_relaxed))
		atomic_store(&captures_seen, true);
	return r;
}

void
sop__capture_watch(void)
{
	atomic_store(&capture_watched, true);
}

void
sop__capture_count(int delta)
{
	atomic_fetch_add(&captures_in_flight, delta);
}

bool
sop__capture_possible(void)
{
	return !atomic_load_explicit(&capture_watched, memory_order_relaxed) ||
	       atomic_load_explicit(&captures_in_flight, memory_order_acquire) > 0;
}

CUresult
sop__stream_capturing(CUstream stream, bool *capturing)
{
	*capturing = false;
	if (SOP_LIKELY(!sop__capture_possible()))
		return CUDA_SUCCESS;
	return capturing_ask(stream, capturing);
}

CUresult
sop__stream_device_of(CUstream stream, CUdevice *device)
{
	CUcontext ctx = NULL, popped;
	CUresult r = SOP_DRV(cuStreamGetCtx)(stream, &ctx);

	if (r == CUDA_SUCCESS)
		r = SOP_DRV(cuCtxPushCurrent)(ctx);
	if (r != CUDA_SUCCESS)
		return stream_refused(stream, r);
	r = SOP_DRV(cuCtxGetDevice)(device);
	SOP_DRV(cuCtxPopCurrent)(&popped);
	return r;
}

CUresult
sop__stream_capturing_seen(CUstream stream, bool *capturing)
{
	*capturing = false;
	if (SOP_LIKELY(!atomic_load_explicit(&capture_watched, memory_order_relaxed) &&
		       !atomic_load_explicit(&captures_seen, memory_order_relaxed)))
		return CUDA_SUCCESS;
	return sop__stream_capturing(stream, capturing);
}

/* -1: nothing exchanged. */
int
sop__capture_relax(void)
{
	CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;

	if (SOP_LIKELY(!sop__capture_possible()) ||
	    SOP_DRV(cuThreadExchangeStreamCaptureMode)(&mode) != CUDA_SUCCESS)
		return -1;
	return (int)mode;
}

void
sop__capture_restore(int saved)
{
	CUstreamCaptureMode mode = (CUstreamCaptureMode)saved;

	if (saved >= 0)
		SOP_DRV(cuThreadExchangeStreamCaptureMode)(&mode);
}

/* Most slow paths carve a block and make no driver call; exchanging the mode around each of them
 * was two calls in every five operations of random sizes up to 1 MiB, a third of the calls sop
 * made there. The first driver call of the stretch pays for the exchange (SOP_DRV). 0: owed;
 * -1: nothing owed (no capture may be in flight, or an enclosing stretch owes it already). */
int
sop__capture_relax_lazy(void)
{
	if (SOP_LIKELY(!sop__capture_possible()) || sop__relax_state != SOP_RELAX_NONE)
		return -1;
	sop__relax_state = SOP_RELAX_DUE;
	return 0;
}

void
sop__capture_restore_lazy(int token)
{
	int paid;

	if (token < 0)
		return;
	paid = sop__relax_state == SOP_RELAX_PAID;
	sop__relax_state = SOP_RELAX_NONE;
	if (paid)
		sop__capture_restore(sop__relax_saved);
}

/* ---- Stream records ----------------------------------------------------------------------- */

/* Records live in a table of shards keyed by stream id. A call finds one and uses it while it is
 * pinned (epoch.c); a pool's stream state, or a synchronization that waits for the driver, holds
 * it (refs). A record nobody holds and nobody looked up since the last sweep is swept out and
 * freed once no pinned call can be reading it: its stream may be gone, and if it is not, its
 * next use makes a new record. Clocks name records by their incarnation (gen), never by
 * address, so nothing outlives a record but names that no longer match. */
#define STREAM_SHARDS 16
#define STREAM_BUCKETS 64
/* A sweep runs when the table holds this many records more than the last one kept (or half as
 * many more, if that is more). */
#define SWEEP_MIN 256

static struct {
	pthread_mutex_t lock;
	struct sop__stream *bucket[STREAM_BUCKETS];
} shards[STREAM_SHARDS] = {
#define SOP_SH_INIT {PTHREAD_MUTEX_INITIALIZER, {0}}
	SOP_SH_INIT, SOP_SH_INIT, SOP_SH_INIT, SOP_SH_INIT, SOP_SH_INIT, SOP_SH_INIT,
	SOP_SH_INIT, SOP_SH_INIT, SOP_SH_INIT, SOP_SH_INIT, SOP_SH_INIT, SOP_SH_INIT,
	SOP_SH_INIT, SOP_SH_INIT, SOP_SH_INIT, SOP_SH_INIT,
#undef SOP_SH_INIT
};
static atomic_size_t n_streams, n_seen, sweep_at = SWEEP_MIN;
static _Atomic uint64_t next_gen = 1;
static pthread_mutex_t sweep_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned
stream_hash(uint64_t id)
{
	return (unsigned)(id * 0x9E3779B97F4A7C15u >> 40);
}

/* This thread's cache of what the driver said of contexts, by id (a context's handle value is
 * reused once it is destroyed; its id never is): a record for each new stream would otherwise
 * push and pop its context to ask the device, and take the primary contexts' lock, where a
 * thread pool whose tasks each bring a stream has one context. What is cached never changes:
 * a context's device, and whether it is the primary context, which sop keeps alive. */
#define CTX_CACHE 4

struct ctx_cache {
	struct {
		uint64_t id; /* 0: empty */
		CUdevice device;
		bool primary;
	} e[CTX_CACHE];
	unsigned next;
};

static __thread struct ctx_cache ccache __attribute__((tls_model("initial-exec")));

/* What the driver says of a stream seen for the first time: its context, the context's id and
 * device, and whether it is the device's primary context (probes are recorded only there). */
static CUresult
stream_describe(CUstream stream, struct sop__stream *st)
{
	unsigned long long ctx_id = 0;
	CUcontext ctx = NULL, primary = NULL, popped;
	CUdevice device = 0;
	CUresult r;
	unsigned i;

	r = SOP_DRV(cuStreamGetCtx)(stream, &ctx);
	if (r == CUDA_SUCCESS)
		r = SOP_DRV(cuCtxGetId)(ctx, &ctx_id);
	if (r != CUDA_SUCCESS)
		return r;
	for (i = 0; i < CTX_CACHE; i++) {
		if (ccache.e[i].id == ctx_id && ctx_id) {
			device = ccache.e[i].device;
			st->probes_ok = ccache.e[i].primary;
			goto done;
		}
	}
	r = SOP_DRV(cuCtxPushCurrent)(ctx);
	if (r != CUDA_SUCCESS)
		return r;
	r = SOP_DRV(cuCtxGetDevice)(&device);
	SOP_DRV(cuCtxPopCurrent)(&popped);
	if (r == CUDA_SUCCESS)
		r = sop__driver_primary(device, &primary);
	if (r != CUDA_SUCCESS)
		return r;
	st->probes_ok = primary == ctx;
	i = ccache.next++ % CTX_CACHE;
	ccache.e[i].id = ctx_id;
	ccache.e[i].device = device;
	ccache.e[i].primary = st->probes_ok;
done:
	st->ctx = ctx;
	st->ctx_id = ctx_id;
	st->device = device;
	return CUDA_SUCCESS;
}

/* Hold a record: the sweep takes out none that is held. Shard lock held, or held already. */
static void
stream_hold(struct sop__stream *st)
{
	atomic_fetch_add_explicit(&st->refs, 1, memory_order_relaxed);
}

/* The record of id in its shard, marked used. Shard lock held. */
static struct sop__stream *
stream_find_locked(unsigned h, uint64_t id)
{
	struct sop__stream *st;

	for (st = shards[h % STREAM_SHARDS].bucket[h / STREAM_SHARDS % STREAM_BUCKETS]; st;
	     st = st->hash_next) {
		if (st->id == id) {
			if (!atomic_load_explicit(&st->used, memory_order_relaxed))
				atomic_store_explicit(&st->used, true, memory_order_relaxed);
			return st;
		}
	}
	return NULL;
}

/* Probe events of records that were freed, kept for the next records: a thread pool whose tasks
 * each bring a stream would otherwise create and destroy a few events per task, and the driver's
 * event creation and destruction do not scale across threads. An event is reused only in the
 * context it was made in, a primary one that sop keeps alive. A spare may still be pending on
 * the GPU, recorded on a stream that is gone: nothing asks about that record any more (its
 * record is freed), the next record replaces it, and a wait made on it earlier waits for what
 * it captured then. A record gives its events back as soon as its stream is destroyed and no
 * pool's state holds it (events_give), rather than at the sweep that frees it, a few hundred
 * streams later: so a few spares serve a thread pool, and records of streams that were never
 * destroyed keep theirs. */
#define SPARE_EVENTS 256

static struct {
	pthread_mutex_t lock;
	unsigned n;
	struct {
		CUcontext ctx;
		CUevent ev;
	} e[SPARE_EVENTS];
} spares = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Give st's empty probe slots spare events of its context, in one acquisition of the lock: a
 * record that needs one probe usually needs more. st's lock held. */
static void
spares_take(struct sop__stream *st)
{
	unsigned i, k = 0;

	SOP_HELD(&st->lock);
	sop__mutex_take(&spares.lock, SOP_RANK_SPARES);
	for (i = spares.n; i-- > 0 && k < SOP_PROBES;) {
		if (spares.e[i].ctx != st->ctx)
			continue;
		while (k < SOP_PROBES && st->probe[k].ev)
			k++;
		if (k == SOP_PROBES)
			break;
		st->probe[k].ev = spares.e[i].ev;
		spares.e[i] = spares.e[--spares.n];
	}
	sop__mutex_drop(&spares.lock);
}

/* Resets of primary contexts so far (sop__stream_ctx_reset). A record made its events after as
 * many as st->events_reset says; if more came since, the reset did not find it (swept out of the
 * table, not yet freed), and its events may be dead. */
static atomic_uint_fast64_t primary_resets;

/* st's probes forgotten, and their events destroyed (destroy) or let go of, as events a reset
 * destroyed already. A query then finds none pending, and so learns nothing (memory reused late,
 * never early); the next probe makes a new event. st's lock held, or st unreachable. */
static void
events_forget(struct sop__stream *st, bool destroy)
{
	unsigned k;

	for (k = 0; k < SOP_PROBES; k++) {
		if (destroy && st->probe[k].ev)
			SOP_DRV(cuEventDestroy)(st->probe[k].ev);
		st->probe[k].ev = NULL;
		st->probe[k].pending = false;
	}
}

/* Make st's events spares, as far as there is room; destroy the others; forget its probes.
 * Events older than a reset are only let go of: those of the reset context are dead, and those
 * of another context are left alive rather than risk that. st's lock held, or st unreachable. */
static void
events_give(struct sop__stream *st)
{
	unsigned k, n = 0;

	for (k = 0; k < SOP_PROBES; k++)
		n += st->probe[k].ev != NULL;
	if (!n)
		return; /* given already, or none made */
	if (st->events_reset != atomic_load(&primary_resets)) {
		events_forget(st, false);
		return;
	}
	/* The context is a primary one sop retains: its events are still there. A record of
	 * another context never made any. */
	sop__mutex_take(&spares.lock, SOP_RANK_SPARES);
	for (k = 0; k < SOP_PROBES; k++) {
		if (st->probe[k].ev && spares.n < SPARE_EVENTS) {
			spares.e[spares.n].ctx = st->ctx;
			spares.e[spares.n++].ev = st->probe[k].ev;
			st->probe[k].ev = NULL;
		}
	}
	sop__mutex_drop(&spares.lock);
	events_forget(st, true);
}

void
sop__stream_ctx_reset(CUcontext ctx)
{
	struct sop__stream *st;
	unsigned i, j;

	/* Every record of the context, those no state holds too: their events would become
	 * spares when their records are freed. Counted first: a record freed from now on whose
	 * events are older only forgets them (events_give). By the context's handle, which a
	 * primary context keeps across resets while its id changes: every record of any of its
	 * lives, whatever id a stream kept (on an H200, driver 580, the legacy and per-thread
	 * streams come back from a reset with new ids; the simulated driver once kept them, and a
	 * poll then queried a dead event: test/preload.c, --reset). Records of the lives before
	 * have forgotten their events already. Records of other contexts never made events. */
	atomic_fetch_add(&primary_resets, 1);
	for (i = 0; i < STREAM_SHARDS; i++) {
		sop__mutex_take(&shards[i].lock, SOP_RANK_SHARD);
		for (j = 0; j < STREAM_BUCKETS; j++) {
			for (st = shards[i].bucket[j]; st; st = st->hash_next) {
				if (st->ctx != ctx)
					continue;
				sop__mutex_take(&st->lock, SOP_RANK_RECORD);
				events_forget(st, true); /* alive until the reset */
				sop__mutex_drop(&st->lock);
			}
		}
		sop__mutex_drop(&shards[i].lock);
	}
	sop__mutex_take(&spares.lock, SOP_RANK_SPARES);
	for (i = spares.n; i-- > 0;) {
		if (spares.e[i].ctx != ctx)
			continue;
		SOP_DRV(cuEventDestroy)(spares.e[i].ev);
		spares.e[i] = spares.e[--spares.n];
	}
	sop__mutex_drop(&spares.lock);
}

/* A record whose stream is being destroyed and that no state holds has no use for its probes:
 * the frees they cover are in no cache any more. */
static void
stream_done_with(struct sop__stream *st)
{
	sop__mutex_take(&st->lock, SOP_RANK_RECORD);
	events_give(st);
	sop__mutex_drop(&st->lock);
}

static void
stream_free(struct sop__retired *r)
{
	struct sop__stream *st = (struct sop__stream *)((char *)r - offsetof(struct sop__stream, retired));

	events_give(st);
	pthread_mutex_destroy(&st->lock);
	free(st);
}

/* Take out the records nobody holds and nobody looked up since the last sweep, and retire them;
 * the others start a new round unused. The bound: what is held, plus what was used within the
 * last two sweeps, which come every SWEEP_MIN new records or more: at most twice what is held
 * or in use, and SWEEP_MIN more. */
static void
streams_sweep(void)
{
	size_t kept = 0, i, j;

	if (!sop__mutex_try(&sweep_lock, SOP_RANK_SWEEP))
		return; /* another thread sweeps */
	for (i = 0; i < STREAM_SHARDS; i++) {
		sop__mutex_take(&shards[i].lock, SOP_RANK_SHARD);
		for (j = 0; j < STREAM_BUCKETS; j++) {
			struct sop__stream **pp = &shards[i].bucket[j], *st;
			while ((st = *pp)) {
				if (atomic_load(&st->refs) ||
				    atomic_exchange_explicit(&st->used, false, memory_order_relaxed)) {
					pp = &st->hash_next;
					kept++;
					continue;
				}
				*pp = st->hash_next;
				atomic_fetch_sub(&n_streams, 1);
				sop__epoch_retire(&st->retired, stream_free, false);
			}
		}
		sop__mutex_drop(&shards[i].lock);
	}
	/* The next sweep after a few hundred records more, or half as many as it kept: the records
	 * made since are all used then, and a threshold of twice what was kept would keep that
	 * many for good. Those kept are the held ones, those in use, and the last interval's. */
	atomic_store(&sweep_at, kept + (kept / 2 > SWEEP_MIN ? kept / 2 : SWEEP_MIN));
	sop__mutex_drop(&sweep_lock);
}

CUresult
sop__stream_of(CUstream stream, uint64_t id, bool hold, struct sop__stream **out)
{
	unsigned h = stream_hash(id), sh = h % STREAM_SHARDS;
	struct sop__stream *st, *had;
	CUresult r;

	sop__mutex_take(&shards[sh].lock, SOP_RANK_SHARD);
	st = stream_find_locked(h, id);
	if (st && hold)
		stream_hold(st);
	sop__mutex_drop(&shards[sh].lock);
	if (st) {
		*out = st;
		return CUDA_SUCCESS;
	}
	/* First sight: ask the driver without the lock, then publish unless another thread did. */
	st = calloc(1, sizeof *st);
	if (!st)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = stream_describe(stream, st);
	if (r != CUDA_SUCCESS) {
		free(st);
		return r;
	}
	st->id = id;
	st->gen = atomic_fetch_add(&next_gen, 1);
	st->born_ns = sop__now_ns();
	atomic_init(&st->epoch, 1);
	atomic_init(&st->used, true);
	pthread_mutex_init(&st->lock, NULL);
	sop__mutex_take(&shards[sh].lock, SOP_RANK_SHARD);
	had = stream_find_locked(h, id);
	if (!had) {
		struct sop__stream **b = &shards[sh].bucket[h / STREAM_SHARDS % STREAM_BUCKETS];
		st->hash_next = *b;
		*b = st;
		atomic_fetch_add(&n_seen, 1);
	}
	if (hold)
		stream_hold(had ? had : st);
	sop__mutex_drop(&shards[sh].lock);
	if (had) {
		pthread_mutex_destroy(&st->lock);
		free(st);
		*out = had;
		return CUDA_SUCCESS;
	}
	*out = st;
	if (atomic_fetch_add(&n_streams, 1) + 1 > atomic_load(&sweep_at))
		streams_sweep();
	return CUDA_SUCCESS;
}

CUresult
sop__stream_lookup(CUstream stream, bool hold, struct sop__stream **out)
{
	uint64_t id;
	CUresult r = sop__stream_id(stream, &id);

	return r == CUDA_SUCCESS ? sop__stream_of(stream, id, hold, out) : r;
}


void
sop__stream_release(struct sop__stream *st)
{
	/* The sweep reads refs under the shard lock and takes the record out only at 0: one held
	 * is never retired. */
	if (atomic_fetch_sub(&st->refs, 1) == 1 && atomic_load(&st->gone))
		stream_done_with(st);
}

struct sop__stream *
sop__stream_find(uint64_t id, uint64_t gen)
{
	unsigned h = stream_hash(id), sh = h % STREAM_SHARDS;
	struct sop__stream *st;

	sop__mutex_take(&shards[sh].lock, SOP_RANK_SHARD);
	st = stream_find_locked(h, id);
	if (st && st->gen != gen)
		st = NULL;
	if (st)
		stream_hold(st);
	sop__mutex_drop(&shards[sh].lock);
	return st;
}

struct sop__stream **
sop__stream_all(uint64_t ctx_id, size_t *n)
{
	struct sop__stream **v = NULL, **w, *st;
	size_t k = 0, cap = 0, i, j;

	*n = 0;
	for (i = 0; i < STREAM_SHARDS; i++) {
		sop__mutex_take(&shards[i].lock, SOP_RANK_SHARD);
		for (j = 0; j < STREAM_BUCKETS; j++) {
			for (st = shards[i].bucket[j]; st; st = st->hash_next) {
				/* One no pool's state holds has nothing cached anywhere. */
				if (st->ctx_id != ctx_id || !atomic_load(&st->refs))
					continue;
				if (k == cap) {
					cap = cap ? 2 * cap : 16;
					w = realloc(v, cap * sizeof *v);
					if (!w)
						continue; /* without host memory, fewer: safe */
					v = w;
				}
				stream_hold(st);
				v[k++] = st;
			}
		}
		sop__mutex_drop(&shards[i].lock);
	}
	*n = k;
	return v;
}

CUresult
sop__stream_device(CUstream stream, uint64_t id, CUdevice *device)
{
	unsigned slot = (unsigned)(id * 0x9E3779B97F4A7C15u >> (64 - DEV_CACHE_LOG2));
	struct thread_memo *c = tmemo_get();
	struct sop__stream *st;
	CUresult r;

	if (SOP_LIKELY(c && c->dev[slot].id == id)) {
		*device = c->dev[slot].device;
		return CUDA_SUCCESS;
	}
	r = sop__stream_of(stream, id, false, &st);
	if (r != CUDA_SUCCESS)
		return r;
	*device = st->device;
	if (c) {
		c->dev[slot].id = id;
		c->dev[slot].device = st->device;
	}
	return CUDA_SUCCESS;
}

bool
sop__streams_interact(void)
{
	return atomic_load_explicit(&n_seen, memory_order_relaxed) > 1;
}

size_t
sop__streams_live(void)
{
	return atomic_load(&n_streams);
}

uint64_t
sop__stream_mark(struct sop__stream *st)
{
	return atomic_fetch_add(&st->epoch, 1);
}

/* ---- Probes ------------------------------------------------------------------------------- */

/* One probe every this many frees on a stream, or sooner (see sop__stream_after_free). */
#define PROBE_EVERY 64
/* A stream gets probes by count only once sop has known it this long (count_probe_due). */
#define PROBE_AGE_NS 1000000
/* Nor, in a pool of its own, sooner than this after its last probe (count_probe_due). */
#define PROBE_GAP_NS 200000

/* Record the next probe on st, which handle names in the current call (checked by the caller).
 * st's lock held. */
static CUresult
probe_record(struct sop__stream *st, CUstream handle)
{
	struct sop__probe *p = &st->probe[st->next_probe];
	CUcontext popped;
	CUresult r;

	/* Never in a capture, where the record would be a node of the graph and the event one that
	 * cannot be queried: the handle was checked in this call (sop__stream_id), which finds a
	 * capturing stream wherever one may be. */
	if (!p->ev)
		spares_take(st);
	if (!p->ev) {
		r = SOP_DRV(cuCtxPushCurrent)(st->ctx);
		if (r != CUDA_SUCCESS)
			return r;
		r = SOP_DRV(cuEventCreate)(&p->ev, CU_EVENT_DISABLE_TIMING);
		SOP_DRV(cuCtxPopCurrent)(&popped);
		if (r != CUDA_SUCCESS) {
			p->ev = NULL;
			return r;
		}
	}
	/* Its events, spares or new, are of the present (spares older than a reset are gone). */
	st->events_reset = atomic_load(&primary_resets);
	/* The epoch first: frees tagged up to it were called before the record. */
	p->epoch = sop__stream_mark(st);
	r = SOP_DRV(cuEventRecord)(p->ev, handle);
	if (r != CUDA_SUCCESS) {
		p->pending = false;
		p->epoch = 0;
		return r;
	}
	p->pending = true;
	atomic_store_explicit(&st->probe_ns, sop__now_ns(), memory_order_relaxed);
	atomic_store(&st->newest, p->epoch);
	st->next_probe = (st->next_probe + 1) % SOP_PROBES;
	atomic_store_explicit(&st->frees_since, 0, memory_order_relaxed);
	return CUDA_SUCCESS;
}

/* Whether st, past PROBE_EVERY frees since its last probe, gets one by count now.
 *
 * Not while it is young: a thread pool whose tasks each make a stream, free on it, synchronize
 * and destroy it within a millisecond has no use for them (the synchronization shows every free
 * complete), and event records on streams that come and go slow the driver's creation and
 * destruction of streams on every thread: five records a task held sixteen threads on the H100
 * to 3.5-4.6 M pairs/s where one record a task let them run at 6.6-8.2 (with 8 MiB refills,
 * reuse.c).
 *
 * Nor, when it is alone in the pool it frees to (lone), within PROBE_GAP_NS of its last probe.
 * There its probes serve only its own slow path, which queries them to give what completed to
 * the heap (reuse.c), and a thread that frees every few hundred nanoseconds reaches 64 frees
 * every few tens of microseconds: a record there, and a query and a capture-mode exchange in a
 * later slow path, each microseconds in a process where the driver's pools run too. Random
 * sizes up to 64 MiB ran at 9.8-11.8x the driver's pool on the H100 with the gap against
 * 7.2-7.5x without (bench/results/2026-11-25-h100-80gb-hbm3-probe-gap-ab/). Where other
 * streams share the pool they take its frees only as its probes show them complete: on the
 * H100 a training step's replay on two streams reserved 5096 MiB with the gap on every stream,
 * against 4778 without (bench/results/2026-11-25-h100-80gb-hbm3-probe-gap-lone-ab/). A stream
 * that joins later learns of the lone one's frees at most the gap late.
 *
 * What others need of a stream they still get: the first free's probe, every free's while the
 * pool is full, one after a quiet spell, and one before a growth or after another stream starved
 * (reuse.c). */
static bool
count_probe_due(const struct sop__stream *st, unsigned since, bool lone)
{
	uint64_t t;

	/* Past PROBE_EVERY frees a stream asks the clock every 16th free, not at each. */
	if (since % 16)
		return false;
	t = sop__now_ns();
	return t - st->born_ns >= PROBE_AGE_NS &&
	       (!lone || t - atomic_load_explicit(&st->probe_ns, memory_order_relaxed) >=
				 PROBE_GAP_NS);
}

/* A stream is paced over at least this long from a free (sop__stream_pace), and counts as slow
 * if it freed less often than once in PACE_SLOW_NS on average since; then its next SLOW_PROBES
 * frees get a probe each, or until it is paced again.
 *
 * Threads that allocate between a framework's Python lines, or between kernels they wait for,
 * free every few hundred microseconds: a probe by count, every PROBE_EVERY frees, comes tens of
 * milliseconds apart there, and the other streams of the pool may take none of the frees after
 * it. CuPy tasks that each bring a stream, four and eight threads on an H200, reserved 1.87 and
 * 1.67 times their live peak with probes by count alone, against the driver's pool's 1.71 and
 * 1.36; with a probe at every free once 500 us had passed since the last, and other streams'
 * completed frees shared before growth (reuse.c), 1.39 and 1.45
 * (bench/results/2026-11-29-h200-clients-threads-probes/). Asking the clock at every free would
 * cost the hot paths a read each, so the pace is taken where the pool lock is taken anyway, and
 * every PACE_FREES frees: a slow path alone came too seldom to a stream its cache served, whose
 * frees went unprobed after its first SLOW_PROBES. At Python's pace a window holds 16 frees or
 * more, so a slow stream's probes never run out. With that, and no growth for segment affinity
 * for a slow stream (reuse.c, affinity_pays), CuPy's tasks held 1.38 and 1.37 times their live
 * peak at four and eight threads, against 1.83 and 1.65 paced at slow paths only and the
 * driver's pool's 1.72 and 1.35 (bench/results/2026-11-29-h200-tasks-affinity/). A probe costs
 * about as much as 2% of a slow stream's time between two frees; SLOW_PROBES bounds what a
 * stream that turned fast pays before it is paced again. */
#define PACE_WINDOW_NS 1000000
#define PACE_SLOW_NS 100000
#define SLOW_PROBES 64
#define PACE_FREES 16

void
sop__stream_pace(struct sop__stream *st)
{
	unsigned n = atomic_load_explicit(&st->frees_paced, memory_order_relaxed);
	uint64_t t, t0;

	/* The window opens at a free (sop__stream_after_free), so that what the stream
	 * allocated before it, freeing nothing, does not make it look slow. */
	if (n < 2)
		return;
	t = sop__now_ns();
	t0 = atomic_load_explicit(&st->pace_ns, memory_order_relaxed);
	if (t - t0 < PACE_WINDOW_NS)
		return;
	atomic_store_explicit(&st->frees_paced, 0, memory_order_relaxed);
	atomic_store_explicit(&st->slow_probes,
			      (uint64_t)(n - 1) * PACE_SLOW_NS < t - t0 ? SLOW_PROBES : 0,
			      memory_order_relaxed);
}

bool
sop__stream_slow(const struct sop__stream *st)
{
	return atomic_load_explicit(&st->slow_probes, memory_order_relaxed) != 0;
}

/* Whether this free of a slow stream gets a probe (sop__stream_pace). A load and a store, as for
 * frees_since: racing frees may spend one probe twice or not at all. */
static bool
slow_probe_due(struct sop__stream *st)
{
	unsigned n = atomic_load_explicit(&st->slow_probes, memory_order_relaxed);

	if (!n)
		return false;
	atomic_store_explicit(&st->slow_probes, n - 1, memory_order_relaxed);
	return true;
}

/* Record a probe unless one recorded since covers seq. With checked false, the caller has not
 * asked the driver who handle is in this call (a free on the stream that allocated the block,
 * stream.c): ask now, so that a probe never lands on a new stream that took a destroyed
 * stream's handle while counting as the old one's. */
static void
probe_if_uncovered(struct sop__stream *st, CUstream handle, uint64_t seq, bool checked)
{
	uint64_t id;

	if (!st->probes_ok)
		return;
	if (!checked && (sop__stream_id(handle, &id) != CUDA_SUCCESS || id != st->id))
		return;
	sop__mutex_take(&st->lock, SOP_RANK_RECORD);
	if (atomic_load(&st->newest) < seq)
		(void)probe_record(st, handle); /* a failure only loses a chance to reuse early */
	sop__mutex_drop(&st->lock);
}

void
sop__stream_after_free(struct sop__stream *st, CUstream handle, uint64_t seq, bool pressure,
		       bool checked, bool lone)
{
	uint64_t newest = atomic_load_explicit(&st->newest, memory_order_relaxed);
	/* A load and a store, not an atomic add: frees racing on one stream may lose a count,
	 * which only puts off a probe, and a locked add stalled every free on its line. */
	unsigned since = atomic_load_explicit(&st->frees_since, memory_order_relaxed) + 1, paced;
	bool due;

	atomic_store_explicit(&st->frees_since, since, memory_order_relaxed);
	paced = atomic_load_explicit(&st->frees_paced, memory_order_relaxed) + 1;
	atomic_store_explicit(&st->frees_paced, paced, memory_order_relaxed);
	if (paced == 1) /* a pacing window opens (sop__stream_pace) */
		atomic_store_explicit(&st->pace_ns, sop__now_ns(), memory_order_relaxed);
	else if (paced % PACE_FREES == 0)
		sop__stream_pace(st);
	if (newest >= seq)
		return; /* a probe recorded since covers this free */
	/* Also when the newest probe is known complete and the stream has been marked since (a
	 * synchronization or an event): then the stream went quiet after a burst, and this free
	 * would otherwise wait 64 more for a probe. Completions learnt between marks, by queries,
	 * never trigger this: they would turn every free into a probe. */
	due = pressure       /* a full pool: cover every free, for internal dependencies */
	      || !newest     /* never probed: the first free gets one */
	      || (since >= PROBE_EVERY && count_probe_due(st, since, lone)) ||
	      (!lone && slow_probe_due(st)) ||
	      (atomic_load_explicit(&st->done, memory_order_relaxed) >= newest &&
	       atomic_load_explicit(&st->epoch, memory_order_relaxed) > newest + 1);
	if (due)
		probe_if_uncovered(st, handle, seq, checked);
}

void
sop__stream_probe(struct sop__stream *st, CUstream handle, uint64_t seq)
{
	probe_if_uncovered(st, handle, seq, true);
}

/* A probe covering every free on st so far, unless one already does; handle names st in the
 * current call, checked. */
void
sop__probe_all_frees(struct sop__stream *st, CUstream handle)
{
	uint64_t last = atomic_load_explicit(&st->last_free, memory_order_relaxed);

	/* Nothing to cover where a synchronization or a probe has shown every free complete: a
	 * task's stream, synchronized and then destroyed, gets no probe event at its end. */
	if (atomic_load(&st->newest) < last && atomic_load(&st->done) < last)
		probe_if_uncovered(st, handle, last, true);
}

/* Query the pending probes, oldest first, and stop at the first still running: probes on one
 * stream complete in order. Stream lock held. */
static void
probes_poll_locked(struct sop__stream *st)
{
	int mode = sop__capture_relax(); /* a query is unsafe during a global capture */
	unsigned i, k;

	for (i = 0; i < SOP_PROBES; i++) {
		struct sop__probe *p = NULL;
		uint64_t best = UINT64_MAX;
		/* The oldest pending probe. */
		for (k = 0; k < SOP_PROBES; k++) {
			if (st->probe[k].pending && st->probe[k].epoch < best) {
				best = st->probe[k].epoch;
				p = &st->probe[k];
			}
		}
		if (!p || SOP_DRV(cuEventQuery)(p->ev) != CUDA_SUCCESS)
			break;
		p->pending = false;
		sop__stream_completed(st, p->epoch);
	}
	sop__capture_restore(mode);
}

void
sop__stream_completed(struct sop__stream *st, uint64_t epoch)
{
	uint64_t done = atomic_load(&st->done);

	while (done < epoch && !atomic_compare_exchange_weak(&st->done, &done, epoch))
		;
}

/* A probe seen still running is not asked again for this long: a query costs as much as the
 * allocation it serves, and the answer rarely changes faster. */
#define POLL_BACKOFF_NS 4000

uint64_t
sop__now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

uint64_t
sop__stream_poll(struct sop__stream *st)
{
	uint64_t done = atomic_load(&st->done), t;

	/* Nothing to learn, or asked a moment ago. */
	if (atomic_load(&st->newest) <= done)
		return done;
	t = sop__now_ns();
	if (t < atomic_load_explicit(&st->next_poll_ns, memory_order_relaxed))
		return done;
	sop__mutex_take(&st->lock, SOP_RANK_RECORD);
	probes_poll_locked(st);
	if (atomic_load(&st->newest) > atomic_load(&st->done))
		atomic_store_explicit(&st->next_poll_ns, t + POLL_BACKOFF_NS, memory_order_relaxed);
	sop__mutex_drop(&st->lock);
	return atomic_load(&st->done);
}

uint64_t
sop__stream_prove(struct sop__stream *st)
{
	if (atomic_load(&st->newest) > atomic_load(&st->done)) {
		sop__mutex_take(&st->lock, SOP_RANK_RECORD);
		probes_poll_locked(st);
		sop__mutex_drop(&st->lock);
	}
	return atomic_load(&st->done);
}

uint64_t
sop__stream_query(struct sop__stream *st, CUstream handle)
{
	/* The epoch first, as for a probe: frees tagged up to it were called before the query. */
	uint64_t epoch = sop__stream_mark(st);
	int mode = sop__capture_relax(); /* a query is unsafe during a global capture */

	if (SOP_DRV(cuStreamQuery)(handle) == CUDA_SUCCESS)
		sop__stream_completed(st, epoch);
	sop__capture_restore(mode);
	return atomic_load(&st->done);
}

struct sop__stream *
sop__stream_ending(CUstream stream, uint64_t id)
{
	unsigned h = stream_hash(id), sh = h % STREAM_SHARDS;
	struct sop__stream *st;

	sop__mutex_take(&shards[sh].lock, SOP_RANK_SHARD);
	st = stream_find_locked(h, id);
	sop__mutex_drop(&shards[sh].lock);
	if (st) {
		sop__probe_all_frees(st, stream);
		atomic_store(&st->gone, true);
		if (!atomic_load(&st->refs))
			stream_done_with(st);
	}
	return st;
}
