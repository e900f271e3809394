/* sop.c - the public entry points: initialise, check arguments, call in.
 *
 * Nothing here keeps state of its own except a thread-local cache of which device a stream
 * belongs to, so that sop_malloc_async does not ask the driver on every call.
 *
 * Every call that finds a pool without its lock (by handle, address or device) pins its thread
 * from before the lookup until it is done with the pool (epoch.c): the pool may be torn down
 * meanwhile by another thread, but its memory is not freed while the call runs. Calls that can
 * tear a pool down reclaim the ones retired before, once unpinned.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The pool, if the application may still use it: not destroyed (a destroyed pool only waits
 * for its last allocations) and not torn down; else NULL. The caller is pinned. */
static struct sop_pool *
pool_live(struct sop_pool *pool)
{
	if (pool && !atomic_load_explicit(&pool->destroyed, memory_order_acquire) &&
	    !atomic_load_explicit(&pool->dead, memory_order_relaxed))
		return pool;
	return NULL;
}

/* The pool a handle names, if usable. A stale handle names no pool, or another generation's
 * pool, which the lookup turns down. The caller is pinned. */
static struct sop_pool *
pool_usable(sop_pool_t handle)
{
	return pool_live(sop__pool_lookup(handle));
}

/* ---- Pools ------------------------------------------------------------------------------- */

static CUresult
props_check(const CUmemPoolProps *p)
{
	int vmm = 0;
	size_t i;
	CUresult r;

	for (i = 0; i < sizeof p->reserved; i++)
		if (p->reserved[i])
			return CUDA_ERROR_INVALID_VALUE;
	if (p->win32SecurityAttributes)
		return CUDA_ERROR_INVALID_VALUE;
	if (p->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
		return p->allocType == CU_MEM_ALLOCATION_TYPE_MANAGED ? CUDA_ERROR_NOT_SUPPORTED
								      : CUDA_ERROR_INVALID_VALUE;
	switch (p->location.type) {
	case CU_MEM_LOCATION_TYPE_DEVICE:
		if (p->location.id < 0 || p->location.id >= sop__device_count())
			return CUDA_ERROR_INVALID_VALUE;
		break;
	case CU_MEM_LOCATION_TYPE_HOST:
		/* "not IPC capable and handleTypes must be 0". */
		if (p->handleTypes)
			return CUDA_ERROR_INVALID_VALUE;
		break;
	case CU_MEM_LOCATION_TYPE_HOST_NUMA:
		if (p->location.id < 0)
			return CUDA_ERROR_INVALID_VALUE;
		break;
	default:
		/* HOST_NUMA_CURRENT among them, as the driver documents. */
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (p->handleTypes & ~(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |
			       CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC))
		return CUDA_ERROR_INVALID_VALUE;
	if (p->handleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (p->usage)
		return CUDA_ERROR_NOT_SUPPORTED;
	/* Whether the driver makes host memory through the virtual memory calls is asked by
	 * trying, at the pool's creation (pool.c): the attributes that say so are missing from
	 * drivers that do it. */
	if (p->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_SUCCESS;
	r = SOP_DRV(cuDeviceGetAttribute)(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
					  p->location.id);
	if (r != CUDA_SUCCESS)
		return r;
	return vmm ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}

SOP_API CUresult
sop_pool_create(sop_pool_t *pool, const CUmemPoolProps *props)
{
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool || !props)
		return CUDA_ERROR_INVALID_VALUE;
	r = props_check(props);
	if (r != CUDA_SUCCESS)
		return r;
	/* The pools retired before go first: a process that makes a pool per job then holds
	 * the host memory of a few, not of every job it ran. */
	sop__epoch_bound();
	r = sop__pool_new(props, false, 0, &p);
	if (r == CUDA_SUCCESS)
		*pool = sop__pool_handle(p);
	return r;
}

SOP_API CUresult
sop_pool_destroy(sop_pool_t pool)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	p = pool_usable(pool);
	if (p && p->imported) {
		if (!sop__import_destroy(p))
			r = CUDA_ERROR_INVALID_VALUE;
	} else if (p && !p->is_default && sop__forget_current(p)) {
		/* Marked destroyed first, so that an export from here on is refused and the broker
		 * stopped here is the last: importers are answered no more, and their later
		 * imports fail. */
		sop__share_stop(p);
		sop__pool_destroy(p);
	} else {
		r = CUDA_ERROR_INVALID_VALUE; /* also when a racing destroy marked it first */
	}
	sop__unpin(pin);
	sop__epoch_reclaim();
	return r;
}

SOP_API CUresult
sop_pool_set_attr(sop_pool_t pool, CUmemPool_attribute attr, void *value)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	p = pool_usable(pool);
	if (!p || !value)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (p->imported && attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH)
		r = *(cuuint64_t *)value ? CUDA_ERROR_INVALID_VALUE
					 : sop__import_used(p, attr, value, true);
	else
		r = sop__pool_set_attr(p, attr, value);
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_pool_get_attr(sop_pool_t pool, CUmemPool_attribute attr, void *value)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	p = pool_usable(pool);
	if (!p || !value)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (p->imported && (attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT ||
				 attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH))
		r = sop__import_used(p, attr, value, false);
	else
		r = sop__pool_get_attr(p, attr, value);
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_pool_get_free_extents(sop_pool_t pool, size_t *largest, size_t *total)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	p = pool_usable(pool);
	if (p && largest && total)
		sop__heap_free_extents(p, largest, total);
	else
		r = CUDA_ERROR_INVALID_VALUE;
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_pool_set_compaction(sop_pool_t pool, int enable)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	p = pool_usable(pool);
	if (p && (enable == 0 || enable == 1))
		atomic_store(&p->compact, enable == 1);
	else
		r = CUDA_ERROR_INVALID_VALUE;
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_pool_get_compaction(sop_pool_t pool, int *enabled)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	p = pool_usable(pool);
	if (p && enabled)
		*enabled = atomic_load(&p->compact);
	else
		r = CUDA_ERROR_INVALID_VALUE;
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_trim_to(sop_pool_t pool, size_t min_bytes_to_keep)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();
	int mode;

	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	p = pool_usable(pool);
	/* Unmapping and releasing are sop's calls, relaxed as its growth is (design.md, Stream
	 * capture). */
	mode = sop__capture_relax();
	/* An imported pool holds only what its imported pointers use. */
	r = !p ? CUDA_ERROR_INVALID_VALUE
	       : p->imported ? CUDA_SUCCESS : sop__pool_trim(p, min_bytes_to_keep);
	sop__capture_restore(mode);
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_pool_set_access(sop_pool_t pool, const CUmemAccessDesc *map, size_t count)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	p = pool_usable(pool);
	if (!p || (!map && count))
		r = CUDA_ERROR_INVALID_VALUE;
	else if (count)
		r = sop__pool_set_access(p, map, count);
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_pool_get_access(CUmemAccess_flags *flags, sop_pool_t pool, CUmemLocation *location)
{
	CUmemAccess_flags f;
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	p = pool_usable(pool);
	if (!flags || !p || !location)
		r = CUDA_ERROR_INVALID_VALUE;
	else if ((r = sop__pool_get_access(p, location, &f)) == CUDA_SUCCESS)
		*flags = f;
	sop__unpin(pin);
	return r;
}

/* ---- Default and current pools ----------------------------------------------------------- */

SOP_API CUresult
sop_device_get_default_pool(sop_pool_t *pool, CUdevice device)
{
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	/* Default pools are never destroyed: no pin. */
	r = sop__default_pool(device, &p);
	if (r == CUDA_SUCCESS)
		*pool = sop__pool_handle(p);
	return r;
}

SOP_API CUresult
sop_device_set_pool(CUdevice device, sop_pool_t pool)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (device < 0 || device >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	pin = sop__pin();
	p = pool_usable(pool);
	r = p && !p->imported ? sop__set_current_pool(device, p) : CUDA_ERROR_INVALID_VALUE;
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_device_get_pool(sop_pool_t *pool, CUdevice device)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	pin = sop__pin();
	r = sop__current_pool(device, &p);
	if (r == CUDA_SUCCESS)
		*pool = sop__pool_handle(p);
	sop__unpin(pin);
	return r;
}

/* A location and allocation type as cuMemGetDefaultMemPool takes them: a device (its
 * ordinal checked), or a host location with a slot. */
static CUresult
location_check(const CUmemLocation *loc, CUmemAllocationType type)
{
	if (!loc)
		return CUDA_ERROR_INVALID_VALUE;
	if (type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return type == CU_MEM_ALLOCATION_TYPE_MANAGED ? CUDA_ERROR_NOT_SUPPORTED
							      : CUDA_ERROR_INVALID_VALUE;
	if (loc->type == CU_MEM_LOCATION_TYPE_DEVICE)
		return loc->id >= 0 && loc->id < sop__device_count() ? CUDA_SUCCESS
								     : CUDA_ERROR_INVALID_DEVICE;
	return sop__host_slot(loc) >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SOP_API CUresult
sop_mem_get_default_pool(sop_pool_t *pool, const CUmemLocation *location, CUmemAllocationType type)
{
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	r = location_check(location, type);
	if (r != CUDA_SUCCESS)
		return r;
	/* Default pools are never destroyed: no pin. */
	r = location->type == CU_MEM_LOCATION_TYPE_DEVICE ? sop__default_pool(location->id, &p)
							   : sop__host_default_pool(location, &p);
	if (r == CUDA_SUCCESS)
		*pool = sop__pool_handle(p);
	return r;
}

SOP_API CUresult
sop_mem_get_pool(sop_pool_t *pool, const CUmemLocation *location, CUmemAllocationType type)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	r = location_check(location, type);
	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	r = location->type == CU_MEM_LOCATION_TYPE_DEVICE ? sop__current_pool(location->id, &p)
							   : sop__host_current_pool(location, &p);
	if (r == CUDA_SUCCESS)
		*pool = sop__pool_handle(p);
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_mem_set_pool(const CUmemLocation *location, CUmemAllocationType type, sop_pool_t pool)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	r = location_check(location, type);
	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	p = pool_usable(pool);
	if (!p || p->imported)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (location->type == CU_MEM_LOCATION_TYPE_DEVICE)
		r = sop__set_current_pool(location->id, p);
	else
		r = sop__host_set_current_pool(location, p);
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_device_get_host_location(CUmemLocation *location, CUdevice device)
{
	CUmemLocation loc;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!location)
		return CUDA_ERROR_INVALID_VALUE;
	r = sop__device_host_location(device, &loc);
	if (r == CUDA_SUCCESS)
		*location = loc;
	return r;
}

/* ---- Device memory limits ---------------------------------------------------------------- */

SOP_API CUresult
sop_device_set_memory_limit(CUdevice device, size_t limit)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (device < 0 || device >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	sop__limit_set(device, limit);
	return CUDA_SUCCESS;
}

SOP_API CUresult
sop_device_get_memory_limit(size_t *limit, size_t *held, CUdevice device)
{
	size_t l, h;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!limit)
		return CUDA_ERROR_INVALID_VALUE;
	if (device < 0 || device >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	sop__limit_get(device, &l, &h);
	*limit = l;
	if (held)
		*held = h;
	return CUDA_SUCCESS;
}

/* ---- Allocation -------------------------------------------------------------------------- */

/* An allocation on a capturing stream: the driver's graph memory (a memory node of the graph,
 * whose address stays the graph's for its lifetime, live between the node and its free at every
 * launch). Not sop's: the graph may be launched any number of times, after sop has long reused
 * anything it could hand out now. The pool's device must be the stream's, where the driver's
 * graph memory comes from. Pinned. */
static CUresult
malloc_graph(void **ptr, size_t size, struct sop_pool *pool, CUstream stream)
{
	CUdeviceptr d;
	CUdevice device;
	CUresult r;

	/* Graph memory is device memory: a host pool has none to give in a capture. */
	if (pool && pool->host)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (pool) {
		r = sop__stream_device_of(stream, &device);
		if (r != CUDA_SUCCESS)
			return r;
		if (device != pool->device)
			return CUDA_ERROR_NOT_SUPPORTED;
	}
	r = SOP_DRV(cuMemAllocAsync)(&d, size, stream);
	if (r == CUDA_SUCCESS)
		*ptr = (void *)(uintptr_t)d;
	return r;
}

/* Allocate from a usable pool (or not: NULL) on the stream with this id, which stream names now
 * (0: ask). Pinned. Inlined: link-time optimization kept it a call of its own on every
 * allocation. */
static inline __attribute__((always_inline)) CUresult
malloc_from(void **ptr, size_t size, struct sop_pool *pool, CUstream stream, uint64_t id)
{
	void *p;
	CUresult r;

	/* An imported pool cannot allocate, as the driver's cannot. */
	if (!ptr || !pool || pool->imported)
		return CUDA_ERROR_INVALID_VALUE;
	if (!size) {
		*ptr = NULL;
		return CUDA_SUCCESS;
	}
	if (!id && (r = sop__stream_id(stream, &id)) != CUDA_SUCCESS)
		return r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ? malloc_graph(ptr, size, pool, stream)
								   : r;
	r = sop__alloc(pool, stream, id, size, &p);
	/* At the device's memory limit, every pool of the device gives back its idle memory, here
	 * where no pool lock is held, and the request is tried once more. */
	if (r == CUDA_ERROR_OUT_OF_MEMORY && sop__limit_reclaim(pool, size))
		r = sop__alloc(pool, stream, id, size, &p);
	if (r == CUDA_SUCCESS)
		*ptr = p;
	else if (r == CUDA_ERROR_OUT_OF_MEMORY)
		sop__oom_report(pool, size);
	return r;
}

SOP_API CUresult
sop_malloc_from_pool_async(void **ptr, size_t size, sop_pool_t pool, CUstream stream)
{
	struct sop__pin *pin;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	r = malloc_from(ptr, size, pool_usable(pool), stream, 0);
	sop__unpin(pin);
	return r;
}

/* How often sop_malloc_async reads the current pool again when it finds the one it read being
 * destroyed: sop_pool_destroy forgets it as current before it marks it, so once is enough
 * unless other threads destroy one current pool after another meanwhile. */
#define CURRENT_TRIES 4

SOP_API CUresult
sop_malloc_async(void **ptr, size_t size, CUstream stream)
{
	struct sop_pool *pool = NULL, *usable = NULL;
	struct sop__pin *pin;
	CUdevice device;
	uint64_t id;
	CUresult r = sop__init();
	int tries;

	if (r != CUDA_SUCCESS)
		return r;
	if (!ptr)
		return CUDA_ERROR_INVALID_VALUE;
	r = sop__stream_id(stream, &id);
	if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) /* the driver's graph memory, on the stream's device */
		return malloc_graph(ptr, size, NULL, stream);
	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	/* By id: a handle the driver gave to a new stream, maybe of another device, is new. */
	r = sop__stream_device(stream, id, &device);
	for (tries = 0; r == CUDA_SUCCESS && tries < CURRENT_TRIES && !usable; tries++) {
		r = sop__current_pool(device, &pool);
		if (r != CUDA_SUCCESS)
			break;
		usable = pool_live(pool);
	}
	if (r == CUDA_SUCCESS)
		r = malloc_from(ptr, size, usable, stream, id);
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_free_async(void *ptr, CUstream stream)
{
	struct sop_pool *pool;
	struct sop__pin *pin;
	bool capturing;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!ptr)
		return CUDA_SUCCESS;
	pin = sop__pin();
	pool = sop__registry_lookup((CUdeviceptr)(uintptr_t)ptr);
	/* On a capturing stream a free is a node of the graph: the driver's for its own graph
	 * memory (what sop_malloc_async gave during the capture); refused for sop's memory, as the
	 * driver refuses a free of memory that is not the graph's. */
	if (!pool || atomic_load_explicit(&pool->dead, memory_order_acquire)) {
		r = sop__stream_capturing(stream, &capturing);
		if (r == CUDA_SUCCESS)
			r = capturing ? SOP_DRV(cuMemFreeAsync)((CUdeviceptr)(uintptr_t)ptr, stream)
				      : CUDA_ERROR_INVALID_VALUE;
	} else {
		r = sop__stream_capturing_seen(stream, &capturing);
		if (r == CUDA_SUCCESS && capturing)
			r = CUDA_ERROR_INVALID_VALUE;
		else if (r == CUDA_SUCCESS && SOP_UNLIKELY(pool->imported))
			r = sop__import_free(pool, (CUdeviceptr)(uintptr_t)ptr, stream, false);
		else if (r == CUDA_SUCCESS)
			r = sop__free_async(pool, (CUdeviceptr)(uintptr_t)ptr, stream);
	}
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_free(void *ptr)
{
	CUdeviceptr addr = (CUdeviceptr)(uintptr_t)ptr;
	uint64_t expect = sop__tag(addr, SOP_BLOCK_ALLOC);
	struct sop_pool *pool;
	struct sop__block *b;
	struct sop__pin *pin;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!ptr)
		return CUDA_SUCCESS;
	pin = sop__pin();
	pool = sop__registry_lookup(addr);
	if (!pool || pool->imported) {
		r = pool ? sop__import_free(pool, addr, NULL, true) : CUDA_ERROR_INVALID_VALUE;
		sop__unpin(pin);
		sop__epoch_reclaim();
		return r;
	}
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	b = atomic_load(&pool->dead) ? NULL : sop__map_get(pool, addr);
	/* Claim it as a free would (racing frees of the same pointer: one wins), then give it to
	 * the heap: the caller vouches that nothing uses it any more. */
	if (!b || !atomic_compare_exchange_strong(&b->tag, &expect,
						  sop__tag(addr, SOP_BLOCK_CACHED))) {
		sop__mutex_drop(&pool->lock);
		sop__unpin(pin);
		return CUDA_ERROR_INVALID_VALUE;
	}
	sop__used_sub(b, NULL);
	if (__atomic_load_n(&b->gen, __ATOMIC_RELAXED))
		sop__share_forget(pool, b);
	sop__heap_put(pool, b);
	if (!sop__pool_reap(pool))
		sop__mutex_drop(&pool->lock);
	sop__unpin(pin);
	sop__epoch_reclaim();
	return CUDA_SUCCESS;
}

CUresult
sop__pointer_block(const void *ptr, sop_pool_t *pool, CUdeviceptr *start, size_t *size)
{
	CUdeviceptr addr = (CUdeviceptr)(uintptr_t)ptr;
	struct sop__segment *seg;
	struct sop__block *b = NULL;
	struct sop__pin *pin;
	struct sop_pool *p;
	CUdeviceptr at = 0;
	size_t req = 0;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool || !ptr)
		return CUDA_ERROR_INVALID_VALUE;
	pin = sop__pin();
	p = sop__registry_lookup(addr);
	if (!p || p->imported) {
		r = p ? sop__import_block(p, addr, start, size) : CUDA_ERROR_INVALID_VALUE;
		if (r == CUDA_SUCCESS)
			*pool = sop__pool_handle(p);
		sop__unpin(pin);
		return r;
	}
	sop__mutex_take(&p->lock, SOP_RANK_POOL);
	/* Not a hot path: find the segment, then the block within it. */
	for (seg = atomic_load(&p->dead) ? NULL : p->segments; seg; seg = seg->next) {
		if (addr >= seg->va && addr - seg->va < seg->size) {
			sop__lock_take(&seg->lock);
			for (b = seg->first; b && !(addr >= b->addr && addr - b->addr < b->size);
			     b = b->phys_next)
				;
			/* A free of the block may be claiming it meanwhile (it takes neither
			 * lock): it is ALLOC and its size still read, or it is not. */
			if (b) {
				req = __atomic_load_n(&b->req, __ATOMIC_RELAXED);
				at = b->addr;
			}
			if (b && !(sop__block_state(b) == SOP_BLOCK_ALLOC && addr - b->addr < req))
				b = NULL;
			sop__lock_drop(&seg->lock);
			break;
		}
	}
	if (b) {
		*pool = sop__pool_handle(p);
		if (start)
			*start = at;
		if (size)
			*size = req;
	} else {
		r = CUDA_ERROR_INVALID_VALUE;
	}
	sop__mutex_drop(&p->lock);
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_pointer_get_pool(sop_pool_t *pool, const void *ptr)
{
	return sop__pointer_block(ptr, pool, NULL, NULL);
}

/* ---- Synchronization points -------------------------------------------------------------- */

SOP_API CUresult
sop_event_record(CUevent event, CUstream stream)
{
	struct sop__pin *pin;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin(); /* the stream's record stays readable (order.c) */
	r = sop__event_record(event, stream);
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_stream_wait_event(CUstream stream, CUevent event, unsigned int flags)
{
	struct sop__pin *pin;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	pin = sop__pin();
	r = sop__event_wait(stream, event, flags);
	sop__unpin(pin);
	return r;
}

SOP_API CUresult
sop_stream_synchronize(CUstream stream)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	return sop__sync_stream(stream);
}

SOP_API CUresult
sop_event_synchronize(CUevent event)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	return sop__sync_event(event);
}

SOP_API CUresult
sop_ctx_synchronize(void)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	return sop__sync_ctx();
}

SOP_API CUresult
sop_stream_destroy(CUstream stream)
{
	struct sop__pin *pin;
	uint64_t id;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	/* The special streams cannot be destroyed: the driver says so. */
	if (!sop__stream_special(stream) && sop__stream_id(stream, &id) == CUDA_SUCCESS) {
		struct sop__stream *st;

		pin = sop__pin();
		if ((st = sop__stream_ending(stream, id)))
			sop__pools_stream_gone(st);
		sop__unpin(pin);
	}
	sop__stream_destroy_begin(stream);
	r = SOP_DRV(cuStreamDestroy)(stream);
	sop__stream_destroy_end(stream);
	return r;
}

SOP_API CUresult
sop_event_destroy(CUevent event)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	sop__event_forget(event);
	return SOP_DRV(cuEventDestroy)(event);
}

/* ---- Sharing pools between processes ------------------------------------------------------ */

SOP_API CUresult
sop_pool_export_to_shareable_handle(void *handle_out, sop_pool_t pool,
				    CUmemAllocationHandleType type, unsigned long long flags)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	int fd;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!handle_out || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags)
		return CUDA_ERROR_INVALID_VALUE;
	pin = sop__pin();
	p = pool_usable(pool);
	r = p ? sop__share_export(p, &fd) : CUDA_ERROR_INVALID_VALUE;
	sop__unpin(pin);
	if (r == CUDA_SUCCESS)
		memcpy(handle_out, &fd, sizeof fd);
	return r;
}

SOP_API CUresult
sop_pool_import_from_shareable_handle(sop_pool_t *pool_out, void *handle,
				      CUmemAllocationHandleType type, unsigned long long flags)
{
	intptr_t fd = (intptr_t)handle;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool_out || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags || fd < 0 ||
	    fd > INT32_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	sop__epoch_bound();
	r = sop__import_pool((int)fd, &p);
	if (r == CUDA_SUCCESS)
		*pool_out = sop__pool_handle(p);
	return r;
}

SOP_API CUresult
sop_pool_export_pointer(CUmemPoolPtrExportData *share_data_out, void *ptr)
{
	CUdeviceptr addr = (CUdeviceptr)(uintptr_t)ptr;
	CUmemPoolPtrExportData d;
	struct sop__pin *pin;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!share_data_out || !ptr)
		return CUDA_ERROR_INVALID_VALUE;
	pin = sop__pin();
	p = sop__registry_lookup(addr);
	r = pool_live(p) ? sop__share_pointer(p, addr, &d) : CUDA_ERROR_INVALID_VALUE;
	sop__unpin(pin);
	if (r == CUDA_SUCCESS)
		*share_data_out = d;
	return r;
}

SOP_API CUresult
sop_pool_import_pointer(void **ptr_out, sop_pool_t pool, CUmemPoolPtrExportData *share_data)
{
	struct sop__pin *pin;
	struct sop_pool *p;
	void *ptr;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!ptr_out || !share_data)
		return CUDA_ERROR_INVALID_VALUE;
	pin = sop__pin();
	p = pool_usable(pool);
	r = p && p->imported ? sop__import_pointer(p, share_data, &ptr) : CUDA_ERROR_INVALID_VALUE;
	sop__unpin(pin);
	if (r == CUDA_SUCCESS)
		*ptr_out = ptr;
	return r;
}
