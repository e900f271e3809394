/* pool.c - pool objects: creation and teardown, attributes, peer access and trimming. What
 * happens at synchronization points, across every pool, is sync.c's.
 *
 * A pool is torn down when it has been destroyed and nothing is left in it: no live allocation
 * and no pending free. Destroying a pool with live allocations only marks it; the last free
 * followed by a synchronization point that covers it (or sop_free) finishes the job. Teardown
 * gives the device memory back and unlinks the pool; its host memory is freed later, once no
 * call can be reading it (epoch.c).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "internal.h"

/* ---- Creation ----------------------------------------------------------------------------- */

static size_t
pool_va_size(size_t device_mem, size_t max_size)
{
	size_t granule = (size_t)1 << SOP_VA_GRANULE_LOG2;
	size_t va = device_mem * SOP_VA_FACTOR;

	if (max_size && max_size * SOP_VA_FACTOR > va)
		va = max_size * SOP_VA_FACTOR;
	if (va > SOP_VA_MAX)
		va = SOP_VA_MAX;
	return sop__round_up(va, granule);
}

/* The host's memory, which sizes a host pool's reservation as a device's memory sizes a device
 * pool's. */
static size_t
host_memory(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);

	if (pages <= 0 || page <= 0)
		return (size_t)64 << 30;
	return (size_t)pages * (size_t)page;
}

/* The device a host pool makes its driver calls in: the current context's, else the first.
 * Its primary context is retained for the pool's lifetime, and a program that uses one device
 * should not pay for a context on another. */
static CUdevice
host_pool_device(void)
{
	CUcontext ctx = NULL;
	CUdevice dev = 0;

	if (SOP_DRV(cuCtxGetCurrent)(&ctx) != CUDA_SUCCESS || !ctx ||
	    SOP_DRV(cuCtxGetDevice)(&dev) != CUDA_SUCCESS || dev < 0 || dev >= sop__device_count())
		dev = 0;
	return dev;
}

/* A token no other pool has, for export data (share.c): random, else a mix of what differs. */
static uint64_t
pool_token(const struct sop_pool *pool)
{
	uint64_t t = 0;

	if (getrandom(&t, sizeof t, GRND_NONBLOCK) != (ssize_t)sizeof t || !t)
		t = (sop__now_ns() * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)getpid() << 32) ^
		    (uint64_t)(uintptr_t)pool;
	return t | 1;
}

CUresult
sop__pool_new(const CUmemPoolProps *props, bool is_default, size_t va_size,
	      struct sop_pool **out)
{
	CUmemAllocationProp prop = {0};
	struct sop_pool *pool;
	size_t total = 0;
	CUresult r;
	bool keep;

	pool = calloc(1, sizeof *pool);
	if (!pool)
		return CUDA_ERROR_OUT_OF_MEMORY;
	sop__lock_init(&pool->leaf_lock, SOP_RANK_LEAF);
	pool->props = *props;
	pool->host = props->location.type != CU_MEM_LOCATION_TYPE_DEVICE;
	if (pool->host) {
		/* "id is ignored" for HOST: kept as 0, so that every piece and descriptor is
		 * the same whatever the caller left there. */
		if (props->location.type == CU_MEM_LOCATION_TYPE_HOST)
			pool->props.location.id = 0;
		pool->device = host_pool_device();
	} else {
		pool->device = props->location.id;
	}
	pool->is_default = is_default;
	{
		/* The pool lock is held for a few hundred nanoseconds at a time (the slow path),
		 * and many threads may want it: spinning a little before sleeping beats a futex
		 * round trip. Held across driver calls only on release (growth drops it while the
		 * driver maps: grow.c). */
		pthread_mutexattr_t attr;
		pthread_mutexattr_init(&attr);
		pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
		pthread_mutex_init(&pool->lock, &attr);
		pthread_mutexattr_destroy(&attr);
		pthread_cond_init(&pool->grown, NULL);
	}
	pool->retire_at = SOP_STATES_MIN;
	pool->token = pool_token(pool);
	atomic_init(&pool->reuse_follow, 1);
	atomic_init(&pool->reuse_opportunistic, 1);
	atomic_init(&pool->reuse_internal, 1);
	pool->va_free = calloc(1, sizeof *pool->va_free);
	if (!pool->va_free) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail_host;
	}

	r = SOP_DRV(cuDevicePrimaryCtxRetain)(&pool->ctx, pool->device);
	if (r != CUDA_SUCCESS)
		goto fail_host;
	r = sop__pool_ctx_push(pool);
	if (r != CUDA_SUCCESS)
		goto fail_ctx;
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location = pool->props.location;
	prop.requestedHandleTypes = props->handleTypes;
	r = SOP_DRV(cuMemGetAllocationGranularity)(&pool->granularity, &prop,
						   CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	/* Whether the driver makes host memory through these calls, and on that node, differs
	 * by version and machine (doc/differences.md): it is asked, by making one granule,
	 * rather than read from attributes that older drivers lack. Its code is the answer. */
	if (r == CUDA_SUCCESS && pool->host)
		r = sop__piece_probe(pool, &prop, pool->granularity);
	if (r == CUDA_SUCCESS && pool->host)
		total = host_memory();
	else if (r == CUDA_SUCCESS)
		r = SOP_DRV(cuDeviceTotalMem)(&total, pool->device);
	if (r == CUDA_SUCCESS) {
		if (props->maxSize)
			pool->max_size = sop__round_up(props->maxSize, pool->granularity);
		pool->va_size = va_size ? va_size : pool_va_size(total, pool->max_size);
		r = sop__va_reserve(pool);
	}
	if (r != CUDA_SUCCESS)
		sop__orphans_release(pool);
	sop__pool_ctx_pop(pool);
	if (r != CUDA_SUCCESS)
		goto fail_ctx;
	/* The first granule is kept for the anchor (vmm.c, sop__anchor_make). */
	pool->va_free->off = pool->granularity;
	pool->va_free->size = pool->va_size - pool->granularity;
	if (!sop__map_init(pool)) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail_va;
	}
	/* The slot first: once the registry names the pool, frees may find it, and it can only
	 * be taken out again by retiring it. */
	if (!sop__handle_take(pool)) {
		sop__map_destroy(pool);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail_va;
	}
	if (!sop__registry_add(pool)) {
		sop__handle_drop(pool);
		sop__map_destroy(pool);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail_va;
	}
	sop__handle_publish(pool);
	*out = pool;
	return CUDA_SUCCESS;

fail_va:
	keep = sop__va_claim();
	if (keep)
		sop__va_keep(pool);
	if (sop__pool_ctx_push(pool) == CUDA_SUCCESS) {
		if (!keep)
			sop__va_give_back(pool);
		sop__orphans_release(pool);
		sop__pool_ctx_pop(pool);
	}
fail_ctx:
	SOP_DRV(cuDevicePrimaryCtxRelease)(pool->device);
fail_host:
	/* A probe's handle whose release the driver refused twice is lost to the process. */
	free(pool->orphans);
	free(pool->va_free);
	pthread_cond_destroy(&pool->grown);
	pthread_mutex_destroy(&pool->lock);
	free(pool);
	return r;
}

/* ---- Teardown ----------------------------------------------------------------------------- */

static bool
pool_empty(struct sop_pool *pool)
{
	struct sop__sstream *ss;

	/* An imported pool: what it maps and the pointers it has imported (import.c). */
	if (sop__pool_used(pool, SOP_FOLD_NONE) ||
	    (pool->import && (pool->import->n_pieces || pool->import->n_ptrs)))
		return false;
	for (ss = pool->streams; ss; ss = ss->next)
		if (sop__sstream_cached(ss))
			return false;
	return true;
}

static void
pool_free(struct sop__retired *r)
{
	struct sop_pool *pool = (struct sop_pool *)((char *)r - offsetof(struct sop_pool, retired));

	sop__heap_destroy(pool);
	sop__sstream_destroy_all(pool);
	if (pool->board)
		munmap(pool->board, SOP_BOARD_BYTES);
	if (pool->board_fd_plus1)
		close(pool->board_fd_plus1 - 1);
	if (pool->import) {
		/* Emptied and disconnected before the teardown (import.c). */
		pthread_mutex_destroy(&pool->import->lock);
		free(pool->import->pieces);
		free(pool->import->ptrs);
		free(pool->import);
	}
	free(pool->access);
	pthread_cond_destroy(&pool->grown);
	pthread_mutex_destroy(&pool->lock);
	free(pool);
}

bool
sop__pool_reap(struct sop_pool *pool)
{
	CUresult r;
	bool keep;

	if (!atomic_load(&pool->destroyed) || atomic_load(&pool->dead) || !pool_empty(pool))
		return false;
	/* Give everything back to the driver. If it refuses anything, the pool stays as it is,
	 * destroyed but whole, and the next synchronization point tries again. */
	if (sop__heap_release(pool, 0, 0) != CUDA_SUCCESS || pool->segments || pool->n_orphans)
		return false;
	/* The reservation goes to the next pool (vmm.c, sop__va_reserve) where there is room,
	 * with an anchor made now if it had been a pool's before and has none (pools come and go
	 * here: the next one's first piece finds the page tables made), else back to the
	 * driver. */
	keep = false;
	if (pool->va_size) {
		r = sop__pool_ctx_push(pool);
		if (r != CUDA_SUCCESS)
			return false;
		keep = sop__va_claim();
		if (keep && pool->va_reused && !pool->anchor_tried) {
			/* A handle it made and the driver would not release stays the pool's,
			 * which then waits, whole, for the next synchronization point. */
			sop__anchor_make(pool);
			if (pool->n_orphans)
				r = sop__orphans_release(pool);
			if (r != CUDA_SUCCESS)
				sop__va_unclaim();
		} else if (!keep) {
			r = sop__va_give_back(pool);
		}
		sop__pool_ctx_pop(pool);
		if (r != CUDA_SUCCESS)
			return false;
	}
	/* Unlinked from every table that finds pools without a lock (it left the current pools
	 * when it was destroyed); then retired. Threads that found it a moment ago may still be
	 * reading it, its stream states, descriptors and block map, which the dead flag, checked
	 * under this lock, keeps them from changing: the host memory is freed once they are done
	 * (pool_free, from epoch.c). Its reservation is kept only once no table names the pool,
	 * so that the next pool's range is never named by two. */
	sop__registry_remove(pool);
	if (keep)
		sop__va_keep(pool);
	sop__handle_drop(pool);
	SOP_DRV(cuDevicePrimaryCtxRelease)(pool->device);
	atomic_store(&pool->dead, true);
	sop__mutex_drop(&pool->lock);
	sop__epoch_retire(&pool->retired, pool_free, true);
	return true;
}


void
sop__pool_destroy(struct sop_pool *pool)
{
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	/* Memory nobody uses goes back now; the rest when its last user lets go. */
	sop__heap_release(pool, 0, 0);
	if (!sop__pool_reap(pool))
		sop__mutex_drop(&pool->lock);
}

void
sop__pool_apply_threshold(struct sop_pool *pool)
{
	uint64_t threshold = atomic_load(&pool->release_threshold);

	if (pool->destroyed)
		threshold = 0;
	if (atomic_load(&pool->reserved) > threshold)
		sop__heap_release(pool, threshold, 0);
}

/* ---- Attributes ----------------------------------------------------------------------------- */

static atomic_int *
reuse_attr(struct sop_pool *pool, CUmemPool_attribute attr)
{
	switch (attr) {
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
		return &pool->reuse_follow;
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
		return &pool->reuse_opportunistic;
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
		return &pool->reuse_internal;
	default:
		return NULL;
	}
}

/* The pool's properties as attributes, read-only, with the ids and types CUDA 13.2 gave them
 * (the 13.0 headers sop builds against lack them): the allocation type, the handle types it
 * exports (none for an imported pool, which cannot export again), its location's type and id,
 * its cap rounded to the granularity as the pool applies it (0: none), and whether hardware
 * decompression is on (never: sop makes no pool with a usage). */
enum {
	ATTR_ALLOCATION_TYPE = 9,
	ATTR_EXPORT_HANDLE_TYPES = 10,
	ATTR_LOCATION_ID = 11,
	ATTR_LOCATION_TYPE = 12,
	ATTR_MAX_POOL_SIZE = 13,
	ATTR_HW_DECOMPRESS_ENABLED = 14,
};

/* CUDA_ERROR_INVALID_VALUE: not one of them. */
static CUresult
property_attr(const struct sop_pool *pool, int attr, void *value)
{
	cuuint64_t max = pool->max_size;
	int i;

	switch (attr) {
	case ATTR_ALLOCATION_TYPE:
		i = (int)pool->props.allocType;
		break;
	case ATTR_EXPORT_HANDLE_TYPES:
		i = pool->imported ? (int)CU_MEM_HANDLE_TYPE_NONE : (int)pool->props.handleTypes;
		break;
	case ATTR_LOCATION_ID:
		i = pool->props.location.id;
		break;
	case ATTR_LOCATION_TYPE:
		i = (int)pool->props.location.type;
		break;
	case ATTR_MAX_POOL_SIZE:
		memcpy(value, &max, sizeof max);
		return CUDA_SUCCESS;
	case ATTR_HW_DECOMPRESS_ENABLED:
		i = 0;
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	memcpy(value, &i, sizeof i);
	return CUDA_SUCCESS;
}

CUresult
sop__pool_get_attr(struct sop_pool *pool, CUmemPool_attribute attr, void *value)
{
	atomic_int *flag = reuse_attr(pool, attr);
	cuuint64_t v;

	if (flag) {
		int i = atomic_load(flag);
		memcpy(value, &i, sizeof i);
		return CUDA_SUCCESS;
	}
	switch (attr) {
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
		v = atomic_load(&pool->release_threshold);
		break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
		v = atomic_load(&pool->reserved);
		break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
		v = atomic_load(&pool->reserved_high);
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
		sop__mutex_take(&pool->lock, SOP_RANK_POOL);
		v = sop__pool_used(pool, SOP_FOLD_NONE);
		sop__mutex_drop(&pool->lock);
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		sop__mutex_take(&pool->lock, SOP_RANK_POOL);
		sop__pool_used(pool, SOP_FOLD_ALL);
		v = pool->used_high;
		sop__mutex_drop(&pool->lock);
		break;
	default:
		return property_attr(pool, (int)attr, value);
	}
	memcpy(value, &v, sizeof v);
	return CUDA_SUCCESS;
}

CUresult
sop__pool_set_attr(struct sop_pool *pool, CUmemPool_attribute attr, void *value)
{
	atomic_int *flag = reuse_attr(pool, attr);
	cuuint64_t v;
	int i;

	if (flag) {
		memcpy(&i, value, sizeof i);
		atomic_store(flag, i != 0);
		return CUDA_SUCCESS;
	}
	switch (attr) {
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
		memcpy(&v, value, sizeof v);
		atomic_store(&pool->release_threshold, v);
		return CUDA_SUCCESS;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
		memcpy(&v, value, sizeof v);
		if (v)
			return CUDA_ERROR_INVALID_VALUE;
		/* Under the lock: reserved only changes there. */
		sop__mutex_take(&pool->lock, SOP_RANK_POOL);
		atomic_store(&pool->reserved_high, atomic_load(&pool->reserved));
		sop__mutex_drop(&pool->lock);
		return CUDA_SUCCESS;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		memcpy(&v, value, sizeof v);
		if (v)
			return CUDA_ERROR_INVALID_VALUE;
		sop__mutex_take(&pool->lock, SOP_RANK_POOL);
		pool->used_high = sop__pool_used(pool, SOP_FOLD_ALL); /* and the shards start again */
		sop__mutex_drop(&pool->lock);
		return CUDA_SUCCESS;
	default:
		/* The *_CURRENT statistics and the properties are read-only; anything else is
		 * unknown. */
		return CUDA_ERROR_INVALID_VALUE;
	}
}

/* ---- Peer access ---------------------------------------------------------------------------- */

/* The access a device has; a host pool's owner is the CPU, and no device is owner. */
static CUmemAccess_flags
access_of(const struct sop_pool *pool, int device)
{
	size_t i;

	if (!pool->host && device == pool->device)
		return CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	for (i = 0; i < pool->n_access; i++)
		if (pool->access[i].location.id == device)
			return pool->access[i].flags;
	return CU_MEM_ACCESS_FLAGS_PROT_NONE;
}

CUresult
sop__pool_get_access(struct sop_pool *pool, const CUmemLocation *loc, CUmemAccess_flags *flags)
{
	if (loc->type != CU_MEM_LOCATION_TYPE_DEVICE) {
		/* The CPU: always for a host pool, its owner; never for a device pool. */
		*flags = pool->host && (loc->type == CU_MEM_LOCATION_TYPE_HOST ||
					loc->type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
				 ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
				 : CU_MEM_ACCESS_FLAGS_PROT_NONE;
		return CUDA_SUCCESS;
	}
	if (loc->id < 0 || loc->id >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	*flags = access_of(pool, loc->id);
	sop__mutex_drop(&pool->lock);
	return CUDA_SUCCESS;
}

/* A host descriptor for a host pool names its owner, the CPU, as the owning device's does for a
 * device pool: read-write is a no-op, anything less is refused. The driver forbids a HOST_NUMA
 * descriptor for memory of another location type; a device pool refuses host access
 * (CUDA_ERROR_NOT_SUPPORTED, as an H100 answers). */
static CUresult
access_check_host(struct sop_pool *pool, const CUmemAccessDesc *d)
{
	if (d->location.type != CU_MEM_LOCATION_TYPE_HOST &&
	    d->location.type != CU_MEM_LOCATION_TYPE_HOST_NUMA)
		return CUDA_ERROR_INVALID_VALUE;
	if (!pool->host)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (d->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA &&
	    pool->props.location.type != CU_MEM_LOCATION_TYPE_HOST_NUMA)
		return CUDA_ERROR_INVALID_VALUE;
	if (d->flags == CU_MEM_ACCESS_FLAGS_PROT_READ)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (d->flags == CU_MEM_ACCESS_FLAGS_PROT_NONE)
		return CUDA_ERROR_INVALID_DEVICE;
	return d->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? CUDA_SUCCESS
							       : CUDA_ERROR_INVALID_VALUE;
}

static CUresult
access_check(struct sop_pool *pool, const CUmemAccessDesc *d)
{
	int can = 0;
	CUresult r;

	if (d->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return access_check_host(pool, d);
	if (d->location.id < 0 || d->location.id >= sop__device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	if (d->flags == CU_MEM_ACCESS_FLAGS_PROT_READ)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (d->flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
	    d->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
		return CUDA_ERROR_INVALID_VALUE;
	/* Every device reaches pinned host memory (the driver's pools let any device be granted
	 * access to a host pool). */
	if (pool->host)
		return CUDA_SUCCESS;
	if (d->location.id == pool->device)
		return d->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? CUDA_SUCCESS
								       : CUDA_ERROR_INVALID_DEVICE;
	if (d->flags == CU_MEM_ACCESS_FLAGS_PROT_NONE)
		return CUDA_SUCCESS;
	r = SOP_DRV(cuDeviceCanAccessPeer)(&can, d->location.id, pool->device);
	if (r != CUDA_SUCCESS)
		return r;
	return can ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult
sop__pool_set_access(struct sop_pool *pool, const CUmemAccessDesc *map, size_t count)
{
	size_t i, n = 1, n_next = 0, n_dev = (size_t)sop__device_count();
	CUmemAccessDesc *next = NULL, *want = NULL, *was = NULL;
	CUresult r;
	int dev;

	for (i = 0; i < count; i++) {
		r = access_check(pool, &map[i]);
		if (r != CUDA_SUCCESS)
			return r;
	}
	next = calloc(n_dev, sizeof *next);
	want = calloc(n_dev + 1, sizeof *want);
	was = calloc(n_dev + 1, sizeof *was);
	if (!next || !want || !was) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	if (atomic_load(&pool->dead)) {
		/* Torn down by another thread since the caller looked: its context is released. */
		r = CUDA_ERROR_INVALID_VALUE;
		goto unlock;
	}
	/* What every mapping gets: the owner, then each peer that has or had access, with the
	 * last descriptor naming it winning. `was` is the same list as it stands now. */
	want[0].location = pool->props.location;
	want[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	was[0] = want[0];
	for (dev = 0; dev < (int)n_dev; dev++) {
		CUmemAccess_flags old = access_of(pool, dev), f = old;
		if (!pool->host && dev == pool->device)
			continue;
		for (i = 0; i < count; i++)
			if (map[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
			    map[i].location.id == dev)
				f = map[i].flags;
		if (f == CU_MEM_ACCESS_FLAGS_PROT_NONE && old == CU_MEM_ACCESS_FLAGS_PROT_NONE)
			continue;
		want[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		want[n].location.id = dev;
		want[n].flags = f;
		was[n] = want[n];
		was[n].flags = old;
		n++;
		if (f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			next[n_next++] = want[n - 1];
	}
	r = sop__pool_ctx_push(pool);
	if (r == CUDA_SUCCESS) {
		r = sop__heap_set_access(pool, want, was, n);
		sop__pool_ctx_pop(pool);
	}
	if (r == CUDA_SUCCESS) {
		free(pool->access);
		pool->access = next;
		pool->n_access = n_next;
		pool->access_gen++; /* growths in flight catch up (grow.c) */
		next = NULL;
	}
unlock:
	sop__mutex_drop(&pool->lock);
out:
	free(next);
	free(want);
	free(was);
	return r;
}

/* ---- Trimming ------------------------------------------------------------------------------ */

CUresult
sop__pool_trim(struct sop_pool *pool, size_t keep)
{
	CUresult r;

	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	r = sop__heap_release(pool, keep, keep);
	sop__mutex_drop(&pool->lock);
	return r;
}
