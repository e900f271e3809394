/* sop.h - stream-ordered GPU memory pools on the CUDA driver's virtual memory API.
 *
 * sop mirrors the driver's stream-ordered allocator (cuMemPoolCreate, cuMemAllocFromPoolAsync,
 * cuMemFreeAsync, cuMemPoolTrimTo, pool attributes, access) with the driver's own types and
 * CUresult codes: porting code from cuMemPool* / cudaMemPool* is a rename. Every call is
 * thread-safe. Out-parameters are left untouched when a call fails, and a failed call leaves the
 * pool as it was.
 *
 * Stream order. Memory returned by sop_malloc_async may be used by work enqueued on the stream
 * after the call, or by work ordered after it through events. sop_free_async(p, s) hands the
 * memory back in stream order: every access must be ordered before it. Memory freed on a stream
 * is reused at once by later allocations on that same stream (their work runs after the free),
 * and by other streams only when stream order allows it (see doc/design.md).
 *
 * The library loads the driver at run time (libcuda.so.1, or the library named by the
 * environment variable SOP_DRIVER_LIBRARY), so a program linked with sop starts on a machine
 * with no driver; its calls then return CUDA_ERROR_NOT_INITIALIZED or CUDA_ERROR_NO_DEVICE. They
 * return CUDA_ERROR_INVALID_VALUE if SOP_DEVICE_MEMORY_LIMIT or SOP_DEVICE_MEMORY_LIMIT_<n> is
 * set to something that is not a size (README.md, Memory limits): sop refuses to start rather
 * than run without the cap asked for.
 */
#ifndef SOP_H
#define SOP_H

#include <stddef.h>
#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SOP_VERSION_MAJOR 0
#define SOP_VERSION_MINOR 1
#define SOP_VERSION_PATCH 0

/* A pool of device memory, or of pinned host memory (a host pool); mirrors cudaMemPool_t. Opaque and pointer-sized, but not an address:
 * it names the pool and its generation, so that a handle kept after its pool was destroyed is
 * refused (CUDA_ERROR_INVALID_VALUE) by every call, even once a new pool has taken its place.
 * NULL is never a pool. May be shared by threads. */
typedef struct sop_pool_handle *sop_pool_t;

/* ---- Pools ------------------------------------------------------------------------------ */

/* Create a pool. props->allocType must be CU_MEM_ALLOCATION_TYPE_PINNED and props->location a
 * device (CU_MEM_LOCATION_TYPE_DEVICE, a valid ordinal) or the host (below); handleTypes may be
 * CU_MEM_HANDLE_TYPE_NONE or CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; win32SecurityAttributes,
 * usage and reserved must be zero. maxSize caps the physical memory the pool may hold (0: the
 * device's memory, or the host's); it is rounded up to the allocation granularity.
 *
 * Host pools: location CU_MEM_LOCATION_TYPE_HOST (id ignored; handleTypes must be 0) or
 * CU_MEM_LOCATION_TYPE_HOST_NUMA (id: a host NUMA node, whose memory the pool then holds;
 * sop_device_get_host_location gives a device's closest). The pool holds pinned host memory,
 * made through the driver's virtual memory calls, and every call that takes a pool works on it
 * as on a device pool: allocation and free in stream order, the reuse policies, the release
 * threshold, trimming, statistics, free extents, compaction. The host CPU may load and store an
 * allocation once the stream work that precedes it has completed (synchronize after the
 * allocation, or after the work that last used the memory on a device), and must be done with it
 * before it frees it: the CPU is not in stream order. Devices reach it only once granted access
 * (sop_pool_set_access), as on the driver's host pools. The memory counts against no device's
 * memory limit. On a stream that is capturing, an allocation from a host pool gives
 * CUDA_ERROR_NOT_SUPPORTED (graph memory is device memory).
 *
 * Returns CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE (bad props or pool NULL; a host pool with
 * handle types, a HOST_NUMA node the driver does not know, CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT),
 * CUDA_ERROR_NOT_SUPPORTED (a location or type sop does not handle, see doc/differences.md),
 * CUDA_ERROR_OUT_OF_MEMORY, or the driver's code: a host pool on a driver that cannot make host
 * memory through cuMemCreate fails with the code cuMemCreate gave (CUDA_ERROR_NOT_SUPPORTED or
 * CUDA_ERROR_INVALID_VALUE, by version), and nothing else changes. */
CUresult sop_pool_create(sop_pool_t *pool, const CUmemPoolProps *props);

/* Destroy a pool. Returns at once. Allocations still live stay valid until freed, and the pool's
 * memory is returned once the last of them is freed and its free has completed; the host memory
 * sop kept for the pool goes back to the system then too, or at a later pool creation,
 * destruction or synchronization once no other thread's call may still be reading it. If the
 * pool is the current pool of its device, the device's default pool becomes current again.
 * From this call on the handle is refused by every call that takes a pool.
 * Returns CUDA_SUCCESS or CUDA_ERROR_INVALID_VALUE (NULL, a default pool, or a pool already
 * destroyed). */
CUresult sop_pool_destroy(sop_pool_t pool);

/* Pool attributes, with the driver's types: int for the three REUSE_* policies (default 1),
 * cuuint64_t for RELEASE_THRESHOLD (default 0), RESERVED_MEM_CURRENT/HIGH and
 * USED_MEM_CURRENT/HIGH. The *_CURRENT attributes are read-only; a *_HIGH attribute accepts only
 * 0, which resets the watermark to the current value. Used memory counts the exact requested
 * bytes of live allocations and drops at the free call; reserved memory is the physical memory
 * the pool holds. The read-only properties CUDA 13.2 added are answered by their ids, which the
 * 13.0 headers lack: 9 ALLOCATION_TYPE, 10 EXPORT_HANDLE_TYPES (none for an imported pool),
 * 11 LOCATION_ID and 12 LOCATION_TYPE (int or enum, four bytes), 13 MAX_POOL_SIZE (cuuint64_t:
 * the cap rounded up to the granularity, 0 for none) and 14 HW_DECOMPRESS_ENABLED (int, 0).
 * Returns CUDA_SUCCESS or CUDA_ERROR_INVALID_VALUE (NULL argument, unknown attribute, read-only
 * attribute, non-zero watermark write). */
CUresult sop_pool_set_attr(sop_pool_t pool, CUmemPool_attribute attr, void *value);
CUresult sop_pool_get_attr(sop_pool_t pool, CUmemPool_attribute attr, void *value);

/* Release physical memory that no allocation and no pending free uses, while the pool holds
 * more than min_bytes_to_keep; the pool keeps at least min_bytes_to_keep if it held that much.
 * Frees whose completion sop has not observed (at a sop_*_synchronize call) count as in use.
 * Returns CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE or the driver's code. */
CUresult sop_trim_to(sop_pool_t pool, size_t min_bytes_to_keep);

/* Grant or revoke other devices' access to every allocation of the pool, past and future.
 * The owning device always has read-write access: granting it is a no-op, revoking it gives
 * CUDA_ERROR_INVALID_DEVICE. Read-only access and host locations give CUDA_ERROR_NOT_SUPPORTED;
 * a device that does not exist or cannot access the owner's memory gives
 * CUDA_ERROR_INVALID_DEVICE. Either every descriptor applies or none does. count 0 succeeds.
 * A host pool's owner is the host CPU (a descriptor of type HOST, or HOST_NUMA for a HOST_NUMA
 * pool; HOST_NUMA for a HOST pool gives CUDA_ERROR_INVALID_VALUE), and no device has access until
 * granted it here; every device may be. */
CUresult sop_pool_set_access(sop_pool_t pool, const CUmemAccessDesc *map, size_t count);
CUresult sop_pool_get_access(CUmemAccess_flags *flags, sop_pool_t pool, CUmemLocation *location);

/* ---- Default and current pools ---------------------------------------------------------- */

/* The device's default pool, created on first use: cannot be destroyed. */
CUresult sop_device_get_default_pool(sop_pool_t *pool, CUdevice device);
/* Make pool (which must be located on device) the pool sop_malloc_async uses for streams of
 * device. Returns CUDA_ERROR_INVALID_DEVICE for a bad ordinal, CUDA_ERROR_INVALID_VALUE for a
 * pool of another device. */
CUresult sop_device_set_pool(CUdevice device, sop_pool_t pool);
/* The last pool set for device, else its default pool. Under the interposer (sop-run), while
 * the program has made a pool of the driver's the device's current pool, this, sop_mem_get_pool
 * and sop_malloc_async for the device give CUDA_ERROR_NOT_SUPPORTED, and the interposer hands the
 * program's calls to the driver. */
CUresult sop_device_get_pool(sop_pool_t *pool, CUdevice device);

/* The same by location, as cuMemGetDefaultMemPool, cuMemGetMemPool and cuMemSetMemPool of CUDA 13
 * take it: a device, or a host location (CU_MEM_LOCATION_TYPE_HOST, or HOST_NUMA for a node below
 * 64), each with a default pool made on first use (for the host, a host pool with the driver's
 * defaults: no device access, release threshold 0) and a current pool. type must be
 * CU_MEM_ALLOCATION_TYPE_PINNED (MANAGED gives CUDA_ERROR_NOT_SUPPORTED). A host location's
 * current pool is only a record, as the driver's is: no call allocates from it unnamed.
 * Returns CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE (NULL, another location type, a pool of another
 * location), CUDA_ERROR_INVALID_DEVICE, or, when a host location's default pool cannot be made,
 * what sop_pool_create would return. */
CUresult sop_mem_get_default_pool(sop_pool_t *pool, const CUmemLocation *location,
				  CUmemAllocationType type);
CUresult sop_mem_get_pool(sop_pool_t *pool, const CUmemLocation *location, CUmemAllocationType type);
CUresult sop_mem_set_pool(const CUmemLocation *location, CUmemAllocationType type, sop_pool_t pool);

/* The host location closest to device, for a host pool's props: CU_MEM_LOCATION_TYPE_HOST_NUMA
 * and the node CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID names, or CU_MEM_LOCATION_TYPE_HOST (id 0) where
 * the device names none (a machine without NUMA, a driver without the attribute).
 * Returns CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE (location NULL), CUDA_ERROR_INVALID_DEVICE or
 * the driver's code. */
CUresult sop_device_get_host_location(CUmemLocation *location, CUdevice device);

/* ---- Device memory limits ---------------------------------------------------------------- */

/* Cap the physical memory that all of the process's sop pools hold on device at limit bytes
 * (0: no cap). At the cap, an allocation that needs more first makes every pool of the device
 * give back its idle memory (as sop_trim_to(pool, 0) would), then returns
 * CUDA_ERROR_OUT_OF_MEMORY. A cap below what the pools hold now takes nothing from them: growth
 * is refused until they hold less. The cap starts as SOP_DEVICE_MEMORY_LIMIT_<device> or
 * SOP_DEVICE_MEMORY_LIMIT, read when sop starts (README.md, Memory limits). Memory the program
 * takes from the driver directly is neither counted nor capped.
 * Returns CUDA_SUCCESS or CUDA_ERROR_INVALID_DEVICE. */
CUresult sop_device_set_memory_limit(CUdevice device, size_t limit);
/* The device's cap (0: none), and in *held (unless NULL) the bytes of physical memory sop's pools
 * hold on it now. Returns CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE (limit NULL) or
 * CUDA_ERROR_INVALID_DEVICE. */
CUresult sop_device_get_memory_limit(size_t *limit, size_t *held, CUdevice device);

/* ---- Allocation ------------------------------------------------------------------------- */

/* Allocate size bytes from the current pool of the stream's device, in stream order. The
 * pointer is valid when this returns; the memory may be touched by work enqueued on stream after
 * this call, or by work ordered after it through events. Size 0 gives NULL and success. Any
 * stream the driver accepts works, including NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
 * Returns CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE (ptr NULL), CUDA_ERROR_OUT_OF_MEMORY (the pool
 * is at its maxSize, the device at its memory limit or full; never blocks),
 * CUDA_ERROR_INVALID_CONTEXT (a special stream with no current context) or the driver's code. */
CUresult sop_malloc_async(void **ptr, size_t size, CUstream stream);

/* On a stream that is capturing (CUDA graphs), sop_malloc_async and sop_malloc_from_pool_async
 * give the driver's graph memory (cuMemAllocAsync: a memory node of the graph, live from the node
 * to its free at every launch), not the pool's, which the pool's statistics do not count; the
 * pool must then be on the stream's device (else CUDA_ERROR_NOT_SUPPORTED). Free it with
 * sop_free_async in the capture, or after a launch with the driver's cuMemFreeAsync. */

/* As sop_malloc_async, from pool, which may be located on another device than stream's. */
CUresult sop_malloc_from_pool_async(void **ptr, size_t size, sop_pool_t pool, CUstream stream);

/* Free ptr in stream order: all accesses to it must be ordered before this call's position in
 * stream. The memory is reusable at once by later allocations on stream. Freeing NULL succeeds.
 * A pointer that is not the start of a live sop allocation (double free, interior or foreign
 * pointer) gives CUDA_ERROR_INVALID_VALUE and changes nothing. On a capturing stream, a free of
 * graph memory (any pointer outside sop's pools) is the driver's cuMemFreeAsync, a node of the
 * graph; a free of sop's memory gives CUDA_ERROR_INVALID_VALUE and leaves it allocated (the
 * driver refuses a free of memory that is not the graph's there too). */
CUresult sop_free_async(void *ptr, CUstream stream);

/* Free ptr at once, like cuMemFree on pool memory: the caller guarantees that every access has
 * completed. The memory is reusable by any stream as soon as this returns. */
CUresult sop_free(void *ptr);

/* The pool that ptr (any address inside a live allocation) came from. */
CUresult sop_pointer_get_pool(sop_pool_t *pool, const void *ptr);

/* ---- Sharing pools between processes (IPC) ----------------------------------------------- */

/* A pool created with handleTypes CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR can be shared with
 * other processes of the machine, as the driver's IPC pools are (doc/design.md, Sharing pools).
 *
 * sop_pool_export_to_shareable_handle writes to *(int *)handle_out one file descriptor for the
 * pool (each call a new one, which the caller closes), to be passed to another process the usual
 * way (SCM_RIGHTS over a Unix socket). type must be CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR and
 * flags 0. The descriptor reaches a thread of the exporting process that hands the pool's
 * physical memory to importers on demand, so the exporter must live while importers import
 * pointers (memory already imported stays valid after it exits). Returns CUDA_SUCCESS,
 * CUDA_ERROR_INVALID_VALUE (NULL, a default pool, an imported pool, a pool without that handle
 * type, another type, flags), CUDA_ERROR_OUT_OF_MEMORY, or CUDA_ERROR_OPERATING_SYSTEM (the
 * system refused a descriptor or a thread).
 *
 * sop_pool_import_from_shareable_handle makes, in the importing process, a pool that stands for
 * the exported one; handle is the descriptor cast to a pointer, as the driver takes it, and stays
 * the caller's. An imported pool cannot allocate (sop_malloc_from_pool_async and
 * sop_device_set_pool refuse it with CUDA_ERROR_INVALID_VALUE), cannot be exported again, and is
 * accessible at first only from its resident device; sop_pool_set_access grants more. Its
 * statistics count what was imported into this process: used memory the live imported pointers,
 * reserved memory the physical memory they map; trimming and the release threshold do nothing.
 * Destroying it unmaps what no imported pointer uses; the rest when their frees complete.
 * Returns CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE (NULL, another type, flags, a descriptor that
 * is closed or is not a sop pool's, an exporter that has exited or destroyed the pool),
 * CUDA_ERROR_NOT_SUPPORTED (the pool's resident device is not visible here) or
 * CUDA_ERROR_OUT_OF_MEMORY.
 *
 * sop_pool_export_pointer describes a live allocation of an exportable pool (ptr: the address
 * sop_malloc_async returned) in 64 opaque bytes that may travel by any means; it may be called
 * before the allocation's stream work has run. sop_pool_import_pointer maps that allocation into
 * this process from the imported pool and returns its address here; the memory is the
 * exporter's, so it may be used only once the allocation's stream order in the exporter allows
 * it (an interprocess event and a stream wait, or a synchronization and a message). The
 * importer frees it with sop_free_async (or sop_free) before the exporter frees it, ordered
 * through events or synchronization the processes share, as the driver requires; the mapping
 * goes away once the importer's free has completed. Export data of another pool, of a freed or
 * reallocated block, or forged, gives CUDA_ERROR_INVALID_VALUE, as does a pointer that is not
 * the start of a live allocation of an exportable pool. Returns also CUDA_ERROR_OUT_OF_MEMORY,
 * or the driver's code for a mapping it refused; a failed call leaves both processes as they
 * were. */
CUresult sop_pool_export_to_shareable_handle(void *handle_out, sop_pool_t pool,
					     CUmemAllocationHandleType type,
					     unsigned long long flags);
CUresult sop_pool_import_from_shareable_handle(sop_pool_t *pool_out, void *handle,
					       CUmemAllocationHandleType type,
					       unsigned long long flags);
CUresult sop_pool_export_pointer(CUmemPoolPtrExportData *share_data_out, void *ptr);
CUresult sop_pool_import_pointer(void **ptr_out, sop_pool_t pool,
				 CUmemPoolPtrExportData *share_data);

/* ---- Synchronization points ------------------------------------------------------------- */

/* Wrappers of cuEventRecord, cuStreamWaitEvent, cuStreamSynchronize, cuEventSynchronize,
 * cuCtxSynchronize and cuEventDestroy. Each does what the driver call does and returns its code;
 * in addition sop learns from them what stream order guarantees (doc/reuse.md):
 *  - an event recorded with sop_event_record carries the recording stream's position, and the
 *    positions that stream was ordered after; a stream that waits on it with
 *    sop_stream_wait_event may then reuse, at once, memory freed before that position
 *    (CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES);
 *  - the synchronize calls make the frees they cover (those enqueued on the stream, before the
 *    event, or on every stream of the current context, before the call) reusable by every stream
 *    whatever the policies, and the pools concerned then release physical memory above their
 *    release threshold.
 * Driver calls made directly are invisible to sop: safe, only less eager. What an event carries is
 * a claim, which sop acts on only once its own probe events prove it: an event recorded with
 * sop_event_record and then recorded again with cuEventRecord, or destroyed and its handle given
 * by the driver to a new event, is safe too (doc/reuse.md). sop_event_destroy forgets the claim
 * as well; cuEventDestroy leaves it to be overwritten.
 *
 * Streams are told apart by the id the driver gives them (cuStreamGetId), asked at every call
 * that names one: the driver hands a destroyed stream's handle to the next stream at once, even
 * while the destroyed stream's work runs, and sop never takes the new stream for the old. */
CUresult sop_event_record(CUevent event, CUstream stream);
CUresult sop_stream_wait_event(CUstream stream, CUevent event, unsigned int flags);
CUresult sop_stream_synchronize(CUstream stream);
CUresult sop_event_synchronize(CUevent event);
CUresult sop_ctx_synchronize(void);
CUresult sop_event_destroy(CUevent event);

/* Wrapper of cuStreamDestroy that tells sop the stream is gone: what sop keeps for it is let go
 * once nothing is cached or allocated on it, and, where the stream still has work running, a
 * last probe event makes the frees before the destroy reusable by other streams once that work
 * is done (after a stream destroyed with cuStreamDestroy alone, that memory waits for the
 * stream's earlier probes or for sop_ctx_synchronize). Returns cuStreamDestroy's code. */
CUresult sop_stream_destroy(CUstream stream);

/* ---- Diagnostics ------------------------------------------------------------------------ */

/* How many times sop has called each driver entry point since the process started (every pool,
 * every thread), for benchmarks and diagnostics. On entry *n is the room in names and counts; the
 * call fills up to that many (name as written in cuda.h, count) pairs and sets *n to the number
 * of entry points sop uses. Works before and without a driver (all counts zero then).
 * Returns CUDA_SUCCESS or CUDA_ERROR_INVALID_VALUE. */
CUresult sop_driver_calls(const char **names, unsigned long long *counts, size_t *n);

/* The pool's free memory as it is now, which the driver's pools do not tell: *total is the bytes
 * it holds that no allocation uses (free in the pool, or freed on a stream and pending there),
 * *largest the longest run of them at contiguous addresses, the largest request the pool could
 * serve without growing once those frees are complete. Their ratio says how scattered the free
 * memory is. A moment's view: the pool's lock is held while every block is walked, and other
 * threads' allocations and frees move the figures as they are read. Returns CUDA_SUCCESS, or
 * CUDA_ERROR_INVALID_VALUE for a pool that is not live or a NULL pointer. */
CUresult sop_pool_get_free_extents(sop_pool_t pool, size_t *largest, size_t *total);

/* Compaction, which the driver's pools do not have: a pool with it on (enable 1) trades mapping
 * calls for memory. It grows in physical allocations of 8 MiB (larger ones only for growth of
 * more than 128 MiB), so that more of its free memory is whole allocations it can give back
 * when it grows elsewhere, and, while it is used from one thread, its small requests (below
 * 2 MiB) split the lowest-addressed of the blocks that fit rather than the smallest. A pool
 * whose live memory rises and falls then
 * reserves less at its peak; one that stays at the same size with scattered free memory may
 * give back and map memory at nearly every growth, each costing tens of microseconds (design.md,
 * Compaction). Off (0) by default; the setting applies to later growth and placement. Returns
 * CUDA_SUCCESS, or CUDA_ERROR_INVALID_VALUE for a pool that is not live, enable other than 0 or
 * 1, or a NULL pointer. */
CUresult sop_pool_set_compaction(sop_pool_t pool, int enable);
CUresult sop_pool_get_compaction(sop_pool_t pool, int *enabled);

#ifdef __cplusplus
}
#endif

#endif /* SOP_H */
