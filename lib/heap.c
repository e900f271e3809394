/* heap.c - blocks, segments and the pool-wide heap.
 *
 * A pool reserves one large range of virtual addresses and maps physical memory into it in
 * segments: one cuMemCreate handle each, mapped and released whole. Blocks tile each segment and
 * never cross a segment's end, so a segment is wholly free exactly when its first block is FREE
 * and as large as the segment. FREE blocks sit in the pool heap (bins.c) and are merged with
 * FREE neighbours as they arrive; CACHED blocks belong to a stream (stream.c) and are merged
 * only when they come back to the heap.
 *
 * The block map answers "which block starts at this address" without a lock: a three-level
 * radix table over the reservation in 512-byte units, written under the pool lock with atomic
 * stores, read by frees on any thread.
 *
 * Everything here runs with the pool lock held.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- Descriptors ------------------------------------------------------------------------ */

#define SLAB_BLOCKS 256

static bool
slab_add(struct sop_pool *pool)
{
	struct sop__block *slab;
	size_t i;

	if (pool->n_slabs == pool->cap_slabs) {
		size_t cap = pool->cap_slabs ? pool->cap_slabs * 2 : 8;
		void **slabs = realloc(pool->slabs, cap * sizeof *slabs);
		if (!slabs)
			return false;
		pool->slabs = slabs;
		pool->cap_slabs = cap;
	}
	slab = aligned_alloc(_Alignof(struct sop__block), SLAB_BLOCKS * sizeof *slab);
	if (!slab)
		return false;
	memset(slab, 0, SLAB_BLOCKS * sizeof *slab);
	pool->slabs[pool->n_slabs++] = slab;
	for (i = 0; i < SLAB_BLOCKS; i++) {
		slab[i].free_next = pool->spare;
		pool->spare = &slab[i];
	}
	return true;
}

/* Descriptors are never returned to libc while the pool lives: a free racing with a merge may
 * still read one, and its tag then tells it the block is gone. */
struct sop__block *
sop__block_new(struct sop_pool *pool)
{
	struct sop__block *b;

	if (!pool->spare)
		pool->spare = atomic_exchange_explicit(&pool->returned, NULL, memory_order_acquire);
	if (!pool->spare && !slab_add(pool))
		return NULL;
	b = pool->spare;
	pool->spare = b->free_next;
	b->free_next = b->free_prev = NULL;
	sop__link_set(&b->phys_prev, NULL);
	b->phys_next = NULL;
	sop__block_set_owner(b, NULL);
	b->seg = NULL;
	b->req = 0;
	b->seq = 0;
	return b;
}

void
sop__block_delete(struct sop_pool *pool, struct sop__block *b)
{
	atomic_store_explicit(&b->tag, sop__tag(0, SOP_BLOCK_DEAD), memory_order_release);
	b->free_next = pool->spare;
	pool->spare = b;
}

/* ---- The block map ---------------------------------------------------------------------- */

#define MAP_LEAF_LOG2 10
#define MAP_MID_LOG2 10
#define MAP_TOP_LOG2 12
#define MAP_LEAF (1u << MAP_LEAF_LOG2)
#define MAP_MID (1u << MAP_MID_LOG2)

typedef _Atomic(struct sop__block *) map_slot;

struct sop__block *
sop__map_get(struct sop_pool *pool, CUdeviceptr addr)
{
	uint64_t key;
	struct sop__block **mid;
	map_slot *leaf;

	if (addr < pool->va_base || addr - pool->va_base >= pool->va_size ||
	    (addr & (SOP_ALIGN - 1)))
		return NULL;
	key = (addr - pool->va_base) >> SOP_ALIGN_LOG2;
	mid = atomic_load_explicit(&pool->map_top[key >> (MAP_LEAF_LOG2 + MAP_MID_LOG2)],
				   memory_order_acquire);
	if (!mid)
		return NULL;
	leaf = atomic_load_explicit(
		(_Atomic(map_slot *) *)&mid[(key >> MAP_LEAF_LOG2) & (MAP_MID - 1)],
		memory_order_acquire);
	if (!leaf)
		return NULL;
	return atomic_load_explicit(&leaf[key & (MAP_LEAF - 1)], memory_order_acquire);
}

/* Setting NULL never allocates; setting a block may fail only for lack of host memory, which
 * callers avoid by calling map_reserve first. Tables are added with compare-and-swap: two
 * streams carving in one range may race to add the same one. */
static bool
map_slot_get(struct sop_pool *pool, CUdeviceptr addr, map_slot **slot, bool create)
{
	uint64_t key = (addr - pool->va_base) >> SOP_ALIGN_LOG2;
	size_t top = key >> (MAP_LEAF_LOG2 + MAP_MID_LOG2);
	size_t m = (key >> MAP_LEAF_LOG2) & (MAP_MID - 1);
	struct sop__block **mid = atomic_load_explicit(&pool->map_top[top], memory_order_acquire);
	_Atomic(map_slot *) *mslot;
	map_slot *leaf;

	if (!mid) {
		struct sop__block **fresh;
		if (!create)
			return false;
		fresh = calloc(MAP_MID, sizeof(void *));
		if (!fresh)
			return false;
		if (atomic_compare_exchange_strong_explicit(&pool->map_top[top], &mid, fresh,
							    memory_order_acq_rel,
							    memory_order_acquire))
			mid = fresh;
		else
			free(fresh); /* mid is the winner's */
	}
	mslot = (_Atomic(map_slot *) *)&mid[m];
	leaf = atomic_load_explicit(mslot, memory_order_acquire);
	if (!leaf) {
		map_slot *fresh;
		if (!create)
			return false;
		fresh = calloc(MAP_LEAF, sizeof *fresh);
		if (!fresh)
			return false;
		if (atomic_compare_exchange_strong_explicit(mslot, &leaf, fresh, memory_order_acq_rel,
							    memory_order_acquire))
			leaf = fresh;
		else
			free(fresh);
	}
	*slot = &leaf[key & (MAP_LEAF - 1)];
	return true;
}

static bool
map_reserve(struct sop_pool *pool, CUdeviceptr addr)
{
	map_slot *slot;

	return map_slot_get(pool, addr, &slot, true);
}

void
sop__map_set(struct sop_pool *pool, CUdeviceptr addr, struct sop__block *b)
{
	map_slot *slot;

	if (map_slot_get(pool, addr, &slot, b != NULL))
		atomic_store_explicit(slot, b, memory_order_release);
}

void
sop__map_destroy(struct sop_pool *pool)
{
	size_t t, m;

	if (!pool->map_top)
		return;
	for (t = 0; t < (1u << MAP_TOP_LOG2); t++) {
		struct sop__block **mid = atomic_load(&pool->map_top[t]);
		if (!mid)
			continue;
		for (m = 0; m < MAP_MID; m++)
			free(mid[m]);
		free(mid);
	}
	free(pool->map_top);
	pool->map_top = NULL;
}

/* ---- Split and merge -------------------------------------------------------------------- */

/* Link rest, a fresh descriptor, as the part of b beyond size bytes, in b's state. Segment lock
 * held. */
static void
block_split(struct sop_pool *pool, struct sop__block *b, struct sop__block *rest, size_t size,
	    enum sop__state state)
{
	rest->addr = b->addr + size;
	rest->size = b->size - size;
	rest->seg = b->seg;
	rest->seq = b->seq;
	rest->phys_prev = b;
	rest->phys_next = b->phys_next;
	if (b->phys_next)
		sop__link_set(&b->phys_next->phys_prev, rest);
	b->phys_next = rest;
	b->size = size;
	atomic_store_explicit(&rest->tag, sop__tag(rest->addr, state), memory_order_release);
	sop__map_set(pool, rest->addr, rest);
}

void
sop__block_carve(struct sop_pool *pool, struct sop__block *b, size_t size,
		 struct sop__sstream *from)
{
	struct sop__block *rest;
	enum sop__state state = sop__block_state(b);

	if (b->size - size < SOP_ALIGN)
		return;
	/* A descriptor and a map slot are needed; without host memory the block is handed out
	 * whole, which wastes device memory but stays correct. */
	if (!map_reserve(pool, b->addr + size))
		return;
	rest = sop__block_new(pool);
	if (!rest)
		return;
	sop__lock_take(&b->seg->lock);
	block_split(pool, b, rest, size, state);
	sop__lock_drop(&b->seg->lock);
	if (state == SOP_BLOCK_CACHED) {
		sop__lock_take(&from->lock);
		sop__block_set_owner(rest, from);
		sop__bins_insert(&from->cache, rest);
		sop__lock_drop(&from->lock);
	} else {
		sop__bins_insert(&pool->heap, rest);
	}
}

bool
sop__block_carve_own(struct sop_pool *pool, struct sop__sstream *ss, struct sop__block *b,
		     size_t size)
{
	struct sop__block *rest = ss->spare;

	if (b->size - size < SOP_ALIGN) {
		sop__bins_remove(&ss->cache, b);
		return true;
	}
	if (!rest || !map_reserve(pool, b->addr + size))
		return false;
	sop__bins_remove(&ss->cache, b);
	ss->spare = rest->free_next;
	ss->n_spare--;
	rest->free_next = NULL;
	sop__lock_take(&b->seg->lock);
	block_split(pool, b, rest, size, SOP_BLOCK_CACHED);
	sop__lock_drop(&b->seg->lock);
	sop__block_set_owner(rest, ss);
	sop__bins_insert(&ss->cache, rest);
	return true;
}

void
sop__block_absorb_next(struct sop_pool *pool, struct sop__block *b, struct sop__block **spare)
{
	struct sop__block *n = b->phys_next;

	b->size += n->size;
	b->phys_next = n->phys_next;
	if (n->phys_next)
		sop__link_set(&n->phys_next->phys_prev, b);
	sop__map_set(pool, n->addr, NULL);
	atomic_store_explicit(&n->tag, sop__tag(0, SOP_BLOCK_DEAD), memory_order_release);
	sop__block_set_owner(n, NULL);
	n->free_next = *spare;
	*spare = n;
}

#define SPARES_LOW 8
#define SPARES_HIGH 64

/* Hand the spares of ss above SPARES_LOW back to the pool without its lock: a stream that only
 * frees gains one with every merge and would otherwise keep them all. Pushed as one chain onto
 * a list the pool lock holder takes whole (sop__block_new), so a compare-and-swap suffices.
 * Stream lock held. */
static void
spares_shed(struct sop_pool *pool, struct sop__sstream *ss)
{
	struct sop__block *head = ss->spare, *tail = head, *old;

	while (ss->n_spare > SPARES_LOW + 1) {
		tail = tail->free_next;
		ss->n_spare--;
	}
	ss->spare = tail->free_next;
	ss->n_spare--;
	old = atomic_load_explicit(&pool->returned, memory_order_relaxed);
	do
		tail->free_next = old;
	while (!atomic_compare_exchange_weak_explicit(&pool->returned, &old, head,
						      memory_order_release, memory_order_relaxed));
}

/* Whether b, a neighbour of the block being merged, is worth joining to it: cached on ss too,
 * and of another size. Two equal neighbours stay apart: a stream that frees a run of blocks of
 * one size is likely to ask for that size again, and then reuses them whole (a batch of k
 * allocations and k frees costs no split and no merge) where joined they would be split again
 * one by one. The size is read only once b is known to be ss's: ss's lock keeps it still. */
static inline bool
mergeable(struct sop__block *b, size_t size, struct sop__sstream *ss)
{
	return b && sop__block_state(b) == SOP_BLOCK_CACHED && sop__block_owner(b) == ss &&
	       b->size != size;
}

struct sop__block *
sop__block_merge_own(struct sop_pool *pool, struct sop__sstream *ss, struct sop__block *b)
{
	struct sop__block *p, *n;
	struct sop__segment *seg = b->seg;

	/* A look without the segment lock first, so that a free with nothing to merge (the common
	 * case when streams share a segment) touches no shared line. It is exact: only ss's lock
	 * holder makes a block cached on ss or changes b's next link, and a prev link that another
	 * thread rewrites points at a block not cached on ss before and after. */
	if (!mergeable(sop__link_peek(&b->phys_next), b->size, ss) &&
	    !mergeable(sop__link_peek(&b->phys_prev), b->size, ss))
		return b;
	sop__lock_take(&seg->lock);
	while (mergeable((n = b->phys_next), b->size, ss)) {
		sop__bins_remove(&ss->cache, n);
		if (n->seq > b->seq)
			b->seq = n->seq;
		sop__block_absorb_next(pool, b, &ss->spare);
		ss->n_spare++;
	}
	while (mergeable((p = b->phys_prev), b->size, ss)) {
		sop__bins_remove(&ss->cache, p);
		if (b->seq > p->seq)
			p->seq = b->seq;
		sop__block_absorb_next(pool, p, &ss->spare);
		ss->n_spare++;
		b = p;
	}
	sop__lock_drop(&seg->lock);
	if (ss->n_spare > SPARES_HIGH)
		spares_shed(pool, ss);
	return b;
}

void
sop__spares_balance(struct sop_pool *pool, struct sop__sstream *ss)
{
	while (ss->n_spare < SPARES_LOW) {
		struct sop__block *b = sop__block_new(pool);
		if (!b)
			return;
		atomic_store_explicit(&b->tag, sop__tag(0, SOP_BLOCK_DEAD), memory_order_relaxed);
		b->free_next = ss->spare;
		ss->spare = b;
		ss->n_spare++;
	}
	while (ss->n_spare > SPARES_HIGH) {
		struct sop__block *b = ss->spare;
		ss->spare = b->free_next;
		ss->n_spare--;
		b->free_next = pool->spare;
		pool->spare = b;
	}
}

void
sop__spares_return(struct sop_pool *pool, struct sop__sstream *ss)
{
	while (ss->spare) {
		struct sop__block *b = ss->spare;
		ss->spare = b->free_next;
		b->free_next = pool->spare;
		pool->spare = b;
	}
	ss->n_spare = 0;
}

void
sop__heap_put(struct sop_pool *pool, struct sop__block *b)
{
	struct sop__segment *seg = b->seg;
	struct sop__block *p, *n;

	sop__block_set_owner(b, NULL);
	b->req = 0;
	b->seq = 0;
	sop__lock_take(&seg->lock);
	p = b->phys_prev;
	n = b->phys_next;
	if (n && sop__block_state(n) == SOP_BLOCK_FREE) {
		sop__bins_remove(&pool->heap, n);
		sop__block_absorb_next(pool, b, &pool->spare);
	}
	if (p && sop__block_state(p) == SOP_BLOCK_FREE) {
		sop__bins_remove(&pool->heap, p);
		sop__block_absorb_next(pool, p, &pool->spare);
		b = p;
	}
	atomic_store_explicit(&b->tag, sop__tag(b->addr, SOP_BLOCK_FREE), memory_order_release);
	sop__lock_drop(&seg->lock);
	sop__bins_insert(&pool->heap, b);
}

/* ---- Virtual address extents (growth path only: a short first-fit list) -------------------- */

static bool
va_take(struct sop_pool *pool, size_t size, size_t *off)
{
	struct sop__va_extent **pp, *e;

	for (pp = &pool->va_free; (e = *pp); pp = &e->next) {
		if (e->size < size)
			continue;
		*off = e->off;
		e->off += size;
		e->size -= size;
		if (!e->size) {
			*pp = e->next;
			free(e);
		}
		return true;
	}
	return false;
}

/* Give a range back, merging with its neighbours. Fails only for lack of host memory, in which
 * case the range is lost to future segments (not to correctness). */
static void
va_give(struct sop_pool *pool, size_t off, size_t size)
{
	struct sop__va_extent **pp = &pool->va_free, *e, *prev = NULL;

	while ((e = *pp) && e->off < off) {
		prev = e;
		pp = &e->next;
	}
	if (prev && prev->off + prev->size == off) {
		prev->size += size;
		if (e && off + size == e->off) {
			prev->size += e->size;
			prev->next = e->next;
			free(e);
		}
		return;
	}
	if (e && off + size == e->off) {
		e->off = off;
		e->size += size;
		return;
	}
	e = malloc(sizeof *e);
	if (!e)
		return;
	e->off = off;
	e->size = size;
	e->next = *pp;
	*pp = e;
}

/* ---- Segments --------------------------------------------------------------------------- */

static void
reserved_add(struct sop_pool *pool, size_t size)
{
	uint64_t now = atomic_load(&pool->reserved) + size;

	atomic_store(&pool->reserved, now);
	if (now > atomic_load(&pool->reserved_high))
		atomic_store(&pool->reserved_high, now);
}

static void
segment_link(struct sop_pool *pool, struct sop__segment *seg)
{
	struct sop__segment *s = pool->segments, *prev = NULL;

	while (s && s->va < seg->va) {
		prev = s;
		s = s->next;
	}
	seg->prev = prev;
	seg->next = s;
	if (s)
		s->prev = seg;
	if (prev)
		prev->next = seg;
	else
		pool->segments = seg;
	pool->n_segments++;
}

static void
segment_unlink(struct sop_pool *pool, struct sop__segment *seg)
{
	if (seg->prev)
		seg->prev->next = seg->next;
	else
		pool->segments = seg->next;
	if (seg->next)
		seg->next->prev = seg->prev;
	pool->n_segments--;
}

/* Create, map and open one physical allocation of size bytes at va. */
static CUresult
segment_map(struct sop_pool *pool, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle *h)
{
	CUmemAllocationProp prop = {0};
	CUmemAccessDesc *desc;
	CUresult r;
	size_t i;

	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location = pool->props.location;
	prop.requestedHandleTypes = pool->props.handleTypes;
	desc = calloc(pool->n_access + 1, sizeof *desc);
	if (!desc)
		return CUDA_ERROR_OUT_OF_MEMORY;
	desc[0].location = pool->props.location;
	desc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	for (i = 0; i < pool->n_access; i++)
		desc[i + 1] = pool->access[i];

	r = SOP_DRV(cuMemCreate)(h, size, &prop, 0);
	if (r != CUDA_SUCCESS)
		goto out;
	r = SOP_DRV(cuMemMap)(va, size, 0, *h, 0);
	if (r != CUDA_SUCCESS)
		goto release;
	r = SOP_DRV(cuMemSetAccess)(va, size, desc, pool->n_access + 1);
	if (r != CUDA_SUCCESS)
		goto unmap;
	goto out;
unmap:
	SOP_DRV(cuMemUnmap)(va, size);
release:
	SOP_DRV(cuMemRelease)(*h);
out:
	free(desc);
	return r;
}

/* The size of the segment to add for a request of size bytes. */
static size_t
segment_size(struct sop_pool *pool, size_t size)
{
	size_t need = sop__round_up(size, pool->granularity);
	size_t want = need > SOP_SEGMENT_MIN ? need : sop__round_up(SOP_SEGMENT_MIN, pool->granularity);
	uint64_t reserved = atomic_load(&pool->reserved);

	/* Near the cap, map only what the request needs. */
	if (pool->max_size && reserved + want > pool->max_size)
		want = need;
	return want;
}

CUresult
sop__heap_grow(struct sop_pool *pool, size_t size)
{
	size_t need = sop__round_up(size, pool->granularity);
	size_t seg_size = segment_size(pool, size);
	uint64_t reserved = atomic_load(&pool->reserved);
	struct sop__segment *seg = NULL;
	struct sop__block *b = NULL;
	size_t off;
	CUresult r;

	if (need < size || (pool->max_size && reserved + need > pool->max_size))
		return CUDA_ERROR_OUT_OF_MEMORY;
	seg = calloc(1, sizeof *seg);
	b = sop__block_new(pool);
	if (!seg || !b) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail;
	}
	if (!va_take(pool, seg_size, &off)) {
		seg_size = need;
		if (!va_take(pool, seg_size, &off)) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
			goto fail;
		}
	}
	if (!map_reserve(pool, pool->va_base + off)) {
		va_give(pool, off, seg_size);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail;
	}
	r = sop__pool_ctx_push(pool);
	if (r != CUDA_SUCCESS) {
		va_give(pool, off, seg_size);
		goto fail;
	}
	r = segment_map(pool, pool->va_base + off, seg_size, &seg->handle);
	if (r == CUDA_ERROR_OUT_OF_MEMORY && seg_size > need) {
		/* The device cannot back a full segment; it may still back the request. */
		va_give(pool, off + need, seg_size - need);
		seg_size = need;
		r = segment_map(pool, pool->va_base + off, seg_size, &seg->handle);
	}
	sop__pool_ctx_pop(pool);
	if (r != CUDA_SUCCESS) {
		va_give(pool, off, seg_size);
		goto fail;
	}

	seg->va = pool->va_base + off;
	seg->size = seg_size;
	seg->first = b;
	segment_link(pool, seg);
	b->addr = seg->va;
	b->size = seg_size;
	b->seg = seg;
	atomic_store_explicit(&b->tag, sop__tag(b->addr, SOP_BLOCK_FREE), memory_order_release);
	sop__map_set(pool, b->addr, b);
	sop__bins_insert(&pool->heap, b);
	reserved_add(pool, seg_size);
	return CUDA_SUCCESS;
fail:
	if (b)
		sop__block_delete(pool, b);
	free(seg);
	return r;
}

static bool
segment_idle(const struct sop__segment *seg)
{
	return sop__block_state(seg->first) == SOP_BLOCK_FREE && seg->first->size == seg->size;
}

static CUresult
segment_release(struct sop_pool *pool, struct sop__segment *seg)
{
	CUresult r;

	r = sop__pool_ctx_push(pool);
	if (r != CUDA_SUCCESS)
		return r;
	r = SOP_DRV(cuMemUnmap)(seg->va, seg->size);
	if (r != CUDA_SUCCESS) {
		/* Still mapped: the segment stays in the heap, whole and usable. */
		sop__pool_ctx_pop(pool);
		return r;
	}
	/* Unmapped: the range leaves the pool whatever the release says. */
	r = SOP_DRV(cuMemRelease)(seg->handle);
	sop__pool_ctx_pop(pool);
	if (r != CUDA_SUCCESS) {
		CUmemGenericAllocationHandle *o =
			realloc(pool->orphans, (pool->n_orphans + 1) * sizeof *o);
		if (o) {
			o[pool->n_orphans++] = seg->handle;
			pool->orphans = o;
		}
	}
	sop__bins_remove(&pool->heap, seg->first);
	sop__map_set(pool, seg->first->addr, NULL);
	sop__block_delete(pool, seg->first);
	segment_unlink(pool, seg);
	va_give(pool, seg->va - pool->va_base, seg->size);
	atomic_store(&pool->reserved, atomic_load(&pool->reserved) - seg->size);
	free(seg);
	return r;
}

/* Retry the releases that failed before. */
static CUresult
orphans_release(struct sop_pool *pool)
{
	CUresult r = CUDA_SUCCESS;

	if (!pool->n_orphans)
		return CUDA_SUCCESS;
	r = sop__pool_ctx_push(pool);
	if (r != CUDA_SUCCESS)
		return r;
	while (pool->n_orphans) {
		r = SOP_DRV(cuMemRelease)(pool->orphans[pool->n_orphans - 1]);
		if (r != CUDA_SUCCESS)
			break;
		pool->n_orphans--;
	}
	sop__pool_ctx_pop(pool);
	return r;
}

CUresult
sop__heap_release(struct sop_pool *pool, size_t target, size_t floor)
{
	CUresult r = orphans_release(pool);

	if (r != CUDA_SUCCESS)
		return r;
	for (;;) {
		uint64_t reserved = atomic_load(&pool->reserved);
		struct sop__segment *seg, *best = NULL;

		if (reserved <= target)
			break;
		for (seg = pool->segments; seg; seg = seg->next) {
			if (!segment_idle(seg) || reserved - seg->size < floor)
				continue;
			if (!best || seg->size > best->size)
				best = seg;
		}
		if (!best)
			break;
		r = segment_release(pool, best);
		if (r != CUDA_SUCCESS)
			return r;
	}
	return CUDA_SUCCESS;
}

/* Free the host side of a pool whose memory has gone back to the driver. */
void
sop__heap_recycle(struct sop_pool *pool, size_t need)
{
	struct sop__segment *seg;
	size_t idle = 0, freed = 0;

	for (seg = pool->segments; seg; seg = seg->next)
		if (segment_idle(seg))
			idle += seg->size;
	if (idle < need)
		return;
	while (freed < need) {
		struct sop__segment *best = NULL;
		for (seg = pool->segments; seg; seg = seg->next)
			if (segment_idle(seg) && (!best || seg->size > best->size))
				best = seg;
		if (!best)
			return;
		size_t size = best->size; /* segment_release frees it */
		if (segment_release(pool, best) != CUDA_SUCCESS)
			return;
		freed += size;
	}
}

void
sop__heap_destroy(struct sop_pool *pool)
{
	size_t i;

	free(pool->orphans);
	pool->orphans = NULL;
	pool->n_orphans = 0;
	while (pool->va_free) {
		struct sop__va_extent *e = pool->va_free;
		pool->va_free = e->next;
		free(e);
	}
	sop__map_destroy(pool);
	for (i = 0; i < pool->n_slabs; i++)
		free(pool->slabs[i]);
	free(pool->slabs);
	pool->slabs = NULL;
	pool->n_slabs = pool->cap_slabs = 0;
	pool->spare = NULL;
	atomic_store(&pool->returned, NULL);
	memset(&pool->heap, 0, sizeof pool->heap);
}
