/* sop.c - the public entry points: initialise, check arguments, call in.
 *
 * Nothing here keeps state of its own except a thread-local cache of which device a stream
 * belongs to, so that sop_malloc_async does not ask the driver on every call.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* A pool handle the application may still use: not destroyed (a destroyed pool only waits for
 * its last allocations) and not torn down. */
static bool
pool_usable(struct sop_pool *pool)
{
	return pool && !atomic_load_explicit(&pool->destroyed, memory_order_relaxed) &&
	       !atomic_load_explicit(&pool->dead, memory_order_relaxed);
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
		break;
	case CU_MEM_LOCATION_TYPE_HOST:
	case CU_MEM_LOCATION_TYPE_HOST_NUMA:
		return CUDA_ERROR_NOT_SUPPORTED;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (p->location.id < 0 || p->location.id >= sop__device_count())
		return CUDA_ERROR_INVALID_VALUE;
	if (p->handleTypes & ~(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |
			       CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC))
		return CUDA_ERROR_INVALID_VALUE;
	if (p->handleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (p->usage)
		return CUDA_ERROR_NOT_SUPPORTED;
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
	r = sop__pool_new(props, false, &p);
	if (r == CUDA_SUCCESS)
		*pool = p;
	return r;
}

SOP_API CUresult
sop_pool_destroy(sop_pool_t pool)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool_usable(pool) || pool->is_default)
		return CUDA_ERROR_INVALID_VALUE;
	sop__pool_destroy(pool);
	return CUDA_SUCCESS;
}

SOP_API CUresult
sop_pool_set_attr(sop_pool_t pool, CUmemPool_attribute attr, void *value)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool_usable(pool) || !value)
		return CUDA_ERROR_INVALID_VALUE;
	return sop__pool_set_attr(pool, attr, value);
}

SOP_API CUresult
sop_pool_get_attr(sop_pool_t pool, CUmemPool_attribute attr, void *value)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool_usable(pool) || !value)
		return CUDA_ERROR_INVALID_VALUE;
	return sop__pool_get_attr(pool, attr, value);
}

SOP_API CUresult
sop_pool_get_free_extents(sop_pool_t pool, size_t *largest, size_t *total)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool_usable(pool) || !largest || !total)
		return CUDA_ERROR_INVALID_VALUE;
	sop__heap_free_extents(pool, largest, total);
	return CUDA_SUCCESS;
}

SOP_API CUresult
sop_pool_set_compaction(sop_pool_t pool, int enable)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool_usable(pool) || (enable != 0 && enable != 1))
		return CUDA_ERROR_INVALID_VALUE;
	atomic_store(&pool->compact, enable == 1);
	return CUDA_SUCCESS;
}

SOP_API CUresult
sop_pool_get_compaction(sop_pool_t pool, int *enabled)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool_usable(pool) || !enabled)
		return CUDA_ERROR_INVALID_VALUE;
	*enabled = atomic_load(&pool->compact);
	return CUDA_SUCCESS;
}

SOP_API CUresult
sop_trim_to(sop_pool_t pool, size_t min_bytes_to_keep)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool_usable(pool))
		return CUDA_ERROR_INVALID_VALUE;
	return sop__pool_trim(pool, min_bytes_to_keep);
}

SOP_API CUresult
sop_pool_set_access(sop_pool_t pool, const CUmemAccessDesc *map, size_t count)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool_usable(pool) || (!map && count))
		return CUDA_ERROR_INVALID_VALUE;
	if (!count)
		return CUDA_SUCCESS;
	return sop__pool_set_access(pool, map, count);
}

SOP_API CUresult
sop_pool_get_access(CUmemAccess_flags *flags, sop_pool_t pool, CUmemLocation *location)
{
	CUmemAccess_flags f;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!flags || !pool_usable(pool) || !location)
		return CUDA_ERROR_INVALID_VALUE;
	r = sop__pool_get_access(pool, location, &f);
	if (r == CUDA_SUCCESS)
		*flags = f;
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
	r = sop__default_pool(device, &p);
	if (r == CUDA_SUCCESS)
		*pool = p;
	return r;
}

SOP_API CUresult
sop_device_set_pool(CUdevice device, sop_pool_t pool)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (device < 0 || device >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	if (!pool_usable(pool))
		return CUDA_ERROR_INVALID_VALUE;
	return sop__set_current_pool(device, pool);
}

SOP_API CUresult
sop_device_get_pool(sop_pool_t *pool, CUdevice device)
{
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	r = sop__current_pool(device, &p);
	if (r == CUDA_SUCCESS)
		*pool = p;
	return r;
}

/* ---- Allocation -------------------------------------------------------------------------- */

SOP_API CUresult
sop_malloc_from_pool_async(void **ptr, size_t size, sop_pool_t pool, CUstream stream)
{
	uint64_t id;
	void *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!ptr || !pool_usable(pool))
		return CUDA_ERROR_INVALID_VALUE;
	if (!size) {
		*ptr = NULL;
		return CUDA_SUCCESS;
	}
	r = sop__stream_id(stream, &id);
	if (r == CUDA_SUCCESS)
		r = sop__alloc(pool, stream, id, size, &p);
	if (r == CUDA_SUCCESS)
		*ptr = p;
	return r;
}

SOP_API CUresult
sop_malloc_async(void **ptr, size_t size, CUstream stream)
{
	struct sop__stream *st;
	struct sop_pool *pool;
	uint64_t id;
	void *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!ptr)
		return CUDA_ERROR_INVALID_VALUE;
	/* The stream's device, from its record (cached per thread by id: a handle the driver gave
	 * to a new stream, maybe of another device, is a new record). */
	r = sop__stream_id(stream, &id);
	if (r == CUDA_SUCCESS)
		r = sop__stream_of(stream, id, &st);
	if (r == CUDA_SUCCESS)
		r = sop__current_pool(st->device, &pool);
	if (r != CUDA_SUCCESS)
		return r;
	if (!pool_usable(pool))
		return CUDA_ERROR_INVALID_VALUE; /* destroyed by another thread just now */
	if (!size) {
		*ptr = NULL;
		return CUDA_SUCCESS;
	}
	r = sop__alloc(pool, stream, id, size, &p);
	if (r == CUDA_SUCCESS)
		*ptr = p;
	return r;
}

SOP_API CUresult
sop_free_async(void *ptr, CUstream stream)
{
	struct sop_pool *pool;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!ptr)
		return CUDA_SUCCESS;
	pool = sop__registry_lookup((CUdeviceptr)(uintptr_t)ptr);
	if (!pool || atomic_load_explicit(&pool->dead, memory_order_acquire))
		return CUDA_ERROR_INVALID_VALUE;
	return sop__free_async(pool, (CUdeviceptr)(uintptr_t)ptr, stream);
}

SOP_API CUresult
sop_free(void *ptr)
{
	CUdeviceptr addr = (CUdeviceptr)(uintptr_t)ptr;
	uint64_t expect = sop__tag(addr, SOP_BLOCK_ALLOC);
	struct sop_pool *pool;
	struct sop__block *b;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!ptr)
		return CUDA_SUCCESS;
	pool = sop__registry_lookup(addr);
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&pool->lock);
	b = atomic_load(&pool->dead) ? NULL : sop__map_get(pool, addr);
	/* Claim it as a free would (racing frees of the same pointer: one wins), then give it to
	 * the heap: the caller vouches that nothing uses it any more. */
	if (!b || !atomic_compare_exchange_strong(&b->tag, &expect,
						  sop__tag(addr, SOP_BLOCK_CACHED))) {
		pthread_mutex_unlock(&pool->lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	sop__used_sub(b, NULL);
	sop__heap_put(pool, b);
	if (!sop__pool_reap(pool))
		pthread_mutex_unlock(&pool->lock);
	return CUDA_SUCCESS;
}

SOP_API CUresult
sop_pointer_get_pool(sop_pool_t *pool, const void *ptr)
{
	CUdeviceptr addr = (CUdeviceptr)(uintptr_t)ptr;
	struct sop__segment *seg;
	struct sop__block *b = NULL;
	struct sop_pool *p;
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pool || !ptr)
		return CUDA_ERROR_INVALID_VALUE;
	p = sop__registry_lookup(addr);
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&p->lock);
	/* Not a hot path: find the segment, then the block within it. */
	for (seg = atomic_load(&p->dead) ? NULL : p->segments; seg; seg = seg->next) {
		if (addr >= seg->va && addr - seg->va < seg->size) {
			sop__lock_take(&seg->lock);
			for (b = seg->first; b && !(addr >= b->addr && addr - b->addr < b->size);
			     b = b->phys_next)
				;
			if (b && !(sop__block_state(b) == SOP_BLOCK_ALLOC && addr - b->addr < b->req))
				b = NULL;
			sop__lock_drop(&seg->lock);
			break;
		}
	}
	if (b)
		*pool = p;
	else
		r = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&p->lock);
	return r;
}

/* ---- Synchronization points -------------------------------------------------------------- */

SOP_API CUresult
sop_event_record(CUevent event, CUstream stream)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	return sop__event_record(event, stream);
}

SOP_API CUresult
sop_stream_wait_event(CUstream stream, CUevent event, unsigned int flags)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	return sop__event_wait(stream, event, flags);
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
sop_event_destroy(CUevent event)
{
	CUresult r = sop__init();

	if (r != CUDA_SUCCESS)
		return r;
	sop__event_forget(event);
	return SOP_DRV(cuEventDestroy)(event);
}
