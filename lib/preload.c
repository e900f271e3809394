/* preload.c - the interposer, libsop-preload.so: the driver's stream-ordered allocator, as
 * programs reach it without being changed, routed to sop. Not part of libsop.
 *
 * sop-run (or LD_PRELOAD) loads it before libcuda. It takes over the driver's pools
 * (cuMemAllocAsync, cuMemFreeAsync, cuMemAllocFromPoolAsync, cuMemPool*, the device's default
 * and current pools) and the calls sop learns stream order from (synchronizations, event records
 * and waits, stream and event destruction), on every path a program finds them by:
 *  - a call to libcuda's symbol: this library exports the same names, the exact ones cuda.h's
 *    macros give (cuStreamDestroy_v2) and the _ptsz per-thread-default-stream variants, and
 *    comes first in the search order;
 *  - dlsym(handle, "cuXxx"), which static cudart (nvcc's default), JAX and others use: dlsym is
 *    overridden, and a name taken over gets this library's function where the handle has the
 *    symbol at all;
 *  - cuGetProcAddress and cuGetProcAddress_v2, reached by either path above, and which static
 *    cudart resolves everything else through: the driver's lookup runs first, then a name taken
 *    over gets the function for the version and flags asked (the _ptsz one for
 *    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; for "cuGetProcAddress", the v1 ABI of 4
 *    arguments below 12000 and v2's 5 from it; cuCtxSynchronize's v2, which takes a context,
 *    from 13000).
 *
 * sop's own driver calls never come back here: driver.c, built into this library with
 * SOP_PRELOAD, resolves its table through the real dlsym (sop__preload_dlsym). What sop does not
 * serve goes, with the program's arguments untouched, to entry points this file resolves itself
 * from libcuda.so.1, also through the real dlsym: every call when sop cannot start (no driver,
 * sop__init failing); a free of memory sop did not allocate; pools sop cannot make (host or
 * managed memory, handle types or usages sop lacks) and pools imported from another process,
 * whose handles the driver gives and this file remembers; event records with flags
 * (sop_event_record has none); a context synchronization of another context than the current
 * one. Everything else is served by sop's public calls, and a pool handle the program sees is a
 * sop_pool_t. IPC of sop's pools and memory, which sop does not have yet, is refused.
 */
#include <dlfcn.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cudaTypedefs.h>

#include "internal.h"

/* ---- The real dlsym ------------------------------------------------------------------------ */

typedef void *(*dlsym_fn)(void *handle, const char *name);

static _Atomic(dlsym_fn) real_dlsym;

/* glibc's dlsym, the definition after this library's: GLIBC_2.34 since libdl went into libc,
 * GLIBC_2.2.5 (x86-64) or GLIBC_2.17 (Arm) before. dlvsym is not overridden. */
static dlsym_fn
dlsym_resolve(void)
{
	static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
	dlsym_fn fn = NULL;
	void *sym;
	size_t i;

	for (i = 0; !fn && i < sizeof versions / sizeof versions[0]; i++) {
		sym = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
		memcpy(&fn, &sym, sizeof fn);
	}
	atomic_store_explicit(&real_dlsym, fn, memory_order_relaxed);
	return fn;
}

static inline dlsym_fn
dlsym_real(void)
{
	dlsym_fn fn = atomic_load_explicit(&real_dlsym, memory_order_relaxed);

	return SOP_LIKELY(fn != NULL) ? fn : dlsym_resolve();
}

void *
sop__preload_dlsym(void *handle, const char *name)
{
	dlsym_fn fn = dlsym_real();

	return fn ? fn(handle, name) : NULL;
}

/* ---- The driver's own entry points -------------------------------------------------------- */

/* Every entry point the interposer forwards to: its type, by the version of its ABI
 * (cudaTypedefs.h), the member, and the exported symbol. */
#define DRIVER_SYMBOLS(X)                                                                          \
	X(PFN_cuGetProcAddress_v11030, cuGetProcAddress_v1, "cuGetProcAddress")                    \
	X(PFN_cuGetProcAddress_v12000, cuGetProcAddress_v2, "cuGetProcAddress_v2")                 \
	X(PFN_cuMemAllocAsync_v11020, cuMemAllocAsync, "cuMemAllocAsync")                          \
	X(PFN_cuMemAllocAsync_v11020_ptsz, cuMemAllocAsync_ptsz, "cuMemAllocAsync_ptsz")           \
	X(PFN_cuMemFreeAsync_v11020, cuMemFreeAsync, "cuMemFreeAsync")                             \
	X(PFN_cuMemFreeAsync_v11020_ptsz, cuMemFreeAsync_ptsz, "cuMemFreeAsync_ptsz")              \
	X(PFN_cuMemAllocFromPoolAsync_v11020, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync")  \
	X(PFN_cuMemAllocFromPoolAsync_v11020_ptsz, cuMemAllocFromPoolAsync_ptsz,                   \
	  "cuMemAllocFromPoolAsync_ptsz")                                                          \
	X(PFN_cuMemPoolCreate_v11020, cuMemPoolCreate, "cuMemPoolCreate")                          \
	X(PFN_cuMemPoolDestroy_v11020, cuMemPoolDestroy, "cuMemPoolDestroy")                       \
	X(PFN_cuMemPoolTrimTo_v11020, cuMemPoolTrimTo, "cuMemPoolTrimTo")                          \
	X(PFN_cuMemPoolSetAttribute_v11020, cuMemPoolSetAttribute, "cuMemPoolSetAttribute")        \
	X(PFN_cuMemPoolGetAttribute_v11020, cuMemPoolGetAttribute, "cuMemPoolGetAttribute")        \
	X(PFN_cuMemPoolSetAccess_v11020, cuMemPoolSetAccess, "cuMemPoolSetAccess")                 \
	X(PFN_cuMemPoolGetAccess_v11020, cuMemPoolGetAccess, "cuMemPoolGetAccess")                 \
	X(PFN_cuMemPoolExportToShareableHandle_v11020, cuMemPoolExportToShareableHandle,           \
	  "cuMemPoolExportToShareableHandle")                                                      \
	X(PFN_cuMemPoolImportFromShareableHandle_v11020, cuMemPoolImportFromShareableHandle,       \
	  "cuMemPoolImportFromShareableHandle")                                                    \
	X(PFN_cuMemPoolExportPointer_v11020, cuMemPoolExportPointer, "cuMemPoolExportPointer")     \
	X(PFN_cuMemPoolImportPointer_v11020, cuMemPoolImportPointer, "cuMemPoolImportPointer")     \
	X(PFN_cuDeviceGetDefaultMemPool_v11020, cuDeviceGetDefaultMemPool,                         \
	  "cuDeviceGetDefaultMemPool")                                                             \
	X(PFN_cuDeviceGetMemPool_v11020, cuDeviceGetMemPool, "cuDeviceGetMemPool")                 \
	X(PFN_cuDeviceSetMemPool_v11020, cuDeviceSetMemPool, "cuDeviceSetMemPool")                 \
	X(PFN_cuMemGetDefaultMemPool_v13000, cuMemGetDefaultMemPool, "cuMemGetDefaultMemPool")     \
	X(PFN_cuMemGetMemPool_v13000, cuMemGetMemPool, "cuMemGetMemPool")                          \
	X(PFN_cuMemSetMemPool_v13000, cuMemSetMemPool, "cuMemSetMemPool")                          \
	X(PFN_cuStreamSynchronize_v2000, cuStreamSynchronize, "cuStreamSynchronize")               \
	X(PFN_cuStreamSynchronize_v7000_ptsz, cuStreamSynchronize_ptsz,                            \
	  "cuStreamSynchronize_ptsz")                                                              \
	X(PFN_cuEventSynchronize_v2000, cuEventSynchronize, "cuEventSynchronize")                  \
	X(PFN_cuCtxSynchronize_v2000, cuCtxSynchronize, "cuCtxSynchronize")                        \
	X(PFN_cuCtxSynchronize_v13000, cuCtxSynchronize_v2, "cuCtxSynchronize_v2")                 \
	X(PFN_cuEventRecord_v2000, cuEventRecord, "cuEventRecord")                                 \
	X(PFN_cuEventRecord_v7000_ptsz, cuEventRecord_ptsz, "cuEventRecord_ptsz")                  \
	X(PFN_cuEventRecordWithFlags_v11010, cuEventRecordWithFlags, "cuEventRecordWithFlags")     \
	X(PFN_cuEventRecordWithFlags_v11010_ptsz, cuEventRecordWithFlags_ptsz,                     \
	  "cuEventRecordWithFlags_ptsz")                                                           \
	X(PFN_cuStreamWaitEvent_v3020, cuStreamWaitEvent, "cuStreamWaitEvent")                     \
	X(PFN_cuStreamWaitEvent_v7000_ptsz, cuStreamWaitEvent_ptsz, "cuStreamWaitEvent_ptsz")      \
	X(PFN_cuStreamDestroy_v4000, cuStreamDestroy_v2, "cuStreamDestroy_v2")                     \
	X(stream_v1_fn, cuStreamDestroy_v1, "cuStreamDestroy")                                     \
	X(PFN_cuCtxDestroy_v4000, cuCtxDestroy_v2, "cuCtxDestroy_v2")                              \
	X(ctx_destroy_v1_fn, cuCtxDestroy_v1, "cuCtxDestroy")                                      \
	X(PFN_cuDevicePrimaryCtxRelease_v11000, cuDevicePrimaryCtxRelease_v2,                       \
	  "cuDevicePrimaryCtxRelease_v2")                                                          \
	X(primary_v1_fn, cuDevicePrimaryCtxRelease_v1, "cuDevicePrimaryCtxRelease")                \
	X(PFN_cuDevicePrimaryCtxReset_v11000, cuDevicePrimaryCtxReset_v2,                           \
	  "cuDevicePrimaryCtxReset_v2")                                                            \
	X(primary_v1_fn, cuDevicePrimaryCtxReset_v1, "cuDevicePrimaryCtxReset")                    \
	X(PFN_cuGreenCtxDestroy_v12040, cuGreenCtxDestroy, "cuGreenCtxDestroy")                    \
	X(PFN_cuEventDestroy_v4000, cuEventDestroy_v2, "cuEventDestroy_v2")                        \
	X(PFN_cuCtxGetCurrent_v4000, cuCtxGetCurrent, "cuCtxGetCurrent")                          \
	X(PFN_cuCtxGetDevice_v2000, cuCtxGetDevice, "cuCtxGetDevice")                             \
	X(PFN_cuMemGetInfo_v3020, cuMemGetInfo_v2, "cuMemGetInfo_v2")                             \
	X(stream_v1_fn, cuStreamBeginCapture_v1, "cuStreamBeginCapture")                           \
	X(stream_v1_fn, cuStreamBeginCapture_v1_ptsz, "cuStreamBeginCapture_ptsz")                 \
	X(PFN_cuStreamBeginCapture_v10010, cuStreamBeginCapture_v2, "cuStreamBeginCapture_v2")     \
	X(PFN_cuStreamBeginCapture_v10010_ptsz, cuStreamBeginCapture_v2_ptsz,                      \
	  "cuStreamBeginCapture_v2_ptsz")                                                          \
	X(PFN_cuStreamBeginCaptureToGraph_v12030, cuStreamBeginCaptureToGraph,                     \
	  "cuStreamBeginCaptureToGraph")                                                           \
	X(PFN_cuStreamBeginCaptureToGraph_v12030_ptsz, cuStreamBeginCaptureToGraph_ptsz,           \
	  "cuStreamBeginCaptureToGraph_ptsz")                                                      \
	X(PFN_cuStreamEndCapture_v10000, cuStreamEndCapture, "cuStreamEndCapture")                 \
	X(PFN_cuStreamEndCapture_v10000_ptsz, cuStreamEndCapture_ptsz, "cuStreamEndCapture_ptsz")  \
	X(PFN_cuStreamIsCapturing_v10000, cuStreamIsCapturing, "cuStreamIsCapturing")              \
	X(PFN_cuPointerGetAttribute_v4000, cuPointerGetAttribute, "cuPointerGetAttribute")         \
	X(PFN_cuPointerGetAttributes_v7000, cuPointerGetAttributes, "cuPointerGetAttributes")      \
	X(PFN_cuMemFree_v3020, cuMemFree_v2, "cuMemFree_v2")

/* v1 entry points whose types cudaTypedefs.h keeps internal: CUDA 10.0's cuStreamBeginCapture,
 * without a mode, and cuStreamDestroy; cuCtxDestroy; cuDevicePrimaryCtxRelease and Reset. */
typedef CUresult(CUDAAPI *stream_v1_fn)(CUstream hStream);
typedef CUresult(CUDAAPI *ctx_destroy_v1_fn)(CUcontext ctx);
typedef CUresult(CUDAAPI *primary_v1_fn)(CUdevice dev);

struct driver_table {
	void *dl; /* libcuda.so.1, or NULL where it cannot be loaded */
#define X(type, member, symbol) type member;
	DRIVER_SYMBOLS(X)
#undef X
};

static struct driver_table drv;

/* The code a forwarded call gets where the driver lacks the entry point: the driver's for a
 * symbol it does not have, or sop's for no driver at all. */
static CUresult
drv_missing(void)
{
	return drv.dl ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_NOT_INITIALIZED;
}

/* Call the driver's entry point with the program's arguments. */
#define FORWARD(member, ...) (drv.member ? drv.member(__VA_ARGS__) : drv_missing())

static void
drv_load(void)
{
	dlsym_fn fn = dlsym_real();
	void *sym;

	/* The driver the program uses: libcuda.so.1 is already loaded when the program links it
	 * or dlopened it, and this returns that very library. Not SOP_DRIVER_LIBRARY, which names
	 * sop's driver: when it names nothing, the program still has its own. */
	drv.dl = fn ? dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
	if (!drv.dl)
		return;
#define X(type, member, symbol)                                                                    \
	sym = fn(drv.dl, symbol);                                                                  \
	memcpy(&drv.member, &sym, sizeof sym);
	DRIVER_SYMBOLS(X)
#undef X
}

/* ---- Starting ------------------------------------------------------------------------------ */

/* Once, on the first call that needs it: the driver's entry points, then sop. A hand-made once
 * rather than pthread_once, so that a child forked while another thread of its parent was in
 * the middle of it can start again (preload_forked). */
enum { ONCE_NONE, ONCE_RUNNING, ONCE_DONE };
static atomic_int drv_once;

/* Whether sop serves the hooked calls: not known until the first of them, then for good. */
enum { SOP_UNKNOWN, SOP_STARTING, SOP_SERVING, SOP_DRIVER_ONLY };
static atomic_int sop_state;

/* Set on the thread that is loading the driver or starting sop: a hooked call it makes meanwhile
 * (the driver's constructor or cuInit calling its own exported names) goes to the driver, instead
 * of waiting for itself. */
static __thread bool starting __attribute__((tls_model("initial-exec")));

static void
drv_ensure(void)
{
	int expect = ONCE_NONE;

	if (SOP_LIKELY(atomic_load_explicit(&drv_once, memory_order_acquire) == ONCE_DONE) ||
	    starting)
		return;
	if (atomic_compare_exchange_strong(&drv_once, &expect, ONCE_RUNNING)) {
		starting = true;
		drv_load();
		starting = false;
		atomic_store_explicit(&drv_once, ONCE_DONE, memory_order_release);
		return;
	}
	while (atomic_load_explicit(&drv_once, memory_order_acquire) != ONCE_DONE)
		sched_yield();
}

static bool
sop_start(void)
{
	int expect = SOP_UNKNOWN, s;
	CUresult r;

	drv_ensure();
	if (starting)
		return false;
	/* Not before the program has initialised the driver: until then its calls get the driver's
	 * CUDA_ERROR_NOT_INITIALIZED, as they would without sop, and sop does not initialise the
	 * driver behind it (a parent that forks its workers before it initialises CUDA relies on
	 * that). The question is asked until sop starts, at most once a call. */
	if (drv.cuCtxGetCurrent) {
		CUcontext current;

		if (drv.cuCtxGetCurrent(&current) == CUDA_ERROR_NOT_INITIALIZED)
			return false;
	}
	if (atomic_compare_exchange_strong(&sop_state, &expect, SOP_STARTING)) {
		starting = true;
		/* sop__init gives CUDA_ERROR_INVALID_VALUE only for a setting it cannot read (a
		 * memory limit that is not a size): then sop's calls answer with that code, rather
		 * than the program running on the driver without the cap it was given. */
		r = sop__init();
		s = r == CUDA_SUCCESS || r == CUDA_ERROR_INVALID_VALUE ? SOP_SERVING : SOP_DRIVER_ONLY;
		starting = false;
		atomic_store_explicit(&sop_state, s, memory_order_release);
		return s == SOP_SERVING;
	}
	while ((s = atomic_load_explicit(&sop_state, memory_order_acquire)) == SOP_STARTING)
		sched_yield();
	return s == SOP_SERVING;
}

/* Whether sop serves this call; else it goes to the driver (drv is loaded either way). */
static inline bool
serving(void)
{
	int s = atomic_load_explicit(&sop_state, memory_order_acquire);

	if (SOP_LIKELY(s == SOP_SERVING))
		return true;
	return s == SOP_DRIVER_ONLY ? false : sop_start();
}

/* A forked child cannot use its parent's CUDA state, nor wait for a thread of the parent: if the
 * parent had started sop, or was starting it, every hooked call of the child goes to the driver,
 * which answers as it does for any forked child. One that execs starts afresh. */
static void
preload_forked(void)
{
	if (atomic_load_explicit(&drv_once, memory_order_relaxed) == ONCE_RUNNING)
		atomic_store_explicit(&drv_once, ONCE_NONE, memory_order_relaxed);
	if (atomic_load_explicit(&sop_state, memory_order_relaxed) != SOP_UNKNOWN)
		atomic_store_explicit(&sop_state, SOP_DRIVER_ONLY, memory_order_relaxed);
	starting = false;
}

__attribute__((constructor)) static void
preload_loaded(void)
{
	pthread_atfork(NULL, NULL, preload_forked);
	/* Every capture begins and ends through this library from now on (the hooks below): sop
	 * asks whether a stream captures only while one is in flight. */
	sop__capture_watch();
	/* And every destroy of a stream or context: a thread's last stream is known without
	 * asking while none is destroyed. */
	sop__stream_destroys_watch();
}

/* ---- Pools the driver made ------------------------------------------------------------------ */

/* Handles of pools that sop could not make and the driver did (host or managed locations,
 * handle types or usages sop lacks, pools imported from another process): calls on them go to
 * the driver. Every other handle is
 * sop's, and refused as sop refuses it; few programs have any of these, so a count read without
 * the lock spares the rest the lookup. */
static pthread_mutex_t foreign_lock = PTHREAD_MUTEX_INITIALIZER;
static CUmemoryPool *foreign;
static size_t n_foreign, cap_foreign;
static atomic_size_t foreign_count;

static bool
foreign_find(CUmemoryPool pool, size_t *at)
{
	size_t i;

	for (i = 0; i < n_foreign; i++) {
		if (foreign[i] == pool) {
			*at = i;
			return true;
		}
	}
	return false;
}

static bool
foreign_has(CUmemoryPool pool)
{
	size_t at;
	bool found;

	if (SOP_LIKELY(!atomic_load_explicit(&foreign_count, memory_order_acquire)))
		return false;
	pthread_mutex_lock(&foreign_lock);
	found = foreign_find(pool, &at);
	pthread_mutex_unlock(&foreign_lock);
	return found;
}

/* Remember a handle the driver gave (a pool made, or a location's default or current pool).
 * Without host memory it is not remembered, and later calls on it get sop's
 * CUDA_ERROR_INVALID_VALUE. */
static void
foreign_add(CUmemoryPool pool)
{
	CUmemoryPool *grown;
	size_t at;

	pthread_mutex_lock(&foreign_lock);
	if (!foreign_find(pool, &at)) {
		if (n_foreign == cap_foreign) {
			size_t cap = cap_foreign ? 2 * cap_foreign : 8;

			grown = realloc(foreign, cap * sizeof *grown);
			if (grown) {
				foreign = grown;
				cap_foreign = cap;
			}
		}
		if (n_foreign < cap_foreign) {
			foreign[n_foreign++] = pool;
			atomic_store_explicit(&foreign_count, n_foreign, memory_order_release);
		}
	}
	pthread_mutex_unlock(&foreign_lock);
}

/* Locations whose current pool the program made one of the driver's, as far as sop knows: the
 * latest such pool of each. Under foreign_lock. */
struct foreign_current {
	CUmemLocation loc;
	CUmemoryPool pool;
};
static struct foreign_current *currents;
static size_t n_currents, cap_currents;

/* The driver made pool, its own, current at loc. sop's calls for the location's current pool
 * answer CUDA_ERROR_NOT_SUPPORTED from now on, so that what takes it (cuMemAllocAsync) goes to
 * the driver, until the program makes a pool of sop's current there or destroys this one (the
 * default is current again, as the driver does). */
static void
foreign_current_set(const CUmemLocation *loc, CUmemoryPool pool)
{
	size_t i;

	pthread_mutex_lock(&foreign_lock);
	for (i = 0; i < n_currents; i++)
		if (currents[i].loc.type == loc->type && currents[i].loc.id == loc->id)
			break;
	if (i == n_currents && n_currents == cap_currents) {
		size_t cap = cap_currents ? 2 * cap_currents : 4;
		struct foreign_current *grown = realloc(currents, cap * sizeof *grown);

		if (grown) {
			currents = grown;
			cap_currents = cap;
		}
	}
	/* Without host memory to remember it, its destroy leaves the mark: the location's
	 * requests keep going to the driver, whose default pool is current again. */
	if (i < cap_currents) {
		currents[i].loc = *loc;
		currents[i].pool = pool;
		if (i == n_currents)
			n_currents++;
	}
	sop__set_current_foreign(loc, true);
	pthread_mutex_unlock(&foreign_lock);
}

/* The driver's destroy of a pool it made, and the handle forgotten, under the lock that
 * foreign_add takes: a pool made on another thread meanwhile may get the same handle value from
 * the driver once it is destroyed, and is remembered after this one is forgotten, not before.
 * Where it was current, sop's default pool is again. */
static CUresult
foreign_destroy(CUmemoryPool pool)
{
	size_t at, i;
	CUresult r;

	pthread_mutex_lock(&foreign_lock);
	r = FORWARD(cuMemPoolDestroy, pool);
	if (r == CUDA_SUCCESS && foreign_find(pool, &at)) {
		foreign[at] = foreign[--n_foreign];
		atomic_store_explicit(&foreign_count, n_foreign, memory_order_release);
	}
	for (i = 0; r == CUDA_SUCCESS && i < n_currents;) {
		if (currents[i].pool == pool) {
			sop__set_current_foreign(&currents[i].loc, false);
			currents[i] = currents[--n_currents];
		} else {
			i++;
		}
	}
	pthread_mutex_unlock(&foreign_lock);
	return r;
}

/* A pool handle the driver gave back while sop serves, remembered. (Only then: a forked child,
 * where sop does not serve, must take no lock a thread of its parent may have held.) */
static CUresult
foreign_got(CUresult r, const CUmemoryPool *pool)
{
	if (r == CUDA_SUCCESS && pool)
		foreign_add(*pool);
	return r;
}

/* ---- Conversions ------------------------------------------------------------------------- */

static inline sop_pool_t
pool_sop(CUmemoryPool pool)
{
	return (sop_pool_t)(void *)pool;
}

static inline CUmemoryPool
pool_cu(sop_pool_t pool)
{
	return (CUmemoryPool)(void *)pool;
}

static inline void *
ptr_of(CUdeviceptr p)
{
	return (void *)(uintptr_t)p;
}

/* In a _ptsz entry point, NULL is the calling thread's default stream, as the driver reads it. */
static inline CUstream
per_thread(CUstream stream)
{
	return stream ? stream : CU_STREAM_PER_THREAD;
}

/* Whether addr lies in memory some sop pool reserved: a pointer there that sop refuses to free is
 * a double or interior free, sop's to answer; any other is the driver's. */
static bool
sop_reserved(CUdeviceptr addr)
{
	struct sop__pin *pin = sop__pin();
	bool found = sop__registry_lookup(addr) != NULL;

	sop__unpin(pin);
	return found;
}

/* After sop_free_async refused memory that is not sop's: whether it had already taken the free
 * to the driver, as it does on a capturing stream (graph memory), so that the driver's answer
 * stands and the driver is not asked twice. Asked only on that path, and without a driver call
 * while no capture is in flight. */
static bool
driver_had_free(CUstream stream)
{
	struct sop__pin *pin;
	bool capturing = false;

	if (!sop__capture_possible())
		return false;
	pin = sop__pin();
	if (sop__stream_capturing(stream, &capturing) != CUDA_SUCCESS)
		capturing = false;
	sop__unpin(pin);
	return capturing;
}

/* ---- Allocation ------------------------------------------------------------------------- */

/* The declarations cuda.h has only for programs built for per-thread default streams. */
SOP_API CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
SOP_API CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
SOP_API CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
						      CUmemoryPool pool, CUstream hStream);
SOP_API CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream);
SOP_API CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
SOP_API CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream,
						     unsigned int flags);
SOP_API CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent,
						unsigned int Flags);

/* From the current pool of stream's device (stream as sop reads it). CUDA_ERROR_NOT_SUPPORTED
 * where sop cannot make that pool: the caller hands the call to the driver. */
static CUresult
alloc_current(CUdeviceptr *dptr, size_t size, CUstream stream)
{
	void *p;
	CUresult r;

	if (!dptr)
		return CUDA_ERROR_INVALID_VALUE;
	r = sop_malloc_async(&p, size, stream);
	if (r == CUDA_SUCCESS)
		*dptr = (CUdeviceptr)(uintptr_t)p;
	return r;
}

static CUresult
alloc_from(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream)
{
	void *p;
	CUresult r;

	if (!dptr)
		return CUDA_ERROR_INVALID_VALUE;
	r = sop_malloc_from_pool_async(&p, size, pool_sop(pool), stream);
	if (r == CUDA_SUCCESS)
		*dptr = (CUdeviceptr)(uintptr_t)p;
	return r;
}

SOP_API CUresult CUDAAPI
cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	CUresult r;

	if (serving() && (r = alloc_current(dptr, bytesize, hStream)) != CUDA_ERROR_NOT_SUPPORTED)
		return r;
	return FORWARD(cuMemAllocAsync, dptr, bytesize, hStream);
}

SOP_API CUresult CUDAAPI
cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	CUresult r;

	if (serving() &&
	    (r = alloc_current(dptr, bytesize, per_thread(hStream))) != CUDA_ERROR_NOT_SUPPORTED)
		return r;
	return FORWARD(cuMemAllocAsync_ptsz, dptr, bytesize, hStream);
}

SOP_API CUresult CUDAAPI
cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
	if (serving() && !foreign_has(pool))
		return alloc_from(dptr, bytesize, pool, hStream);
	return FORWARD(cuMemAllocFromPoolAsync, dptr, bytesize, pool, hStream);
}

SOP_API CUresult CUDAAPI
cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
			     CUstream hStream)
{
	if (serving() && !foreign_has(pool))
		return alloc_from(dptr, bytesize, pool, per_thread(hStream));
	return FORWARD(cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, hStream);
}

SOP_API CUresult CUDAAPI
cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	CUresult r;

	if (serving() && ((r = sop_free_async(ptr_of(dptr), hStream)) != CUDA_ERROR_INVALID_VALUE ||
			  sop_reserved(dptr) || driver_had_free(hStream)))
		return r;
	return FORWARD(cuMemFreeAsync, dptr, hStream);
}

SOP_API CUresult CUDAAPI
cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	CUresult r;

	if (serving() && ((r = sop_free_async(ptr_of(dptr), per_thread(hStream))) !=
				  CUDA_ERROR_INVALID_VALUE ||
			  sop_reserved(dptr) || driver_had_free(per_thread(hStream))))
		return r;
	return FORWARD(cuMemFreeAsync_ptsz, dptr, hStream);
}

/* ---- Pools ------------------------------------------------------------------------------- */

SOP_API CUresult CUDAAPI
cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
	sop_pool_t p;
	CUresult r;

	if (!serving())
		return FORWARD(cuMemPoolCreate, pool, poolProps);
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	r = sop_pool_create(&p, poolProps);
	if (r == CUDA_SUCCESS)
		*pool = pool_cu(p);
	else if (r == CUDA_ERROR_NOT_SUPPORTED)
		r = foreign_got(FORWARD(cuMemPoolCreate, pool, poolProps), pool);
	return r;
}

SOP_API CUresult CUDAAPI
cuMemPoolDestroy(CUmemoryPool pool)
{
	if (!serving())
		return FORWARD(cuMemPoolDestroy, pool);
	if (!foreign_has(pool))
		return sop_pool_destroy(pool_sop(pool));
	return foreign_destroy(pool);
}

SOP_API CUresult CUDAAPI
cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
	if (serving() && !foreign_has(pool))
		return sop_trim_to(pool_sop(pool), minBytesToKeep);
	return FORWARD(cuMemPoolTrimTo, pool, minBytesToKeep);
}

SOP_API CUresult CUDAAPI
cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	if (serving() && !foreign_has(pool))
		return sop_pool_set_attr(pool_sop(pool), attr, value);
	return FORWARD(cuMemPoolSetAttribute, pool, attr, value);
}

SOP_API CUresult CUDAAPI
cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	if (serving() && !foreign_has(pool))
		return sop_pool_get_attr(pool_sop(pool), attr, value);
	return FORWARD(cuMemPoolGetAttribute, pool, attr, value);
}

SOP_API CUresult CUDAAPI
cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
	if (serving() && !foreign_has(pool))
		return sop_pool_set_access(pool_sop(pool), map, count);
	return FORWARD(cuMemPoolSetAccess, pool, map, count);
}

SOP_API CUresult CUDAAPI
cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool memPool, CUmemLocation *location)
{
	if (serving() && !foreign_has(memPool))
		return sop_pool_get_access(flags, pool_sop(memPool), location);
	return FORWARD(cuMemPoolGetAccess, flags, memPool, location);
}

/* IPC: sop's pools export through sop, whose descriptor is a socket (share.c); a descriptor that
 * is not a socket is another process's driver pool, imported by the driver, and its pointers
 * too. Pools and pointers the driver made are the driver's. */
SOP_API CUresult CUDAAPI
cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
				 CUmemAllocationHandleType handleType, unsigned long long flags)
{
	if (serving() && !foreign_has(pool))
		return sop_pool_export_to_shareable_handle(handle_out, pool_sop(pool), handleType,
							   flags);
	return FORWARD(cuMemPoolExportToShareableHandle, handle_out, pool, handleType, flags);
}

/* Whether a handle may be one sop exported: a descriptor of a Unix socket of the kind sop's
 * broker hands out (sequenced packets). Anything else is the driver's to import or refuse, and
 * nothing is written into a socket of the program's own kind. */
static bool
sop_descriptor(void *handle, CUmemAllocationHandleType handleType)
{
	struct stat st;
	intptr_t fd = (intptr_t)handle;
	int type = 0, domain = 0;
	socklen_t n = sizeof type, m = sizeof domain;

	return handleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && fd >= 0 &&
	       fd <= INT32_MAX && fstat((int)fd, &st) == 0 && S_ISSOCK(st.st_mode) &&
	       getsockopt((int)fd, SOL_SOCKET, SO_TYPE, &type, &n) == 0 && type == SOCK_SEQPACKET &&
	       getsockopt((int)fd, SOL_SOCKET, SO_DOMAIN, &domain, &m) == 0 && domain == AF_UNIX;
}

SOP_API CUresult CUDAAPI
cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
				   CUmemAllocationHandleType handleType, unsigned long long flags)
{
	if (!serving())
		return FORWARD(cuMemPoolImportFromShareableHandle, pool_out, handle, handleType,
			       flags);
	if (sop_descriptor(handle, handleType)) {
		sop_pool_t p;
		CUresult r;

		if (!pool_out)
			return CUDA_ERROR_INVALID_VALUE;
		r = sop_pool_import_from_shareable_handle(&p, handle, handleType, flags);
		if (r == CUDA_SUCCESS)
			*pool_out = pool_cu(p);
		return r;
	}
	return foreign_got(FORWARD(cuMemPoolImportFromShareableHandle, pool_out, handle,
				   handleType, flags),
			   pool_out);
}

SOP_API CUresult CUDAAPI
cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr)
{
	if (serving() && sop_reserved(ptr))
		return sop_pool_export_pointer(shareData_out, (void *)(uintptr_t)ptr);
	return FORWARD(cuMemPoolExportPointer, shareData_out, ptr);
}

SOP_API CUresult CUDAAPI
cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
		       CUmemPoolPtrExportData *shareData)
{
	if (serving() && !foreign_has(pool))
		return sop_pool_import_pointer((void **)ptr_out, pool_sop(pool), shareData);
	return FORWARD(cuMemPoolImportPointer, ptr_out, pool, shareData);
}

/* ---- Default and current pools ----------------------------------------------------------- */

/* A device's default or current pool from sop; CUDA_ERROR_NOT_SUPPORTED where sop cannot make
 * it (the caller asks the driver). Serving. */
static CUresult
device_pool(CUmemoryPool *out, CUdevice dev, bool current)
{
	sop_pool_t p;
	CUresult r;

	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	r = current ? sop_device_get_pool(&p, dev) : sop_device_get_default_pool(&p, dev);
	if (r == CUDA_SUCCESS)
		*out = pool_cu(p);
	return r;
}

/* A location the pools of sop stand for: device memory, pinned. */
static inline bool
location_sop(const CUmemLocation *location, CUmemAllocationType type)
{
	return location && location->type == CU_MEM_LOCATION_TYPE_DEVICE &&
	       type == CU_MEM_ALLOCATION_TYPE_PINNED;
}

/* A host location sop keeps a default and a current pool for: pinned host memory (HOST, HOST_NUMA
 * of a node below 64). Where sop cannot make its default pool (a driver without host memory
 * through the virtual memory calls: CUDA_ERROR_NOT_SUPPORTED), the driver's pools serve it. */
static inline bool
location_host(const CUmemLocation *location, CUmemAllocationType type)
{
	return location && type == CU_MEM_ALLOCATION_TYPE_PINNED && sop__host_slot(location) >= 0;
}

/* A host location's default or current pool from sop; CUDA_ERROR_NOT_SUPPORTED where sop cannot
 * make it. Serving. */
static CUresult
host_pool(CUmemoryPool *out, CUmemLocation *location, CUmemAllocationType type, bool current)
{
	sop_pool_t p;
	CUresult r;

	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	r = current ? sop_mem_get_pool(&p, location, type)
		    : sop_mem_get_default_pool(&p, location, type);
	if (r == CUDA_SUCCESS)
		*out = pool_cu(p);
	return r;
}

SOP_API CUresult CUDAAPI
cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
	CUresult r;

	if (!serving())
		return FORWARD(cuDeviceGetDefaultMemPool, pool_out, dev);
	r = device_pool(pool_out, dev, false);
	if (r == CUDA_ERROR_NOT_SUPPORTED)
		r = foreign_got(FORWARD(cuDeviceGetDefaultMemPool, pool_out, dev), pool_out);
	return r;
}

SOP_API CUresult CUDAAPI
cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
	CUresult r;

	if (!serving())
		return FORWARD(cuDeviceGetMemPool, pool, dev);
	r = device_pool(pool, dev, true);
	if (r == CUDA_ERROR_NOT_SUPPORTED)
		r = foreign_got(FORWARD(cuDeviceGetMemPool, pool, dev), pool);
	return r;
}

/* A pool the driver made becomes current through the driver, and sop's calls for that current
 * pool then go there too (foreign_current_set). */
SOP_API CUresult CUDAAPI
cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
	CUresult r;

	if (!serving())
		return FORWARD(cuDeviceSetMemPool, dev, pool);
	if (!foreign_has(pool))
		return sop_device_set_pool(dev, pool_sop(pool));
	r = FORWARD(cuDeviceSetMemPool, dev, pool);
	if (r == CUDA_SUCCESS)
		foreign_current_set(&loc, pool);
	return r;
}

SOP_API CUresult CUDAAPI
cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location, CUmemAllocationType type)
{
	CUresult r = CUDA_ERROR_NOT_SUPPORTED;

	if (!serving())
		return FORWARD(cuMemGetDefaultMemPool, pool_out, location, type);
	if (location_sop(location, type))
		r = device_pool(pool_out, location->id, false);
	else if (location_host(location, type))
		r = host_pool(pool_out, location, type, false);
	if (r == CUDA_ERROR_NOT_SUPPORTED)
		r = foreign_got(FORWARD(cuMemGetDefaultMemPool, pool_out, location, type),
				pool_out);
	return r;
}

SOP_API CUresult CUDAAPI
cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type)
{
	CUresult r = CUDA_ERROR_NOT_SUPPORTED;

	if (!serving())
		return FORWARD(cuMemGetMemPool, pool, location, type);
	if (location_sop(location, type))
		r = device_pool(pool, location->id, true);
	else if (location_host(location, type))
		r = host_pool(pool, location, type, true);
	if (r == CUDA_ERROR_NOT_SUPPORTED)
		r = foreign_got(FORWARD(cuMemGetMemPool, pool, location, type), pool);
	return r;
}

SOP_API CUresult CUDAAPI
cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type, CUmemoryPool pool)
{
	bool ours;
	CUresult r;

	if (!serving())
		return FORWARD(cuMemSetMemPool, location, type, pool);
	ours = location_sop(location, type) || location_host(location, type);
	if (ours && !foreign_has(pool))
		return sop_mem_set_pool(location, type, pool_sop(pool));
	r = FORWARD(cuMemSetMemPool, location, type, pool);
	if (r == CUDA_SUCCESS && ours)
		foreign_current_set(location, pool);
	return r;
}

/* ---- Synchronization points --------------------------------------------------------------- */

SOP_API CUresult CUDAAPI
cuStreamSynchronize(CUstream hStream)
{
	return serving() ? sop_stream_synchronize(hStream) : FORWARD(cuStreamSynchronize, hStream);
}

SOP_API CUresult CUDAAPI
cuStreamSynchronize_ptsz(CUstream hStream)
{
	return serving() ? sop_stream_synchronize(per_thread(hStream))
			 : FORWARD(cuStreamSynchronize_ptsz, hStream);
}

SOP_API CUresult CUDAAPI
cuEventSynchronize(CUevent hEvent)
{
	return serving() ? sop_event_synchronize(hEvent) : FORWARD(cuEventSynchronize, hEvent);
}

SOP_API CUresult CUDAAPI
cuCtxSynchronize(void)
{
	if (serving())
		return sop_ctx_synchronize();
	return drv.cuCtxSynchronize ? drv.cuCtxSynchronize() : drv_missing();
}

/* CUDA 13's, which names the context. sop synchronizes the current one; another context (a green
 * context, or one not current on this thread) goes to the driver, and sop learns nothing: its
 * frees there become reusable later, never earlier. */
SOP_API CUresult CUDAAPI
cuCtxSynchronize_v2(CUcontext ctx)
{
	CUcontext current = NULL;

	if (serving() &&
	    (!ctx || (drv.cuCtxGetCurrent && drv.cuCtxGetCurrent(&current) == CUDA_SUCCESS &&
		      current == ctx)))
		return sop_ctx_synchronize();
	return FORWARD(cuCtxSynchronize_v2, ctx);
}

SOP_API CUresult CUDAAPI
cuEventRecord(CUevent hEvent, CUstream hStream)
{
	return serving() ? sop_event_record(hEvent, hStream)
			 : FORWARD(cuEventRecord, hEvent, hStream);
}

SOP_API CUresult CUDAAPI
cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
	return serving() ? sop_event_record(hEvent, per_thread(hStream))
			 : FORWARD(cuEventRecord_ptsz, hEvent, hStream);
}

/* sop_event_record takes no flags: a record with flags (CU_EVENT_RECORD_EXTERNAL, for graphs)
 * goes to the driver and tells sop nothing, which is safe: a wait on the event then makes no
 * memory reusable early. */
SOP_API CUresult CUDAAPI
cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
	if (!flags && serving())
		return sop_event_record(hEvent, hStream);
	return FORWARD(cuEventRecordWithFlags, hEvent, hStream, flags);
}

SOP_API CUresult CUDAAPI
cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
	if (!flags && serving())
		return sop_event_record(hEvent, per_thread(hStream));
	return FORWARD(cuEventRecordWithFlags_ptsz, hEvent, hStream, flags);
}

SOP_API CUresult CUDAAPI
cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	return serving() ? sop_stream_wait_event(hStream, hEvent, Flags)
			 : FORWARD(cuStreamWaitEvent, hStream, hEvent, Flags);
}

SOP_API CUresult CUDAAPI
cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	return serving() ? sop_stream_wait_event(per_thread(hStream), hEvent, Flags)
			 : FORWARD(cuStreamWaitEvent_ptsz, hStream, hEvent, Flags);
}

/* ---- Calls that destroy streams ------------------------------------------------------------
 *
 * A destroyed stream's handle goes to the next stream at once, and a destroyed context's streams'
 * handles with it. sop answers who a thread's last stream is without asking the driver while no
 * stream was destroyed (order.c): every call that destroys one is taken here and reported before
 * and after the driver's call, the v1 entry points of old binaries too. */

/* The driver's call, reported before and after it as a destroy of stream (NULL: of a context's
 * streams, every handle). */
#define DESTROYING(stream, call)                                                                   \
	do {                                                                                       \
		CUresult r_;                                                                       \
		drv_ensure();                                                                      \
		sop__stream_destroy_begin(stream);                                                 \
		r_ = call;                                                                         \
		sop__stream_destroy_end(stream);                                                   \
		return r_;                                                                         \
	} while (0)

/* cuda.h's cuStreamDestroy and cuEventDestroy are the _v2 symbols. */
SOP_API CUresult CUDAAPI
cuStreamDestroy(CUstream hStream)
{
	if (serving())
		return sop_stream_destroy(hStream); /* reports it */
	DESTROYING(hStream, FORWARD(cuStreamDestroy_v2, hStream));
}

SOP_API CUresult CUDAAPI stream_destroy_v1(CUstream hStream) __asm__("cuStreamDestroy");
SOP_API CUresult CUDAAPI ctx_destroy_v1(CUcontext ctx) __asm__("cuCtxDestroy");
SOP_API CUresult CUDAAPI primary_release_v1(CUdevice dev) __asm__("cuDevicePrimaryCtxRelease");
SOP_API CUresult CUDAAPI primary_reset_v1(CUdevice dev) __asm__("cuDevicePrimaryCtxReset");

/* A hook that reports fn's call as a destroy of the streams of a context and passes it on to the
 * driver's member. */
#define DESTROY_HOOK(fn, type, member)                                                             \
	SOP_API CUresult CUDAAPI fn(type arg) { DESTROYING(NULL, FORWARD(member, arg)); }

SOP_API CUresult CUDAAPI
stream_destroy_v1(CUstream hStream)
{
	DESTROYING(hStream, FORWARD(cuStreamDestroy_v1, hStream));
}

/* A hook for a call that destroys a context's streams after waiting for its work: sop's sync
 * (sync.c) passes it on and counts it as a synchronization of the context, whose streams' frees
 * have completed once it returns, where nothing could synchronize those streams again. */
#define SYNC_DESTROY_HOOK(fn, type, member, sync)                                                 \
	SOP_API CUresult CUDAAPI fn(type arg)                                                      \
	{                                                                                          \
		if (!serving())                                                                    \
			DESTROYING(NULL, FORWARD(member, arg));                                    \
		DESTROYING(NULL, drv.member ? sync(arg, drv.member) : drv_missing());              \
	}
/* A context the program made. */
SYNC_DESTROY_HOOK(cuCtxDestroy, CUcontext, cuCtxDestroy_v2, sop__sync_ctx_destroy)
SYNC_DESTROY_HOOK(ctx_destroy_v1, CUcontext, cuCtxDestroy_v1, sop__sync_ctx_destroy)
/* The primary context goes with its last release. */
DESTROY_HOOK(cuDevicePrimaryCtxRelease, CUdevice, cuDevicePrimaryCtxRelease_v2)
DESTROY_HOOK(primary_release_v1, CUdevice, cuDevicePrimaryCtxRelease_v1)
/* A reset destroys the primary context's streams and events, sop's among them, which sop lets go
 * of first. */
SYNC_DESTROY_HOOK(cuDevicePrimaryCtxReset, CUdevice, cuDevicePrimaryCtxReset_v2,
		  sop__sync_primary_reset)
SYNC_DESTROY_HOOK(primary_reset_v1, CUdevice, cuDevicePrimaryCtxReset_v1, sop__sync_primary_reset)
DESTROY_HOOK(cuGreenCtxDestroy, CUgreenCtx, cuGreenCtxDestroy)

SOP_API CUresult CUDAAPI
cuEventDestroy(CUevent hEvent)
{
	return serving() ? sop_event_destroy(hEvent) : FORWARD(cuEventDestroy_v2, hEvent);
}

/* ---- Device memory ------------------------------------------------------------------------ */

/* cuda.h's cuMemGetInfo is the _v2 symbol. Under a memory limit (sop_device_set_memory_limit), the
 * device as the program's allocator should size itself: the cap as total (never more than the
 * device has), and what sop's pools leave of it as free, never more than the driver's own free,
 * which also counts what the program took from the driver directly (cuMemAlloc) and what other
 * processes hold. Without a limit, or where sop does not serve, the driver's answer untouched. */
SOP_API CUresult CUDAAPI
cuMemGetInfo(size_t *free_bytes, size_t *total)
{
	size_t limit, held, left;
	CUdevice dev;
	CUresult r;

	/* It may be the first call taken over (a framework sizing itself at start). */
	drv_ensure();
	r = FORWARD(cuMemGetInfo_v2, free_bytes, total);

	if (r != CUDA_SUCCESS || !serving() || !drv.cuCtxGetDevice ||
	    drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS ||
	    sop_device_get_memory_limit(&limit, &held, dev) != CUDA_SUCCESS || !limit)
		return r;
	if (limit < *total)
		*total = limit;
	left = held < *total ? *total - held : 0;
	if (left < *free_bytes)
		*free_bytes = left;
	return r;
}

/* ---- Stream capture ------------------------------------------------------------------------ */

/* sop asks whether a stream captures only while the hooks count a capture in flight
 * (order.c). The count is raised before the driver begins one, so that no call of another
 * thread on a stream that has begun capturing can miss it, and lowered when the begin failed, or
 * once the driver's end left the stream capturing no more (an end refused, from the wrong thread
 * say, leaves the capture running). The count is kept whether sop serves or not: it costs an
 * atomic add, and sop may start later. A count too high only costs queries. */
SOP_API CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
SOP_API CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
SOP_API CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
							  const CUgraphNode *dependencies,
							  const CUgraphEdgeData *dependencyData,
							  size_t numDependencies,
							  CUstreamCaptureMode mode);
SOP_API CUresult CUDAAPI begin_capture_v1(CUstream hStream) __asm__("cuStreamBeginCapture");
SOP_API CUresult CUDAAPI begin_capture_v1_ptsz(CUstream hStream)
	__asm__("cuStreamBeginCapture_ptsz");

static CUresult
capture_begun(CUresult r)
{
	if (r != CUDA_SUCCESS)
		sop__capture_count(-1);
	return r;
}

/* Whether stream (as the driver reads it, special handles resolved by the caller) captures. */
static bool
capture_running(CUstream stream)
{
	CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;

	/* Without the query, assume it does: the count stays high, which is safe. */
	if (!drv.cuStreamIsCapturing || drv.cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS)
		return true;
	return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

SOP_API CUresult CUDAAPI
begin_capture_v1(CUstream hStream)
{
	drv_ensure();
	sop__capture_count(1);
	return capture_begun(FORWARD(cuStreamBeginCapture_v1, hStream));
}

SOP_API CUresult CUDAAPI
begin_capture_v1_ptsz(CUstream hStream)
{
	drv_ensure();
	sop__capture_count(1);
	return capture_begun(FORWARD(cuStreamBeginCapture_v1_ptsz, hStream));
}

SOP_API CUresult CUDAAPI
cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode)
{
	drv_ensure();
	sop__capture_count(1);
	return capture_begun(FORWARD(cuStreamBeginCapture_v2, hStream, mode));
}

SOP_API CUresult CUDAAPI
cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
	drv_ensure();
	sop__capture_count(1);
	return capture_begun(FORWARD(cuStreamBeginCapture_v2_ptsz, hStream, mode));
}

SOP_API CUresult CUDAAPI
cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
			    const CUgraphEdgeData *dependencyData, size_t numDependencies,
			    CUstreamCaptureMode mode)
{
	drv_ensure();
	sop__capture_count(1);
	return capture_begun(FORWARD(cuStreamBeginCaptureToGraph, hStream, hGraph, dependencies,
				     dependencyData, numDependencies, mode));
}

SOP_API CUresult CUDAAPI
cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
				 const CUgraphEdgeData *dependencyData, size_t numDependencies,
				 CUstreamCaptureMode mode)
{
	drv_ensure();
	sop__capture_count(1);
	return capture_begun(FORWARD(cuStreamBeginCaptureToGraph_ptsz, hStream, hGraph,
				     dependencies, dependencyData, numDependencies, mode));
}

/* Lowered only for a stream that captured before and does not after: an end of a stream that
 * was not capturing ended nothing. */
SOP_API CUresult CUDAAPI
cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
	bool was;
	CUresult r;

	drv_ensure();
	was = capture_running(hStream);
	r = FORWARD(cuStreamEndCapture, hStream, phGraph);
	if (was && !capture_running(hStream))
		sop__capture_count(-1);
	return r;
}

SOP_API CUresult CUDAAPI
cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
	bool was;
	CUresult r;

	drv_ensure();
	was = capture_running(per_thread(hStream));
	r = FORWARD(cuStreamEndCapture_ptsz, hStream, phGraph);
	if (was && !capture_running(per_thread(hStream)))
		sop__capture_count(-1);
	return r;
}

/* ---- Pointers ----------------------------------------------------------------------------- */

/* The attributes sop answers for its own memory: which pool holds it (the handle the program
 * got, a sop pool), and the allocation's range, as the driver gives it for memory of its pools,
 * rather than the range of the physical piece that sop mapped there. The driver answers the
 * rest (device, context, memory type, access), since the memory is mapped as the driver's. An
 * address in sop's reservation but in no live allocation is CUDA_ERROR_INVALID_VALUE. */
static bool
pointer_attr_sop(CUpointer_attribute attr)
{
	return attr == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE ||
	       attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR ||
	       attr == CU_POINTER_ATTRIBUTE_RANGE_SIZE;
}

static CUresult
pointer_attr(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
	CUdeviceptr start;
	sop_pool_t pool;
	size_t size;
	CUresult r;

	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	r = sop__pointer_block(ptr_of(ptr), &pool, &start, &size);
	if (r != CUDA_SUCCESS)
		return r;
	if (attr == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE)
		*(CUmemoryPool *)data = pool_cu(pool);
	else if (attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
		*(CUdeviceptr *)data = start;
	else
		*(size_t *)data = size;
	return CUDA_SUCCESS;
}

SOP_API CUresult CUDAAPI
cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	if (serving() && pointer_attr_sop(attribute) && sop_reserved(ptr))
		return pointer_attr(data, attribute, ptr);
	return FORWARD(cuPointerGetAttribute, data, attribute, ptr);
}

/* For sop's memory: sop's answers alone when it is asked only its attributes, else the
 * driver's answer with sop's written over it. An address of sop's that no live allocation holds
 * gets the defaults, NULL or 0, and no error, as the driver documents for a pointer that is not
 * valid (unlike cuPointerGetAttribute). */
SOP_API CUresult CUDAAPI
cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
		       CUdeviceptr ptr)
{
	unsigned int i, n_sop = 0;
	CUresult r = CUDA_SUCCESS, mine;

	if (!serving() || !numAttributes || !attributes || !data || !sop_reserved(ptr))
		return FORWARD(cuPointerGetAttributes, numAttributes, attributes, data, ptr);
	for (i = 0; i < numAttributes; i++)
		n_sop += pointer_attr_sop(attributes[i]);
	if (n_sop < numAttributes)
		r = FORWARD(cuPointerGetAttributes, numAttributes, attributes, data, ptr);
	for (i = 0; r == CUDA_SUCCESS && i < numAttributes; i++) {
		if (!pointer_attr_sop(attributes[i]) || !data[i])
			continue;
		mine = pointer_attr(data[i], attributes[i], ptr);
		if (mine != CUDA_SUCCESS) /* all three are 8 bytes: a handle, an address, a size */
			memset(data[i], 0, sizeof(CUdeviceptr));
	}
	return r;
}

/* cuMemFree of memory of the driver's pools synchronizes, then frees at once: the same for sop's
 * memory, with a synchronization of the current context (sop_ctx_synchronize, which also makes
 * every completed free reusable), then sop_free. During a global capture the synchronization is
 * refused as the driver refuses it, and the memory stays allocated. */
SOP_API CUresult CUDAAPI
cuMemFree(CUdeviceptr dptr)
{
	CUresult r;

	if (!serving() || !sop_reserved(dptr))
		return FORWARD(cuMemFree_v2, dptr);
	r = sop_ctx_synchronize();
	return r == CUDA_SUCCESS ? sop_free(ptr_of(dptr)) : r;
}

/* ---- Lookups ---------------------------------------------------------------------------- */

typedef void (*fn_t)(void);

SOP_API CUresult CUDAAPI proc_address_v1(const char *symbol, void **pfn, int cudaVersion,
					 cuuint64_t flags) __asm__("cuGetProcAddress");

/* Every function above by the symbol it is exported as: what dlsym gives for that name. */
static const struct {
	const char *symbol;
	fn_t fn;
} hooks[] = {
	{"cuGetProcAddress", (fn_t)proc_address_v1},
	{"cuGetProcAddress_v2", (fn_t)cuGetProcAddress_v2},
	{"cuMemAllocAsync", (fn_t)cuMemAllocAsync},
	{"cuMemAllocAsync_ptsz", (fn_t)cuMemAllocAsync_ptsz},
	{"cuMemFreeAsync", (fn_t)cuMemFreeAsync},
	{"cuMemFreeAsync_ptsz", (fn_t)cuMemFreeAsync_ptsz},
	{"cuMemAllocFromPoolAsync", (fn_t)cuMemAllocFromPoolAsync},
	{"cuMemAllocFromPoolAsync_ptsz", (fn_t)cuMemAllocFromPoolAsync_ptsz},
	{"cuMemPoolCreate", (fn_t)cuMemPoolCreate},
	{"cuMemPoolDestroy", (fn_t)cuMemPoolDestroy},
	{"cuMemPoolTrimTo", (fn_t)cuMemPoolTrimTo},
	{"cuMemPoolSetAttribute", (fn_t)cuMemPoolSetAttribute},
	{"cuMemPoolGetAttribute", (fn_t)cuMemPoolGetAttribute},
	{"cuMemPoolSetAccess", (fn_t)cuMemPoolSetAccess},
	{"cuMemPoolGetAccess", (fn_t)cuMemPoolGetAccess},
	{"cuMemPoolExportToShareableHandle", (fn_t)cuMemPoolExportToShareableHandle},
	{"cuMemPoolImportFromShareableHandle", (fn_t)cuMemPoolImportFromShareableHandle},
	{"cuMemPoolExportPointer", (fn_t)cuMemPoolExportPointer},
	{"cuMemPoolImportPointer", (fn_t)cuMemPoolImportPointer},
	{"cuDeviceGetDefaultMemPool", (fn_t)cuDeviceGetDefaultMemPool},
	{"cuDeviceGetMemPool", (fn_t)cuDeviceGetMemPool},
	{"cuDeviceSetMemPool", (fn_t)cuDeviceSetMemPool},
	{"cuMemGetDefaultMemPool", (fn_t)cuMemGetDefaultMemPool},
	{"cuMemGetMemPool", (fn_t)cuMemGetMemPool},
	{"cuMemSetMemPool", (fn_t)cuMemSetMemPool},
	{"cuStreamSynchronize", (fn_t)cuStreamSynchronize},
	{"cuStreamSynchronize_ptsz", (fn_t)cuStreamSynchronize_ptsz},
	{"cuEventSynchronize", (fn_t)cuEventSynchronize},
	{"cuCtxSynchronize", (fn_t)cuCtxSynchronize},
	{"cuCtxSynchronize_v2", (fn_t)cuCtxSynchronize_v2},
	{"cuEventRecord", (fn_t)cuEventRecord},
	{"cuEventRecord_ptsz", (fn_t)cuEventRecord_ptsz},
	{"cuEventRecordWithFlags", (fn_t)cuEventRecordWithFlags},
	{"cuEventRecordWithFlags_ptsz", (fn_t)cuEventRecordWithFlags_ptsz},
	{"cuStreamWaitEvent", (fn_t)cuStreamWaitEvent},
	{"cuStreamWaitEvent_ptsz", (fn_t)cuStreamWaitEvent_ptsz},
	{"cuStreamDestroy_v2", (fn_t)cuStreamDestroy},
	{"cuStreamDestroy", (fn_t)stream_destroy_v1},
	{"cuCtxDestroy_v2", (fn_t)cuCtxDestroy},
	{"cuCtxDestroy", (fn_t)ctx_destroy_v1},
	{"cuDevicePrimaryCtxRelease_v2", (fn_t)cuDevicePrimaryCtxRelease},
	{"cuDevicePrimaryCtxRelease", (fn_t)primary_release_v1},
	{"cuDevicePrimaryCtxReset_v2", (fn_t)cuDevicePrimaryCtxReset},
	{"cuDevicePrimaryCtxReset", (fn_t)primary_reset_v1},
	{"cuGreenCtxDestroy", (fn_t)cuGreenCtxDestroy},
	{"cuEventDestroy_v2", (fn_t)cuEventDestroy},
	{"cuMemGetInfo_v2", (fn_t)cuMemGetInfo},
	{"cuStreamBeginCapture", (fn_t)begin_capture_v1},
	{"cuStreamBeginCapture_ptsz", (fn_t)begin_capture_v1_ptsz},
	{"cuStreamBeginCapture_v2", (fn_t)cuStreamBeginCapture},
	{"cuStreamBeginCapture_v2_ptsz", (fn_t)cuStreamBeginCapture_v2_ptsz},
	{"cuStreamBeginCaptureToGraph", (fn_t)cuStreamBeginCaptureToGraph},
	{"cuStreamBeginCaptureToGraph_ptsz", (fn_t)cuStreamBeginCaptureToGraph_ptsz},
	{"cuStreamEndCapture", (fn_t)cuStreamEndCapture},
	{"cuStreamEndCapture_ptsz", (fn_t)cuStreamEndCapture_ptsz},
	{"cuPointerGetAttribute", (fn_t)cuPointerGetAttribute},
	{"cuPointerGetAttributes", (fn_t)cuPointerGetAttributes},
	{"cuMemFree_v2", (fn_t)cuMemFree},
};

/* What cuGetProcAddress gives for a base name: from version `since` on (cudaTypedefs.h's
 * PFN_<name>_v<since>), the function of that ABI, and its _ptsz variant where it has one. Rows of
 * one name in ascending versions; a NULL function leaves that version to the driver. */
static const struct {
	const char *name;
	int since;
	fn_t legacy, ptsz;
} routes[] = {
	{"cuGetProcAddress", 11030, (fn_t)proc_address_v1, NULL},
	{"cuGetProcAddress", 12000, (fn_t)cuGetProcAddress_v2, NULL},
	{"cuMemAllocAsync", 11020, (fn_t)cuMemAllocAsync, (fn_t)cuMemAllocAsync_ptsz},
	{"cuMemFreeAsync", 11020, (fn_t)cuMemFreeAsync, (fn_t)cuMemFreeAsync_ptsz},
	{"cuMemAllocFromPoolAsync", 11020, (fn_t)cuMemAllocFromPoolAsync,
	 (fn_t)cuMemAllocFromPoolAsync_ptsz},
	{"cuMemPoolCreate", 11020, (fn_t)cuMemPoolCreate, NULL},
	{"cuMemPoolDestroy", 11020, (fn_t)cuMemPoolDestroy, NULL},
	{"cuMemPoolTrimTo", 11020, (fn_t)cuMemPoolTrimTo, NULL},
	{"cuMemPoolSetAttribute", 11020, (fn_t)cuMemPoolSetAttribute, NULL},
	{"cuMemPoolGetAttribute", 11020, (fn_t)cuMemPoolGetAttribute, NULL},
	{"cuMemPoolSetAccess", 11020, (fn_t)cuMemPoolSetAccess, NULL},
	{"cuMemPoolGetAccess", 11020, (fn_t)cuMemPoolGetAccess, NULL},
	{"cuMemPoolExportToShareableHandle", 11020, (fn_t)cuMemPoolExportToShareableHandle, NULL},
	{"cuMemPoolImportFromShareableHandle", 11020, (fn_t)cuMemPoolImportFromShareableHandle,
	 NULL},
	{"cuMemPoolExportPointer", 11020, (fn_t)cuMemPoolExportPointer, NULL},
	{"cuMemPoolImportPointer", 11020, (fn_t)cuMemPoolImportPointer, NULL},
	{"cuDeviceGetDefaultMemPool", 11020, (fn_t)cuDeviceGetDefaultMemPool, NULL},
	{"cuDeviceGetMemPool", 11020, (fn_t)cuDeviceGetMemPool, NULL},
	{"cuDeviceSetMemPool", 11020, (fn_t)cuDeviceSetMemPool, NULL},
	{"cuMemGetDefaultMemPool", 13000, (fn_t)cuMemGetDefaultMemPool, NULL},
	{"cuMemGetMemPool", 13000, (fn_t)cuMemGetMemPool, NULL},
	{"cuMemSetMemPool", 13000, (fn_t)cuMemSetMemPool, NULL},
	{"cuStreamSynchronize", 2000, (fn_t)cuStreamSynchronize, (fn_t)cuStreamSynchronize_ptsz},
	{"cuEventSynchronize", 2000, (fn_t)cuEventSynchronize, NULL},
	{"cuCtxSynchronize", 2000, (fn_t)cuCtxSynchronize, NULL},
	{"cuCtxSynchronize", 13000, (fn_t)cuCtxSynchronize_v2, NULL},
	{"cuEventRecord", 2000, (fn_t)cuEventRecord, (fn_t)cuEventRecord_ptsz},
	{"cuEventRecordWithFlags", 11010, (fn_t)cuEventRecordWithFlags,
	 (fn_t)cuEventRecordWithFlags_ptsz},
	{"cuStreamWaitEvent", 3020, (fn_t)cuStreamWaitEvent, (fn_t)cuStreamWaitEvent_ptsz},
	{"cuStreamDestroy", 2000, (fn_t)stream_destroy_v1, NULL},
	{"cuStreamDestroy", 4000, (fn_t)cuStreamDestroy, NULL},
	{"cuCtxDestroy", 2000, (fn_t)ctx_destroy_v1, NULL},
	{"cuCtxDestroy", 4000, (fn_t)cuCtxDestroy, NULL},
	{"cuDevicePrimaryCtxRelease", 7000, (fn_t)primary_release_v1, NULL},
	{"cuDevicePrimaryCtxRelease", 11000, (fn_t)cuDevicePrimaryCtxRelease, NULL},
	{"cuDevicePrimaryCtxReset", 7000, (fn_t)primary_reset_v1, NULL},
	{"cuDevicePrimaryCtxReset", 11000, (fn_t)cuDevicePrimaryCtxReset, NULL},
	{"cuGreenCtxDestroy", 12040, (fn_t)cuGreenCtxDestroy, NULL},
	/* Before 4000, the v1 entry point, which sop does not wrap. */
	{"cuEventDestroy", 2000, NULL, NULL},
	{"cuEventDestroy", 4000, (fn_t)cuEventDestroy, NULL},
	/* Before 3020, the v1 entry point of 32-bit sizes, which sop does not wrap. */
	{"cuMemGetInfo", 2000, NULL, NULL},
	{"cuMemGetInfo", 3020, (fn_t)cuMemGetInfo, NULL},
	{"cuStreamBeginCapture", 10000, (fn_t)begin_capture_v1, (fn_t)begin_capture_v1_ptsz},
	{"cuStreamBeginCapture", 10010, (fn_t)cuStreamBeginCapture,
	 (fn_t)cuStreamBeginCapture_v2_ptsz},
	{"cuStreamBeginCaptureToGraph", 12030, (fn_t)cuStreamBeginCaptureToGraph,
	 (fn_t)cuStreamBeginCaptureToGraph_ptsz},
	{"cuStreamEndCapture", 10000, (fn_t)cuStreamEndCapture, (fn_t)cuStreamEndCapture_ptsz},
	{"cuPointerGetAttribute", 4000, (fn_t)cuPointerGetAttribute, NULL},
	{"cuPointerGetAttributes", 7000, (fn_t)cuPointerGetAttributes, NULL},
	/* Before 3020, the v1 entry point of 32-bit addresses, which sop does not wrap. */
	{"cuMemFree", 2000, NULL, NULL},
	{"cuMemFree", 3020, (fn_t)cuMemFree, NULL},
};

static fn_t
hook_by_symbol(const char *symbol)
{
	size_t i;

	for (i = 0; i < sizeof hooks / sizeof hooks[0]; i++)
		if (!strcmp(hooks[i].symbol, symbol))
			return hooks[i].fn;
	return NULL;
}

/* The function for a cuGetProcAddress request: by base name, version and flags; else by the
 * exported symbol, which names its ABI; NULL for a name the interposer leaves alone. */
static fn_t
hook_by_request(const char *symbol, int version, cuuint64_t flags)
{
	bool named = false, ptsz = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
	fn_t fn = NULL;
	size_t i;

	for (i = 0; i < sizeof routes / sizeof routes[0]; i++) {
		if (strcmp(routes[i].name, symbol))
			continue;
		named = true;
		if (routes[i].since <= version)
			fn = ptsz && routes[i].ptsz ? routes[i].ptsz : routes[i].legacy;
	}
	return named ? fn : hook_by_symbol(symbol);
}

/* The driver's lookup, by whichever ABI the program called. */
static CUresult
proc_lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
	    CUdriverProcAddressQueryResult *status, bool v2)
{
	if (v2)
		return FORWARD(cuGetProcAddress_v2, symbol, pfn, version, flags, status);
	return FORWARD(cuGetProcAddress_v1, symbol, pfn, version, flags);
}

/* After the driver found *pfn: sop's function instead, where sop takes the entry point over. A
 * version newer than the cuda.h this was built with may have brought a new ABI that sop's
 * function does not have: sop's is given only if the driver's answer is the function it gives
 * for the newest version sop knows (CUDA_VERSION), that is, if the ABI has not changed since. */
static void
proc_hook(const char *symbol, void **pfn, int version, cuuint64_t flags, bool v2)
{
	fn_t fn = hook_by_request(symbol, version, flags);
	void *known = NULL;

	if (!fn)
		return;
	if (version > CUDA_VERSION &&
	    (proc_lookup(symbol, &known, CUDA_VERSION, flags, NULL, v2) != CUDA_SUCCESS ||
	     known != *pfn))
		return;
	memcpy(pfn, &fn, sizeof *pfn);
}

SOP_API CUresult CUDAAPI
proc_address_v1(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	CUresult r;

	drv_ensure();
	r = proc_lookup(symbol, pfn, cudaVersion, flags, NULL, false);
	if (r == CUDA_SUCCESS && symbol && pfn && *pfn)
		proc_hook(symbol, pfn, cudaVersion, flags, false);
	return r;
}

SOP_API CUresult CUDAAPI
cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
		    CUdriverProcAddressQueryResult *symbolStatus)
{
	CUresult r;

	drv_ensure();
	r = proc_lookup(symbol, pfn, cudaVersion, flags, symbolStatus, true);
	if (r == CUDA_SUCCESS && symbol && pfn && *pfn)
		proc_hook(symbol, pfn, cudaVersion, flags, true);
	return r;
}

/* glibc's dlsym finds RTLD_NEXT and RTLD_DEFAULT from its caller's address: the call to it must
 * be a tail call, so that the caller it sees is the program's. GCC makes it one when it optimizes
 * sibling calls, which the attribute turns on in unoptimized builds too; clang is told. A test
 * (test/preload.c) checks it. */
#if defined(__clang__)
#define PRELOAD_SIBLING_CALLS
#define PRELOAD_TAIL __attribute__((musttail))
#else
#define PRELOAD_SIBLING_CALLS __attribute__((optimize("O2")))
#define PRELOAD_TAIL
#endif

/* Names the interposer takes over come from a library's handle as its functions, where the
 * library has the symbol at all. RTLD_DEFAULT finds them as this library's exports anyway (it
 * comes first), and RTLD_NEXT keeps its meaning: both go straight to glibc, as every other name
 * does. */
SOP_API PRELOAD_SIBLING_CALLS void *
dlsym(void *restrict handle, const char *restrict name)
{
	dlsym_fn real = dlsym_real();
	fn_t fn;
	void *p;

	if (SOP_UNLIKELY(!real))
		return NULL;
	if (handle != RTLD_DEFAULT && handle != RTLD_NEXT && name[0] == 'c' && name[1] == 'u' &&
	    (fn = hook_by_symbol(name))) {
		if (!real(handle, name))
			return NULL;
		memcpy(&p, &fn, sizeof p);
		return p;
	}
	PRELOAD_TAIL return real(handle, name);
}
