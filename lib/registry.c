/* registry.c - process-wide state: driver initialisation, the device list, pool handles, the
 * table that maps an address to its pool, and the tables of each device's and each host
 * location's default and current pool (devices.c makes and sets them; a pool's teardown takes it
 * out of them here).
 *
 * A free names only a pointer, so sop must find the pool from the address alone, on every
 * thread, without a lock: each pool reserves its addresses in whole gigabytes, and a two-level
 * table indexed by address / 1 GiB holds the owning pool (atomic loads to read, a lock to
 * write). A pool handle is a slot of a table of its own and a generation (internal.h). Every
 * reader of these tables without a lock is pinned (epoch.c): a pool it finds there a moment
 * before the pool's teardown unlinks it stays readable until it unpins, and is freed after.
 *
 * Locks, in the order they may be taken: sop__dev_lock, then a pool's lock, then reg_lock or
 * handle_lock.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define REG_LEAF_LOG2 10
#define REG_TOP_LOG2 (49 - SOP_VA_GRANULE_LOG2 - REG_LEAF_LOG2)
#define REG_LEAF (1u << REG_LEAF_LOG2)

typedef _Atomic(struct sop_pool *) reg_slot;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(reg_slot *) reg_top[1u << REG_TOP_LOG2];
static struct sop_pool *live_pools; /* not torn down */

pthread_mutex_t sop__dev_lock = PTHREAD_MUTEX_INITIALIZER;
static int n_devices;
/* Read without the lock on every sop_malloc_async; written under sop__dev_lock. */
_Atomic(struct sop_pool *) *sop__default_pools;
_Atomic(struct sop_pool *) *sop__current_pools;
_Atomic(struct sop_pool *) sop__host_default_pools[SOP_HOST_SLOTS];
_Atomic(struct sop_pool *) sop__host_current_pools[SOP_HOST_SLOTS];

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_status;

static void
init_run(void)
{
	int n = 0;

	sop__epoch_init();
	init_status = sop__driver_init();
	if (init_status != CUDA_SUCCESS)
		return;
	init_status = SOP_DRV(cuDeviceGetCount)(&n);
	if (init_status == CUDA_SUCCESS && n <= 0)
		init_status = CUDA_ERROR_NO_DEVICE;
	if (init_status != CUDA_SUCCESS)
		return;
	init_status = sop__limits_init(n);
	if (init_status != CUDA_SUCCESS)
		return;
	sop__default_pools = calloc((size_t)n, sizeof *sop__default_pools);
	sop__current_pools = calloc((size_t)n, sizeof *sop__current_pools);
	if (!sop__default_pools || !sop__current_pools) {
		free(sop__default_pools);
		free(sop__current_pools);
		init_status = CUDA_ERROR_OUT_OF_MEMORY;
		return;
	}
	n_devices = n;
}

CUresult
sop__init(void)
{
	/* After the first call, one load: no call into libc on every allocation. */
	static atomic_bool done;

	if (SOP_LIKELY(atomic_load_explicit(&done, memory_order_acquire)))
		return init_status;
	pthread_once(&init_once, init_run);
	atomic_store_explicit(&done, true, memory_order_release);
	return init_status;
}

int
sop__device_count(void)
{
	return n_devices;
}

/* ---- Handles ------------------------------------------------------------------------------ */

#define HANDLE_SLOTS (1u << SOP_HANDLE_INDEX_BITS)
#define HANDLE_CHUNK (1u << SOP_HANDLE_CHUNK_LOG2)
/* A slot whose generation reaches this is retired for good: a handle is never given out twice. */
#define HANDLE_GEN_MAX (UINT64_MAX >> SOP_HANDLE_INDEX_BITS)
#define HANDLE_NONE UINT32_MAX

_Atomic(struct sop__handle_slot *) sop__handles[HANDLE_SLOTS / HANDLE_CHUNK];
static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t handle_free = HANDLE_NONE; /* free slots, linked through next_free */
static uint32_t handles_made;              /* slots [0, handles_made) exist */
static size_t handles_used;

static struct sop__handle_slot *
handle_slot(uint32_t i)
{
	return &atomic_load_explicit(&sop__handles[i / HANDLE_CHUNK],
				     memory_order_relaxed)[i % HANDLE_CHUNK];
}

bool
sop__handle_take(struct sop_pool *pool)
{
	struct sop__handle_slot *s;
	uint32_t i;

	sop__mutex_take(&handle_lock, SOP_RANK_HANDLE);
	if (handle_free != HANDLE_NONE) {
		i = handle_free;
		s = handle_slot(i);
		handle_free = s->next_free;
	} else {
		/* Chunks are never freed: a handle from any time can be looked up. */
		if (handles_made == HANDLE_SLOTS) {
			sop__mutex_drop(&handle_lock);
			return false;
		}
		i = handles_made;
		if (i % HANDLE_CHUNK == 0) {
			struct sop__handle_slot *chunk = calloc(HANDLE_CHUNK, sizeof *chunk);
			uint32_t k;
			if (!chunk) {
				sop__mutex_drop(&handle_lock);
				return false;
			}
			for (k = 0; k < HANDLE_CHUNK; k++)
				chunk[k].gen = 1; /* so that no handle is 0 */
			atomic_store_explicit(&sop__handles[i / HANDLE_CHUNK], chunk,
					      memory_order_release);
		}
		handles_made++;
		s = handle_slot(i);
	}
	s->next_free = HANDLE_NONE;
	pool->handle = s->gen << SOP_HANDLE_INDEX_BITS | i;
	handles_used++;
	sop__mutex_drop(&handle_lock);
	return true;
}

void
sop__handle_publish(struct sop_pool *pool)
{
	uint32_t i = (uint32_t)(pool->handle & (HANDLE_SLOTS - 1));

	/* Release: a reader that finds the pool there finds it initialised. */
	atomic_store_explicit(&handle_slot(i)->pool, pool, memory_order_release);
}

void
sop__handle_drop(struct sop_pool *pool)
{
	uint32_t i = (uint32_t)(pool->handle & (HANDLE_SLOTS - 1));
	struct sop__handle_slot *s;

	sop__mutex_take(&handle_lock, SOP_RANK_HANDLE);
	s = handle_slot(i);
	atomic_store_explicit(&s->pool, NULL, memory_order_release);
	handles_used--;
	if (++s->gen < HANDLE_GEN_MAX) {
		s->next_free = handle_free;
		handle_free = i;
	}
	sop__mutex_drop(&handle_lock);
}

size_t
sop__handles_used(void)
{
	size_t n;

	sop__mutex_take(&handle_lock, SOP_RANK_HANDLE);
	n = handles_used;
	sop__mutex_drop(&handle_lock);
	return n;
}

/* ---- Address table ------------------------------------------------------------------------ */

static reg_slot *
reg_slot_of(CUdeviceptr addr, bool create)
{
	uint64_t g = (uint64_t)addr >> SOP_VA_GRANULE_LOG2;
	uint64_t t = g >> REG_LEAF_LOG2;
	reg_slot *leaf;

	if (t >= (1u << REG_TOP_LOG2))
		return NULL;
	leaf = atomic_load_explicit(&reg_top[t], memory_order_acquire);
	if (!leaf) {
		if (!create)
			return NULL;
		leaf = calloc(REG_LEAF, sizeof *leaf);
		if (!leaf)
			return NULL;
		atomic_store_explicit(&reg_top[t], leaf, memory_order_release);
	}
	return &leaf[g & (REG_LEAF - 1)];
}

/* Fails (false) only for an address beyond the table or for lack of host memory. */
bool
sop__registry_add(struct sop_pool *pool)
{
	CUdeviceptr a, end = pool->va_base + pool->va_size;
	bool ok = true;

	sop__mutex_take(&reg_lock, SOP_RANK_REG);
	for (a = pool->va_base; a < end; a += (CUdeviceptr)1 << SOP_VA_GRANULE_LOG2) {
		if (!reg_slot_of(a, true)) {
			ok = false;
			break;
		}
	}
	if (ok) {
		for (a = pool->va_base; a < end; a += (CUdeviceptr)1 << SOP_VA_GRANULE_LOG2)
			atomic_store_explicit(reg_slot_of(a, false), pool, memory_order_release);
		pool->next = live_pools;
		live_pools = pool;
	}
	sop__mutex_drop(&reg_lock);
	return ok;
}

void
sop__registry_remove(struct sop_pool *pool)
{
	CUdeviceptr a, end = pool->va_base + pool->va_size;
	struct sop_pool **pp;

	sop__mutex_take(&reg_lock, SOP_RANK_REG);
	/* Only the entries that still name it: its addresses were given back to the driver
	 * before it left the table, and a pool made meanwhile on another thread may have them. */
	for (a = pool->va_base; a < end; a += (CUdeviceptr)1 << SOP_VA_GRANULE_LOG2) {
		reg_slot *slot = reg_slot_of(a, false);
		if (atomic_load_explicit(slot, memory_order_relaxed) == pool)
			atomic_store_explicit(slot, NULL, memory_order_release);
	}
	for (pp = &live_pools; *pp; pp = &(*pp)->next) {
		if (*pp == pool) {
			*pp = pool->next;
			break;
		}
	}
	pool->next = NULL;
	sop__mutex_drop(&reg_lock);
}

struct sop_pool *
sop__registry_lookup(CUdeviceptr addr)
{
	reg_slot *slot = reg_slot_of(addr, false);

	return slot ? atomic_load_explicit(slot, memory_order_acquire) : NULL;
}

struct sop_pool **
sop__registry_snapshot(size_t *n)
{
	struct sop_pool **v = NULL, *p;
	size_t k = 0, cnt = 0;

	sop__mutex_take(&reg_lock, SOP_RANK_REG);
	for (p = live_pools; p; p = p->next)
		cnt++;
	if (cnt)
		v = malloc(cnt * sizeof *v);
	if (v)
		for (p = live_pools; p; p = p->next)
			v[k++] = p;
	sop__mutex_drop(&reg_lock);
	*n = k;
	return v;
}

/* ---- Default and current pools ------------------------------------------------------------ */

bool
sop__forget_current(struct sop_pool *pool)
{
	int slot;

	sop__mutex_take(&sop__dev_lock, SOP_RANK_DEV);
	if (atomic_load(&pool->destroyed)) {
		sop__mutex_drop(&sop__dev_lock);
		return false;
	}
	if (pool->host) {
		slot = sop__host_slot(&pool->props.location);
		if (slot >= 0 && atomic_load(&sop__host_current_pools[slot]) == pool)
			atomic_store(&sop__host_current_pools[slot], NULL);
	} else if (pool->device >= 0 && pool->device < n_devices &&
		   atomic_load(&sop__current_pools[pool->device]) == pool) {
		atomic_store(&sop__current_pools[pool->device], NULL);
	}
	/* After the table, with release: a sop_malloc_async that finds the pool destroyed and
	 * reads the table again finds the default. */
	atomic_store_explicit(&pool->destroyed, true, memory_order_release);
	sop__mutex_drop(&sop__dev_lock);
	return true;
}
