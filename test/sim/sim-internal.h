/*
 * Private declarations shared by the files of the simulated CUDA driver.
 *
 * sim.c        initialisation, configuration, call counting, fault injection,
 *              devices, primary and created contexts, the per-thread context stack
 * sim-handle.c handle values of streams, events and created contexts
 * sim-table.c  a small intrusive hash table (allocation handles)
 * sim-lookup.c error strings and cuGetProcAddress
 * sim-vmm.c    virtual memory management (reserve, create, map, access)
 * sim-stream.c streams, events, asynchronous memsets, copies, host functions
 */
#ifndef SOP_SIM_INTERNAL_H
#define SOP_SIM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "sim.h"

/* The library is built with hidden visibility; only this is exported. */
#define SIM_EXPORT __attribute__((visibility("default")))

/* Per-mapping access flags are kept in a fixed array of this many devices. */
#define SIM_MAX_DEVICES 64

#define SIM_STR_(x) #x
/* Stringify after macro expansion: SIM_STR(cuStreamDestroy) is "cuStreamDestroy_v2". */
#define SIM_STR(x) SIM_STR_(x)

#define sim_container_of(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/*
 * Every entry point, by the base name written in source. The list drives the
 * call counters, the fault rules and the cuGetProcAddress table, so a new
 * entry point is added here and defined with SIM_ENTER() at its top.
 */
#define SIM_ENTRY_POINTS(X) \
	X(cuInit) X(cuDriverGetVersion) X(cuGetErrorString) X(cuGetErrorName) \
	X(cuGetProcAddress) \
	X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetUuid) \
	X(cuDeviceTotalMem) X(cuDeviceGetAttribute) X(cuDeviceCanAccessPeer) \
	X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) \
	X(cuDevicePrimaryCtxGetState) X(cuDevicePrimaryCtxReset) X(cuGreenCtxDestroy) \
	X(cuCtxCreate) X(cuCtxDestroy) \
	X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxPushCurrent) X(cuCtxPopCurrent) \
	X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuCtxGetId) \
	X(cuCtxGetStreamPriorityRange) \
	X(cuMemGetInfo) X(cuMemHostAlloc) X(cuMemFreeHost) \
	X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree) \
	X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) \
	X(cuMemGetAccess) X(cuMemExportToShareableHandle) \
	X(cuMemImportFromShareableHandle) X(cuMemRetainAllocationHandle) \
	X(cuMemGetAllocationPropertiesFromHandle) \
	X(cuStreamCreate) X(cuStreamCreateWithPriority) X(cuStreamDestroy) \
	X(cuStreamQuery) X(cuStreamSynchronize) X(cuStreamWaitEvent) \
	X(cuStreamGetCtx) X(cuStreamGetFlags) X(cuStreamGetPriority) X(cuStreamGetId) \
	X(cuStreamGetDevice) X(cuLaunchHostFunc) X(cuStreamAddCallback) \
	X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventRecordWithFlags) \
	X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime) \
	X(cuIpcGetEventHandle) X(cuIpcOpenEventHandle) \
	X(cuMemsetD8Async) X(cuMemsetD16Async) X(cuMemsetD32Async) \
	X(cuMemsetD8) X(cuMemsetD16) X(cuMemsetD32) \
	X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemcpyAsync) \
	X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemcpy) \
	X(cuModuleLoadData) X(cuModuleGetFunction) X(cuModuleUnload) X(cuLaunchKernel) \
	X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing) \
	X(cuStreamGetCaptureInfo) X(cuThreadExchangeStreamCaptureMode) \
	X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuGraphCreate) \
	SIM_GRAPH_MEMORY_ENTRY_POINTS(X) \
	SIM_LIBCUDA_ENTRY_POINTS(X)

/*
 * What libcuda.so.1, the copy of the sim that the interposer's tests link in
 * place of the driver (built with SIM_LIBCUDA, sim-libcuda.c), has beyond
 * libsopsim.so: the driver's stream-ordered pools, as stubs that fail on
 * devices; classic allocations; the _ptsz variants and the ABIs that
 * cuGetProcAddress hands out by version. libsopsim.so stays without them: its
 * users find the pools missing and skip.
 */
#ifdef SIM_LIBCUDA
#define SIM_LIBCUDA_ENTRY_POINTS(X) \
	X(cuMemAlloc) X(cuMemFree) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) \
	X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) \
	X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) \
	X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemPoolTrimTo) \
	X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute) \
	X(cuMemPoolSetAccess) X(cuMemPoolGetAccess) \
	X(cuMemPoolExportToShareableHandle) X(cuMemPoolImportFromShareableHandle) \
	X(cuMemPoolExportPointer) X(cuMemPoolImportPointer) \
	X(cuDeviceGetDefaultMemPool) X(cuDeviceGetMemPool) X(cuDeviceSetMemPool) \
	X(cuMemGetDefaultMemPool) X(cuMemGetMemPool) X(cuMemSetMemPool) \
	X(cuCtxSynchronize_v2) X(cuStreamSynchronize_ptsz) X(cuStreamWaitEvent_ptsz) \
	X(cuEventRecord_ptsz) X(cuEventRecordWithFlags_ptsz) \
	X(cuStreamBeginCapture_v1) X(cuStreamBeginCapture_v1_ptsz) \
	X(cuStreamBeginCapture_v2_ptsz) X(cuStreamEndCapture_ptsz) \
	X(cuStreamBeginCaptureToGraph) X(cuStreamBeginCaptureToGraph_ptsz) \
	X(cuPointerGetAttribute) X(cuPointerGetAttributes)

/* cuda.h declares the _ptsz variants only for programs built for per-thread streams. */
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
					      CUmemoryPool pool, CUstream hStream);
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream);
CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream,
					     unsigned int flags);
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
/* CUDA 10.0's, without a mode (global), exported as cuStreamBeginCapture(_ptsz). */
CUresult CUDAAPI cuStreamBeginCapture_v1(CUstream hStream) __asm__("cuStreamBeginCapture");
CUresult CUDAAPI cuStreamBeginCapture_v1_ptsz(CUstream hStream) __asm__("cuStreamBeginCapture_ptsz");
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
						  const CUgraphNode *dependencies,
						  const CUgraphEdgeData *dependencyData,
						  size_t numDependencies, CUstreamCaptureMode mode);

/*
 * cuGetProcAddress's answer for the names whose ABI depends on the version or
 * on CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (sim-libcuda.c): true if
 * symbol is one, with *rc the call's result.
 */
bool sim_libcuda_lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
			CUdriverProcAddressQueryResult *status, CUresult *rc);
#define SIM_GRAPH_MEMORY_ENTRY_POINTS(X)
#else
#define SIM_LIBCUDA_ENTRY_POINTS(X)
/*
 * libsopsim.so has cuMemAllocAsync and cuMemFreeAsync for graph memory alone: an allocation on a
 * capturing stream, its free, and a free of a graph allocation after a launch. Anything else
 * gets CUDA_ERROR_NOT_SUPPORTED (allocation) or CUDA_ERROR_INVALID_VALUE (free), as the pools are
 * not simulated. libcuda.so.1 defines them in sim-libcuda.c, on top of the same helpers.
 */
#define SIM_GRAPH_MEMORY_ENTRY_POINTS(X) X(cuMemAllocAsync) X(cuMemFreeAsync)
#endif
/*
 * Stream capture (sim-stream.c). Graph memory: true if the call concerns it (the stream is
 * capturing, or the pointer is a graph allocation), with *rc its result; false leaves the call
 * to the caller.
 */
bool sim_graph_alloc(CUdeviceptr *dptr, size_t size, CUstream stream, CUresult *rc);
bool sim_graph_free(CUdeviceptr dptr, CUstream stream, CUresult *rc);
/*
 * A call the driver deems potentially unsafe during a capture (it may synchronize or is not
 * captured): CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the captures that forbid it invalidated,
 * when the calling thread's capture interaction mode and the captures in flight forbid it.
 */
CUresult sim_capture_unsafe(void);
/* Begin a capture on handle, into a new graph, or into one the program made with cuGraphCreate
 * (cuStreamBeginCaptureToGraph, without dependencies: nodes are not simulated). */
CUresult sim_capture_begin(CUstream handle, CUstreamCaptureMode mode, CUgraph into);

enum sim_entry {
#define SIM_ENTRY_ENUM(name) SIM_E_##name,
	SIM_ENTRY_POINTS(SIM_ENTRY_ENUM)
#undef SIM_ENTRY_ENUM
	SIM_E_COUNT
};

/* Base name of an entry point ("cuStreamDestroy"); NULL if out of range. */
const char *sim_entry_name(enum sim_entry e);

/*
 * Gate at the top of every entry point: counts the call, refuses calls made
 * from inside a host function, before cuInit (when need_init) and calls that
 * a fault rule fails. Anything but CUDA_SUCCESS is returned as is.
 */
CUresult sim_enter(enum sim_entry e, bool need_init);

#define SIM_ENTER_GATE(entry, need_init) \
	do { \
		CUresult enter_rc_ = sim_enter((entry), (need_init)); \
		if (enter_rc_ != CUDA_SUCCESS) \
			return enter_rc_; \
	} while (0)
/*
 * For entry points that need cuInit first (nearly all). The name is pasted
 * here, before cuda.h's macros could turn cuStreamDestroy into _v2.
 */
#define SIM_ENTER(name) SIM_ENTER_GATE(SIM_E_##name, true)
/* For the few that the real driver also answers before cuInit. */
#define SIM_ENTER_ANYTIME(name) SIM_ENTER_GATE(SIM_E_##name, false)

/* Configuration, fixed by the first successful cuInit. */
struct sim_config {
	int ndevices;
	size_t memory;		/* bytes of device memory per device */
	size_t granularity;	/* allocation granularity, minimum = recommended */
	bool dead_handles_fault; /* SOP_SIM_DEAD_HANDLES: fault (the default, as the driver) or error */
};
extern struct sim_config sim_cfg;

/* Abort with a message: a broken test setup or an impossible state. */
_Noreturn void sim_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- per-thread state (sim.c) ---- */

/* The kinds of handle values (sim-handle.c). */
enum sim_handle_kind {
	SIM_HANDLE_STREAM,
	SIM_HANDLE_EVENT,
	SIM_HANDLE_CONTEXT,
	SIM_HANDLE_KINDS
};

struct sim_ctx;
struct sim_stream;
struct sim_event;

#define SIM_CTX_STACK_MAX 64

/* A thread's default stream (CU_STREAM_PER_THREAD) in one context. */
struct sim_per_thread {
	struct sim_per_thread *next;
	uint64_t ctx_serial;		/* the context's sim_ctx.serial */
	struct sim_stream *stream;	/* holds a reference */
};

/*
 * What the driver keeps per thread. It lives in a pthread key rather than in
 * _Thread_local variables: ThreadSanitizer reports the release of a dlopen'ed
 * library's dynamic TLS as a data race, and the key's destructor is where an
 * exiting thread gives up its per-thread default streams.
 */
struct sim_thread {
	bool in_host_fn;	/* a stream worker runs a host function */
	int capture_mode;	/* cuThreadExchangeStreamCaptureMode: GLOBAL (0) at first */
	int ctx_depth;
	/* Each entry holds a reference on its context. */
	struct sim_ctx *ctx_stack[SIM_CTX_STACK_MAX];
	struct sim_per_thread *per_thread;
	/*
	 * The gate's call counters, per thread so that a call writes to no
	 * cache line that other threads write; sim_calls() adds them up.
	 */
	atomic_ulong calls[SIM_E_COUNT];
	/* A destroyed stream's and a destroyed event's handle this thread names on purpose, by
	 * kind (sim_stream_dead_ok, sim_event_dead_ok): they get an error rather than the fault. */
	uint64_t dead_ok[SIM_HANDLE_KINDS];
	/* The handle table slot this thread is reading (sim-handle.c), or NULL. */
	_Atomic(const void *) hazard;
	struct sim_thread *prev, *next;	/* every thread's state, under sim.c's lock */
};

/* The calling thread's state; with create false, NULL if it has none yet. */
struct sim_thread *sim_thread(bool create);
/* Waits until no thread has p as its hazard. */
void sim_thread_hazard_wait(const void *p);

/* CUDA_ERROR_* name to code (sim-lookup.c), for SOP_SIM_FAIL. */
bool sim_error_by_name(const char *name, CUresult *code);

/* ---- devices and contexts (sim.c) ---- */

/*
 * A context: one primary context per device, which never goes away, and the
 * contexts of cuCtxCreate, which cuCtxDestroy ends.
 */
struct sim_ctx {
	uint64_t handle;	/* primary: the object's address; created: from sim-handle.c */
	int device;
	bool primary;
	/* Never reused, unlike handle values and addresses; a primary context's changes at each
	 * reset, which ends its per-thread streams. */
	_Atomic uint64_t serial;
	atomic_long refs;	/* primary context retain count */
	atomic_ullong id;	/* primary: changes on every activation */
	/*
	 * Created contexts only. `life` counts references: one until
	 * cuCtxDestroy, one per entry on a thread's stack, per stream worker,
	 * per stream object other than the legacy stream, per event, and per
	 * lookup in progress; the object is freed when it reaches zero.
	 * `current` counts the entries on threads' stacks.
	 */
	atomic_long life;
	atomic_long current;
	atomic_bool destroyed;
	/*
	 * Orders enqueues on the legacy stream against enqueues on blocking
	 * streams, and guards the lists below. Taken before any stream lock.
	 */
	pthread_mutex_t lock;
	/* Created on first use and kept until the context is freed or reset; read without the
	 * lock. A reset retires it, and keeps it on legacy_old (under the lock) for readers that
	 * still hold it, until the context is freed: a primary context's never is. */
	_Atomic(struct sim_stream *) legacy;
	struct sim_stream *legacy_old;
	struct sim_stream *streams;	/* every stream whose worker still runs */
	struct sim_event *events;	/* events not destroyed */
	struct sim_ctx *created_next;	/* list of created contexts not yet freed */
};

bool sim_device_valid(int dev);
/* The calling thread's current context, checked to be active. */
CUresult sim_ctx_current(struct sim_ctx **out);
/* References on created contexts; nothing for primary contexts. */
void sim_ctx_ref(struct sim_ctx *ctx);
void sim_ctx_put(struct sim_ctx *ctx);

/* ---- handle values (sim-handle.c) ---- */

/* A CUstream, CUevent or CUcontext as the number it is. */
#define SIM_VALUE(handle) ((uint64_t)(uintptr_t)(handle))

/*
 * Binds obj to a free handle value of its kind: in recycle mode the one freed
 * most recently, in fresh mode one never handed out. The value is stored to
 * *value before obj can be found through it. Returns the value, 0 when the
 * kind has no value left.
 */
uint64_t sim_handle_bind(enum sim_handle_kind kind, void *obj, uint64_t *value);
/*
 * Unbinds value if it names obj (or anything, when obj is NULL) and returns
 * the object it named, else NULL. The value is free for the next bind when
 * this returns.
 */
void *sim_handle_unbind(enum sim_handle_kind kind, uint64_t value, const void *obj);
/*
 * Calls fn(obj, arg) on the object that value names, which its owner cannot
 * free while fn runs, so fn may take a reference or copy fields; fn must be
 * short and must not call into the sim. False when value names nothing.
 */
bool sim_handle_visit(enum sim_handle_kind kind, uint64_t value, void (*fn)(void *obj, void *arg),
		      void *arg);
/* Whether value was bound once and names nothing now: a destroyed object's handle that no
 * object has taken since. */
bool sim_handle_dead(enum sim_handle_kind kind, uint64_t value);
/* Number of values bound. */
long sim_handle_count(enum sim_handle_kind kind);
/* Recycle (the default) or fresh values for later binds; sim_handles_recycle() in sim.h. */
void sim_handle_set_recycle(bool on);

/* ---- registry of allocation handles (sim-table.c) ---- */

/* Embedded in each registered object; the key is its handle value. */
struct sim_node {
	struct sim_node *next;
	uint64_t key;
};

/* Chained hash table; callers hold their own lock around every call. */
struct sim_table {
	struct sim_node **buckets;
	size_t nbuckets;
	size_t count;
};

struct sim_node *sim_table_find(struct sim_table *t, uint64_t key);
void sim_table_insert(struct sim_table *t, struct sim_node *node);
/* Removes and returns the node with `key`, or NULL. */
struct sim_node *sim_table_remove(struct sim_table *t, uint64_t key);

/* ---- memory (sim-vmm.c) ---- */

/* Adds the VMM objects and physical bytes to out. */
void sim_vmm_live(struct sim_live *out);
/* Bytes of physical memory created on dev and not yet freed. */
size_t sim_vmm_device_used(int dev);
/* Whether device dev may read and write [p, p + n) where that is memory mapped with cuMemMap
 * (other memory is not checked): what a copy or memset on one of its streams needs. */
bool sim_vmm_reaches(uintptr_t p, size_t n, int dev);
/* Whether host memory can be made through the VMM calls now (sim_host_vmm). */
bool sim_host_vmm_supported(void);
/* The host NUMA node closest to dev (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID): -1 where the machine has
 * no NUMA; else the machine's nodes in turn. */
int sim_host_numa_id(int dev);

/* ---- streams and events (sim-stream.c) ---- */

void sim_stream_live(struct sim_live *out);
/* The device of the context a stream handle's stream belongs to. */
CUresult sim_stream_device(CUstream handle, CUdevice *dev);
/* Retires an exiting thread's per-thread default streams. */
void sim_stream_thread_exit(struct sim_thread *t);
/*
 * cuCtxDestroy's part in sim-stream.c: waits until no stream of ctx has work
 * queued, then destroys its streams and events and retires its legacy and
 * per-thread streams. The caller has marked ctx destroyed. With reset (a
 * primary context's cuDevicePrimaryCtxReset), the context goes on, and its
 * legacy and per-thread streams are new ones at their next use, with new ids,
 * as on an H200 (driver 580: the legacy stream's id went from 7 to 16 over a
 * reset, the per-thread stream's from 13 to 22).
 */
void sim_stream_ctx_destroy(struct sim_ctx *ctx, bool reset);
/* Lets go of what ctx still holds in sim-stream.c, when the context is freed. */
void sim_stream_ctx_free(struct sim_ctx *ctx);

#endif /* SOP_SIM_INTERNAL_H */
