/* segment.c - the pool's address space: free extents of its reservation, segments, holes and
 * each segment's array of pieces, the part of a segment that a stream adopts, and what reads
 * every segment (free extents, peer access).
 *
 * A pool reserves one large range of virtual addresses. Segments are runs of it that blocks
 * tile, never crossing a segment's ends; physical memory is mapped into them in pieces (one
 * cuMemCreate handle each, mapped and released whole: vmm.c), and what no piece backs is a
 * HOLE block. Blocks cross piece boundaries freely. Pool lock held throughout, but for the
 * segment locks where blocks are read.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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

/* ---- Segments and pieces ---------------------------------------------------------------- */

void
sop__reserved_add(struct sop_pool *pool, size_t size)
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

/* HOLE blocks are in no bin; the pool keeps them on a list of their own for growth to search. */
void
sop__hole_link(struct sop_pool *pool, struct sop__block *h)
{
	h->free_prev = NULL;
	h->free_next = pool->holes;
	if (pool->holes)
		pool->holes->free_prev = h;
	pool->holes = h;
}

void
sop__hole_unlink(struct sop_pool *pool, struct sop__block *h)
{
	if (h->free_prev)
		h->free_prev->free_next = h->free_next;
	else
		pool->holes = h->free_next;
	if (h->free_next)
		h->free_next->free_prev = h->free_prev;
	h->free_next = h->free_prev = NULL;
}

void
sop__hole_make(struct sop_pool *pool, struct sop__block *m)
{
	struct sop__block *x;

	atomic_store_explicit(&m->tag, sop__tag(m->addr, SOP_BLOCK_HOLE), memory_order_release);
	m->seq = 0;
	sop__hole_link(pool, m);
	if ((x = m->phys_next) && sop__block_state(x) == SOP_BLOCK_HOLE) {
		sop__hole_unlink(pool, x);
		sop__block_absorb_next(pool, m, NULL);
	}
	if ((x = m->phys_prev) && sop__block_state(x) == SOP_BLOCK_HOLE) {
		sop__hole_unlink(pool, m);
		sop__block_absorb_next(pool, x, NULL);
	}
}

/* A new segment of size bytes of the reservation (min if that much is not to be had), all one
 * HOLE block. */
struct sop__segment *
sop__segment_new(struct sop_pool *pool, size_t size, size_t min, const struct sop__sstream *home)
{
	struct sop__segment *seg = calloc(1, sizeof *seg);
	size_t unit = pool->granularity > SOP_MAP_SPAN ? pool->granularity : SOP_MAP_SPAN;
	struct sop__block *h = NULL;
	size_t off;

	if (!seg)
		return NULL;
	sop__lock_init(&seg->lock, SOP_RANK_SEGMENT);
	/* Whole spans of the block map, so that no leaf is shared by two segments' locks. */
	size = sop__round_up(size, unit);
	min = sop__round_up(min, unit);
	if (!va_take(pool, size, &off)) {
		size = min;
		if (!va_take(pool, size, &off)) {
			free(seg);
			return NULL;
		}
	}
	if (!(h = sop__block_new(pool))) {
		va_give(pool, off, size);
		free(seg);
		return NULL;
	}
	seg->va = pool->va_base + off;
	seg->size = size;
	seg->first = h;
	seg->home = home;
	seg->met = &pool->threads_met;
	h->addr = seg->va;
	h->size = size;
	h->seg = seg;
	atomic_store_explicit(&h->tag, sop__tag(h->addr, SOP_BLOCK_HOLE), memory_order_release);
	/* Not yet seen by others: no lock. The first span is the segment's alone and empty, so
	 * the entry is a lone block and takes no leaf. */
	sop__map_add(pool, &seg->leaves, h->addr, h);
	sop__hole_link(pool, h);
	segment_link(pool, seg);
	return seg;
}

/* ---- A part of a segment ------------------------------------------------------------------ */

/* Whether seg may be cut at at: on a boundary of its pieces and of the block map's spans (each
 * span's entry and leaf stay under one segment's lock), with pieces on both sides. */
static bool
cut_fits(const struct sop_pool *pool, const struct sop__segment *seg, CUdeviceptr at)
{
	size_t unit = pool->granularity > SOP_MAP_SPAN ? pool->granularity : SOP_MAP_SPAN;
	size_t i;

	if (at <= seg->va || at >= seg->va + seg->size || (at - pool->va_base) % unit)
		return false;
	i = sop__piece_search(seg, at);
	return i > 0 && i < seg->n_pieces &&
	       seg->pieces[i - 1]->va + seg->pieces[i - 1]->size <= at;
}

/* Make the part of seg from at on a segment of its own, n (zeroed, nobody's), its pieces moved
 * to v (room for all of them). Every block there is FREE or HOLE: in the heap or on the holes
 * list, which only the pool lock's holder reads, so that their segment changes with no other
 * thread looking; the block before at, which a stream may hold, loses its link to them under
 * seg's lock. b is the block across at or starting there; split with *d (then NULL) and a leaf
 * of seg's spares if at is inside it. Pool lock and seg's lock held. */
static void
segment_cut(struct sop_pool *pool, struct sop__segment *seg, struct sop__block *b, CUdeviceptr at,
	    struct sop__segment *n, struct sop__piece **v, struct sop__block **d)
{
	size_t i = sop__piece_search(seg, at), k;
	struct sop__block *x;

	SOP_HELD(&pool->lock);
	SOP_HELD(&seg->lock);
	if (b->addr < at) {
		enum sop__state st = sop__block_state(b);

		if (st == SOP_BLOCK_FREE)
			sop__bins_remove(&pool->heap, b);
		sop__block_split(pool, b, *d, at - b->addr, st, &seg->leaves);
		if (st == SOP_BLOCK_FREE) {
			sop__block_set_owner(*d, sop__block_owner(b));
			sop__bins_insert(&pool->heap, b);
			sop__bins_insert(&pool->heap, *d);
		} else {
			sop__hole_link(pool, *d);
		}
		b = *d;
		*d = NULL;
	}
	sop__link_set(&b->phys_prev->phys_next, NULL);
	sop__link_set(&b->phys_prev, NULL);
	for (x = b; x; x = x->phys_next)
		x->seg = n;
	n->first = b;
	n->pieces = v;
	n->cap_pieces = seg->n_pieces - i;
	for (k = i; k < seg->n_pieces; k++) {
		n->pieces[n->n_pieces++] = seg->pieces[k];
		n->mapped += seg->pieces[k]->size;
		seg->mapped -= seg->pieces[k]->size;
	}
	seg->n_pieces = i;
	n->va = at;
	n->size = seg->va + seg->size - at;
	seg->size = at - seg->va;
	n->met = &pool->threads_met;
	segment_link(pool, n);
}

struct sop__block *
sop__segment_adopt(struct sop_pool *pool, struct sop__block *h, size_t size, size_t part,
		   const struct sop__sstream *ss)
{
	struct sop__segment *seg = h->seg, *n[2] = {NULL, NULL}, *mine = seg;
	struct sop__piece **v[2] = {NULL, NULL};
	struct sop__block *d[2] = {NULL, NULL}, *x, *at_lo = h, *at_hi = NULL;
	CUdeviceptr lo, hi, tail = h->addr, end = seg->va + seg->size;
	bool cut_lo, cut_hi;
	size_t i, k;

	if (seg->mapped <= 2 * part || seg->claims ||
	    (i = sop__piece_search(seg, h->addr)) == seg->n_pieces)
		goto whole;
	/* From the first piece boundary in h, if the request fits there, to the first one past
	 * part bytes (or the request) beyond it. */
	lo = seg->pieces[i]->va;
	if (lo + size > h->addr + h->size)
		goto whole;
	i = sop__piece_search(seg, lo + (size > part ? size : part));
	hi = i < seg->n_pieces ? seg->pieces[i]->va : end;
	cut_lo = cut_fits(pool, seg, lo);
	cut_hi = cut_fits(pool, seg, hi);
	if (!cut_lo && !cut_hi)
		goto whole;
	for (k = 0; k < 2; k++) {
		n[k] = calloc(1, sizeof *n[k]);
		v[k] = malloc(seg->n_pieces * sizeof *v[k]);
		d[k] = sop__block_new(pool);
		if (!n[k] || !v[k] || !d[k])
			goto out;
		sop__lock_init(&n[k]->lock, SOP_RANK_SEGMENT);
	}
	if (!sop__segment_lock_leaves(pool, seg, 2))
		goto out;
	/* Only where everything from the cut to the segment's end is FREE or HOLE (see
	 * segment_cut): tail is where that run begins. */
	for (x = h; x; x = x->phys_next) {
		enum sop__state st = sop__block_state(x);

		if (st != SOP_BLOCK_FREE && st != SOP_BLOCK_HOLE)
			tail = x->addr + x->size;
		if (!at_hi && x->addr + x->size > hi)
			at_hi = x;
	}
	cut_lo = cut_lo && lo >= tail;
	cut_hi = cut_hi && hi >= tail && at_hi;
	if (cut_hi)
		segment_cut(pool, seg, at_hi, hi, n[1], v[1], &d[1]);
	if (cut_lo) {
		segment_cut(pool, seg, at_lo, lo, n[0], v[0], &d[0]);
		mine = n[0];
		h = mine->first;
	}
	sop__lock_drop(&seg->lock);
out:
	for (k = 0; k < 2; k++) {
		if (d[k])
			sop__block_delete(pool, d[k]);
		if (!n[k] || !n[k]->pieces) {
			free(v[k]);
			free(n[k]);
		}
	}
whole:
	mine->home = ss;
	return h;
}

/* Give back a segment that is one HOLE block again. */
void
sop__segment_drop(struct sop_pool *pool, struct sop__segment *seg)
{
	struct sop__block *h = seg->first;

	sop__hole_unlink(pool, h);
	/* No other thread reaches a segment that is one HOLE (growth, under the pool lock, is what
	 * maps holes), but the map's writers hold the segment lock, and so does this one. */
	sop__lock_take(&seg->lock);
	sop__map_remove(pool, seg, h->addr);
	sop__leaves_put(pool, &seg->leaves, 0);
	sop__lock_drop(&seg->lock);
	sop__block_delete(pool, h);
	segment_unlink(pool, seg);
	va_give(pool, seg->va - pool->va_base, seg->size);
	free(seg->pieces);
	free(seg);
}

/* Room in seg's array for one more piece, made before the piece is mapped so that linking it
 * cannot fail. Pool lock held. */
bool
sop__pieces_reserve(struct sop__segment *seg)
{
	struct sop__piece **v;
	size_t cap;

	if (seg->n_pieces < seg->cap_pieces)
		return true;
	cap = seg->cap_pieces ? 2 * seg->cap_pieces : 4;
	v = realloc(seg->pieces, cap * sizeof *v);
	if (!v)
		return false;
	seg->pieces = v;
	seg->cap_pieces = cap;
	return true;
}

/* The index of seg's first piece at or after addr. */
size_t
sop__piece_search(const struct sop__segment *seg, CUdeviceptr addr)
{
	size_t lo = 0, hi = seg->n_pieces;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (seg->pieces[mid]->va < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Pool lock held, room reserved. */
void
sop__piece_link(struct sop__segment *seg, struct sop__piece *pc)
{
	size_t i = sop__piece_search(seg, pc->va);

	memmove(&seg->pieces[i + 1], &seg->pieces[i], (seg->n_pieces - i) * sizeof *seg->pieces);
	seg->pieces[i] = pc;
	seg->n_pieces++;
	seg->mapped += pc->size;
}

void
sop__piece_unlink(struct sop__segment *seg, struct sop__piece *pc)
{
	size_t i = sop__piece_search(seg, pc->va);

	memmove(&seg->pieces[i], &seg->pieces[i + 1],
		(seg->n_pieces - i - 1) * sizeof *seg->pieces);
	seg->n_pieces--;
	seg->mapped -= pc->size;
}

void
sop__heap_free_extents(struct sop_pool *pool, size_t *largest, size_t *total)
{
	struct sop__segment *seg;
	size_t most = 0, sum = 0;

	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	for (seg = pool->segments; seg; seg = seg->next) {
		struct sop__block *b;
		size_t run = 0;

		/* Links and sizes change under the segment lock; a stream may take one of its
		 * cached blocks meanwhile, which only changes the state read here. */
		sop__segment_lock(seg);
		for (b = seg->first; b; b = b->phys_next) {
			enum sop__state st = sop__block_state(b);

			if (st != SOP_BLOCK_FREE && st != SOP_BLOCK_CACHED) {
				run = 0;
				continue;
			}
			run += b->size;
			sum += b->size;
			if (run > most)
				most = run;
		}
		sop__lock_drop(&seg->lock);
	}
	sop__mutex_drop(&pool->lock);
	*largest = most;
	*total = sum;
}

CUresult
sop__heap_set_access(struct sop_pool *pool, const CUmemAccessDesc *want,
		     const CUmemAccessDesc *was, size_t n)
{
	struct sop__segment *seg;
	struct sop__piece *pc, *failed = NULL;
	CUresult r = CUDA_SUCCESS;
	size_t i;

	for (seg = pool->segments; seg && !failed; seg = seg->next) {
		for (i = 0; i < seg->n_pieces; i++) {
			pc = seg->pieces[i];
			r = SOP_DRV(cuMemSetAccess)(pc->va, pc->size, want, n);
			if (r != CUDA_SUCCESS) {
				failed = pc;
				break;
			}
		}
	}
	/* An imported pool's pieces are the exporter's, mapped here (import.c). */
	for (i = 0; pool->import && !failed && i < pool->import->n_pieces; i++) {
		pc = pool->import->pieces[i];
		r = SOP_DRV(cuMemSetAccess)(pc->va, pc->size, want, n);
		if (r != CUDA_SUCCESS)
			failed = pc;
	}
	/* All or nothing: put back what changed before the failure. */
	for (seg = pool->segments; failed && seg; seg = seg->next)
		for (i = 0; i < seg->n_pieces; i++) {
			pc = seg->pieces[i];
			if (pc == failed)
				return r;
			SOP_DRV(cuMemSetAccess)(pc->va, pc->size, was, n);
		}
	for (i = 0; pool->import && failed && i < pool->import->n_pieces; i++) {
		pc = pool->import->pieces[i];
		if (pc == failed)
			return r;
		SOP_DRV(cuMemSetAccess)(pc->va, pc->size, was, n);
	}
	return r;
}
