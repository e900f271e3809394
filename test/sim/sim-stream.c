/*
 * Streams, events and asynchronous work of the simulated driver.
 *
 * Every stream has a worker thread that runs its operations in order: host
 * functions, memsets, copies, event records and waits. Memsets and copies
 * touch the memory from the worker, so a bad address faults there, late,
 * like on a GPU.
 *
 * A stream counts the operations enqueued and completed; a "position" is a
 * (stream, sequence number) pair, reached once `completed` gets there. Events
 * hold the position of their last record; waits block a worker until another
 * stream reaches a position. Objects are reference counted, so a stream stays
 * alive while its queue drains after cuStreamDestroy or while an event or a
 * wait still refers to it. Its handle value, though, is free at once
 * (sim-handle.c) and may name the next stream created, as on the driver:
 * every handle is looked up in the handle table, never taken for an object.
 *
 * Legacy default stream semantics are made of implicit waits added at enqueue
 * time, under the context lock so that enqueues are totally ordered: an
 * operation on the legacy stream first waits for every blocking stream's
 * pending work, and an operation on a blocking stream first waits for the
 * legacy stream's pending work.
 *
 * Interprocess events (CU_EVENT_INTERPROCESS) keep what other processes need
 * in a page of shared memory (a memfd): how many records were enqueued, in
 * every process, and the last that ran. A record takes the next number and
 * its run publishes it; a wait, query or synchronization asks for the number
 * the event had when it was called, polling the page from the waiting stream's
 * worker. cuIpcGetEventHandle writes the creator's pid and the memfd's number
 * in the handle, and cuIpcOpenEventHandle opens it through /proc, as a process
 * of the same user may.
 *
 * Lock order: event lock, then context lock, then stream lock; the handle
 * tables' locks come last.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim-internal.h"

enum op_kind {
	OP_HOST_FN,
	OP_CALLBACK,
	OP_MEMSET,
	OP_COPY,
	OP_WAIT,
	OP_RECORD,
	OP_IPC_WAIT,
};

struct op {
	struct op *next;
	enum op_kind kind;
	union {
		struct {
			CUhostFn fn;
			void *data;
		} host;
		struct {
			CUstreamCallback fn;
			CUstream handle;	/* as the caller named the stream */
			void *data;
		} callback;
		struct {
			void *dst;
			size_t count;		/* elements */
			unsigned value;
			unsigned width;		/* bytes per element: 1, 2 or 4 */
		} set;
		struct {
			void *dst;
			const void *src;
			size_t bytes;
		} copy;
		struct {
			struct sim_stream *stream;	/* holds a reference */
			uint64_t seq;
		} wait;
		struct {
			struct sim_event *event;	/* holds a reference */
			uint64_t gen;
			uint64_t ipc_gen;		/* interprocess: the shared number */
		} record;
		struct {
			struct sim_event *event;	/* holds a reference */
			uint64_t gen;			/* shared number to wait for */
		} ipc_wait;
	};
};

enum stream_kind {
	STREAM_USER,
	STREAM_LEGACY,
	STREAM_PER_THREAD,
};

struct sim_stream {
	struct sim_ctx *ctx;		/* a reference, but for the legacy stream */
	enum stream_kind kind;
	unsigned flags;
	int priority;
	unsigned long long id;
	uint64_t handle;		/* user streams: the value handed out */
	atomic_long refs;
	struct sim_stream *ctx_next;	/* ctx->streams, under ctx->lock */
	struct sim_stream *old_next;	/* a reset legacy stream's: ctx->legacy_old, under ctx->lock */

	pthread_mutex_t lock;		/* everything below */
	pthread_cond_t work_cv;		/* to the worker: new op, or retired */
	pthread_cond_t done_cv;		/* to waiters: `completed` moved */
	struct op *head, *tail;
	uint64_t enqueued;
	uint64_t completed;
	bool retired;			/* takes no more work; worker exits when drained */
	struct sim_graph *cap;		/* the capture it records into, or NULL (cap_lock) */
};

struct sim_event {
	struct sim_ctx *ctx;		/* a reference */
	uint64_t handle;
	unsigned flags;
	atomic_long refs;
	struct sim_event *ctx_prev, *ctx_next;	/* ctx->events, under ctx->lock */

	pthread_mutex_t lock;		/* everything below */
	struct sim_stream *stream;	/* last record's position; NULL: never recorded */
	uint64_t seq;
	uint64_t gen;			/* number of records so far */
	struct timespec time;		/* when the record of `gen` ran */
	bool captured;			/* last recorded in a capture (cap_lock) */
	uint64_t capture_id;		/* that capture's id (cap_lock) */

	struct sim_ipc *ipc;		/* interprocess: the shared page; else NULL */
	int ipc_fd;			/* the creator's memfd; -1 if opened or not shared */
};

/* The shared page of an interprocess event. */
#define SIM_IPC_MAGIC 0x73696d6970636576ull	/* "simipcev" */
struct sim_ipc {
	uint64_t magic;
	uint64_t serial;		/* tells this event from a later one at the same fd */
	_Atomic uint64_t recorded;	/* records enqueued, in every process */
	_Atomic uint64_t completed;	/* the highest of them that ran */
};

/* What cuIpcGetEventHandle writes in CUipcEventHandle.reserved. */
struct sim_ipc_handle {
	uint64_t magic;
	uint64_t serial;
	int32_t pid;
	int32_t fd;
};
_Static_assert(sizeof(struct sim_ipc_handle) <= sizeof(((CUipcEventHandle *)0)->reserved),
	       "an IPC event handle fits the driver's");

/* A position to wait for, with a reference on its stream. */
struct pos {
	struct sim_stream *stream;
	uint64_t seq;
};

/* Ids are never reused, unlike handle values. */
static atomic_ullong next_stream_id = 1;

/* ---- reference counting ---- */

static void stream_ref(struct sim_stream *s)
{
	atomic_fetch_add(&s->refs, 1);
}

static void stream_put(struct sim_stream *s)
{
	struct sim_ctx *ctx = s->ctx;
	bool legacy = s->kind == STREAM_LEGACY;

	if (atomic_fetch_sub(&s->refs, 1) != 1)
		return;
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->work_cv);
	pthread_cond_destroy(&s->done_cv);
	free(s);
	if (!legacy)
		sim_ctx_put(ctx);
}

static void event_put(struct sim_event *e)
{
	struct sim_ctx *ctx = e->ctx;

	if (atomic_fetch_sub(&e->refs, 1) != 1)
		return;
	if (e->stream)
		stream_put(e->stream);
	if (e->ipc)
		munmap(e->ipc, sizeof(*e->ipc));
	if (e->ipc_fd >= 0)
		close(e->ipc_fd);
	pthread_mutex_destroy(&e->lock);
	free(e);
	sim_ctx_put(ctx);
}

static void op_free(struct op *op)
{
	if (op->kind == OP_WAIT)
		stream_put(op->wait.stream);
	else if (op->kind == OP_RECORD)
		event_put(op->record.event);
	else if (op->kind == OP_IPC_WAIT)
		event_put(op->ipc_wait.event);
	free(op);
}

static void op_free_list(struct op *op)
{
	while (op) {
		struct op *next = op->next;

		op_free(op);
		op = next;
	}
}

/* ---- positions ---- */

static bool pos_reached(struct sim_stream *s, uint64_t seq)
{
	bool done;

	pthread_mutex_lock(&s->lock);
	done = s->completed >= seq;
	pthread_mutex_unlock(&s->lock);
	return done;
}

static void pos_wait(struct sim_stream *s, uint64_t seq)
{
	pthread_mutex_lock(&s->lock);
	while (s->completed < seq)
		pthread_cond_wait(&s->done_cv, &s->lock);
	pthread_mutex_unlock(&s->lock);
}

/* The stream's current end, or 0 when all its work is done already. */
static uint64_t pending_end(struct sim_stream *s)
{
	uint64_t end;

	pthread_mutex_lock(&s->lock);
	end = s->completed < s->enqueued ? s->enqueued : 0;
	pthread_mutex_unlock(&s->lock);
	return end;
}

static bool is_blocking(const struct sim_stream *s)
{
	return s->kind != STREAM_LEGACY && !(s->flags & CU_STREAM_NON_BLOCKING);
}

/*
 * The pending ends of the context's streams: all of them (legacy_only false,
 * for cuCtxSynchronize), or the legacy stream and the blocking streams (what
 * synchronising with the legacy stream means). Free with positions_drop().
 */
static CUresult ctx_positions(struct sim_ctx *ctx, bool legacy_only, struct pos **out, size_t *n)
{
	struct sim_stream *s;
	struct pos *p;
	size_t cap = 0;

	pthread_mutex_lock(&ctx->lock);
	for (s = ctx->streams; s; s = s->ctx_next)
		cap++;
	p = malloc((cap ? cap : 1) * sizeof(*p));
	if (!p) {
		pthread_mutex_unlock(&ctx->lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*n = 0;
	for (s = ctx->streams; s; s = s->ctx_next) {
		uint64_t end;

		if (legacy_only && s->kind != STREAM_LEGACY && !is_blocking(s))
			continue;
		end = pending_end(s);
		if (!end)
			continue;
		stream_ref(s);
		p[*n].stream = s;
		p[(*n)++].seq = end;
	}
	pthread_mutex_unlock(&ctx->lock);
	*out = p;
	return CUDA_SUCCESS;
}

static void positions_drop(struct pos *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		stream_put(p[i].stream);
	free(p);
}

/* ---- the worker ---- */

static void run_memset(const struct op *op)
{
	size_t n = op->set.count;

	if (op->set.width == 1) {
		memset(op->set.dst, (int)op->set.value, n);
	} else if (op->set.width == 2) {
		uint16_t *d = op->set.dst;

		for (size_t i = 0; i < n; i++)
			d[i] = (uint16_t)op->set.value;
	} else {
		uint32_t *d = op->set.dst;

		for (size_t i = 0; i < n; i++)
			d[i] = op->set.value;
	}
}

/* ---- interprocess events ---- */

/* Record number gen has run: completed is the highest that has. */
static void ipc_complete(struct sim_ipc *ipc, uint64_t gen)
{
	uint64_t c = atomic_load(&ipc->completed);

	while (c < gen && !atomic_compare_exchange_weak(&ipc->completed, &c, gen))
		;
}

/* Block until record number gen has run, in whichever process it was made. */
static void ipc_wait(struct sim_ipc *ipc, uint64_t gen)
{
	struct timespec ts = {0, 20000};

	while (atomic_load(&ipc->completed) < gen)
		nanosleep(&ts, NULL);
}

static struct sim_ipc *ipc_map(int fd)
{
	struct stat st;
	void *m;

	if (fstat(fd, &st) || st.st_size < (off_t)sizeof(struct sim_ipc))
		return NULL;
	m = mmap(NULL, sizeof(struct sim_ipc), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	return m == MAP_FAILED ? NULL : m;
}

/* A new shared page for an event created with CU_EVENT_INTERPROCESS. */
static bool ipc_new(struct sim_event *e)
{
	static _Atomic uint64_t next_serial = 1;
	int fd = memfd_create("sim-ipc-event", MFD_CLOEXEC);

	if (fd < 0)
		return false;
	if (ftruncate(fd, sizeof(struct sim_ipc)) || !(e->ipc = ipc_map(fd))) {
		close(fd);
		return false;
	}
	e->ipc_fd = fd;
	e->ipc->magic = SIM_IPC_MAGIC;
	e->ipc->serial = (uint64_t)getpid() << 32 ^ atomic_fetch_add(&next_serial, 1) ^
			 (uint64_t)time(NULL) << 20;
	return true;
}

static void run_record(const struct op *op)
{
	struct sim_event *e = op->record.event;

	if (e->ipc)
		ipc_complete(e->ipc, op->record.ipc_gen);

	pthread_mutex_lock(&e->lock);
	/* A record that was overwritten by a later one leaves no trace. */
	if (e->gen == op->record.gen)
		clock_gettime(CLOCK_MONOTONIC, &e->time);
	pthread_mutex_unlock(&e->lock);
}

static void op_run(const struct op *op)
{
	struct sim_thread *t;

	switch (op->kind) {
	case OP_HOST_FN:
		t = sim_thread(true);
		t->in_host_fn = true;
		op->host.fn(op->host.data);
		t->in_host_fn = false;
		break;
	case OP_CALLBACK:
		t = sim_thread(true);
		t->in_host_fn = true;
		op->callback.fn(op->callback.handle, CUDA_SUCCESS, op->callback.data);
		t->in_host_fn = false;
		break;
	case OP_MEMSET:
		run_memset(op);
		break;
	case OP_COPY:
		memcpy(op->copy.dst, op->copy.src, op->copy.bytes);
		break;
	case OP_WAIT:
		pos_wait(op->wait.stream, op->wait.seq);
		break;
	case OP_RECORD:
		run_record(op);
		break;
	case OP_IPC_WAIT:
		ipc_wait(op->ipc_wait.event->ipc, op->ipc_wait.gen);
		break;
	}
}

static void ctx_unlink(struct sim_stream *s)
{
	struct sim_stream **link;

	pthread_mutex_lock(&s->ctx->lock);
	for (link = &s->ctx->streams; *link != s; link = &(*link)->ctx_next)
		;
	*link = s->ctx_next;
	pthread_mutex_unlock(&s->ctx->lock);
}

static void *stream_worker(void *arg)
{
	struct sim_stream *s = arg;
	struct sim_ctx *ctx = s->ctx;
	struct op *op;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		while (!s->head && !s->retired)
			pthread_cond_wait(&s->work_cv, &s->lock);
		op = s->head;
		if (!op)
			break;
		/* The op stays queued while it runs: the stream is not idle yet. */
		pthread_mutex_unlock(&s->lock);
		op_run(op);
		pthread_mutex_lock(&s->lock);
		s->head = op->next;
		if (!s->head)
			s->tail = NULL;
		s->completed++;
		pthread_cond_broadcast(&s->done_cv);
		pthread_mutex_unlock(&s->lock);
		op_free(op);
		pthread_mutex_lock(&s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	ctx_unlink(s);
	stream_put(s);
	sim_ctx_put(ctx);
	return NULL;
}

/* ---- stream objects ---- */

/* A new stream with a running worker, linked into ctx; caller holds ctx->lock. */
static CUresult stream_new_locked(struct sim_ctx *ctx, enum stream_kind kind, unsigned flags,
				  int priority, struct sim_stream **out)
{
	struct sim_stream *s;
	pthread_attr_t attr;
	pthread_t thread;
	int err;

	/* cuCtxDestroy marks the context under its lock, and from then on nothing joins. */
	if (atomic_load(&ctx->destroyed))
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	s = calloc(1, sizeof(*s));
	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	s->ctx = ctx;
	s->kind = kind;
	s->flags = flags;
	s->priority = priority;
	s->id = atomic_fetch_add(&next_stream_id, 1);
	/* One reference for the owner (handle, context or thread), one for the worker. */
	atomic_init(&s->refs, 2);
	/*
	 * The worker keeps the context until it has unlinked itself, and the
	 * stream object keeps it while it lives, but for the legacy stream,
	 * which the context keeps instead.
	 */
	sim_ctx_ref(ctx);
	if (kind != STREAM_LEGACY)
		sim_ctx_ref(ctx);
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->work_cv, NULL);
	pthread_cond_init(&s->done_cv, NULL);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	err = pthread_create(&thread, &attr, stream_worker, s);
	pthread_attr_destroy(&attr);
	if (err) {
		sim_ctx_put(ctx);
		atomic_store(&s->refs, 1);
		stream_put(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	/* The worker unlinks itself under ctx->lock, which the caller holds. */
	s->ctx_next = ctx->streams;
	ctx->streams = s;
	*out = s;
	return CUDA_SUCCESS;
}

/* No more work for s: its worker finishes what is queued and exits. */
static void stream_retire(struct sim_stream *s)
{
	pthread_mutex_lock(&s->lock);
	s->retired = true;
	pthread_cond_signal(&s->work_cv);
	pthread_mutex_unlock(&s->lock);
}

/*
 * The legacy stream of a context current on this thread, borrowed: the
 * context keeps it until the context is freed, so no lock or reference is
 * needed once it exists.
 */
static CUresult ctx_legacy(struct sim_ctx *ctx, struct sim_stream **out)
{
	struct sim_stream *s = atomic_load_explicit(&ctx->legacy, memory_order_acquire);
	CUresult rc = CUDA_SUCCESS;

	if (!s) {
		pthread_mutex_lock(&ctx->lock);
		s = atomic_load_explicit(&ctx->legacy, memory_order_relaxed);
		if (!s) {
			rc = stream_new_locked(ctx, STREAM_LEGACY, 0, 0, &s);
			if (rc == CUDA_SUCCESS)
				atomic_store_explicit(&ctx->legacy, s, memory_order_release);
		}
		pthread_mutex_unlock(&ctx->lock);
	}
	if (rc == CUDA_SUCCESS)
		*out = s;
	return rc;
}

static bool stream_retired(struct sim_stream *s)
{
	bool retired;

	pthread_mutex_lock(&s->lock);
	retired = s->retired;
	pthread_mutex_unlock(&s->lock);
	return retired;
}

/* Retired by the thread state's destructor when the thread exits. */
void sim_stream_thread_exit(struct sim_thread *t)
{
	struct sim_per_thread *pt;

	while ((pt = t->per_thread)) {
		t->per_thread = pt->next;
		stream_retire(pt->stream);
		stream_put(pt->stream);
		free(pt);
	}
}

/* The calling thread's default stream in ctx, created on first use; borrowed from the thread. */
static CUresult ctx_per_thread(struct sim_ctx *ctx, struct sim_stream **out)
{
	struct sim_thread *t = sim_thread(true);
	struct sim_per_thread *pt, **link;
	CUresult rc;

	/* By serial: a context's address and handle value may be another's later. */
	for (pt = t->per_thread; pt; pt = pt->next) {
		if (pt->ctx_serial == atomic_load(&ctx->serial)) {
			*out = pt->stream;
			return CUDA_SUCCESS;
		}
	}
	/* cuCtxDestroy retired the streams of destroyed contexts, and a reset those of the
	 * primary context's life before; let go of them here. */
	for (link = &t->per_thread; (pt = *link);) {
		if (stream_retired(pt->stream)) {
			*link = pt->next;
			stream_put(pt->stream);
			free(pt);
		} else {
			link = &pt->next;
		}
	}
	pt = malloc(sizeof(*pt));
	if (!pt)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&ctx->lock);
	rc = stream_new_locked(ctx, STREAM_PER_THREAD, 0, 0, &pt->stream);
	pthread_mutex_unlock(&ctx->lock);
	if (rc != CUDA_SUCCESS) {
		free(pt);
		return rc;
	}
	pt->ctx_serial = atomic_load(&ctx->serial);
	pt->next = t->per_thread;
	t->per_thread = pt;
	*out = pt->stream;
	return CUDA_SUCCESS;
}

static bool handle_special(CUstream handle)
{
	return handle == NULL || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD;
}

/*
 * The stream that NULL or CU_STREAM_LEGACY (the legacy stream) or
 * CU_STREAM_PER_THREAD (the thread's default stream) names in the current
 * context; borrowed, as the context and the thread keep these alive.
 */
static CUresult stream_special(CUstream handle, struct sim_stream **out)
{
	struct sim_ctx *ctx;
	CUresult rc;

	rc = sim_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (handle == CU_STREAM_PER_THREAD)
		return ctx_per_thread(ctx, out);
	return ctx_legacy(ctx, out);
}

static void stream_take(void *obj, void *arg)
{
	stream_ref(obj);
	*(struct sim_stream **)arg = obj;
}

/* A handle that names no stream, or no event. Where it is a destroyed one's that nothing has
 * taken since, the driver faults (580: cuStreamGetId, cuStreamGetCtx, cuStreamQuery;
 * cuEventQuery, cuEventSynchronize, cuEventRecord, cuStreamWaitEvent), and so does the sim
 * unless SOP_SIM_DEAD_HANDLES=error (sim.c) or this thread named it on purpose. */
static CUresult handle_unknown(enum sim_handle_kind kind, uint64_t value)
{
	const char *what = kind == SIM_HANDLE_STREAM ? "stream" : "event";

	if (sim_cfg.dead_handles_fault && value != sim_thread(true)->dead_ok[kind] &&
	    sim_handle_dead(kind, value))
		sim_die("sim: %s %p used after its destroy, and no %s was made at its handle "
			"since: the driver faults here",
			what, (void *)(uintptr_t)value, what);
	return CUDA_ERROR_INVALID_HANDLE;
}

SIM_EXPORT void sim_stream_dead_ok(CUstream h)
{
	sim_thread(true)->dead_ok[SIM_HANDLE_STREAM] = SIM_VALUE(h);
}

SIM_EXPORT void sim_event_dead_ok(CUevent h)
{
	sim_thread(true)->dead_ok[SIM_HANDLE_EVENT] = SIM_VALUE(h);
}

/* The stream a handle names, with a reference: a special handle, or a live stream. */
static CUresult stream_get(CUstream handle, struct sim_stream **out)
{
	CUresult rc;

	if (handle_special(handle)) {
		rc = stream_special(handle, out);
		if (rc == CUDA_SUCCESS)
			stream_ref(*out);
		return rc;
	}
	if (!sim_handle_visit(SIM_HANDLE_STREAM, SIM_VALUE(handle), stream_take, out))
		return handle_unknown(SIM_HANDLE_STREAM, SIM_VALUE(handle));
	return CUDA_SUCCESS;
}

static void event_take(void *obj, void *arg)
{
	struct sim_event *e = obj;

	atomic_fetch_add(&e->refs, 1);
	*(struct sim_event **)arg = e;
}

static CUresult event_get(CUevent handle, struct sim_event **out)
{
	if (!sim_handle_visit(SIM_HANDLE_EVENT, SIM_VALUE(handle), event_take, out))
		return handle_unknown(SIM_HANDLE_EVENT, SIM_VALUE(handle));
	return CUDA_SUCCESS;
}

/* ---- enqueueing ---- */

static struct op *op_wait_new(struct sim_stream *target, uint64_t seq)
{
	struct op *w = calloc(1, sizeof(*w));

	if (w) {
		w->kind = OP_WAIT;
		stream_ref(target);
		w->wait.stream = target;
		w->wait.seq = seq;
	}
	return w;
}

/* Appends a wait for target's pending work to *list; false if out of memory. */
static bool implicit_wait(struct sim_stream *target, struct op **list)
{
	uint64_t end = pending_end(target);
	struct op *w;

	if (!end)
		return true;
	w = op_wait_new(target, end);
	if (!w)
		return false;
	w->next = *list;
	*list = w;
	return true;
}

/* The implicit waits that legacy stream semantics put in front of work on s. */
static bool legacy_waits(struct sim_stream *s, struct op **list)
{
	struct sim_ctx *ctx = s->ctx;

	if (s->kind != STREAM_LEGACY) {
		struct sim_stream *legacy = atomic_load(&ctx->legacy);

		return !legacy || implicit_wait(legacy, list);
	}
	for (struct sim_stream *t = ctx->streams; t; t = t->ctx_next)
		if (t != s && is_blocking(t) && !implicit_wait(t, list))
			return false;
	return true;
}

/* Appends the list (ending in the caller's op) to s; gives the last op's position. */
static CUresult push(struct sim_stream *s, struct op *list, uint64_t *seq)
{
	struct op *last = list;

	pthread_mutex_lock(&s->lock);
	if (s->retired) {
		/* Only a use racing with cuStreamDestroy gets here. */
		pthread_mutex_unlock(&s->lock);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	s->enqueued++;
	while (last->next) {
		last = last->next;
		s->enqueued++;
	}
	if (s->tail)
		s->tail->next = list;
	else
		s->head = list;
	s->tail = last;
	*seq = s->enqueued;
	pthread_cond_signal(&s->work_cv);
	pthread_mutex_unlock(&s->lock);
	return CUDA_SUCCESS;
}

/* Enqueues op (taking ownership of it, even on failure) on s. */
static bool capture_append(struct sim_stream *s, struct op *op, CUresult *rc);

static CUresult enqueue(struct sim_stream *s, struct op *op, uint64_t *seq)
{
	struct op *list = NULL, **tail;
	CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;

	op->next = NULL;
	if (capture_append(s, op, &rc)) {
		*seq = 0;	/* reached at once: nothing runs until a launch */
		return rc;
	}
	if (s->kind != STREAM_LEGACY && !is_blocking(s)) {
		rc = push(s, op, seq);
		if (rc != CUDA_SUCCESS)
			op_free(op);
		return rc;
	}
	/* The context lock makes the snapshot and the append one step. */
	pthread_mutex_lock(&s->ctx->lock);
	if (legacy_waits(s, &list)) {
		for (tail = &list; *tail; tail = &(*tail)->next)
			;
		*tail = op;
		rc = push(s, list, seq);
		op = NULL;	/* now part of list */
	}
	pthread_mutex_unlock(&s->ctx->lock);
	if (rc != CUDA_SUCCESS) {
		op_free_list(list);
		if (op)
			op_free(op);
	}
	return rc;
}

/* Enqueues a copy of *tmpl on the stream named by handle; waits for it if sync. */
static CUresult submit(CUstream handle, const struct op *tmpl, bool sync)
{
	struct sim_stream *s;
	struct op *op;
	uint64_t seq;
	CUresult rc;

	rc = stream_get(handle, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	/* A memset or copy on a stream of a device the memory is not open to: on a GPU the copy
	 * faults (CUDA_ERROR_ILLEGAL_ADDRESS, at its run); here the enqueue says so. */
	if ((tmpl->kind == OP_MEMSET &&
	     !sim_vmm_reaches((uintptr_t)tmpl->set.dst, tmpl->set.count * tmpl->set.width,
			      s->ctx->device)) ||
	    (tmpl->kind == OP_COPY &&
	     (!sim_vmm_reaches((uintptr_t)tmpl->copy.dst, tmpl->copy.bytes, s->ctx->device) ||
	      !sim_vmm_reaches((uintptr_t)tmpl->copy.src, tmpl->copy.bytes, s->ctx->device)))) {
		stream_put(s);
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	}
	op = malloc(sizeof(*op));
	if (!op) {
		stream_put(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*op = *tmpl;
	rc = enqueue(s, op, &seq);
	if (rc == CUDA_SUCCESS && sync)
		pos_wait(s, seq);
	stream_put(s);
	return rc;
}

/* ---- streams ---- */

/*
 * The driver's creation of a stream may wait for the work of streams destroyed before it: on
 * an H100 (driver 580) it did once 35 or 36 of a context's streams existed, the destroyed ones
 * whose work was still pending among them. The sim waits from 32 on, a little sooner than
 * either, so that a test whose stream creation waits for its own blocked work on some machine
 * waits here too (the watchdog says where).
 */
#define STREAMS_BEFORE_WAIT 32

/* Caller holds ctx->lock; returns with it held, once no destroyed stream's work holds a
 * creation back. */
static void stream_room_locked(struct sim_ctx *ctx)
{
	for (;;) {
		struct sim_stream *t;
		int n = 0;
		bool pending = false;

		for (t = ctx->streams; t; t = t->ctx_next) {
			if (t->kind != STREAM_USER)
				continue;
			n++;
			if (stream_retired(t))
				pending = true;
		}
		if (n < STREAMS_BEFORE_WAIT || !pending)
			return;
		pthread_mutex_unlock(&ctx->lock);
		usleep(200);
		pthread_mutex_lock(&ctx->lock);
	}
}

static CUresult stream_create(CUstream *ph, unsigned flags, int priority)
{
	struct sim_ctx *ctx;
	struct sim_stream *s;
	uint64_t value = 0;
	CUresult rc;

	if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
		return CUDA_ERROR_INVALID_VALUE;
	rc = sim_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	/* Bound under the context lock, so that cuCtxDestroy finds each stream with its value. */
	pthread_mutex_lock(&ctx->lock);
	stream_room_locked(ctx);
	rc = stream_new_locked(ctx, STREAM_USER, flags, priority, &s);
	if (rc == CUDA_SUCCESS && !sim_handle_bind(SIM_HANDLE_STREAM, s, &s->handle)) {
		/* The worker still holds the stream: this frees nothing under the lock. */
		stream_retire(s);
		stream_put(s);
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (rc == CUDA_SUCCESS) {
		value = s->handle;
	}
	pthread_mutex_unlock(&ctx->lock);
	if (rc == CUDA_SUCCESS)
		*ph = (CUstream)(uintptr_t)value;
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream *ph, unsigned int flags)
{
	SIM_ENTER(cuStreamCreate);
	return stream_create(ph, flags, 0);
}

SIM_EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *ph, unsigned int flags,
						       int priority)
{
	SIM_ENTER(cuStreamCreateWithPriority);
	/* Like the driver, clamp to the range cuCtxGetStreamPriorityRange gives. */
	if (priority < -5)
		priority = -5;
	if (priority > 0)
		priority = 0;
	return stream_create(ph, flags, priority);
}

SIM_EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream handle)
{
	struct sim_stream *s;

	SIM_ENTER(cuStreamDestroy);
	s = sim_handle_unbind(SIM_HANDLE_STREAM, SIM_VALUE(handle), NULL);
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	/*
	 * Returns at once; queued work still runs, then the worker lets go.
	 * The value is already free: the next stream created may get it.
	 */
	stream_retire(s);
	stream_put(s);
	return CUDA_SUCCESS;
}

/* Reached: every position of the stream's current work (legacy: and the blocking streams'). */
static CUresult stream_reach(CUstream handle, bool wait)
{
	struct sim_stream *s;
	struct pos *p, one;
	size_t n = 1;
	bool done = true;
	CUresult rc;

	rc = stream_get(handle, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (s->kind == STREAM_LEGACY) {
		rc = ctx_positions(s->ctx, true, &p, &n);
		stream_put(s);
		if (rc != CUDA_SUCCESS)
			return rc;
	} else {
		one.stream = s;
		pthread_mutex_lock(&s->lock);
		one.seq = s->enqueued;
		pthread_mutex_unlock(&s->lock);
		p = &one;
	}
	for (size_t i = 0; i < n; i++) {
		if (wait)
			pos_wait(p[i].stream, p[i].seq);
		else if (!pos_reached(p[i].stream, p[i].seq))
			done = false;
	}
	if (p == &one)
		stream_put(s);
	else
		positions_drop(p, n);
	return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

static CUresult capture_forbids(CUstream handle);

SIM_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream handle)
{
	CUresult rc;

	SIM_ENTER(cuStreamQuery);
	rc = capture_forbids(handle);
	return rc == CUDA_SUCCESS ? stream_reach(handle, false) : rc;
}

SIM_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream handle)
{
	CUresult rc;

	SIM_ENTER(cuStreamSynchronize);
	rc = capture_forbids(handle);
	return rc == CUDA_SUCCESS ? stream_reach(handle, true) : rc;
}

SIM_EXPORT CUresult CUDAAPI cuCtxSynchronize(void)
{
	struct sim_ctx *ctx;
	struct pos *p;
	size_t n;
	CUresult rc;

	SIM_ENTER(cuCtxSynchronize);
	rc = sim_capture_unsafe();
	if (rc == CUDA_SUCCESS)
		rc = sim_ctx_current(&ctx);
	if (rc == CUDA_SUCCESS)
		rc = ctx_positions(ctx, false, &p, &n);
	if (rc != CUDA_SUCCESS)
		return rc;
	for (size_t i = 0; i < n; i++)
		pos_wait(p[i].stream, p[i].seq);
	positions_drop(p, n);
	return CUDA_SUCCESS;
}

/* What the getters read, all fixed at creation. */
struct stream_info {
	unsigned long long id;
	CUcontext ctx;
	unsigned flags;
	int priority;
	CUdevice device;
};

static void stream_info_fill(void *obj, void *arg)
{
	const struct sim_stream *s = obj;
	struct stream_info *info = arg;

	info->id = s->id;
	info->ctx = (CUcontext)(uintptr_t)s->ctx->handle;
	info->flags = s->flags;
	info->priority = s->priority;
	info->device = s->ctx->device;
}

/*
 * Copied under the handle table's read lock, without a reference: lookups of
 * one stream from many threads (the library asks for a stream's id on every
 * allocation) then share nothing but that read lock.
 */
static CUresult stream_info(CUstream handle, struct stream_info *info)
{
	struct sim_stream *s;
	CUresult rc;

	if (handle_special(handle)) {
		rc = stream_special(handle, &s);
		if (rc == CUDA_SUCCESS)
			stream_info_fill(s, info);
		return rc;
	}
	if (!sim_handle_visit(SIM_HANDLE_STREAM, SIM_VALUE(handle), stream_info_fill, info))
		return handle_unknown(SIM_HANDLE_STREAM, SIM_VALUE(handle));
	return CUDA_SUCCESS;
}

CUresult sim_stream_device(CUstream handle, CUdevice *dev)
{
	struct stream_info info;
	CUresult rc = stream_info(handle, &info);

	if (rc == CUDA_SUCCESS)
		*dev = info.device;
	return rc;
}

/* The body of the simple getters: one field of stream_info. */
#define STREAM_GETTER(handle, out, field) \
	do { \
		struct stream_info info_; \
		CUresult rc_; \
		if (!(out)) \
			return CUDA_ERROR_INVALID_VALUE; \
		rc_ = stream_info((handle), &info_); \
		if (rc_ == CUDA_SUCCESS) \
			*(out) = info_.field; \
		return rc_; \
	} while (0)

SIM_EXPORT CUresult CUDAAPI cuStreamGetCtx(CUstream handle, CUcontext *pctx)
{
	SIM_ENTER(cuStreamGetCtx);
	STREAM_GETTER(handle, pctx, ctx);
}

SIM_EXPORT CUresult CUDAAPI cuStreamGetFlags(CUstream handle, unsigned int *flags)
{
	SIM_ENTER(cuStreamGetFlags);
	STREAM_GETTER(handle, flags, flags);
}

SIM_EXPORT CUresult CUDAAPI cuStreamGetPriority(CUstream handle, int *priority)
{
	SIM_ENTER(cuStreamGetPriority);
	STREAM_GETTER(handle, priority, priority);
}

static CUresult capture_refuses(CUstream handle);

SIM_EXPORT CUresult CUDAAPI cuStreamGetId(CUstream handle, unsigned long long *id)
{
	CUresult rc;

	SIM_ENTER(cuStreamGetId);
	rc = capture_refuses(handle);
	if (rc != CUDA_SUCCESS)
		return rc;
	STREAM_GETTER(handle, id, id);
}

SIM_EXPORT CUresult CUDAAPI cuStreamGetDevice(CUstream handle, CUdevice *device)
{
	SIM_ENTER(cuStreamGetDevice);
	STREAM_GETTER(handle, device, device);
}

SIM_EXPORT CUresult CUDAAPI cuLaunchHostFunc(CUstream handle, CUhostFn fn, void *data)
{
	struct op op = { .kind = OP_HOST_FN, .host = { fn, data } };

	SIM_ENTER(cuLaunchHostFunc);
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	return submit(handle, &op, false);
}

SIM_EXPORT CUresult CUDAAPI cuStreamAddCallback(CUstream handle, CUstreamCallback fn, void *data,
						unsigned int flags)
{
	struct op op = { .kind = OP_CALLBACK, .callback = { fn, handle, data } };

	SIM_ENTER(cuStreamAddCallback);
	if (!fn || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	return submit(handle, &op, false);
}

/* ---- memsets and copies ---- */

static CUresult memset_submit(CUdeviceptr dst, unsigned value, unsigned width, size_t count,
			      CUstream handle, bool sync)
{
	struct op op = {
		.kind = OP_MEMSET,
		.set = { (void *)(uintptr_t)dst, count, value, width },
	};

	/* The driver refuses misaligned 16- and 32-bit memsets. */
	if (!dst || dst % width != 0)
		return CUDA_ERROR_INVALID_VALUE;
	return submit(handle, &op, sync);
}

SIM_EXPORT CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n,
					    CUstream handle)
{
	SIM_ENTER(cuMemsetD8Async);
	return memset_submit(dst, uc, 1, n, handle, false);
}

SIM_EXPORT CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dst, unsigned short us, size_t n,
					     CUstream handle)
{
	SIM_ENTER(cuMemsetD16Async);
	return memset_submit(dst, us, 2, n, handle, false);
}

SIM_EXPORT CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t n,
					     CUstream handle)
{
	SIM_ENTER(cuMemsetD32Async);
	return memset_submit(dst, ui, 4, n, handle, false);
}

SIM_EXPORT CUresult CUDAAPI cuMemsetD8(CUdeviceptr dst, unsigned char uc, size_t n)
{
	SIM_ENTER(cuMemsetD8);
	return memset_submit(dst, uc, 1, n, NULL, true);
}

SIM_EXPORT CUresult CUDAAPI cuMemsetD16(CUdeviceptr dst, unsigned short us, size_t n)
{
	SIM_ENTER(cuMemsetD16);
	return memset_submit(dst, us, 2, n, NULL, true);
}

SIM_EXPORT CUresult CUDAAPI cuMemsetD32(CUdeviceptr dst, unsigned int ui, size_t n)
{
	SIM_ENTER(cuMemsetD32);
	return memset_submit(dst, ui, 4, n, NULL, true);
}

static CUresult copy_submit(void *dst, const void *src, size_t bytes, CUstream handle, bool sync)
{
	struct op op = { .kind = OP_COPY, .copy = { dst, src, bytes } };

	if (bytes && (!dst || !src))
		return CUDA_ERROR_INVALID_VALUE;
	return submit(handle, &op, sync);
}

#define DPTR(p) ((void *)(uintptr_t)(p))

SIM_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n,
					      CUstream handle)
{
	SIM_ENTER(cuMemcpyHtoDAsync);
	return copy_submit(DPTR(dst), src, n, handle, false);
}

SIM_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n,
					      CUstream handle)
{
	SIM_ENTER(cuMemcpyDtoHAsync);
	return copy_submit(dst, DPTR(src), n, handle, false);
}

SIM_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n,
					      CUstream handle)
{
	SIM_ENTER(cuMemcpyDtoDAsync);
	return copy_submit(DPTR(dst), DPTR(src), n, handle, false);
}

SIM_EXPORT CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n,
					  CUstream handle)
{
	SIM_ENTER(cuMemcpyAsync);
	return copy_submit(DPTR(dst), DPTR(src), n, handle, false);
}

SIM_EXPORT CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n)
{
	SIM_ENTER(cuMemcpyHtoD);
	return copy_submit(DPTR(dst), src, n, NULL, true);
}

SIM_EXPORT CUresult CUDAAPI cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n)
{
	SIM_ENTER(cuMemcpyDtoH);
	return copy_submit(dst, DPTR(src), n, NULL, true);
}

SIM_EXPORT CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	SIM_ENTER(cuMemcpyDtoD);
	return copy_submit(DPTR(dst), DPTR(src), n, NULL, true);
}

SIM_EXPORT CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	SIM_ENTER(cuMemcpy);
	return copy_submit(DPTR(dst), DPTR(src), n, NULL, true);
}

/* ---- events ---- */

/* Takes e off its context's list; caller holds e->ctx->lock. */
static void event_unlink(struct sim_event *e)
{
	if (e->ctx_prev)
		e->ctx_prev->ctx_next = e->ctx_next;
	else
		e->ctx->events = e->ctx_next;
	if (e->ctx_next)
		e->ctx_next->ctx_prev = e->ctx_prev;
}

/*
 * A new event in the current context. An interprocess one gets a shared page
 * of its own (ipc_fd -1), or the one opened at ipc_fd (closed here either way).
 */
static CUresult event_new(unsigned flags, int ipc_fd, CUevent *ph)
{
	struct sim_ctx *ctx;
	struct sim_event *e;
	uint64_t value = 0;
	CUresult rc = CUDA_SUCCESS;

	rc = sim_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS) {
		if (ipc_fd >= 0)
			close(ipc_fd);
		return rc;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		if (ipc_fd >= 0)
			close(ipc_fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	sim_ctx_ref(ctx);
	e->ctx = ctx;
	e->flags = flags;
	e->ipc_fd = -1;
	atomic_init(&e->refs, 1);
	pthread_mutex_init(&e->lock, NULL);
	if (ipc_fd >= 0) {
		e->ipc = ipc_map(ipc_fd);
		close(ipc_fd);
		if (!e->ipc || e->ipc->magic != SIM_IPC_MAGIC) {
			event_put(e);
			return CUDA_ERROR_INVALID_VALUE;
		}
	} else if ((flags & CU_EVENT_INTERPROCESS) && !ipc_new(e)) {
		event_put(e);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	/* Bound and listed in one step, for cuCtxDestroy and cuEventDestroy alike. */
	pthread_mutex_lock(&ctx->lock);
	if (atomic_load(&ctx->destroyed)) {
		rc = CUDA_ERROR_CONTEXT_IS_DESTROYED;
	} else if (!sim_handle_bind(SIM_HANDLE_EVENT, e, &e->handle)) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		value = e->handle;
		e->ctx_next = ctx->events;
		if (ctx->events)
			ctx->events->ctx_prev = e;
		ctx->events = e;
	}
	pthread_mutex_unlock(&ctx->lock);
	if (rc != CUDA_SUCCESS) {
		event_put(e);
		return rc;
	}
	*ph = (CUevent)(uintptr_t)value;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuEventCreate(CUevent *ph, unsigned int flags)
{
	const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
			       CU_EVENT_INTERPROCESS;

	SIM_ENTER(cuEventCreate);
	if (!ph || (flags & ~known))
		return CUDA_ERROR_INVALID_VALUE;
	/* The driver's rule: an interprocess event is not timed. */
	if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING))
		return CUDA_ERROR_INVALID_VALUE;
	return event_new(flags, -1, ph);
}

SIM_EXPORT CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle *handle, CUevent event)
{
	struct sim_ipc_handle h = {0};
	struct sim_event *e;
	CUresult rc;

	SIM_ENTER(cuIpcGetEventHandle);
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	rc = event_get(event, &e);
	if (rc != CUDA_SUCCESS)
		return rc;
	/* Only the creator's: an opened event names its page through the creator. */
	if (e->ipc && e->ipc_fd >= 0) {
		h.magic = SIM_IPC_MAGIC;
		h.serial = e->ipc->serial;
		h.pid = (int32_t)getpid();
		h.fd = e->ipc_fd;
		memset(handle, 0, sizeof(*handle));
		memcpy(handle->reserved, &h, sizeof(h));
	} else {
		rc = CUDA_ERROR_INVALID_VALUE;
	}
	event_put(e);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuIpcOpenEventHandle(CUevent *ph, CUipcEventHandle handle)
{
	struct sim_ipc_handle h;
	struct sim_ipc *ipc;
	char path[64];
	CUevent ev;
	CUresult rc;
	int fd;

	SIM_ENTER(cuIpcOpenEventHandle);
	if (!ph)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(&h, handle.reserved, sizeof(h));
	if (h.magic != SIM_IPC_MAGIC || h.fd < 0 || h.pid <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	/* The driver opens IPC handles of other processes only. */
	if (h.pid == (int32_t)getpid())
		return CUDA_ERROR_INVALID_CONTEXT;
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return CUDA_ERROR_INVALID_VALUE;
	/* The same page, not whatever the creator has at that number now. */
	ipc = ipc_map(fd);
	if (!ipc || ipc->magic != SIM_IPC_MAGIC || ipc->serial != h.serial) {
		if (ipc)
			munmap(ipc, sizeof(*ipc));
		close(fd);
		return CUDA_ERROR_INVALID_VALUE;
	}
	munmap(ipc, sizeof(*ipc));
	rc = event_new(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, fd, &ev);
	if (rc == CUDA_SUCCESS)
		*ph = ev;
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuEventDestroy(CUevent handle)
{
	struct sim_event *e;

	SIM_ENTER(cuEventDestroy);
	e = sim_handle_unbind(SIM_HANDLE_EVENT, SIM_VALUE(handle), NULL);
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&e->ctx->lock);
	event_unlink(e);
	pthread_mutex_unlock(&e->ctx->lock);
	/* A pending record keeps its own reference; the event dies after it. */
	event_put(e);
	return CUDA_SUCCESS;
}

static bool capture_record(struct sim_event *e, struct sim_stream *s, CUresult *rc);
static bool capture_wait(struct sim_stream *s, CUevent event, unsigned flags, CUresult *rc);
static bool event_captured(CUevent handle);

static CUresult event_record(CUevent handle, CUstream stream_handle)
{
	struct sim_event *e;
	struct sim_stream *s, *old = NULL;
	struct op *op;
	uint64_t seq, ipc_gen = 0;
	CUresult rc;

	rc = event_get(handle, &e);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = stream_get(stream_handle, &s);
	if (rc != CUDA_SUCCESS)
		goto out_event;
	rc = CUDA_ERROR_INVALID_HANDLE;
	if (s->ctx != e->ctx)
		goto out_stream;
	rc = CUDA_ERROR_OUT_OF_MEMORY;
	op = calloc(1, sizeof(*op));
	if (!op)
		goto out_stream;
	op->kind = OP_RECORD;
	op->record.event = e;
	atomic_fetch_add(&e->refs, 1);
	/* Under the event lock, so that concurrent records of e are ordered. */
	pthread_mutex_lock(&e->lock);
	op->record.gen = e->gen + 1;
	if (capture_record(e, s, &rc)) {
		/* A node of the graph: the event's position is the capture's now. */
		pthread_mutex_unlock(&e->lock);
		op_free(op);
		goto out_stream;
	}
	if (e->ipc)
		op->record.ipc_gen = ipc_gen = atomic_fetch_add(&e->ipc->recorded, 1) + 1;
	rc = enqueue(s, op, &seq);
	if (rc != CUDA_SUCCESS && e->ipc)
		/* Taken, so published: no process waits for a record that never runs. */
		ipc_complete(e->ipc, ipc_gen);
	if (rc == CUDA_SUCCESS) {
		old = e->stream;
		stream_ref(s);
		e->stream = s;
		e->seq = seq;
		e->gen++;
	}
	pthread_mutex_unlock(&e->lock);
	if (old)
		stream_put(old);
out_stream:
	stream_put(s);
out_event:
	event_put(e);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuEventRecord(CUevent handle, CUstream stream)
{
	SIM_ENTER(cuEventRecord);
	return event_record(handle, stream);
}

SIM_EXPORT CUresult CUDAAPI cuEventRecordWithFlags(CUevent handle, CUstream stream,
						   unsigned int flags)
{
	SIM_ENTER(cuEventRecordWithFlags);
	/* EXTERNAL only matters under stream capture, where it is recorded like any other. */
	if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	return event_record(handle, stream);
}

/* The event's last record position, with a reference; stream NULL if never recorded. */
static CUresult event_position(CUevent handle, struct pos *p)
{
	struct sim_event *e;
	CUresult rc;

	rc = event_get(handle, &e);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&e->lock);
	p->stream = e->stream;
	p->seq = e->seq;
	if (p->stream)
		stream_ref(p->stream);
	pthread_mutex_unlock(&e->lock);
	event_put(e);
	return CUDA_SUCCESS;
}

/*
 * An interprocess event, with a reference, and the number of its last record
 * in any process (0: none); NULL (and success) for an event of this process
 * alone.
 */
static CUresult event_ipc(CUevent handle, struct sim_event **out, uint64_t *gen)
{
	struct sim_event *e;
	CUresult rc;

	*out = NULL;
	rc = event_get(handle, &e);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (!e->ipc) {
		event_put(e);
		return CUDA_SUCCESS;
	}
	*gen = atomic_load(&e->ipc->recorded);
	*out = e;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuEventQuery(CUevent handle)
{
	struct sim_event *e;
	struct pos p;
	uint64_t gen;
	bool done;
	CUresult rc;

	SIM_ENTER(cuEventQuery);
	if (event_captured(handle))
		return CUDA_ERROR_CAPTURED_EVENT;
	rc = sim_capture_unsafe();
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = event_ipc(handle, &e, &gen);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (e) {
		done = atomic_load(&e->ipc->completed) >= gen;
		event_put(e);
		return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
	}
	rc = event_position(handle, &p);
	if (rc != CUDA_SUCCESS || !p.stream)
		return rc;
	done = pos_reached(p.stream, p.seq);
	stream_put(p.stream);
	return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent handle)
{
	struct sim_event *e;
	struct pos p;
	uint64_t gen;
	CUresult rc;

	SIM_ENTER(cuEventSynchronize);
	if (event_captured(handle))
		return CUDA_ERROR_CAPTURED_EVENT;
	rc = sim_capture_unsafe();
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = event_ipc(handle, &e, &gen);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (e) {
		ipc_wait(e->ipc, gen);
		event_put(e);
		return CUDA_SUCCESS;
	}
	rc = event_position(handle, &p);
	if (rc != CUDA_SUCCESS || !p.stream)
		return rc;
	pos_wait(p.stream, p.seq);
	stream_put(p.stream);
	return CUDA_SUCCESS;
}

/* When a timed, recorded and completed event happened. */
static CUresult event_time(struct sim_event *e, struct timespec *t)
{
	CUresult rc = CUDA_SUCCESS;

	if (e->flags & CU_EVENT_DISABLE_TIMING)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&e->lock);
	if (!e->stream)
		rc = CUDA_ERROR_INVALID_HANDLE;
	else if (!pos_reached(e->stream, e->seq))
		rc = CUDA_ERROR_NOT_READY;
	else
		*t = e->time;
	pthread_mutex_unlock(&e->lock);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
	struct sim_event *a, *b;
	struct timespec ta, tb;
	CUresult rc;

	SIM_ENTER(cuEventElapsedTime);
	if (!ms)
		return CUDA_ERROR_INVALID_VALUE;
	rc = event_get(start, &a);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = event_get(end, &b);
	if (rc == CUDA_SUCCESS) {
		rc = event_time(a, &ta);
		if (rc == CUDA_SUCCESS)
			rc = event_time(b, &tb);
		if (rc == CUDA_SUCCESS)
			*ms = (float)((double)(tb.tv_sec - ta.tv_sec) * 1e3 +
				      (double)(tb.tv_nsec - ta.tv_nsec) / 1e6);
		event_put(b);
	}
	event_put(a);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuStreamWaitEvent(CUstream handle, CUevent event, unsigned int flags)
{
	struct sim_stream *s;
	struct sim_event *e;
	struct pos p;
	struct op *op;
	uint64_t seq, gen;
	CUresult rc;

	SIM_ENTER(cuStreamWaitEvent);
	if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	rc = stream_get(handle, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (capture_wait(s, event, flags, &rc))
		goto out;
	rc = event_ipc(event, &e, &gen);
	if (rc != CUDA_SUCCESS)
		goto out;
	if (e) {
		/* The last record in any process, as it is now. */
		if (!gen || !(op = calloc(1, sizeof(*op)))) {
			event_put(e);
			rc = gen ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
			goto out;
		}
		op->kind = OP_IPC_WAIT;
		op->ipc_wait.event = e;	/* the reference moves into the op */
		op->ipc_wait.gen = gen;
		rc = enqueue(s, op, &seq);
		goto out;
	}
	/* The record as it is now; a later record does not move this wait. */
	rc = event_position(event, &p);
	if (rc != CUDA_SUCCESS || !p.stream)
		goto out;
	op = calloc(1, sizeof(*op));
	if (!op) {
		stream_put(p.stream);
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	op->kind = OP_WAIT;
	op->wait.stream = p.stream;	/* the reference moves into the op */
	op->wait.seq = p.seq;
	rc = enqueue(s, op, &seq);
out:
	stream_put(s);
	return rc;
}

/* ---- created contexts ---- */

void sim_stream_ctx_destroy(struct sim_ctx *ctx, bool reset)
{
	struct sim_event *e, *next, *dead = NULL;
	struct sim_stream *s;
	uint64_t end = 0;

	/* One stream at a time until none has work queued: nothing to allocate, nothing to fail. */
	for (;;) {
		pthread_mutex_lock(&ctx->lock);
		for (s = ctx->streams; s; s = s->ctx_next) {
			end = pending_end(s);
			if (end) {
				stream_ref(s);
				break;
			}
		}
		pthread_mutex_unlock(&ctx->lock);
		if (!s)
			break;
		pos_wait(s, end);
		stream_put(s);
	}
	pthread_mutex_lock(&ctx->lock);
	/* A reset context's next legacy stream is a new one; this one stays allocated for whoever
	 * still holds it (ctx_legacy lends it without a reference). Its per-thread streams, retired
	 * below, are let go of by their threads (ctx_per_thread, sim_stream_thread_exit). */
	if (reset && (s = atomic_exchange(&ctx->legacy, NULL))) {
		s->old_next = ctx->legacy_old;
		ctx->legacy_old = s;
	}
	for (s = ctx->streams; s; s = s->ctx_next) {
		stream_retire(s);
		/*
		 * A user stream not destroyed yet lets go of its value, and
		 * its handle's reference; its worker still holds it, so
		 * nothing is freed under the lock.
		 */
		if (s->kind == STREAM_USER && sim_handle_unbind(SIM_HANDLE_STREAM, s->handle, s))
			stream_put(s);
	}
	for (e = ctx->events; e; e = next) {
		next = e->ctx_next;
		/* An event that a racing cuEventDestroy unbound is unlinked there. */
		if (sim_handle_unbind(SIM_HANDLE_EVENT, e->handle, e)) {
			event_unlink(e);
			e->ctx_next = dead;
			dead = e;
		}
	}
	pthread_mutex_unlock(&ctx->lock);
	while ((e = dead)) {
		dead = e->ctx_next;
		event_put(e);
	}
}

void sim_stream_ctx_free(struct sim_ctx *ctx)
{
	struct sim_stream *legacy = atomic_load(&ctx->legacy), *next;

	if (legacy)
		stream_put(legacy);
	for (legacy = ctx->legacy_old; legacy; legacy = next) {
		next = legacy->old_next;
		stream_put(legacy);
	}
}

void sim_stream_live(struct sim_live *out)
{
	out->streams = sim_handle_count(SIM_HANDLE_STREAM);
	out->events = sim_handle_count(SIM_HANDLE_EVENT);
}

/* ---- stream capture and graphs ----
 *
 * A capture is what cuStreamBeginCapture starts on a stream: work enqueued on a capturing stream
 * is not run but appended to the capture's list of operations, in call order (one valid order of
 * the graph the driver would build). A stream joins a capture by waiting on an event recorded in
 * it. cuStreamEndCapture makes the list a graph; cuGraphLaunch enqueues copies of its operations
 * on a stream, as often as asked. Graph memory (cuMemAllocAsync on a capturing stream) is host
 * memory allocated at capture and kept for the graph's lifetime; it is live from a launch to its
 * free, in the graph or after it (cuMemFreeAsync), and a launch while it is live fails, as the
 * driver's does.
 *
 * The capture interaction modes, as the driver documents them: a thread in GLOBAL mode may not
 * make a potentially unsafe call while it has a capture of its own that is not RELAXED, or while
 * another thread has a GLOBAL one; a THREAD_LOCAL thread only for its own; a RELAXED thread never.
 * A forbidden call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates those
 * captures. The unsafe calls here: synchronizations and queries of streams, events and contexts,
 * classic allocations and frees, and stream-ordered ones on a stream that is not capturing (the
 * driver of 580 refuses cuMemFreeAsync there).
 *
 * cap_lock guards every capture's state and the streams' and events' links to captures; it is
 * taken last, under any other lock.
 */

struct sim_galloc {
	struct sim_galloc *next;
	void *mem;
	size_t size;
	bool freed_in_graph;	/* the capture freed it: a free node */
	bool live;		/* launched and not yet freed */
};

struct sim_graph {
	uint64_t id;
	CUstreamCaptureMode mode;
	struct sim_thread *owner;	/* the thread that began the capture */
	struct sim_stream *origin;	/* holds a reference while capturing */
	bool capturing, invalidated;
	/* Made by cuGraphCreate: a capture into it appends to it, and its end gives it back as it
	 * is, the program's still. */
	bool made;
	struct op *head, *tail;
	struct sim_galloc *allocs;
	struct sim_stream **joined;	/* streams that joined, with references */
	size_t n_joined;
	long refs;			/* the graph handle and its executables */
	struct sim_graph *next;		/* captures in flight */
	struct sim_graph *all_prev, *all_next;	/* every graph not yet freed */
};

struct sim_graph_exec {
	struct sim_graph *graph;
};

static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sim_graph *captures;	/* in flight */
static atomic_long n_captures;
static atomic_long n_captured_events;	/* set once an event is recorded in a capture */
static atomic_ullong next_capture_id = 1;
static struct sim_graph *graphs;	/* every capture and graph not yet freed */

/* A new graph among every graph not yet freed, with the reference its handle holds. cap_lock
 * held. */
static void graph_add_locked(struct sim_graph *g)
{
	g->refs = 1;
	g->all_next = graphs;
	if (graphs)
		graphs->all_prev = g;
	graphs = g;
}

static void graph_put_locked(struct sim_graph *g)
{
	if (--g->refs)
		return;
	if (g->all_prev)
		g->all_prev->all_next = g->all_next;
	else
		graphs = g->all_next;
	if (g->all_next)
		g->all_next->all_prev = g->all_prev;
	while (g->allocs) {
		struct sim_galloc *a = g->allocs;

		g->allocs = a->next;
		free(a->mem);
		free(a);
	}
	op_free_list(g->head);
	free(g);
}

static bool capture_append(struct sim_stream *s, struct op *op, CUresult *rc)
{
	struct sim_graph *g;

	if (!atomic_load(&n_captures))
		return false;
	pthread_mutex_lock(&cap_lock);
	g = s->cap;
	if (g && g->invalidated) {
		*rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	} else if (g) {
		*rc = CUDA_SUCCESS;
		op->next = NULL;
		if (g->tail)
			g->tail->next = op;
		else
			g->head = op;
		g->tail = op;
		op = NULL;
	}
	pthread_mutex_unlock(&cap_lock);
	if (g && op)
		op_free(op);
	return g != NULL;
}

/* An event recorded on a capturing stream: a node of the graph. e's lock held. */
static bool capture_record(struct sim_event *e, struct sim_stream *s, CUresult *rc)
{
	struct sim_graph *g;

	pthread_mutex_lock(&cap_lock);
	g = s->cap;
	if (g) {
		*rc = g->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
		if (!g->invalidated) {
			e->captured = true;
			e->capture_id = g->id;
			atomic_store(&n_captured_events, 1);
		}
	} else {
		e->captured = false;
	}
	pthread_mutex_unlock(&cap_lock);
	return g != NULL;
}

static void event_captured_read(void *obj, void *arg)
{
	*(bool *)arg = ((struct sim_event *)obj)->captured;
}

static bool event_captured(CUevent handle)
{
	bool captured = false;

	if (!atomic_load(&n_captured_events))
		return false;
	pthread_mutex_lock(&cap_lock);
	sim_handle_visit(SIM_HANDLE_EVENT, SIM_VALUE(handle), event_captured_read, &captured);
	pthread_mutex_unlock(&cap_lock);
	return captured;
}

/* The id of the capture an event was last recorded in, 0 if none. */
static void event_capture_read(void *obj, void *arg)
{
	struct sim_event *e = obj;

	*(uint64_t *)arg = e->captured ? e->capture_id : 0;
}

static void capture_invalidate_locked(struct sim_graph *g)
{
	g->invalidated = true;
}

/* A wait that concerns a capture: s capturing, or the event recorded in one. */
static bool capture_wait(struct sim_stream *s, CUevent event, unsigned flags, CUresult *rc)
{
	struct sim_graph *g = NULL;
	struct sim_stream **grown;
	uint64_t id = 0;
	bool handled = false;

	if (!atomic_load(&n_captures) && !atomic_load(&n_captured_events))
		return false;
	pthread_mutex_lock(&cap_lock);
	if (!sim_handle_visit(SIM_HANDLE_EVENT, SIM_VALUE(event), event_capture_read, &id)) {
		pthread_mutex_unlock(&cap_lock);
		return false; /* the caller answers the bad handle */
	}
	for (g = id ? captures : NULL; g && g->id != id; g = g->next)
		;
	if (id && !g) {
		/* Recorded in a capture that has ended: nothing to wait for in a stream. */
		*rc = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
		handled = true;
	} else if (g && !s->cap) {
		/* Joins the capture. */
		grown = realloc(g->joined, (g->n_joined + 1) * sizeof(*grown));
		*rc = grown ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
		if (grown) {
			g->joined = grown;
			stream_ref(s);
			g->joined[g->n_joined++] = s;
			s->cap = g;
		}
		handled = true;
	} else if (g && s->cap != g) {
		*rc = CUDA_ERROR_STREAM_CAPTURE_MERGE;
		capture_invalidate_locked(s->cap);
		handled = true;
	} else if (g) {
		*rc = s->cap->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
		handled = true;
	} else if (s->cap && !(flags & CU_EVENT_WAIT_EXTERNAL)) {
		/* An event from outside the capture, without the external flag. */
		*rc = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
		capture_invalidate_locked(s->cap);
		handled = true;
	}
	pthread_mutex_unlock(&cap_lock);
	return handled;
}

CUresult sim_capture_unsafe(void)
{
	struct sim_thread *t;
	struct sim_graph *g;
	bool forbidden = false;

	if (!atomic_load(&n_captures))
		return CUDA_SUCCESS;
	t = sim_thread(true);
	if (t->capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&cap_lock);
	for (g = captures; g; g = g->next) {
		bool own = g->owner == t;

		if ((own && g->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
		    (!own && t->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
		     g->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
			capture_invalidate_locked(g);
			forbidden = true;
		}
	}
	pthread_mutex_unlock(&cap_lock);
	return forbidden ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* A call the driver refuses on a capturing stream whatever the mode, invalidating the capture:
 * queries and synchronizations, and cuStreamGetId (which the driver of 580 refuses there even
 * from a thread in the relaxed mode). */
static CUresult capture_refuses(CUstream handle)
{
	struct sim_stream *s;
	CUresult rc = CUDA_SUCCESS;

	if (!atomic_load(&n_captures))
		return CUDA_SUCCESS;
	if (stream_get(handle, &s) == CUDA_SUCCESS) {
		pthread_mutex_lock(&cap_lock);
		if (s->cap) {
			capture_invalidate_locked(s->cap);
			rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
		}
		pthread_mutex_unlock(&cap_lock);
		stream_put(s);
	}
	return rc;
}

/* Querying or synchronizing a capturing stream is illegal whatever the mode; else the call is
 * only potentially unsafe. */
static CUresult capture_forbids(CUstream handle)
{
	CUresult rc = capture_refuses(handle);

	return rc == CUDA_SUCCESS ? sim_capture_unsafe() : rc;
}

CUresult sim_capture_begin(CUstream handle, CUstreamCaptureMode mode, CUgraph into)
{
	struct sim_stream *s;
	struct sim_graph *g = (struct sim_graph *)into, *a;
	CUresult rc;

	if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	/* The legacy stream by its special handle: what the driver of 580 answers. */
	if (handle == CU_STREAM_LEGACY)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	rc = stream_get(handle, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (s->kind == STREAM_LEGACY) {
		stream_put(s);
		return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
	}
	if (!g && !(g = calloc(1, sizeof(*g)))) {
		stream_put(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_lock(&cap_lock);
	if (into) {
		/* A graph the program made, alive, and in no capture. */
		for (a = graphs; a && a != g; a = a->all_next)
			;
		if (!a || !g->made)
			rc = CUDA_ERROR_INVALID_VALUE;
		else if (g->capturing)
			rc = CUDA_ERROR_ILLEGAL_STATE;
	}
	if (rc == CUDA_SUCCESS && s->cap)
		rc = CUDA_ERROR_ILLEGAL_STATE;
	if (rc == CUDA_SUCCESS) {
		g->id = atomic_fetch_add(&next_capture_id, 1);
		g->mode = mode;
		g->owner = sim_thread(true);
		g->origin = s; /* the reference moves here */
		g->capturing = true;
		g->invalidated = false;
		s->cap = g;
		g->next = captures;
		captures = g;
		if (!into)
			graph_add_locked(g);
		atomic_fetch_add(&n_captures, 1);
	}
	pthread_mutex_unlock(&cap_lock);
	if (rc != CUDA_SUCCESS) {
		if (!into)
			free(g);
		stream_put(s);
	}
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuStreamBeginCapture(CUstream handle, CUstreamCaptureMode mode)
{
	SIM_ENTER(cuStreamBeginCapture);
	return sim_capture_begin(handle, mode, NULL);
}

/* An empty graph, for a capture into it. */
SIM_EXPORT CUresult CUDAAPI cuGraphCreate(CUgraph *graph, unsigned int flags)
{
	struct sim_graph *g;

	SIM_ENTER(cuGraphCreate);
	if (!graph || flags)
		return CUDA_ERROR_INVALID_VALUE;
	g = calloc(1, sizeof(*g));
	if (!g)
		return CUDA_ERROR_OUT_OF_MEMORY;
	g->made = true;
	pthread_mutex_lock(&cap_lock);
	graph_add_locked(g);
	pthread_mutex_unlock(&cap_lock);
	*graph = (CUgraph)g;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream handle, CUgraph *graph)
{
	struct sim_stream *s, *origin = NULL, **joined = NULL;
	struct sim_graph *g, **pp;
	size_t n_joined = 0;
	CUresult rc;

	SIM_ENTER(cuStreamEndCapture);
	if (!graph)
		return CUDA_ERROR_INVALID_VALUE;
	rc = stream_get(handle, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&cap_lock);
	g = s->cap;
	if (!g)
		rc = CUDA_ERROR_ILLEGAL_STATE;
	else if (g->origin != s)
		rc = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
	else if (g->mode != CU_STREAM_CAPTURE_MODE_RELAXED && g->owner != sim_thread(true))
		rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
	if (rc == CUDA_SUCCESS) {
		for (pp = &captures; *pp != g; pp = &(*pp)->next)
			;
		*pp = g->next;
		atomic_fetch_sub(&n_captures, 1);
		g->capturing = false;
		s->cap = NULL;
		for (size_t i = 0; i < g->n_joined; i++)
			if (g->joined[i]->cap == g)
				g->joined[i]->cap = NULL;
		joined = g->joined;
		n_joined = g->n_joined;
		g->joined = NULL;
		origin = g->origin;
		g->origin = NULL;
		if (g->invalidated) {
			rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
			*graph = NULL;
			if (!g->made) /* else the program's handle still holds it */
				graph_put_locked(g);
		} else {
			*graph = (CUgraph)g;
		}
	}
	pthread_mutex_unlock(&cap_lock);
	for (size_t i = 0; i < n_joined; i++)
		stream_put(joined[i]);
	free(joined);
	if (origin)
		stream_put(origin);
	stream_put(s);
	return rc;
}

static CUresult capture_status(CUstream handle, CUstreamCaptureStatus *status, uint64_t *id)
{
	struct sim_stream *s;
	CUresult rc;

	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	rc = stream_get(handle, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&cap_lock);
	*status = !s->cap ? CU_STREAM_CAPTURE_STATUS_NONE
	          : s->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
				    : CU_STREAM_CAPTURE_STATUS_ACTIVE;
	if (id && s->cap)
		*id = s->cap->id;
	pthread_mutex_unlock(&cap_lock);
	stream_put(s);
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuStreamIsCapturing(CUstream handle, CUstreamCaptureStatus *status)
{
	SIM_ENTER(cuStreamIsCapturing);
	return capture_status(handle, status, NULL);
}

SIM_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream handle, CUstreamCaptureStatus *status,
						   cuuint64_t *id, CUgraph *graph,
						   const CUgraphNode **deps,
						   const CUgraphEdgeData **edges, size_t *n_deps)
{
	uint64_t v = 0;
	CUresult rc;

	SIM_ENTER(cuStreamGetCaptureInfo);
	rc = capture_status(handle, status, &v);
	if (rc != CUDA_SUCCESS)
		return rc;
	/* Nodes are not simulated: a capture has no dependencies to show. */
	if (id && *status != CU_STREAM_CAPTURE_STATUS_NONE)
		*id = v;
	if (graph)
		*graph = NULL;
	if (deps)
		*deps = NULL;
	if (edges)
		*edges = NULL;
	if (n_deps)
		*n_deps = 0;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
	struct sim_thread *t;
	int was;

	SIM_ENTER(cuThreadExchangeStreamCaptureMode);
	if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	t = sim_thread(true);
	was = t->capture_mode;
	t->capture_mode = (int)*mode;
	*mode = (CUstreamCaptureMode)was;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *exec, CUgraph graph,
					       unsigned long long flags)
{
	struct sim_graph_exec *x;

	SIM_ENTER(cuGraphInstantiate);
	if (!exec || !graph || flags)
		return CUDA_ERROR_INVALID_VALUE;
	x = calloc(1, sizeof(*x));
	if (!x)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&cap_lock);
	x->graph = (struct sim_graph *)graph;
	x->graph->refs++;
	pthread_mutex_unlock(&cap_lock);
	*exec = (CUgraphExec)x;
	return CUDA_SUCCESS;
}

/* A copy of a captured operation, holding its own references. */
static struct op *op_copy(const struct op *op)
{
	struct op *c = malloc(sizeof(*c));

	if (!c)
		return NULL;
	*c = *op;
	c->next = NULL;
	if (c->kind == OP_WAIT)
		stream_ref(c->wait.stream);
	else if (c->kind == OP_RECORD)
		atomic_fetch_add(&c->record.event->refs, 1);
	return c;
}

SIM_EXPORT CUresult CUDAAPI cuGraphLaunch(CUgraphExec exec, CUstream handle)
{
	struct sim_graph_exec *x = (struct sim_graph_exec *)exec;
	struct sim_galloc *a;
	struct sim_stream *s;
	struct op *list = NULL, **tail = &list, *op, *next;
	uint64_t seq;
	CUresult rc;

	SIM_ENTER(cuGraphLaunch);
	if (!x)
		return CUDA_ERROR_INVALID_VALUE;
	rc = stream_get(handle, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&cap_lock);
	for (a = x->graph->allocs; a; a = a->next)
		if (a->live)
			rc = CUDA_ERROR_INVALID_VALUE; /* still allocated from the last launch */
	for (op = x->graph->head; rc == CUDA_SUCCESS && op; op = op->next) {
		/* A record in a capture only ordered the graph's own work: no node to run. */
		if (op->kind == OP_RECORD)
			continue;
		if (!(*tail = op_copy(op)))
			rc = CUDA_ERROR_OUT_OF_MEMORY;
		else
			tail = &(*tail)->next;
	}
	if (rc == CUDA_SUCCESS)
		for (a = x->graph->allocs; a; a = a->next)
			a->live = !a->freed_in_graph;
	pthread_mutex_unlock(&cap_lock);
	for (op = list; op; op = next) {
		next = op->next;
		if (rc == CUDA_SUCCESS)
			rc = enqueue(s, op, &seq);
		else
			op_free(op);
	}
	stream_put(s);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec exec)
{
	struct sim_graph_exec *x = (struct sim_graph_exec *)exec;

	SIM_ENTER(cuGraphExecDestroy);
	if (!x)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&cap_lock);
	graph_put_locked(x->graph);
	pthread_mutex_unlock(&cap_lock);
	free(x);
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuGraphDestroy(CUgraph graph)
{
	SIM_ENTER(cuGraphDestroy);
	if (!graph)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&cap_lock);
	graph_put_locked((struct sim_graph *)graph);
	pthread_mutex_unlock(&cap_lock);
	return CUDA_SUCCESS;
}

/* The capture a stream records into, or NULL; rc set for a bad handle. */
static struct sim_graph *stream_capture_locked(CUstream handle, CUresult *rc)
{
	struct sim_stream *s;
	struct sim_graph *g;

	*rc = stream_get(handle, &s);
	if (*rc != CUDA_SUCCESS)
		return NULL;
	g = s->cap;
	stream_put(s);
	return g;
}

bool sim_graph_alloc(CUdeviceptr *dptr, size_t size, CUstream stream, CUresult *rc)
{
	struct sim_galloc *a;
	struct sim_graph *g;

	if (!atomic_load(&n_captures))
		return false;
	pthread_mutex_lock(&cap_lock);
	g = stream_capture_locked(stream, rc);
	if (g && g->invalidated) {
		*rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	} else if (g && (!dptr || !size)) {
		*rc = CUDA_ERROR_INVALID_VALUE;
	} else if (g) {
		a = calloc(1, sizeof(*a));
		if (a)
			a->mem = aligned_alloc(256, (size + 255) & ~(size_t)255);
		if (!a || !a->mem) {
			free(a);
			*rc = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			a->size = size;
			a->next = g->allocs;
			g->allocs = a;
			*dptr = (CUdeviceptr)(uintptr_t)a->mem;
			*rc = CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&cap_lock);
	return g != NULL || *rc != CUDA_SUCCESS;
}

static struct sim_galloc *galloc_find_locked(struct sim_graph *g, CUdeviceptr p)
{
	struct sim_galloc *a;

	for (a = g->allocs; a; a = a->next)
		if ((uintptr_t)a->mem == (uintptr_t)p)
			return a;
	return NULL;
}

bool sim_graph_free(CUdeviceptr dptr, CUstream stream, CUresult *rc)
{
	struct sim_galloc *a = NULL;
	struct sim_graph *g;
	bool handled = false;

	pthread_mutex_lock(&cap_lock);
	if (!graphs) {
		pthread_mutex_unlock(&cap_lock);
		return false;
	}
	g = stream_capture_locked(stream, rc);
	if (*rc != CUDA_SUCCESS) {
		handled = true;
	} else if (g) {
		/* A free node: of an allocation of this capture, never freed in it. */
		a = galloc_find_locked(g, dptr);
		*rc = g->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
		      : a && !a->freed_in_graph ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
		if (*rc == CUDA_SUCCESS)
			a->freed_in_graph = true;
		handled = true;
	} else {
		/* After a launch, outside the graph: the allocation must be live. */
		for (g = graphs; g && !a; g = g->all_next)
			a = galloc_find_locked(g, dptr);
		if (a) {
			*rc = a->live ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
			a->live = false;
			handled = true;
		}
	}
	pthread_mutex_unlock(&cap_lock);
	return handled;
}

#ifndef SIM_LIBCUDA
SIM_EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	CUresult rc;

	SIM_ENTER(cuMemAllocAsync);
	if (sim_graph_alloc(dptr, bytesize, hStream, &rc))
		return rc;
	rc = sim_capture_unsafe();
	return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_NOT_SUPPORTED;
}

SIM_EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	CUresult rc;

	SIM_ENTER(cuMemFreeAsync);
	if (sim_graph_free(dptr, hStream, &rc))
		return rc;
	rc = sim_capture_unsafe();
	return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_INVALID_VALUE;
}
#endif
