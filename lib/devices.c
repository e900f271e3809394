/* devices.c - what concerns every pool of a device: its default and current pool, as the public
 * calls that name a device find them (the default made on first use, the current one set and
 * read), and at the device's memory limit, its pools' idle memory given back and the
 * out-of-memory report. The same tables for host locations (HOST, HOST_NUMA nodes), which
 * the driver keeps per location on CUDA 13, and a device's closest host location.
 *
 * The tables live in registry.c, which pool.c reaches to make a destroyed pool no device's
 * current one (sop__forget_current); making a pool is pool.c's, so the default is made here,
 * above both. Locks: sop__dev_lock, then what sop__pool_new takes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The three operations below, on one location's entries of the tables (registry.c): a device's,
 * or a host location's slot. */

/* The default pool in *def, made on first use with the driver's defaults for its location. */
static CUresult
default_in(_Atomic(struct sop_pool *) *def, CUmemLocationType type, int id, struct sop_pool **out)
{
	struct sop_pool *p = atomic_load_explicit(def, memory_order_acquire);
	CUresult r = CUDA_SUCCESS;

	if (SOP_LIKELY(p != NULL)) {
		*out = p;
		return CUDA_SUCCESS;
	}
	sop__mutex_take(&sop__dev_lock, SOP_RANK_DEV);
	p = atomic_load_explicit(def, memory_order_relaxed);
	if (!p) {
		CUmemPoolProps props;
		memset(&props, 0, sizeof props);
		props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		props.location.type = type;
		props.location.id = id;
		r = sop__pool_new(&props, true, 0, &p);
		if (r == CUDA_SUCCESS)
			atomic_store_explicit(def, p, memory_order_release);
	}
	sop__mutex_drop(&sop__dev_lock);
	if (r == CUDA_SUCCESS)
		*out = p;
	return r;
}

/* What an entry of the current pools holds while the location's current pool is one sop did not
 * make (sop__set_current_foreign): no pool, never read through. */
#define CURRENT_FOREIGN ((struct sop_pool *)(uintptr_t)1)

/* The current pool: the one set in *cur, else the default; CUDA_ERROR_NOT_SUPPORTED while it is
 * not sop's. */
static CUresult
current_in(_Atomic(struct sop_pool *) *cur, _Atomic(struct sop_pool *) *def,
	   CUmemLocationType type, int id, struct sop_pool **out)
{
	struct sop_pool *p = atomic_load_explicit(cur, memory_order_acquire);

	if (p) {
		if (SOP_UNLIKELY(p == CURRENT_FOREIGN))
			return CUDA_ERROR_NOT_SUPPORTED;
		*out = p;
		return CUDA_SUCCESS;
	}
	return default_in(def, type, id, out);
}

/* Make pool current in *cur (the default: NULL, so that the entry names no pool of its own). */
static CUresult
set_current_in(_Atomic(struct sop_pool *) *cur, struct sop_pool *pool)
{
	CUresult r = CUDA_SUCCESS;

	sop__mutex_take(&sop__dev_lock, SOP_RANK_DEV);
	/* Checked under the lock that sop__forget_current takes to mark it: a pool being
	 * destroyed on another thread never becomes current after it was forgotten, to be freed
	 * while the table still names it. */
	if (atomic_load(&pool->destroyed))
		r = CUDA_ERROR_INVALID_VALUE;
	else
		atomic_store_explicit(cur, pool->is_default ? NULL : pool, memory_order_release);
	sop__mutex_drop(&sop__dev_lock);
	return r;
}

CUresult
sop__default_pool(CUdevice device, struct sop_pool **out)
{
	if (device < 0 || device >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	return default_in(&sop__default_pools[device], CU_MEM_LOCATION_TYPE_DEVICE, device, out);
}

CUresult
sop__current_pool(CUdevice device, struct sop_pool **out)
{
	if (device < 0 || device >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	return current_in(&sop__current_pools[device], &sop__default_pools[device],
			  CU_MEM_LOCATION_TYPE_DEVICE, device, out);
}

CUresult
sop__set_current_pool(CUdevice device, struct sop_pool *pool)
{
	if (device < 0 || device >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	if (pool->host || pool->device != device)
		return CUDA_ERROR_INVALID_VALUE;
	return set_current_in(&sop__current_pools[device], pool);
}

CUresult
sop__set_current_foreign(const CUmemLocation *loc, bool on)
{
	_Atomic(struct sop_pool *) *cur;
	int slot;

	if (loc->type == CU_MEM_LOCATION_TYPE_DEVICE) {
		if (loc->id < 0 || loc->id >= sop__device_count())
			return CUDA_ERROR_INVALID_DEVICE;
		cur = &sop__current_pools[loc->id];
	} else if ((slot = sop__host_slot(loc)) >= 0) {
		cur = &sop__host_current_pools[slot];
	} else {
		return CUDA_ERROR_INVALID_VALUE;
	}
	sop__mutex_take(&sop__dev_lock, SOP_RANK_DEV);
	if (on)
		atomic_store_explicit(cur, CURRENT_FOREIGN, memory_order_release);
	else if (atomic_load_explicit(cur, memory_order_relaxed) == CURRENT_FOREIGN)
		atomic_store_explicit(cur, NULL, memory_order_release);
	sop__mutex_drop(&sop__dev_lock);
	return CUDA_SUCCESS;
}

/* ---- Host locations ------------------------------------------------------------------------ */

/* A host location's default pool (HOST, or HOST_NUMA of a node below SOP_NUMA_NODES), made on
 * first use with the driver's defaults, as cuMemGetDefaultMemPool makes it on CUDA 13. */
CUresult
sop__host_default_pool(const CUmemLocation *loc, struct sop_pool **out)
{
	int slot = sop__host_slot(loc);

	if (slot < 0)
		return CUDA_ERROR_INVALID_VALUE;
	return default_in(&sop__host_default_pools[slot], loc->type, slot ? loc->id : 0, out);
}

CUresult
sop__host_current_pool(const CUmemLocation *loc, struct sop_pool **out)
{
	int slot = sop__host_slot(loc);

	if (slot < 0)
		return CUDA_ERROR_INVALID_VALUE;
	return current_in(&sop__host_current_pools[slot], &sop__host_default_pools[slot], loc->type,
			  slot ? loc->id : 0, out);
}

CUresult
sop__host_set_current_pool(const CUmemLocation *loc, struct sop_pool *pool)
{
	int slot = sop__host_slot(loc);

	if (slot < 0 || !pool->host || sop__host_slot(&pool->props.location) != slot)
		return CUDA_ERROR_INVALID_VALUE;
	return set_current_in(&sop__host_current_pools[slot], pool);
}

CUresult
sop__device_host_location(CUdevice device, CUmemLocation *loc)
{
	int node = -1;
	CUresult r;

	if (device < 0 || device >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	/* A driver that does not know the attribute knows no node either. */
	r = SOP_DRV(cuDeviceGetAttribute)(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device);
	if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE)
		return r;
	if (r == CUDA_SUCCESS && node >= 0) {
		loc->type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
		loc->id = node;
	} else {
		loc->type = CU_MEM_LOCATION_TYPE_HOST;
		loc->id = 0;
	}
	return CUDA_SUCCESS;
}

/* ---- At a device's memory limit (limit.c) --------------------------------------------------- */

/* Whether a request of size bytes from pool cannot be mapped under the cap as the device's
 * pools stand now. */
static bool
limit_binds(struct sop_pool *pool, size_t size)
{
	size_t limit, held;

	if (pool->host)
		return false; /* host memory counts against no device */
	sop__limit_get(pool->device, &limit, &held);
	size = sop__round_up(size, pool->granularity);
	return limit && (held > limit || size > limit - held);
}

/* Every pool of the device gives back its idle memory, as sop_trim_to(pool, 0) would: what free
 * memory whose frees are complete covers whole. Called with no pool lock held, so that each
 * pool's lock is taken alone, as a trim takes it: growth holds its own pool's lock and never
 * waits for another's, so no two growths at the cap can wait for each other. Pinned. */
bool
sop__limit_reclaim(struct sop_pool *pool, size_t size)
{
	struct sop_pool **pools;
	size_t n, i, limit, before, after;

	if (!limit_binds(pool, size))
		return false;
	sop__limit_get(pool->device, &limit, &before);
	pools = sop__registry_snapshot(&n);
	for (i = 0; i < n; i++) {
		if (pools[i]->host || pools[i]->device != pool->device)
			continue;
		sop__mutex_take(&pools[i]->lock, SOP_RANK_POOL);
		if (!atomic_load(&pools[i]->dead))
			sop__heap_release(pools[i], 0, 0);
		sop__mutex_drop(&pools[i]->lock);
	}
	free(pools);
	sop__limit_get(pool->device, &limit, &after);
	return after < before;
}

/* ---- The out-of-memory report ------------------------------------------------------------- */

static void
report_pool(struct sop_pool *p, const struct sop_pool *failed)
{
	size_t largest = 0, free_bytes = 0;
	uint64_t used;

	sop__mutex_take(&p->lock, SOP_RANK_POOL);
	if (atomic_load(&p->dead)) {
		sop__mutex_drop(&p->lock);
		return;
	}
	used = sop__pool_used(p, SOP_FOLD_NONE);
	sop__mutex_drop(&p->lock);
	sop__heap_free_extents(p, &largest, &free_bytes);
	fprintf(stderr,
		"sop:   pool %#llx%s%s%s: reserved %llu, used %llu, free %zu, largest free extent "
		"%zu\n",
		(unsigned long long)p->handle, p->is_default ? " (default)" : "",
		atomic_load(&p->destroyed) ? " (destroyed)" : "", p == failed ? " (this request)" : "",
		(unsigned long long)atomic_load(&p->reserved), (unsigned long long)used, free_bytes,
		largest);
}

void
sop__oom_report(struct sop_pool *pool, size_t size)
{
	struct sop_pool **pools;
	size_t n, i, limit, held;

	if (SOP_LIKELY(!sop__limit_reporting()))
		return;
	if (pool->host) {
		/* No device's limit is concerned: the pool alone. */
		flockfile(stderr);
		fprintf(stderr, "sop: out of memory: %zu bytes from host pool %#llx\n", size,
			(unsigned long long)pool->handle);
		report_pool(pool, pool);
		funlockfile(stderr);
		return;
	}
	sop__limit_get(pool->device, &limit, &held);
	pools = sop__registry_snapshot(&n);
	/* One report in one piece, whatever other threads write. */
	flockfile(stderr);
	fprintf(stderr, "sop: out of memory: %zu bytes from pool %#llx on device %d\n", size,
		(unsigned long long)pool->handle, (int)pool->device);
	if (limit)
		fprintf(stderr, "sop: device %d: limit %zu, held by sop's pools %zu\n",
			(int)pool->device, limit, held);
	else
		fprintf(stderr, "sop: device %d: no limit, held by sop's pools %zu\n",
			(int)pool->device, held);
	for (i = 0; i < n; i++)
		if (!pools[i]->host && pools[i]->device == pool->device)
			report_pool(pools[i], pool);
	funlockfile(stderr);
	free(pools);
}
