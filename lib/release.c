/* release.c - giving physical memory back: pieces that FREE blocks cover whole are idle, and
 * are unmapped and released on their own, leaving a hole, or unmapped and taken out of the pool
 * with their handles for growth to map again elsewhere (grow.c); unmaps the driver refused to a
 * failed growth, retried; and the host side of a pool whose segments have all gone. Pool lock
 * held.
 */
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "internal.h"

/* ---- Release ---------------------------------------------------------------------------- */

/* A piece that one FREE block covers whole. */
struct idle {
	struct sop__piece *pc;
	struct sop__block *f;
};

/* Every idle piece, found from the FREE blocks (few, since they merge), never from walking
 * every block; none inside the blocks spare names. Pool lock held. */
static struct idle *
idle_collect(struct sop_pool *pool, struct sop__block *const spare[2], size_t *count,
	     size_t *bytes)
{
	struct sop__bins *heap = &pool->heap;
	struct idle *v = NULL;
	size_t n = 0, cap = 0;
	uint64_t fls = heap->fl_bitmap;
	unsigned fl0, sl0;

	/* Only blocks of at least a granule can cover a piece: skip the lists below. */
	sop__bins_index(pool->granularity, &fl0, &sl0);
	fls &= ~(((uint64_t)1 << fl0) - 1);
	*bytes = 0;
	while (fls) {
		unsigned fl = (unsigned)__builtin_ctzll(fls);
		uint32_t sls = heap->sl_bitmap[fl];

		fls &= fls - 1;
		while (sls) {
			unsigned sl = (unsigned)__builtin_ctz(sls);
			struct sop__block *f;

			sls &= sls - 1;
			for (f = heap->head[fl][sl]; f; f = f->free_next) {
				struct sop__segment *seg = f->seg;
				CUdeviceptr end = f->addr + f->size;
				size_t i;

				if (spare && (f == spare[0] || f == spare[1]))
					continue;

				/* The pieces that start inside f, while they end inside it. */
				for (i = sop__piece_search(seg, f->addr);
				     i < seg->n_pieces &&
				     seg->pieces[i]->va + seg->pieces[i]->size <= end;
				     i++) {
					struct sop__piece *pc = seg->pieces[i];

					if (pc->exporting) /* share.c, broker_ahead */
						continue;
					if (n == cap) {
						struct idle *w;
						cap = cap ? 2 * cap : 16;
						w = realloc(v, cap * sizeof *v);
						if (!w)
							goto out;
						v = w;
					}
					v[n].pc = pc;
					v[n].f = f;
					n++;
					*bytes += pc->size;
				}
			}
		}
	}
out:
	*count = n;
	return v;
}

static int
idle_by_size(const void *a, const void *b)
{
	const struct idle *x = a, *y = b;

	return x->pc->size < y->pc->size ? 1 : x->pc->size > y->pc->size ? -1 : 0;
}

static int
idle_by_address(const void *a, const void *b)
{
	const struct idle *x = a, *y = b;

	return x->pc->va < y->pc->va ? -1 : x->pc->va > y->pc->va;
}

/* Turn the part of f that pc backs into a HOLE, joined with HOLE neighbours; the rest of f
 * stays FREE. Returns the FREE block after the piece, if any. Pool lock held, pc unmapped. */
static struct sop__block *
piece_unback(struct sop_pool *pool, struct sop__block *f, struct sop__piece *pc,
	     struct sop__block *d[2], struct sop__leaves *lv)
{
	struct sop__segment *seg = f->seg;
	struct sop__block *m = f, *left = NULL, *right = NULL;
	int k = 0;

	sop__bins_remove(&pool->heap, f);
	sop__segment_lock(seg);
	if (pc->va > f->addr) {
		sop__block_split(pool, f, d[k], pc->va - f->addr, SOP_BLOCK_FREE, lv);
		left = f;
		m = d[k++];
	}
	if (m->size > pc->size) {
		sop__block_split(pool, m, d[k], pc->size, SOP_BLOCK_FREE, lv);
		right = d[k++];
	}
	sop__hole_make(pool, m);
	sop__lock_drop(&seg->lock);
	if (left)
		sop__bins_insert(&pool->heap, left);
	if (right)
		sop__bins_insert(&pool->heap, right);
	while (k < 2)
		sop__block_delete(pool, d[k++]);
	return right;
}

/* Unmap one idle piece inside f and take it out of the pool: its range becomes a hole and
 * reserved drops by its bytes; its handle, and its charge against the device's limit, stay
 * with pc. *right as piece_unback says. A piece the driver will not unmap stays, whole and
 * usable. Context current. */
static CUresult
piece_take(struct sop_pool *pool, struct sop__block *f, struct sop__piece *pc,
	   struct sop__block **right)
{
	struct sop__segment *seg = f->seg;
	struct sop__leaves lv = {0};
	struct sop__block *d[2];
	CUresult r;

	*right = NULL;
	/* What the surgery needs, before anything is given up. */
	if (!sop__leaves_get(pool, &lv, 2, 2)) {
		sop__leaves_put(pool, &lv, 0);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	d[0] = sop__block_new(pool);
	d[1] = d[0] ? sop__block_new(pool) : NULL;
	if (!d[1]) {
		if (d[0])
			sop__block_delete(pool, d[0]);
		sop__leaves_put(pool, &lv, 0);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	r = SOP_DRV(cuMemUnmap)(pc->va, pc->size);
	if (r != CUDA_SUCCESS) {
		sop__block_delete(pool, d[0]);
		sop__block_delete(pool, d[1]);
		sop__leaves_put(pool, &lv, 0);
		return r;
	}
	*right = piece_unback(pool, f, pc, d, &lv);
	sop__leaves_put(pool, &lv, 0);
	sop__piece_unlink(seg, pc);
	atomic_store(&pool->reserved, atomic_load(&pool->reserved) - pc->size);
	if (pc->fd_plus1) { /* the descriptor an exported pool kept (share.c) */
		close(pc->fd_plus1 - 1);
		pc->fd_plus1 = 0;
		pool->fds_kept--;
	}
	if (!seg->mapped && !seg->claims) /* else the growth in it drops it if it fails */
		sop__segment_drop(pool, seg);
	return CUDA_SUCCESS;
}

/* Unmap and release one idle piece inside f. Unmapped, the range leaves the pool whatever the
 * release says: a handle the driver will not release is kept as an orphan, and counted off
 * like reserved (a host pool's memory was never counted: vmm.c). */
static CUresult
piece_release(struct sop_pool *pool, struct sop__block *f, struct sop__piece *pc,
	      struct sop__block **right)
{
	CUresult r = piece_take(pool, f, pc, right);

	if (r != CUDA_SUCCESS)
		return r;
	r = sop__piece_let_go(pool, pc);
	if (r != CUDA_SUCCESS)
		sop__orphan_keep(pool, pc->handle);
	free(pc);
	return r;
}

/* ---- Unmaps owed -------------------------------------------------------------------------- */

void
sop__stuck_keep(struct sop_pool *pool, struct sop__block *claim, size_t size,
		struct sop__piece *const *pc, size_t n)
{
	struct sop__stuck *st = malloc(sizeof *st + n * sizeof *pc);

	/* Without host memory to note it in, the range stays claimed for the pool's life: lost
	 * to the pool, and its pieces to the process, but never mapped over. */
	if (!st)
		return;
	st->claim = claim;
	st->size = size;
	st->n = n;
	memcpy(st->pc, pc, n * sizeof *pc);
	st->next = pool->stuck;
	pool->stuck = st;
}

/* Unmap the pieces of claims whose unmaps are owed; a claim with none left mapped ends: its
 * range is a hole again, and its segment goes if it then holds nothing. A refusal leaves the
 * piece for the next release, and fails nothing: the release that retries has its own work.
 * Context current, pool lock held. */
static void
stuck_retry(struct sop_pool *pool)
{
	struct sop__stuck **pp = &pool->stuck, *st;

	while ((st = *pp)) {
		struct sop__segment *seg = st->claim->seg;
		size_t i = 0;

		while (i < st->n) {
			struct sop__piece *pc = st->pc[i];
			bool orphaned;

			if (!sop__piece_unmake(pool, pc, &orphaned)) {
				i++;
				continue;
			}
			if (orphaned)
				sop__orphan_keep(pool, pc->handle);
			free(pc);
			st->pc[i] = st->pc[--st->n];
		}
		if (st->n) {
			pp = &st->next;
			continue;
		}
		*pp = st->next;
		pool->mapping -= st->size;
		sop__segment_lock(seg);
		seg->claims--;
		sop__hole_make(pool, st->claim);
		sop__lock_drop(&seg->lock);
		if (!seg->mapped && !seg->claims)
			sop__segment_drop(pool, seg);
		free(st);
	}
}

/* ---- Idle pieces -------------------------------------------------------------------------- */

/* Release idle pieces, largest first, while reserved > target, keeping reserved >= floor; only
 * if they add up to at_least bytes. */
CUresult
sop__release_idle(struct sop_pool *pool, size_t target, size_t floor, size_t at_least,
		  struct sop__block *const spare[2])
{
	uint64_t reserved = atomic_load(&pool->reserved);
	struct sop__block *prev_f = NULL, *next_f = NULL;
	size_t n = 0, i, picked = 0, bytes = 0;
	struct idle *v = NULL;
	CUresult r;

	if (reserved > target) {
		v = idle_collect(pool, spare, &n, &bytes);
		if (bytes < at_least)
			n = 0;
		if (n)
			qsort(v, n, sizeof *v, idle_by_size);
		for (i = 0; i < n && reserved > target; i++) {
			if (reserved - v[i].pc->size < floor)
				continue;
			reserved -= v[i].pc->size;
			v[picked++] = v[i];
		}
	}
	if (!picked && !pool->n_orphans && !pool->stuck) {
		free(v);
		return CUDA_SUCCESS;
	}
	r = sop__pool_ctx_push(pool);
	if (r != CUDA_SUCCESS) {
		free(v);
		return r;
	}
	r = sop__orphans_release(pool);
	if (pool->stuck)
		stuck_retry(pool);
	if (picked && !reserved && !pool->anchor_tried && !atomic_load(&pool->destroyed))
		sop__anchor_make(pool);
	/* In address order, so that a FREE block holding several is walked once: each release
	 * leaves the rest of it in the block after the piece. */
	if (picked)
		qsort(v, picked, sizeof *v, idle_by_address);
	for (i = 0; i < picked && r == CUDA_SUCCESS; i++) {
		struct sop__block *f = v[i].f == prev_f && next_f ? next_f : v[i].f;

		prev_f = v[i].f;
		r = piece_release(pool, f, v[i].pc, &next_f);
	}
	sop__pool_ctx_pop(pool);
	free(v);
	return r;
}

size_t
sop__idle_take(struct sop_pool *pool, size_t want, struct sop__block *const spare[2],
	       struct sop__piece ***out, size_t *n_out)
{
	struct sop__block *prev_f = NULL, *next_f = NULL;
	struct sop__piece **pcs = NULL;
	size_t n, i, picked = 0, bytes, got = 0;
	struct idle *v = idle_collect(pool, spare, &n, &bytes);

	*out = NULL;
	*n_out = 0;
	if (n)
		qsort(v, n, sizeof *v, idle_by_size);
	for (i = 0; i < n; i++)
		if (v[i].pc->size <= want - got) {
			got += v[i].pc->size;
			v[picked++] = v[i];
		}
	if (picked)
		pcs = malloc(picked * sizeof *pcs);
	if (!pcs || sop__pool_ctx_push(pool) != CUDA_SUCCESS) {
		free(pcs);
		free(v);
		return 0;
	}
	/* In address order, as a release walks them (sop__release_idle); the first refusal ends
	 * it, f then being whole again only for the pieces after it. */
	qsort(v, picked, sizeof *v, idle_by_address);
	got = 0;
	for (i = 0; i < picked; i++) {
		struct sop__block *f = v[i].f == prev_f && next_f ? next_f : v[i].f;

		prev_f = v[i].f;
		if (piece_take(pool, f, v[i].pc, &next_f) != CUDA_SUCCESS)
			break;
		pcs[i] = v[i].pc;
		got += v[i].pc->size;
	}
	sop__pool_ctx_pop(pool);
	free(v);
	if (!i) {
		free(pcs);
		return 0;
	}
	*out = pcs;
	*n_out = i;
	return got;
}

CUresult
sop__heap_release(struct sop_pool *pool, size_t target, size_t floor)
{
	SOP_HELD(&pool->lock);
	return sop__release_idle(pool, target, floor, 0, NULL);
}

void
sop__heap_destroy(struct sop_pool *pool)
{
	size_t i;

	free(pool->orphans);
	pool->orphans = NULL;
	pool->n_orphans = 0;
	while (pool->stuck) { /* none by teardown, which waits for their unmaps */
		struct sop__stuck *st = pool->stuck;
		pool->stuck = st->next;
		while (st->n)
			free(st->pc[--st->n]);
		free(st);
	}
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
	pool->holes = NULL;
	atomic_store(&pool->returned, NULL);
	memset(&pool->heap, 0, sizeof pool->heap);
}
