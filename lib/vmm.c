/* vmm.c - physical memory through the driver's virtual memory calls: a piece created, mapped
 * and opened to the pool's devices in one call, handles whose release failed kept to be
 * released again, the anchor that keeps the driver's page tables of an empty pool, and the
 * reservations of pools torn down, kept with their anchors for the next pools.
 *
 * A host pool's pieces are host memory (cuMemCreate at the pool's HOST or HOST_NUMA location),
 * mapped in its reservation like a device pool's and opened to the host CPU, the owner, with a
 * descriptor of the pool's location type, and to the devices granted access. They count against
 * no device's memory limit.
 *
 * These functions make and give back driver objects; which range a piece takes, and what
 * blocks cover it, is segment.c's and grow.c's. (A release's unmap and release of a piece, in
 * the middle of reshaping the blocks over it, is release.c's.)
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

CUmemAccessDesc *
sop__access_list(const struct sop_pool *pool, size_t *n)
{
	CUmemAccessDesc *desc = calloc(pool->n_access + 1, sizeof *desc);
	size_t i;

	if (!desc)
		return NULL;
	desc[0].location = pool->props.location;
	desc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	for (i = 0; i < pool->n_access; i++)
		desc[i + 1] = pool->access[i];
	*n = pool->n_access + 1;
	return desc;
}

/* Map a physical allocation at va and open it as desc says; on a failure nothing stays mapped,
 * unless the driver refused the unmap as well: then *stuck (if given) is set. Context current. */
static CUresult
piece_open_as(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h,
	      const CUmemAccessDesc *desc, size_t n, bool *stuck)
{
	CUresult r = SOP_DRV(cuMemMap)(va, size, 0, h, 0);

	if (r == CUDA_SUCCESS) {
		r = SOP_DRV(cuMemSetAccess)(va, size, desc, n);
		if (r != CUDA_SUCCESS && SOP_DRV(cuMemUnmap)(va, size) != CUDA_SUCCESS && stuck)
			*stuck = true;
	}
	return r;
}

CUresult
sop__piece_open(struct sop_pool *pool, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h,
		bool *stuck)
{
	size_t n;
	CUmemAccessDesc *desc = sop__access_list(pool, &n);
	CUresult r;

	if (!desc)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = piece_open_as(va, size, h, desc, n, stuck);
	free(desc);
	return r;
}

/* Create, map and open one physical allocation of size bytes at va. Reads nothing that the
 * pool lock guards: growth calls it with the lock dropped. */
CUresult
sop__piece_map(struct sop_pool *pool, CUdeviceptr va, size_t size, const CUmemAccessDesc *desc,
	       size_t n, CUmemGenericAllocationHandle *h, enum sop__left *left)
{
	CUmemAllocationProp prop = {0};
	bool stuck = false;
	CUresult r;

	*left = SOP_LEFT_NONE;
	/* Counted against the device's limit before the driver is asked, so that growths of
	 * several pools at once never pass it together (limit.c). */
	if (!pool->host && !sop__limit_charge(pool->device, size))
		return CUDA_ERROR_OUT_OF_MEMORY;
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location = pool->props.location;
	prop.requestedHandleTypes = pool->props.handleTypes;
	r = SOP_DRV(cuMemCreate)(h, size, &prop, 0);
	if (r == CUDA_SUCCESS) {
		r = piece_open_as(va, size, *h, desc, n, &stuck);
		/* Still mapped, the piece keeps its handle and its charge for the caller, who owes
		 * the unmap. */
		if (stuck) {
			*left = SOP_LEFT_MAPPED;
			return r;
		}
		if (r != CUDA_SUCCESS && SOP_DRV(cuMemRelease)(*h) != CUDA_SUCCESS)
			*left = SOP_LEFT_HANDLE;
	}
	if (r != CUDA_SUCCESS && !pool->host)
		sop__limit_discharge(pool->device, size);
	return r;
}

CUresult
sop__piece_remap(struct sop_pool *pool, const struct sop__piece *pc, const CUmemAccessDesc *desc,
		 size_t n, enum sop__left *left)
{
	bool stuck = false;
	CUresult r = piece_open_as(pc->va, pc->size, pc->handle, desc, n, &stuck);

	*left = SOP_LEFT_NONE;
	if (r == CUDA_SUCCESS)
		return r;
	if (stuck)
		*left = SOP_LEFT_MAPPED;
	else if (sop__piece_let_go(pool, pc) != CUDA_SUCCESS)
		*left = SOP_LEFT_HANDLE;
	return r;
}

CUresult
sop__piece_let_go(struct sop_pool *pool, const struct sop__piece *pc)
{
	CUresult r = SOP_DRV(cuMemRelease)(pc->handle);

	if (!pool->host)
		sop__limit_discharge(pool->device, pc->size);
	return r;
}

bool
sop__piece_unmake(struct sop_pool *pool, const struct sop__piece *pc, bool *orphaned)
{
	if (SOP_DRV(cuMemUnmap)(pc->va, pc->size) != CUDA_SUCCESS)
		return false;
	*orphaned = sop__piece_let_go(pool, pc) != CUDA_SUCCESS;
	return true;
}

/* Create one physical allocation of size bytes with prop and release it at once: whether the
 * driver makes memory there, in its own words. A release the driver refuses leaves the handle
 * to the pool's orphans. Context current. */
CUresult
sop__piece_probe(struct sop_pool *pool, const CUmemAllocationProp *prop, size_t size)
{
	CUmemGenericAllocationHandle h;
	CUresult r = SOP_DRV(cuMemCreate)(&h, size, prop, 0);

	if (r == CUDA_SUCCESS && SOP_DRV(cuMemRelease)(h) != CUDA_SUCCESS)
		sop__orphan_keep(pool, h);
	return r;
}

/* Keep a handle whose range is unmapped but whose cuMemRelease failed, for sop__orphans_release to
 * retry. Without host memory to note it in, it is lost (to the process, not to correctness). */
void
sop__orphan_keep(struct sop_pool *pool, CUmemGenericAllocationHandle h)
{
	CUmemGenericAllocationHandle *o =
		realloc(pool->orphans, (pool->n_orphans + 1) * sizeof *o);

	if (o) {
		o[pool->n_orphans++] = h;
		pool->orphans = o;
	}
}

/* Retry the releases that failed before. Context current. */
CUresult
sop__orphans_release(struct sop_pool *pool)
{
	CUresult r = CUDA_SUCCESS;

	while (pool->n_orphans) {
		r = SOP_DRV(cuMemRelease)(pool->orphans[pool->n_orphans - 1]);
		if (r != CUDA_SUCCESS)
			break;
		pool->n_orphans--;
	}
	return r;
}

/* A pool that empties and grows again, as one with release threshold 0 does at every
 * synchronization, pays the driver for page tables each time: with nothing mapped in the
 * 512 MiB around an address, the driver frees the tables that covered it at the unmap and
 * makes them again at the next map, and a 32 MiB map, use and release costs a third more on the
 * H100 (65-72 us against 92-111). So before its first release that leaves the pool with no
 * memory, it maps a granule of host memory, read-only and never handed out, at the start of its
 * reservation, where growth puts the first segment: the tables there stay. Host memory, so that
 * the device loses nothing; without it (a driver that cannot map host memory), no anchor.
 * Context current, pool lock held. */
void
sop__anchor_make(struct sop_pool *pool)
{
	CUmemAllocationProp prop = {0};
	CUmemAccessDesc desc = {0};
	CUmemGenericAllocationHandle h;
	size_t gran = 0;

	SOP_HELD(&pool->lock);
	pool->anchor_tried = true;
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
	if (SOP_DRV(cuMemGetAllocationGranularity)(&gran, &prop,
						   CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
	    !gran || pool->granularity % gran)
		return;
	if (SOP_DRV(cuMemCreate)(&h, pool->granularity, &prop, 0) != CUDA_SUCCESS)
		return;
	if (SOP_DRV(cuMemMap)(pool->va_base, pool->granularity, 0, h, 0) != CUDA_SUCCESS) {
		if (SOP_DRV(cuMemRelease)(h) != CUDA_SUCCESS)
			sop__orphan_keep(pool, h);
		return;
	}
	/* Read access for the owner: a host pool's is the CPU, with the descriptor for HOST
	 * memory (a HOST_NUMA one is refused for it). */
	desc.location = pool->props.location;
	if (pool->host)
		desc.location.type = CU_MEM_LOCATION_TYPE_HOST;
	desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
	if (SOP_DRV(cuMemSetAccess)(pool->va_base, pool->granularity, &desc, 1) != CUDA_SUCCESS &&
	    SOP_DRV(cuMemUnmap)(pool->va_base, pool->granularity) == CUDA_SUCCESS) {
		if (SOP_DRV(cuMemRelease)(h) != CUDA_SUCCESS)
			sop__orphan_keep(pool, h);
		return;
	}
	/* Opened, or left mapped with no access at all because the driver refused the unmap: as
	 * good an anchor (a stray access faults either way), and teardown unmaps it. Given back,
	 * the range would be where growth maps the first segment, and every growth there would
	 * fail. */
	pool->anchor = h;
	pool->anchored = true;
}

/* Unmap the anchor h at va, then release it: the unmap's refusal, with the anchor still
 * mapped (*anchored stays true); else the release's result, *anchored false. A pool keeps a
 * refused release as an orphan; the kept ranges' hook returns it. */
static CUresult
anchor_unmake(CUdeviceptr va, size_t granularity, CUmemGenericAllocationHandle h, bool *anchored)
{
	CUresult r = SOP_DRV(cuMemUnmap)(va, granularity);

	if (r != CUDA_SUCCESS)
		return r;
	*anchored = false;
	return SOP_DRV(cuMemRelease)(h);
}

CUresult
sop__heap_anchor_drop(struct sop_pool *pool)
{
	CUresult r;

	if (!pool->anchored)
		return CUDA_SUCCESS;
	r = anchor_unmake(pool->va_base, pool->granularity, pool->anchor, &pool->anchored);
	if (r != CUDA_SUCCESS && !pool->anchored)
		sop__orphan_keep(pool, pool->anchor);
	return r;
}

/* ---- Reservations kept for the next pool ------------------------------------------------- */

/* A pool torn down leaves its reservation, with its anchor if it had one, to the next pool of
 * the same location and size, rather than give it back: a server that makes a pool per job
 * would otherwise pay the driver for the reservation at each pool's creation and destroy (2
 * and 5 us for four times an H200's memory), and, where the pool had emptied before, for the
 * page tables as well: on an H200, a 32 MiB first piece and its unmap took 49.3 and 38.3 us in
 * a reservation kept bare, 32.9 and 30.1 beside a kept anchor, against 48.5 and 45.8 in a new
 * reservation each time (bench/results/2026-11-28-h200-kept-reservation/). Both outlive the
 * contexts they were made in: the range and the anchor's mapping stay usable after the
 * primary context is released to nothing or reset (ctx.txt there). A reservation taken again
 * gets an anchor at its next teardown if it has none (pool.c, sop__pool_reap): pools come and
 * go there, and a program that makes one pool pays for no anchor. A few are kept: each holds
 * addresses only, and an anchor a granule of pinned host memory. */
#define VA_KEPT 4

struct va_kept {
	CUmemLocation loc;
	size_t size, granularity;
	CUdeviceptr va;
	CUmemGenericAllocationHandle anchor;
	bool anchored;
};

static struct {
	pthread_mutex_t lock;
	struct va_kept slot[VA_KEPT];
	int n, claimed; /* slots filled, and promised to pools being torn down */
	int max;	/* at most this many (tests set fewer) */
} kept = {.lock = PTHREAD_MUTEX_INITIALIZER, .max = VA_KEPT};

static bool
kept_fits(const struct va_kept *k, const struct sop_pool *pool)
{
	return k->loc.type == pool->props.location.type && k->loc.id == pool->props.location.id &&
	       k->size == pool->va_size && k->granularity == pool->granularity;
}

CUresult
sop__va_reserve(struct sop_pool *pool)
{
	int i;

	sop__mutex_take(&kept.lock, SOP_RANK_KEPT);
	for (i = kept.n - 1; i >= 0 && !kept_fits(&kept.slot[i], pool); i--)
		;
	if (i >= 0) {
		pool->va_base = kept.slot[i].va;
		pool->anchor = kept.slot[i].anchor;
		pool->anchored = pool->anchor_tried = kept.slot[i].anchored;
		pool->va_reused = true;
		kept.slot[i] = kept.slot[--kept.n];
	}
	sop__mutex_drop(&kept.lock);
	if (i >= 0)
		return CUDA_SUCCESS;
	return SOP_DRV(cuMemAddressReserve)(&pool->va_base, pool->va_size,
					    (size_t)1 << SOP_VA_GRANULE_LOG2, 0, 0);
}

bool
sop__va_claim(void)
{
	bool room;

	sop__mutex_take(&kept.lock, SOP_RANK_KEPT);
	room = kept.n + kept.claimed < kept.max;
	kept.claimed += room;
	sop__mutex_drop(&kept.lock);
	return room;
}

void
sop__va_unclaim(void)
{
	sop__mutex_take(&kept.lock, SOP_RANK_KEPT);
	kept.claimed--;
	sop__mutex_drop(&kept.lock);
}

void
sop__va_keep(struct sop_pool *pool)
{
	struct va_kept *k;

	sop__mutex_take(&kept.lock, SOP_RANK_KEPT);
	kept.claimed--;
	k = &kept.slot[kept.n++];
	k->loc = pool->props.location;
	k->size = pool->va_size;
	k->granularity = pool->granularity;
	k->va = pool->va_base;
	k->anchor = pool->anchor;
	k->anchored = pool->anchored;
	sop__mutex_drop(&kept.lock);
	pool->anchored = false;
}

CUresult
sop__va_give_back(struct sop_pool *pool)
{
	CUresult r = sop__heap_anchor_drop(pool);

	if (r == CUDA_SUCCESS)
		r = SOP_DRV(cuMemAddressFree)(pool->va_base, pool->va_size);
	return r;
}

void
sop__va_kept(long *reservations, long *anchors, size_t *anchor_bytes)
{
	int i;

	*reservations = *anchors = 0;
	*anchor_bytes = 0;
	sop__mutex_take(&kept.lock, SOP_RANK_KEPT);
	for (i = 0; i < kept.n; i++) {
		++*reservations;
		*anchors += kept.slot[i].anchored;
		*anchor_bytes += kept.slot[i].anchored ? kept.slot[i].granularity : 0;
	}
	sop__mutex_drop(&kept.lock);
}

int
sop__va_kept_max(int n)
{
	int old;

	sop__mutex_take(&kept.lock, SOP_RANK_KEPT);
	old = kept.max;
	kept.max = n < 0 ? 0 : n > VA_KEPT ? VA_KEPT : n;
	sop__mutex_drop(&kept.lock);
	return old;
}

CUresult
sop__va_kept_free(void)
{
	CUresult r = CUDA_SUCCESS, e = CUDA_SUCCESS;

	sop__mutex_take(&kept.lock, SOP_RANK_KEPT);
	while (kept.n && r == CUDA_SUCCESS) {
		struct va_kept *k = &kept.slot[kept.n - 1];

		if (k->anchored) {
			e = anchor_unmake(k->va, k->granularity, k->anchor, &k->anchored);
			r = k->anchored ? e : CUDA_SUCCESS;
		}
		if (r == CUDA_SUCCESS)
			r = SOP_DRV(cuMemAddressFree)(k->va, k->size);
		if (r == CUDA_SUCCESS)
			kept.n--;
	}
	sop__mutex_drop(&kept.lock);
	return r != CUDA_SUCCESS ? r : e;
}
