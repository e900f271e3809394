/* devices.c - each device's default and current pool, as the public calls that name a device
 * find them: the default made on first use, the current one set and read.
 *
 * The tables live in registry.c, which pool.c reaches to make a destroyed pool no device's
 * current one (sop__forget_current); making a pool is pool.c's, so the default is made here,
 * above both. Locks: sop__dev_lock, then what sop__pool_new takes.
 */
#include <string.h>

#include "internal.h"

CUresult
sop__default_pool(CUdevice device, struct sop_pool **out)
{
	struct sop_pool *p;
	CUresult r = CUDA_SUCCESS;

	if (device < 0 || device >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	p = atomic_load_explicit(&sop__default_pools[device], memory_order_acquire);
	if (SOP_LIKELY(p != NULL)) {
		*out = p;
		return CUDA_SUCCESS;
	}
	pthread_mutex_lock(&sop__dev_lock);
	p = atomic_load_explicit(&sop__default_pools[device], memory_order_relaxed);
	if (!p) {
		CUmemPoolProps props;
		memset(&props, 0, sizeof props);
		props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		props.location.id = device;
		r = sop__pool_new(&props, true, &p);
		if (r == CUDA_SUCCESS)
			atomic_store_explicit(&sop__default_pools[device], p, memory_order_release);
	}
	pthread_mutex_unlock(&sop__dev_lock);
	if (r == CUDA_SUCCESS)
		*out = p;
	return r;
}

CUresult
sop__current_pool(CUdevice device, struct sop_pool **out)
{
	struct sop_pool *p;

	if (device < 0 || device >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	p = atomic_load_explicit(&sop__current_pools[device], memory_order_acquire);
	if (p) {
		*out = p;
		return CUDA_SUCCESS;
	}
	return sop__default_pool(device, out);
}

CUresult
sop__set_current_pool(CUdevice device, struct sop_pool *pool)
{
	CUresult r = CUDA_SUCCESS;

	if (device < 0 || device >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	if (pool->device != device)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sop__dev_lock);
	/* Checked under the lock that sop__forget_current takes to mark it: a pool being
	 * destroyed on another thread never becomes current after it was forgotten, to be freed
	 * while the table still names it. */
	if (atomic_load(&pool->destroyed))
		r = CUDA_ERROR_INVALID_VALUE;
	else
		atomic_store_explicit(&sop__current_pools[device], pool->is_default ? NULL : pool,
				      memory_order_release);
	pthread_mutex_unlock(&sop__dev_lock);
	return r;
}
