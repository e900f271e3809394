/*
 * What the sim adds when it stands in for libcuda.so.1 under the interposer
 * (libsop-preload.so), built into that copy only (SIM_LIBCUDA):
 *
 * - the driver's stream-ordered pools, which the interposer takes over: on a
 *   device every one of them fails with CUDA_ERROR_NOT_SUPPORTED, so that a
 *   call that reached the driver where sop should have served it shows, as
 *   that code and in sim_calls(), except pools with a usage, which sop cannot
 *   make. Those and pools on the host, which sop leaves to the driver, work
 *   just enough to be made, read, allocated from, made current and destroyed;
 *   IPC of pools fails with that code everywhere;
 * - classic allocations (cuMemAlloc, cuMemFree, and cuMemFreeAsync of them):
 *   memory sop did not allocate, which the interposer must pass through;
 * - the _ptsz per-thread-default-stream variants of the entry points the
 *   interposer takes over, cuCtxSynchronize_v2 and the v1 cuGetProcAddress;
 * - cuGetProcAddress by version and flags, as the driver answers: the ABI a
 *   version asks for (cuGetProcAddress v1 below 12000, cuCtxSynchronize_v2
 *   from 13000, cuMemGetInfo's 32-bit v1 below 3020), the _ptsz variant for CU_GET_PROC_ADDRESS_PER_THREAD_
 *   DEFAULT_STREAM, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT below the
 *   version that brought an entry point, and a made-up ABI of
 *   cuStreamWaitEvent from 99000, newer than any header the interposer knows.
 *
 * The library is linked with -Bsymbolic-functions, as the driver binds its
 * own calls: a _ptsz variant runs the base entry point of this library, never
 * the interposer's export of the same name.
 */
#include <stdlib.h>
#include <string.h>

#include "sim-internal.h"

static CUstream per_thread(CUstream s)
{
	return s ? s : CU_STREAM_PER_THREAD;
}

/* ---- classic allocations ---- */

struct classic {
	struct sim_node node;	/* key: the address */
	void *mem;
	size_t size;
};

static pthread_mutex_t classic_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sim_table classic_table;

#define CLASSIC_ALIGN 256

static CUresult classic_alloc(CUdeviceptr *dptr, size_t size)
{
	struct classic *c;
	struct sim_ctx *ctx;
	CUresult rc;

	if (!dptr || !size)
		return CUDA_ERROR_INVALID_VALUE;
	rc = sim_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (size > SIZE_MAX - CLASSIC_ALIGN)
		return CUDA_ERROR_OUT_OF_MEMORY;
	c = calloc(1, sizeof(*c));
	if (c)
		c->mem = aligned_alloc(CLASSIC_ALIGN, (size + CLASSIC_ALIGN - 1) &
						       ~(size_t)(CLASSIC_ALIGN - 1));
	if (!c || !c->mem) {
		free(c);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	c->node.key = (uint64_t)(uintptr_t)c->mem;
	c->size = size;
	pthread_mutex_lock(&classic_lock);
	sim_table_insert(&classic_table, &c->node);
	pthread_mutex_unlock(&classic_lock);
	*dptr = (CUdeviceptr)(uintptr_t)c->mem;
	return CUDA_SUCCESS;
}

/* The allocation at dptr, taken out of the table: a second free finds nothing. */
static struct classic *classic_take(CUdeviceptr dptr)
{
	struct sim_node *n;

	pthread_mutex_lock(&classic_lock);
	n = sim_table_remove(&classic_table, (uint64_t)dptr);
	pthread_mutex_unlock(&classic_lock);
	return n ? sim_container_of(n, struct classic, node) : NULL;
}

static void classic_free(void *arg)
{
	struct classic *c = arg;

	free(c->mem);
	free(c);
}

SIM_EXPORT CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
	CUresult rc;

	SIM_ENTER(cuMemAlloc);
	rc = sim_capture_unsafe();
	return rc == CUDA_SUCCESS ? classic_alloc(dptr, bytesize) : rc;
}

SIM_EXPORT CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
	struct classic *c;
	CUresult rc;

	SIM_ENTER(cuMemFree);
	rc = sim_capture_unsafe();
	if (rc != CUDA_SUCCESS)
		return rc;
	c = classic_take(dptr);
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	classic_free(c);
	return CUDA_SUCCESS;
}

/* A free in stream order: the memory goes when the stream gets there. */
static CUresult classic_free_async(CUdeviceptr dptr, CUstream stream)
{
	struct classic *c;
	CUresult rc;

	if (sim_graph_free(dptr, stream, &rc))
		return rc;
	rc = sim_capture_unsafe();
	if (rc != CUDA_SUCCESS)
		return rc;
	c = classic_take(dptr);
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	rc = cuLaunchHostFunc(stream, classic_free, c);
	if (rc != CUDA_SUCCESS) {
		pthread_mutex_lock(&classic_lock);
		sim_table_insert(&classic_table, &c->node);
		pthread_mutex_unlock(&classic_lock);
	}
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	SIM_ENTER(cuMemFreeAsync);
	return classic_free_async(dptr, hStream);
}

SIM_EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	SIM_ENTER(cuMemFreeAsync_ptsz);
	return classic_free_async(dptr, per_thread(hStream));
}

/* ---- the driver's own pools ---- */

/*
 * A pool the driver made: on the host, and on a device only with a usage,
 * which sop cannot make (it answers CUDA_ERROR_NOT_SUPPORTED and the
 * interposer hands the creation here). Every other device pool call fails
 * with CUDA_ERROR_NOT_SUPPORTED, so that one that should have been sop's
 * shows. These pools work just enough to be made, read, allocated from, made
 * a location's current pool and destroyed.
 */
struct drv_pool {
	struct drv_pool *next;
	bool is_default;
	int device;		/* -1: the host */
	cuuint64_t threshold;
};

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static struct drv_pool host_default = {.is_default = true, .device = -1};
static struct drv_pool *drv_pools = &host_default;	/* every live one */
/* Destroyed ones, the latest first: a create takes the value destroyed most recently, at once, as
 * a driver may that frees a pool's object and allocates the next one in its place. */
static struct drv_pool *drv_spare;
static struct drv_pool *host_current = &host_default;
/* A device's current pool where it is one of these; NULL: the interposer's. */
static struct drv_pool *dev_current[SIM_MAX_DEVICES];

static bool host_location(const CUmemLocation *loc, CUmemAllocationType type)
{
	return loc && loc->type == CU_MEM_LOCATION_TYPE_HOST &&
	       type == CU_MEM_ALLOCATION_TYPE_PINNED;
}

static bool device_location(const CUmemLocation *loc, CUmemAllocationType type)
{
	return loc && loc->type == CU_MEM_LOCATION_TYPE_DEVICE &&
	       type == CU_MEM_ALLOCATION_TYPE_PINNED && sim_device_valid(loc->id);
}

/* The pool a handle names, or NULL. pools_lock held. */
static struct drv_pool *drv_pool_of(CUmemoryPool pool)
{
	struct drv_pool *p;

	for (p = drv_pools; p && (CUmemoryPool)(void *)p != pool; p = p->next)
		;
	return p;
}

SIM_EXPORT CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	struct drv_pool *p;
	int device;

	SIM_ENTER(cuMemPoolCreate);
	if (!pool || !props)
		return CUDA_ERROR_INVALID_VALUE;
	if (host_location(&props->location, props->allocType))
		device = -1;
	else if (device_location(&props->location, props->allocType) && props->usage)
		device = props->location.id;
	else
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&pools_lock);
	p = drv_spare;
	if (p) {
		drv_spare = p->next;
		memset(p, 0, sizeof(*p));
	} else if (!(p = calloc(1, sizeof(*p)))) {
		pthread_mutex_unlock(&pools_lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	p->device = device;
	p->next = drv_pools;
	drv_pools = p;
	pthread_mutex_unlock(&pools_lock);
	*pool = (CUmemoryPool)(void *)p;
	return CUDA_SUCCESS;
}

/* The current pool of its location goes back to the default, as the driver does. */
SIM_EXPORT CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool)
{
	struct drv_pool **link, *p = NULL;

	SIM_ENTER(cuMemPoolDestroy);
	pthread_mutex_lock(&pools_lock);
	for (link = &drv_pools; *link; link = &(*link)->next) {
		if ((CUmemoryPool)(void *)*link == pool && !(*link)->is_default) {
			p = *link;
			*link = p->next;
			if (host_current == p)
				host_current = &host_default;
			if (p->device >= 0 && dev_current[p->device] == p)
				dev_current[p->device] = NULL;
			p->next = drv_spare;
			drv_spare = p;
			break;
		}
	}
	pthread_mutex_unlock(&pools_lock);
	return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
	bool found;

	SIM_ENTER(cuMemPoolTrimTo);
	(void)minBytesToKeep;
	pthread_mutex_lock(&pools_lock);
	found = drv_pool_of(pool) != NULL;
	pthread_mutex_unlock(&pools_lock);
	return found ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}

SIM_EXPORT CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
						  void *value)
{
	struct drv_pool *p;
	CUresult rc = CUDA_SUCCESS;

	SIM_ENTER(cuMemPoolSetAttribute);
	if (!value)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&pools_lock);
	p = drv_pool_of(pool);
	if (!p)
		rc = CUDA_ERROR_NOT_SUPPORTED;
	else if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
		memcpy(&p->threshold, value, sizeof(p->threshold));
	pthread_mutex_unlock(&pools_lock);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
						  void *value)
{
	struct drv_pool *p;
	CUresult rc = CUDA_SUCCESS;
	cuuint64_t v = 0;
	int policy = 1;

	SIM_ENTER(cuMemPoolGetAttribute);
	if (!value)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&pools_lock);
	p = drv_pool_of(pool);
	if (!p) {
		rc = CUDA_ERROR_NOT_SUPPORTED;
	} else if (attr == CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES ||
		   attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC ||
		   attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES) {
		memcpy(value, &policy, sizeof(policy));
	} else {
		/* Memory is not tracked: every figure but the threshold reads 0. */
		if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
			v = p->threshold;
		memcpy(value, &v, sizeof(v));
	}
	pthread_mutex_unlock(&pools_lock);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map,
					       size_t count)
{
	SIM_ENTER(cuMemPoolSetAccess);
	(void)pool, (void)map, (void)count;
	return CUDA_ERROR_NOT_SUPPORTED;
}

SIM_EXPORT CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool memPool,
					       CUmemLocation *location)
{
	SIM_ENTER(cuMemPoolGetAccess);
	(void)flags, (void)memPool, (void)location;
	return CUDA_ERROR_NOT_SUPPORTED;
}

/* IPC of pools is not simulated: the interposer keeps sop's pools and memory from it. */
SIM_EXPORT CUresult CUDAAPI cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
							     CUmemAllocationHandleType handleType,
							     unsigned long long flags)
{
	SIM_ENTER(cuMemPoolExportToShareableHandle);
	(void)handle_out, (void)pool, (void)handleType, (void)flags;
	return CUDA_ERROR_NOT_SUPPORTED;
}

SIM_EXPORT CUresult CUDAAPI cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out,
							       void *handle,
							       CUmemAllocationHandleType handleType,
							       unsigned long long flags)
{
	SIM_ENTER(cuMemPoolImportFromShareableHandle);
	(void)pool_out, (void)handle, (void)handleType, (void)flags;
	return CUDA_ERROR_NOT_SUPPORTED;
}

SIM_EXPORT CUresult CUDAAPI cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out,
						   CUdeviceptr ptr)
{
	SIM_ENTER(cuMemPoolExportPointer);
	(void)shareData_out, (void)ptr;
	return CUDA_ERROR_NOT_SUPPORTED;
}

SIM_EXPORT CUresult CUDAAPI cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
						   CUmemPoolPtrExportData *shareData)
{
	SIM_ENTER(cuMemPoolImportPointer);
	(void)ptr_out, (void)pool, (void)shareData;
	return CUDA_ERROR_NOT_SUPPORTED;
}

/* Pool memory is a classic allocation here: freed by cuMemFreeAsync alike. */
static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, CUmemoryPool pool)
{
	bool found;

	pthread_mutex_lock(&pools_lock);
	found = drv_pool_of(pool) != NULL;
	pthread_mutex_unlock(&pools_lock);
	return found ? classic_alloc(dptr, size) : CUDA_ERROR_NOT_SUPPORTED;
}

SIM_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
						    CUmemoryPool pool, CUstream hStream)
{
	SIM_ENTER(cuMemAllocFromPoolAsync);
	(void)hStream;
	return pool_alloc(dptr, bytesize, pool);
}

SIM_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
							 CUmemoryPool pool, CUstream hStream)
{
	SIM_ENTER(cuMemAllocFromPoolAsync_ptsz);
	(void)hStream;
	return pool_alloc(dptr, bytesize, pool);
}

/* From the current pool of the stream's device: one of the driver's pools above if the program
 * made it current, else the interposer's, which the driver does not serve. */
static CUresult alloc_current(CUdeviceptr *dptr, size_t size, CUstream stream)
{
	struct drv_pool *p;
	CUdevice dev;
	CUresult rc;

	if (sim_graph_alloc(dptr, size, stream, &rc))
		return rc;
	rc = sim_capture_unsafe();
	if (rc == CUDA_SUCCESS)
		rc = sim_stream_device(stream, &dev);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&pools_lock);
	p = dev_current[dev];
	pthread_mutex_unlock(&pools_lock);
	if (!p)
		return CUDA_ERROR_NOT_SUPPORTED;
	return dptr ? classic_alloc(dptr, size) : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	SIM_ENTER(cuMemAllocAsync);
	return alloc_current(dptr, bytesize, hStream);
}

SIM_EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
						 CUstream hStream)
{
	SIM_ENTER(cuMemAllocAsync_ptsz);
	return alloc_current(dptr, bytesize, per_thread(hStream));
}

SIM_EXPORT CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
	SIM_ENTER(cuDeviceGetDefaultMemPool);
	(void)pool_out, (void)dev;
	return CUDA_ERROR_NOT_SUPPORTED;
}

/* A device's current pool, where it is one of the driver's pools above. */
static CUresult device_get(CUmemoryPool *pool, CUdevice dev)
{
	struct drv_pool *p;

	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&pools_lock);
	p = dev_current[dev];
	pthread_mutex_unlock(&pools_lock);
	if (!p)
		return CUDA_ERROR_NOT_SUPPORTED;
	*pool = (CUmemoryPool)(void *)p;
	return CUDA_SUCCESS;
}

/* One of the driver's pools made current on its device; a pool of another location is
 * refused as the driver refuses it; any other handle is not the driver's to take. */
static CUresult device_set(CUdevice dev, CUmemoryPool pool)
{
	struct drv_pool *p;
	CUresult rc = CUDA_SUCCESS;

	if (!sim_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&pools_lock);
	p = drv_pool_of(pool);
	if (!p)
		rc = CUDA_ERROR_NOT_SUPPORTED;
	else if (p->device != dev)
		rc = CUDA_ERROR_INVALID_VALUE;
	else
		dev_current[dev] = p;
	pthread_mutex_unlock(&pools_lock);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
	SIM_ENTER(cuDeviceGetMemPool);
	return device_get(pool, dev);
}

SIM_EXPORT CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
	SIM_ENTER(cuDeviceSetMemPool);
	return device_set(dev, pool);
}

SIM_EXPORT CUresult CUDAAPI cuMemGetDefaultMemPool(CUmemoryPool *pool_out,
						   CUmemLocation *location,
						   CUmemAllocationType type)
{
	SIM_ENTER(cuMemGetDefaultMemPool);
	if (!pool_out)
		return CUDA_ERROR_INVALID_VALUE;
	if (!host_location(location, type))
		return CUDA_ERROR_NOT_SUPPORTED;
	*pool_out = (CUmemoryPool)(void *)&host_default;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location,
					    CUmemAllocationType type)
{
	SIM_ENTER(cuMemGetMemPool);
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	if (device_location(location, type))
		return device_get(pool, location->id);
	if (!host_location(location, type))
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&pools_lock);
	*pool = (CUmemoryPool)(void *)host_current;
	pthread_mutex_unlock(&pools_lock);
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type,
					    CUmemoryPool pool)
{
	struct drv_pool *p;

	SIM_ENTER(cuMemSetMemPool);
	if (device_location(location, type))
		return device_set(location->id, pool);
	if (!host_location(location, type))
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&pools_lock);
	p = drv_pool_of(pool);
	if (p && p->device < 0)
		host_current = p;
	pthread_mutex_unlock(&pools_lock);
	return p && p->device < 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- per-thread variants and newer ABIs ---- */

SIM_EXPORT CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream)
{
	SIM_ENTER(cuStreamSynchronize_ptsz);
	return cuStreamSynchronize(per_thread(hStream));
}

SIM_EXPORT CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent,
						   unsigned int Flags)
{
	SIM_ENTER(cuStreamWaitEvent_ptsz);
	return cuStreamWaitEvent(per_thread(hStream), hEvent, Flags);
}

SIM_EXPORT CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
	SIM_ENTER(cuEventRecord_ptsz);
	return cuEventRecord(hEvent, per_thread(hStream));
}

SIM_EXPORT CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream,
							unsigned int flags)
{
	SIM_ENTER(cuEventRecordWithFlags_ptsz);
	return cuEventRecordWithFlags(hEvent, per_thread(hStream), flags);
}

SIM_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx)
{
	CUcontext popped;
	CUresult rc;

	SIM_ENTER(cuCtxSynchronize_v2);
	if (!ctx)
		return cuCtxSynchronize();
	rc = cuCtxPushCurrent(ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = cuCtxSynchronize();
	cuCtxPopCurrent(&popped);
	return rc;
}

/* The v1 ABI, exported under the name cuda.h's macro takes for v2: no status. */
SIM_EXPORT CUresult CUDAAPI sim_get_proc_address_v1(const char *symbol, void **pfn,
						    int cudaVersion, cuuint64_t flags)
	__asm__("cuGetProcAddress");

SIM_EXPORT CUresult CUDAAPI sim_get_proc_address_v1(const char *symbol, void **pfn,
						    int cudaVersion, cuuint64_t flags)
{
	return cuGetProcAddress(symbol, pfn, cudaVersion, flags, NULL);
}

/* cuMemGetInfo's v1 ABI of 32-bit sizes, which a lookup below 3020 gets (libcuda exports it as
 * cuMemGetInfo; the stand-in keeps it to lookups). Sizes past 4 GiB are cut, as a 32-bit field
 * would hold them. */
static CUresult CUDAAPI mem_get_info_v1(unsigned int *free_bytes, unsigned int *total)
{
	size_t f, t;
	CUresult rc;

	if (!free_bytes || !total)
		return CUDA_ERROR_INVALID_VALUE;
	rc = cuMemGetInfo(&f, &t);
	if (rc != CUDA_SUCCESS)
		return rc;
	*free_bytes = f > UINT32_MAX ? UINT32_MAX : (unsigned int)f;
	*total = t > UINT32_MAX ? UINT32_MAX : (unsigned int)t;
	return CUDA_SUCCESS;
}

/* An ABI of cuStreamWaitEvent that no header has: whoever gets it asked for too new a version. */
static CUresult CUDAAPI stream_wait_event_future(CUstream hStream, CUevent hEvent,
						 unsigned int Flags, void *future)
{
	(void)hStream, (void)hEvent, (void)Flags, (void)future;
	return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- stream capture: the other ABIs and the per-thread variants ---- */

SIM_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v1(CUstream hStream)
{
	SIM_ENTER(cuStreamBeginCapture_v1);
	return cuStreamBeginCapture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

SIM_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v1_ptsz(CUstream hStream)
{
	SIM_ENTER(cuStreamBeginCapture_v1_ptsz);
	return cuStreamBeginCapture(per_thread(hStream), CU_STREAM_CAPTURE_MODE_GLOBAL);
}

SIM_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
	SIM_ENTER(cuStreamBeginCapture_v2_ptsz);
	return cuStreamBeginCapture(per_thread(hStream), mode);
}

SIM_EXPORT CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
	SIM_ENTER(cuStreamEndCapture_ptsz);
	return cuStreamEndCapture(per_thread(hStream), phGraph);
}

/* Capturing into a graph the program made (cuGraphCreate): the capture appends to it. With
 * dependencies it needs graph nodes, which are not simulated. */
SIM_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
							const CUgraphNode *dependencies,
							const CUgraphEdgeData *dependencyData,
							size_t numDependencies,
							CUstreamCaptureMode mode)
{
	SIM_ENTER(cuStreamBeginCaptureToGraph);
	if (numDependencies || dependencies || dependencyData)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (!hGraph)
		return CUDA_ERROR_INVALID_VALUE;
	return sim_capture_begin(hStream, mode, hGraph);
}

SIM_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
							     const CUgraphNode *dependencies,
							     const CUgraphEdgeData *dependencyData,
							     size_t numDependencies,
							     CUstreamCaptureMode mode)
{
	SIM_ENTER(cuStreamBeginCaptureToGraph_ptsz);
	return cuStreamBeginCaptureToGraph(per_thread(hStream), hGraph, dependencies,
					   dependencyData, numDependencies, mode);
}

/* ---- pointer attributes ----
 *
 * Of classic allocations only: their range, and no pool (MEMPOOL_HANDLE NULL, as for memory
 * that no pool holds). Any other pointer is CUDA_ERROR_INVALID_VALUE, and any other attribute
 * CUDA_ERROR_NOT_SUPPORTED: not simulated. */
static CUresult pointer_attribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
	struct classic *c = NULL;
	struct sim_node *n;
	CUdeviceptr start = 0;
	size_t size = 0;

	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&classic_lock);
	for (size_t b = 0; b < classic_table.nbuckets && !c; b++)
		for (n = classic_table.buckets[b]; n && !c; n = n->next) {
			struct classic *k = sim_container_of(n, struct classic, node);

			if (ptr >= (CUdeviceptr)(uintptr_t)k->mem &&
			    ptr - (CUdeviceptr)(uintptr_t)k->mem < k->size)
				c = k;
		}
	if (c) {
		start = (CUdeviceptr)(uintptr_t)c->mem;
		size = c->size;
	}
	pthread_mutex_unlock(&classic_lock);
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
		*(CUmemoryPool *)data = NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = start;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = size;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_NOT_SUPPORTED;
	}
}

SIM_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
						  CUdeviceptr ptr)
{
	SIM_ENTER(cuPointerGetAttribute);
	return pointer_attribute(data, attribute, ptr);
}

SIM_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes,
						   CUpointer_attribute *attributes, void **data,
						   CUdeviceptr ptr)
{
	CUresult rc = CUDA_SUCCESS;

	SIM_ENTER(cuPointerGetAttributes);
	if (!numAttributes || !attributes || !data)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned int i = 0; i < numAttributes && rc == CUDA_SUCCESS; i++)
		rc = pointer_attribute(data[i], attributes[i], ptr);
	return rc;
}

/* ---- cuGetProcAddress by version ---- */

typedef void (*sim_fn)(void);

struct versioned {
	const char *name;	/* the base name asked for */
	int since;		/* the first version with this ABI (cudaTypedefs.h's PFN_*_vN) */
	sim_fn legacy, ptsz;	/* ptsz NULL: no per-thread variant */
};

#define FN(f) ((sim_fn)(f))

/* Rows of one name in ascending versions. */
static const struct versioned versioned[] = {
	{"cuGetProcAddress", 11030, FN(sim_get_proc_address_v1), NULL},
	{"cuGetProcAddress", 12000, FN(cuGetProcAddress_v2), NULL},
	{"cuCtxSynchronize", 2000, FN(cuCtxSynchronize), NULL},
	{"cuCtxSynchronize", 13000, FN(cuCtxSynchronize_v2), NULL},
	{"cuStreamSynchronize", 2000, FN(cuStreamSynchronize), FN(cuStreamSynchronize_ptsz)},
	{"cuStreamWaitEvent", 3020, FN(cuStreamWaitEvent), FN(cuStreamWaitEvent_ptsz)},
	{"cuStreamWaitEvent", 99000, FN(stream_wait_event_future), FN(stream_wait_event_future)},
	{"cuEventRecord", 2000, FN(cuEventRecord), FN(cuEventRecord_ptsz)},
	{"cuEventRecordWithFlags", 11010, FN(cuEventRecordWithFlags),
	 FN(cuEventRecordWithFlags_ptsz)},
	{"cuMemAlloc", 3020, FN(cuMemAlloc_v2), NULL},
	{"cuMemGetInfo", 2000, FN(mem_get_info_v1), NULL},
	{"cuMemGetInfo", 3020, FN(cuMemGetInfo), NULL},
	{"cuMemFree", 3020, FN(cuMemFree_v2), NULL},
	{"cuMemFreeAsync", 11020, FN(cuMemFreeAsync), FN(cuMemFreeAsync_ptsz)},
	{"cuMemAllocAsync", 11020, FN(cuMemAllocAsync), FN(cuMemAllocAsync_ptsz)},
	{"cuMemAllocFromPoolAsync", 11020, FN(cuMemAllocFromPoolAsync),
	 FN(cuMemAllocFromPoolAsync_ptsz)},
	{"cuMemPoolCreate", 11020, FN(cuMemPoolCreate), NULL},
	{"cuMemPoolDestroy", 11020, FN(cuMemPoolDestroy), NULL},
	{"cuMemPoolTrimTo", 11020, FN(cuMemPoolTrimTo), NULL},
	{"cuMemPoolSetAttribute", 11020, FN(cuMemPoolSetAttribute), NULL},
	{"cuMemPoolGetAttribute", 11020, FN(cuMemPoolGetAttribute), NULL},
	{"cuMemPoolSetAccess", 11020, FN(cuMemPoolSetAccess), NULL},
	{"cuMemPoolGetAccess", 11020, FN(cuMemPoolGetAccess), NULL},
	{"cuMemPoolExportToShareableHandle", 11020, FN(cuMemPoolExportToShareableHandle), NULL},
	{"cuMemPoolImportFromShareableHandle", 11020, FN(cuMemPoolImportFromShareableHandle), NULL},
	{"cuMemPoolExportPointer", 11020, FN(cuMemPoolExportPointer), NULL},
	{"cuMemPoolImportPointer", 11020, FN(cuMemPoolImportPointer), NULL},
	{"cuDeviceGetDefaultMemPool", 11020, FN(cuDeviceGetDefaultMemPool), NULL},
	{"cuDeviceGetMemPool", 11020, FN(cuDeviceGetMemPool), NULL},
	{"cuDeviceSetMemPool", 11020, FN(cuDeviceSetMemPool), NULL},
	{"cuStreamBeginCapture", 10000, FN(cuStreamBeginCapture_v1), FN(cuStreamBeginCapture_v1_ptsz)},
	{"cuStreamBeginCapture", 10010, FN(cuStreamBeginCapture_v2), FN(cuStreamBeginCapture_v2_ptsz)},
	{"cuStreamEndCapture", 10000, FN(cuStreamEndCapture), FN(cuStreamEndCapture_ptsz)},
	{"cuStreamBeginCaptureToGraph", 12030, FN(cuStreamBeginCaptureToGraph),
	 FN(cuStreamBeginCaptureToGraph_ptsz)},
	{"cuPointerGetAttribute", 4000, FN(cuPointerGetAttribute), NULL},
	{"cuPointerGetAttributes", 7000, FN(cuPointerGetAttributes), NULL},
	{"cuMemGetDefaultMemPool", 13000, FN(cuMemGetDefaultMemPool), NULL},
	{"cuMemGetMemPool", 13000, FN(cuMemGetMemPool), NULL},
	{"cuMemSetMemPool", 13000, FN(cuMemSetMemPool), NULL},
};

bool sim_libcuda_lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
			CUdriverProcAddressQueryResult *status, CUresult *rc)
{
	const struct versioned *best = NULL;
	bool known = false;
	sim_fn fn;

	for (size_t i = 0; i < sizeof(versioned) / sizeof(versioned[0]); i++) {
		if (strcmp(versioned[i].name, symbol) != 0)
			continue;
		known = true;
		if (versioned[i].since <= version)
			best = &versioned[i];
	}
	if (!known)
		return false;
	if (!best) {
		*pfn = NULL;
		if (status)
			*status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
		*rc = CUDA_ERROR_NOT_FOUND;
		return true;
	}
	fn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->ptsz ? best->ptsz
										    : best->legacy;
	memcpy(pfn, &fn, sizeof(*pfn));
	if (status)
		*status = CU_GET_PROC_ADDRESS_SUCCESS;
	*rc = CUDA_SUCCESS;
	return true;
}
