/* grow.c - growth: mapping physical memory for a request that nothing free can serve.
 *
 * Growth maps a piece where it joins free memory if that maps less (a block at a hole's edge,
 * or a stream's own cached memory), else in a hole of a segment of the stream's own or of a
 * new segment. Wholly free pieces replace new memory: moved there, or released first when they
 * add up to what is mapped (release.c). Pool lock held, but for the driver's calls: the range is claimed first, mapped
 * with the lock dropped, and published under it again (Claims, below).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- Growth ----------------------------------------------------------------------------- */

/* Where growth maps a piece: in hole, at its start or its end, size bytes; least is the
 * fewest that still make the request fit there (what is mapped when the device cannot back
 * size). No hole: a new segment. */
struct plan {
	struct sop__block *hole;
	bool at_end;
	int rank; /* whose segment: see plan_rank */
	size_t size, least;
};

/* How fitting a segment is for ss's growth: 0 its own; 1 nobody's, or any while the pool is
 * used from one thread (placement by cost alone); 2 another stream's, once threads have met
 * in the pool (growth there would put the two streams' splits and merges under one lock). */
static int
plan_rank(struct sop_pool *pool, const struct sop__segment *seg, const struct sop__sstream *ss)
{
	if (seg->home == ss)
		return 0;
	if (!seg->home || !atomic_load_explicit(&pool->threads_met, memory_order_relaxed))
		return 1;
	return 2;
}

/* The bytes of b a new piece next to it joins with: FREE ones, or ones cached on ss (which ss
 * may reuse at once). Stream and segment locks held. */
static size_t
joinable(struct sop__block *b, const struct sop__sstream *ss)
{
	enum sop__state st;

	if (!b)
		return 0;
	st = sop__block_state(b);
	if (st == SOP_BLOCK_FREE || (ss && st == SOP_BLOCK_CACHED && sop__block_owner(b) == ss))
		return b->size;
	return 0;
}

/* The growth step of a pool that holds reserved bytes, for ss's growth in seg (NULL: a new
 * segment): the driver's 32 MiB, or a compacting pool's pieces; a host pool's ramps up to the
 * former by half of what it holds. Pinning host memory costs by the byte (a 32 MiB cuMemCreate
 * of host memory takes 9 ms on the H100, a granule 0.6 ms), not by the call as on a device, so
 * a host pool that needs a few megabytes pins a few, not a step: a 1 MiB staging loop held
 * 32 MiB, and its first allocation pinned all of them. The ramp keeps a growing pool's pieces
 * few (a pool of 1 GiB has about 40).
 *
 * Once threads have met, a segment of the stream's own (or nobody's, which it adopts) grows by
 * SOP_OWN_STEP, a quarter step. Each stream then has segments of its own, and what a step maps
 * beyond the stream's needs is memory no other stream takes while that one lives: sixteen tasks
 * at once, each with a stream that keeps 32 blocks of up to 1 MiB live, held a segment of
 * 32 MiB each where each needed about 25 (512 MiB reserved for 265 MiB live, 1.93x; 416 MiB,
 * 1.57x, in quarter steps: test/tasks.c, on the simulated driver). Quarter steps only until a
 * segment mapped a whole step left threads that keep more with up to a step each beyond their
 * needs: sixteen of test-crowd's workers, about 130 MiB live each, reserved 2896-2976 MiB on the
 * simulated driver, 2640-2656 in quarter steps all the way (test/placement.c, own_steps); on
 * the H100 3040-3072 against 2712-2720, the driver's pool 2656. The price is growths: four
 * times as many for a stream past its first 32 MiB, each a create, map and set access of about
 * 60 us on the H100, once. A pool used from one thread keeps whole steps. */
static size_t
growth_step(const struct sop_pool *pool, const struct sop__segment *seg,
	    const struct sop__sstream *ss, uint64_t reserved)
{
	if (atomic_load_explicit(&pool->compact, memory_order_relaxed))
		return SOP_COMPACT_PIECE;
	if (pool->host && reserved / 2 < SOP_SEGMENT_MIN)
		return (size_t)reserved / 2;
	if (ss && atomic_load_explicit(&pool->threads_met, memory_order_relaxed) &&
	    (!seg || !seg->home || seg->home == ss))
		return SOP_OWN_STEP;
	return SOP_SEGMENT_MIN;
}

/* What counts against maxSize: the pool's pieces, and the ranges growths in flight are
 * mapping. Pool lock held. */
static uint64_t
committed(struct sop_pool *pool)
{
	return atomic_load(&pool->reserved) + pool->mapping;
}

/* The bytes to map in room bytes of a hole so that, joined with have bytes next to it, a block
 * of size bytes fits: whole granules, and at least a growth step (growth_step), except near
 * maxSize, where only what is needed. 0 if it cannot fit there. */
static size_t
span(struct sop_pool *pool, const struct sop__segment *seg, const struct sop__sstream *ss,
     size_t size, size_t have, size_t room, size_t *least)
{
	size_t g = pool->granularity;
	size_t lo = size > have ? sop__round_up(size - have, g) : g;
	uint64_t reserved = committed(pool);
	size_t want = sop__round_up(growth_step(pool, seg, ss, reserved), g);

	if (lo > room || (pool->max_size && reserved + lo > pool->max_size))
		return 0;
	if (want < lo)
		want = lo;
	if (want > room)
		want = room;
	if (pool->max_size && reserved + want > pool->max_size)
		want = lo;
	*least = lo;
	return want;
}

/* Keep the place that maps least; on a tie, one in a segment of the stream's own. */
static void
plan_offer(struct plan *best, struct sop__block *h, bool at_end, int rank, size_t size,
	   size_t least)
{
	if (!size || (best->size && (best->size < size ||
				     (best->size == size && best->rank <= rank))))
		return;
	best->hole = h;
	best->at_end = at_end;
	best->rank = rank;
	best->size = size;
	best->least = least;
}

/* The cheapest place for size bytes: the hole whose neighbours leave the least to map, or,
 * with nothing to join, a hole of a segment of ss's own or of nobody's (plan_rank); else (hole
 * NULL) a new segment, which also beats another stream's segment for no saving once threads
 * have met: each stream splits and merges under the lock of its own segments, and a small
 * request maps a whole step wherever it goes. With any, every hole will do (a new segment
 * found no addresses). False if the request cannot fit under maxSize at all. */
static bool
plan_make(struct sop_pool *pool, struct sop__sstream *ss, size_t size, bool any, struct plan *pl)
{
	struct sop__block *h;
	size_t least = 0, n;

	memset(pl, 0, sizeof *pl);
	for (h = pool->holes; h; h = h->free_next) {
		struct sop__segment *seg = h->seg;
		int rank = plan_rank(pool, seg, ss);
		size_t l, r;

		if (ss)
			sop__lock_take(&ss->lock);
		sop__segment_lock(seg);
		l = joinable(h->phys_prev, ss);
		r = joinable(h->phys_next, ss);
		sop__lock_drop(&seg->lock);
		if (ss)
			sop__lock_drop(&ss->lock);
		if (l) {
			n = span(pool, seg, ss, size, l, h->size, &least);
			plan_offer(pl, h, false, rank, n, least);
		}
		if (r) {
			n = span(pool, seg, ss, size, r, h->size, &least);
			plan_offer(pl, h, true, rank, n, least);
		}
		/* Filled whole, a hole joins the free memory on both sides. */
		if (l && r && size <= l + h->size + r &&
		    (!pool->max_size || committed(pool) + h->size <= pool->max_size))
			plan_offer(pl, h, false, rank, h->size, h->size);
		if (rank < 2 || any) {
			n = span(pool, seg, ss, size, 0, h->size, &least);
			plan_offer(pl, h, false, rank, n, least);
		}
	}
	n = span(pool, NULL, ss, size, 0, SIZE_MAX, &least);
	if (pl->size && (pl->rank < 2 || pl->size < n || !n || any))
		return true;
	if (any)
		return false;
	memset(pl, 0, sizeof *pl);
	pl->size = n;
	pl->least = least;
	return n != 0;
}

/* The FREE blocks next to the plan's hole, which growth may join: spared by the release before
 * it. Pool lock held. */
static void
plan_spare(const struct plan *pl, struct sop__block *spare[2])
{
	struct sop__block *h = pl->hole, *x;
	int k;

	spare[0] = spare[1] = NULL;
	if (!h)
		return;
	/* Under the segment lock: a neighbour cached on a stream may be split meanwhile. */
	sop__segment_lock(h->seg);
	for (k = 0; k < 2; k++) {
		x = k ? h->phys_next : h->phys_prev;
		if (x && sop__block_state(x) == SOP_BLOCK_FREE)
			spare[k] = x;
	}
	sop__lock_drop(&h->seg->lock);
}

/* A new piece's block b, FREE and in no bin, joined with what a block of size bytes needs of
 * its neighbours cached on ss: the joined block is cached on ss then (ss may use what it freed
 * at once, others only once that completes; the new memory has no past), out of ss's bins and
 * without an owner, like any block the slow path takes out of a cache (*from = ss), and what
 * it does not need of b stays FREE for any stream. With nothing to join, b itself (*from =
 * NULL). Pool lock held. */
static struct sop__block *
join_own(struct sop_pool *pool, struct sop__sstream *ss, struct sop__block *b, size_t size,
	 struct sop__sstream **from)
{
	struct sop__segment *seg = b->seg;
	struct sop__block *p, *n, *d;
	bool own_p, own_n, leaf;

	*from = NULL;
	if (!ss || b->size >= size)
		return b;
	d = sop__block_new(pool);
	if (!d)
		return b;
	sop__lock_take(&ss->lock);
	/* Without a leaf for the split's map slot, b is joined whole. */
	leaf = sop__segment_lock_leaves(pool, seg, 1);
	if (!leaf)
		sop__segment_lock(seg);
	p = b->phys_prev;
	n = b->phys_next;
	own_p = p && sop__block_state(p) == SOP_BLOCK_CACHED && sop__block_owner(p) == ss;
	own_n = n && sop__block_state(n) == SOP_BLOCK_CACHED && sop__block_owner(n) == ss;
	/* One side if it is enough, both if it takes both, none if the plan's neighbours were
	 * taken since (then the block is too small and growth plans again). */
	if (own_p && own_n) {
		if (p->size + b->size >= size)
			own_n = false;
		else if (n->size + b->size >= size)
			own_p = false;
		else if (p->size + b->size + n->size < size)
			own_p = own_n = false;
	} else if (own_p && p->size + b->size < size) {
		own_p = false;
	} else if (own_n && n->size + b->size < size) {
		own_n = false;
	}
	/* Only the part of b next to the joined neighbour that the request needs. */
	if (own_p && !own_n && p->size + b->size - size >= SOP_ALIGN && leaf) {
		sop__block_split(pool, b, d, size - p->size, SOP_BLOCK_FREE, &seg->leaves);
		sop__bins_insert(&pool->heap, d);
		d = NULL;
	} else if (own_n && !own_p && n->size + b->size - size >= SOP_ALIGN && leaf) {
		struct sop__block *head = b;
		sop__block_split(pool, b, d, b->size - (size - n->size), SOP_BLOCK_FREE,
				 &seg->leaves);
		b = d;
		d = NULL;
		sop__bins_insert(&pool->heap, head);
	}
	if (d)
		sop__block_delete(pool, d);
	if (own_p || own_n) {
		if (own_p) {
			sop__bins_remove(&ss->cache, p);
			sop__block_absorb_next(pool, p, NULL);
			b = p;
		} else {
			b->seq = 0;
		}
		if (own_n) {
			sop__bins_remove(&ss->cache, n);
			if (n->seq > b->seq)
				b->seq = n->seq;
			sop__block_absorb_next(pool, b, NULL);
		}
		atomic_store_explicit(&b->tag, sop__tag(b->addr, SOP_BLOCK_CACHED),
				      memory_order_release);
		sop__block_set_owner(b, NULL);
		*from = ss;
	}
	sop__lock_drop(&seg->lock);
	sop__lock_drop(&ss->lock);
	return b;
}

/* New segments take this much of the reservation (or what the request needs, if more): room
 * for later pieces to join the first. */
static size_t
segment_room(struct sop_pool *pool)
{
	size_t room = pool->va_size / 32;

	if (room > ((size_t)16 << 30))
		room = (size_t)16 << 30;
	room = room / pool->granularity * pool->granularity;
	return room > SOP_SEGMENT_MIN ? room : sop__round_up(SOP_SEGMENT_MIN, pool->granularity);
}

bool
sop__pieces_move(const struct sop_pool *pool)
{
	return !pool->props.handleTypes && !atomic_load_explicit(&pool->compact, memory_order_relaxed);
}

/* The size of each physical allocation that maps size bytes of growth: one for the whole, in
 * equal parts of at most SOP_PIECE_MAX where pieces move, or, in a compacting pool, pieces of
 * SOP_COMPACT_PIECE (at most SOP_COMPACT_PIECES of them), each given back on its own once
 * idle. */
static size_t
piece_unit(struct sop_pool *pool, size_t size)
{
	size_t unit;

	if (!atomic_load_explicit(&pool->compact, memory_order_relaxed)) {
		if (size <= SOP_PIECE_MAX || !sop__pieces_move(pool))
			return size;
		return sop__round_up(size / ((size + SOP_PIECE_MAX - 1) / SOP_PIECE_MAX),
				     pool->granularity);
	}
	unit = sop__round_up((size + SOP_COMPACT_PIECES - 1) / SOP_COMPACT_PIECES,
			     pool->granularity);
	return unit > SOP_COMPACT_PIECE ? unit : sop__round_up(SOP_COMPACT_PIECE, pool->granularity);
}

/* Let go of idle pieces taken for a growth (sop__idle_take) that will not map them: released,
 * or kept as orphans, and uncounted. Pool lock held. */
static void
moved_drop(struct sop_pool *pool, struct sop__piece *const *pc, size_t n)
{
	bool ctx = n && sop__pool_ctx_push(pool) == CUDA_SUCCESS;
	size_t i;

	for (i = 0; i < n; i++) {
		if (!ctx) {
			if (!pool->host)
				sop__limit_discharge(pool->device, pc[i]->size);
			sop__orphan_keep(pool, pc[i]->handle);
		} else if (sop__piece_let_go(pool, pc[i]) != CUDA_SUCCESS) {
			sop__orphan_keep(pool, pc[i]->handle);
		}
		free(pc[i]);
	}
	if (ctx)
		sop__pool_ctx_pop(pool);
}

/* Of the idle pieces taken, n of them, keep in pc those that fit in size bytes together, in
 * the order taken, and let go of the others; their bytes returned, *n what is kept. Pool lock
 * held. */
static size_t
moved_fit(struct sop_pool *pool, struct sop__piece **pc, size_t *n, size_t size)
{
	size_t i, kept = 0, bytes = 0;

	for (i = 0; i < *n; i++) {
		if (pc[i]->size <= size - bytes) {
			bytes += pc[i]->size;
			pc[kept++] = pc[i];
		} else {
			moved_drop(pool, &pc[i], 1);
		}
	}
	*n = kept;
	return bytes;
}

/* ---- Claims ------------------------------------------------------------------------------
 *
 * The driver's calls of a growth (create, map, set access: about 60 us on the H100, and
 * milliseconds while other threads create and destroy streams) run with the pool lock dropped,
 * so that other threads' slow paths, synchronizations and growths go on meanwhile: sixteen
 * threads running a stream per task on a fresh pool waited 1.5-1.9 ms each time they found the
 * lock held past their spin, mostly behind growths. Under the lock, the growth claims its range
 * (a MAPPING block, which nothing joins, searches or gives back), counts it against maxSize
 * (pool->mapping) and keeps its segment (claims); it notes the pool's access as it stands.
 * The pieces are made and mapped with the lock dropped, then linked under it again, opened to
 * any peer whose access changed meanwhile, and the range becomes FREE. On a failure it goes
 * back to the holes. */

/* What a growth maps with the pool lock dropped: its pieces, and the access they were opened
 * with. */
struct mapping {
	struct sop__piece **pc;
	size_t n;
	CUmemAccessDesc *desc;
	size_t n_desc;
	uint64_t gen; /* pool->access_gen when desc was taken */
	/* Handles unmapped whose release the driver refused, for the pool's orphans (as many
	 * places as pieces). */
	CUmemGenericAllocationHandle *orphans;
	size_t n_orphans;
};

/* Unmap and release m's pieces. Those the driver will not unmap stay in m (m->n of them, the
 * range still theirs: the caller keeps the claim, sop__stuck_keep), handles whose release
 * fails go to m->orphans. Context current; no pool lock needed. */
static void
pieces_unmake(struct sop_pool *pool, struct mapping *m)
{
	size_t i, kept = 0;

	for (i = 0; i < m->n; i++) {
		struct sop__piece *pc = m->pc[i];
		bool orphaned;

		if (!sop__piece_unmake(pool, pc, &orphaned)) {
			m->pc[kept++] = pc;
			continue;
		}
		if (orphaned)
			m->orphans[m->n_orphans++] = pc->handle;
		free(pc);
	}
	m->n = kept;
}

/* Make and map size bytes at va as pieces of unit bytes into m; on a failure, what was made is
 * unmapped and released again (pieces_unmake: what stays mapped stays in m). Context current;
 * pool lock dropped. */
static CUresult
pieces_map(struct sop_pool *pool, struct mapping *m, CUdeviceptr va, size_t size, size_t unit)
{
	size_t off;
	CUresult r = CUDA_SUCCESS;

	for (off = 0; off < size; off += unit) {
		struct sop__piece *pc = calloc(1, sizeof *pc);
		enum sop__left left;

		if (!pc) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
			break;
		}
		pc->va = va + off;
		pc->size = size - off < unit ? size - off : unit;
		r = sop__piece_map(pool, pc->va, pc->size, m->desc, m->n_desc, &pc->handle, &left);
		if (r != CUDA_SUCCESS) {
			if (left == SOP_LEFT_MAPPED) { /* unmade with the others, or kept */
				m->pc[m->n++] = pc;
			} else {
				if (left == SOP_LEFT_HANDLE)
					m->orphans[m->n_orphans++] = pc->handle;
				free(pc);
			}
			break;
		}
		m->pc[m->n++] = pc;
	}
	if (r != CUDA_SUCCESS)
		pieces_unmake(pool, m);
	return r;
}

/* Let go of n unmapped pieces pc taken for a growth (sop__idle_take): released and uncounted,
 * a handle whose release the driver refuses to m's orphans. Context current; pool lock dropped
 * (moved_drop, with it held). */
static void
pieces_let_go(struct sop_pool *pool, struct mapping *m, struct sop__piece *const *pc, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		if (sop__piece_let_go(pool, pc[i]) != CUDA_SUCCESS)
			m->orphans[m->n_orphans++] = pc[i]->handle;
		free(pc[i]);
	}
}

/* Map the idle pieces pc taken from elsewhere in the pool (sop__idle_take), n of them, one
 * after another from va, into m. On a failure, the rest are let go, and those mapped are
 * unmapped and let go with m's others (pieces_unmake: what stays mapped stays in m). Context
 * current; pool lock dropped. */
static CUresult
pieces_remap(struct sop_pool *pool, struct mapping *m, CUdeviceptr va,
	     struct sop__piece *const *pc, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		enum sop__left left;
		CUresult r;

		pc[i]->va = va;
		va += pc[i]->size;
		r = sop__piece_remap(pool, pc[i], m->desc, m->n_desc, &left);
		if (r == CUDA_SUCCESS) {
			m->pc[m->n++] = pc[i];
			continue;
		}
		if (left == SOP_LEFT_MAPPED) {
			m->pc[m->n++] = pc[i];
		} else {
			if (left == SOP_LEFT_HANDLE)
				m->orphans[m->n_orphans++] = pc[i]->handle;
			free(pc[i]);
		}
		pieces_let_go(pool, m, pc + i + 1, n - i - 1);
		pieces_unmake(pool, m);
		return r;
	}
	return CUDA_SUCCESS;
}

/* Open m's pieces to the peers as the pool's access stands now, if it changed since they were
 * mapped: each peer with access now, and none for those that lost it. Pool lock held,
 * context current. */
static CUresult
access_catch_up(struct sop_pool *pool, struct mapping *m)
{
	CUmemAccessDesc *want;
	size_t n, i, j;
	CUresult r = CUDA_SUCCESS;

	if (m->gen == pool->access_gen)
		return CUDA_SUCCESS;
	want = calloc(pool->n_access + m->n_desc + 1, sizeof *want);
	if (!want)
		return CUDA_ERROR_OUT_OF_MEMORY;
	want[0] = m->desc[0];
	for (n = 1; n <= pool->n_access; n++)
		want[n] = pool->access[n - 1];
	for (i = 1; i < m->n_desc; i++) {
		for (j = 1; j < n && want[j].location.id != m->desc[i].location.id; j++)
			;
		if (j == n) {
			want[n] = m->desc[i];
			want[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
		}
	}
	for (i = 0; i < m->n && r == CUDA_SUCCESS; i++)
		r = SOP_DRV(cuMemSetAccess)(m->pc[i]->va, m->pc[i]->size, want, n);
	free(want);
	return r;
}

/* Link m's pieces into seg, each named by the pool's count of pieces made; all or none. Pool
 * lock held. */
static bool
pieces_link(struct sop_pool *pool, struct sop__segment *seg, struct mapping *m)
{
	size_t i;

	for (i = 0; i < m->n; i++) {
		if (!sop__pieces_reserve(seg)) {
			while (i--)
				sop__piece_unlink(seg, m->pc[i]);
			return false;
		}
		m->pc[i]->serial = ++pool->piece_serial;
		sop__piece_link(seg, m->pc[i]);
	}
	return true;
}

/* Claim [at, at + size) of hole h, splitting off what is left of it on either side (descriptors
 * from d, *k of them used). Pool lock held. */
static struct sop__block *
claim(struct sop_pool *pool, struct sop__block *h, CUdeviceptr at, size_t size,
      struct sop__block *d[], int *k, struct sop__leaves *lv)
{
	struct sop__segment *seg = h->seg;
	struct sop__block *b = h;

	sop__segment_lock(seg);
	if (at > h->addr) {
		sop__block_split(pool, h, d[*k], at - h->addr, SOP_BLOCK_HOLE, lv);
		b = d[(*k)++];
	} else {
		sop__hole_unlink(pool, h);
	}
	if (b->size > size) {
		sop__block_split(pool, b, d[*k], size, SOP_BLOCK_HOLE, lv);
		sop__hole_link(pool, d[(*k)++]);
	}
	atomic_store_explicit(&b->tag, sop__tag(b->addr, SOP_BLOCK_MAPPING), memory_order_release);
	seg->claims++;
	sop__lock_drop(&seg->lock);
	pool->mapping += size;
	return b;
}

/* End b's claim of size bytes: what was mapped of it, [va, va + mapped), stays claimed
 * (returned), the rest goes back to the holes, and with nothing mapped (NULL) all of it, and
 * the segment too if it then holds nothing. Descriptor from d for a split. Pool lock held. */
static struct sop__block *
claim_end(struct sop_pool *pool, struct sop__block *b, size_t size, CUdeviceptr va,
	  size_t mapped, struct sop__block *d[], int *k, struct sop__leaves *lv)
{
	struct sop__segment *seg = b->seg;
	struct sop__block *back = NULL;

	pool->mapping -= size;
	sop__segment_lock(seg);
	seg->claims--;
	if (!mapped) {
		back = b;
		b = NULL;
	} else if (va > b->addr) {
		sop__block_split(pool, b, d[*k], va - b->addr, SOP_BLOCK_MAPPING, lv);
		back = b;
		b = d[(*k)++];
	} else if (b->size > mapped) {
		sop__block_split(pool, b, d[*k], mapped, SOP_BLOCK_MAPPING, lv);
		back = d[(*k)++];
	}
	if (back)
		sop__hole_make(pool, back);
	sop__lock_drop(&seg->lock);
	if (!seg->mapped && !seg->claims)
		sop__segment_drop(pool, seg);
	return b;
}

static CUresult
grow(struct sop_pool *pool, struct sop__sstream *ss, size_t size, uint64_t roomy,
     struct sop__block **out, struct sop__sstream **from)
{
	struct sop__block *d[3] = {NULL, NULL, NULL}, *spare[2], *b;
	struct sop__segment *fresh = NULL;
	struct sop__leaves lv = {0}; /* for the map slots of the splits */
	struct sop__piece **moved = NULL;
	struct mapping m = {0};
	CUdeviceptr at, va;
	size_t unit, mapped, make, mv, n_moved = 0;
	bool again = false; /* anything given back or taken: the plan is made again */
	struct plan pl;
	CUresult r;
	int k;

	if (!plan_make(pool, ss, size, false, &pl))
		return CUDA_ERROR_OUT_OF_MEMORY;
	/* Wholly free pieces replace memory that could not serve the request instead of adding
	 * to it (the driver's "defragment by remapping unused memory"). Where pieces move, once
	 * the pool would hold more than roomy (reuse.c), as many as fit in the growth are moved
	 * there: unmapped where they lie idle and mapped again with their handles (40-50 us a
	 * piece on the H100, a third of making one and giving one back), and only the rest is
	 * made. Elsewhere, idle pieces that add up to the growth are given back first. Not those
	 * of the free memory the plan joins: taken, largest first, they took the very memory
	 * that made the plan small, and the plan made again mapped the whole request elsewhere
	 * (random sizes up to 1 GiB, with growth in bounded pieces, crept from 1.12 to 2.7 times
	 * their live peak on the simulated driver). Either may open a better place, so the plan
	 * is made again. Where pieces move, idle ones that do not fit are not given back: when
	 * they were, pieces made and released (0.115 of each an operation) kept a warm pool of
	 * random sizes up to 1 GiB at 0.024 M operations a second on the H100, a third of the
	 * driver's pool's speed. */
	plan_spare(&pl, spare);
	if (!sop__pieces_move(pool))
		again = sop__release_idle(pool, (size_t)atomic_load(&pool->reserved) - pl.size, 0,
					  pl.size, spare) == CUDA_SUCCESS;
	else if (committed(pool) + pl.size > roomy)
		again = sop__idle_take(pool, pl.size, spare, &moved, &n_moved) != 0;
	if (again && !plan_make(pool, ss, size, false, &pl)) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail;
	}
	mv = moved_fit(pool, moved, &n_moved, pl.size);

	for (k = 0; k < 3; k++)
		d[k] = sop__block_new(pool);
	k = 0;
	m.desc = sop__access_list(pool, &m.n_desc);
	m.gen = pool->access_gen;
	if (!d[0] || !d[1] || !d[2] || !m.desc || !sop__leaves_get(pool, &lv, 3, 3)) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail;
	}
	if (!pl.hole) {
		size_t room = segment_room(pool);
		fresh = sop__segment_new(pool, room > pl.size ? room : pl.size, pl.size, ss);
		if (fresh) {
			pl.hole = fresh->first;
		} else if (!plan_make(pool, ss, size, true, &pl)) {
			/* No addresses for a new segment: any hole that fits. */
			r = CUDA_ERROR_OUT_OF_MEMORY;
			goto fail;
		} else {
			mv = moved_fit(pool, moved, &n_moved, pl.size);
		}
	}
	/* The plan is final here (the fallback above makes it again). What is made lies on the
	 * far side of what the range joins, the moved pieces next to it. */
	make = pl.size - mv;
	unit = piece_unit(pool, make ? make : pool->granularity);
	m.pc = calloc((make + unit - 1) / unit + n_moved, sizeof *m.pc);
	m.orphans = calloc((make + unit - 1) / unit + n_moved, sizeof *m.orphans);
	if (!m.pc || !m.orphans) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail;
	}
	at = pl.at_end ? pl.hole->addr + pl.hole->size - pl.size : pl.hole->addr;
	b = claim(pool, pl.hole, at, pl.size, d, &k, &lv);
	pool->mapping_leaves = lv.n; /* for sop__pool_check meanwhile */
	sop__mutex_drop(&pool->lock);

	r = sop__pool_ctx_push(pool);
	if (r != CUDA_SUCCESS) {
		sop__pool_lock_spun(pool);
	} else {
		/* The device cannot back the full step; it may still back the request, next to
		 * the memory it joins. */
		for (;;) {
			r = make ? pieces_map(pool, &m, pl.at_end ? at + pl.size - mv - make : at + mv,
					      make, unit)
				 : CUDA_SUCCESS;
			if (r != CUDA_ERROR_OUT_OF_MEMORY || m.n || !make || mv + make <= pl.least)
				break;
			make = pl.least > mv ? pl.least - mv : 0;
		}
		if (r == CUDA_SUCCESS)
			r = pieces_remap(pool, &m, pl.at_end ? at + pl.size - mv : at, moved, n_moved);
		else
			pieces_let_go(pool, &m, moved, n_moved);
		n_moved = 0;
		sop__pool_lock_spun(pool);
		if (r == CUDA_SUCCESS) {
			r = access_catch_up(pool, &m);
			if (r == CUDA_SUCCESS && !pieces_link(pool, b->seg, &m))
				r = CUDA_ERROR_OUT_OF_MEMORY;
			if (r != CUDA_SUCCESS)
				pieces_unmake(pool, &m);
		}
		sop__pool_ctx_pop(pool);
	}
	mapped = mv + make;
	va = pl.at_end ? at + pl.size - mapped : at;
	pool->mapping_leaves = 0;
	while (m.n_orphans)
		sop__orphan_keep(pool, m.orphans[--m.n_orphans]);
	fresh = NULL; /* claim_end drops it if nothing was mapped */
	if (r != CUDA_SUCCESS && m.n) {
		/* Pieces the driver would not unmap: the claim stays, so that no growth maps over
		 * them, until a release unmaps them (release.c). */
		sop__stuck_keep(pool, b, pl.size, m.pc, m.n);
		goto fail;
	}
	b = claim_end(pool, b, pl.size, va, r == CUDA_SUCCESS ? mapped : 0, d, &k, &lv);
	if (r != CUDA_SUCCESS)
		goto fail;
	sop__leaves_put(pool, &lv, 0);
	sop__reserved_add(pool, mapped);
	while (k < 3)
		sop__block_delete(pool, d[k++]);
	free(moved);
	free(m.pc);
	free(m.orphans);
	free(m.desc);
	b = sop__heap_put(pool, b);
	sop__bins_remove(&pool->heap, b);
	if (!b->seg->home)
		b->seg->home = ss;
	*out = join_own(pool, ss, b, size, from);
	return CUDA_SUCCESS;
fail:
	moved_drop(pool, moved, n_moved);
	free(moved);
	if (fresh)
		sop__segment_drop(pool, fresh);
	for (; k < 3; k++) /* those before k split the claim */
		if (d[k])
			sop__block_delete(pool, d[k]);
	sop__leaves_put(pool, &lv, 0);
	free(m.pc);
	free(m.orphans);
	free(m.desc);
	return r;
}

/* Wake one request waiting for growth, if any: the next to look at the heap, and to grow if it
 * finds nothing there. One at a time, each passing the turn on once it found its fit or grew:
 * woken all at the end of each growth, all but one of them waited again. The threads
 * workload's sixteen threads on the H100 then waited 240 000 times for 20 000 growths (in
 * the cold start, mostly for growths of other streams' segments, which they could not use),
 * each wait a futex's wake-up and the pool lock taken twice; one at a time, 20 000. */
void
sop__growth_pass(struct sop_pool *pool)
{
	pthread_cond_signal(&pool->grown);
}

CUresult
sop__heap_grow(struct sop_pool *pool, struct sop__sstream *ss, size_t size, uint64_t roomy,
	       struct sop__block **out, struct sop__sstream **from)
{
	CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
	int tries;

	SOP_HELD(&pool->lock);
	/* Torn down (sop__pool_reap) while this request waited for another's growth with the
	 * lock dropped: its reservation and context are gone, and the request fails as calls on
	 * a destroyed pool do. Grown there, it mapped memory into addresses that another pool
	 * may hold by then. */
	if (atomic_load(&pool->dead))
		return CUDA_ERROR_INVALID_VALUE;
	/* One growth at a time: the next one waits for it, with the pool lock dropped, and then
	 * finds what it mapped beyond its request (a step at least) in the heap. Growths made at
	 * once, each for itself, reserved 2.1 times the live peak where sixteen threads run a
	 * stream per task on the H100, against 1.6-1.7 one at a time. */
	/* ss, whose request this is, is not retired while the lock is dropped (retirement runs
	 * under it): the caller goes on with it afterwards. */
	if (ss)
		ss->growing++;
	if (pool->growing) {
		/* Waiting for another thread's growth is meeting it in the pool, as waiting for
		 * the pool lock is (sop__pool_lock_noting): threads that start together on a fresh
		 * pool find the lock free while the first one's growth is in the driver, and left
		 * unnoted, the pool placed their first blocks by best fit alone, in one another's
		 * segments, where their splits and merges share segment locks. */
		if (!atomic_load_explicit(&pool->threads_met, memory_order_relaxed))
			atomic_store_explicit(&pool->threads_met, true, memory_order_relaxed);
		while (pool->growing)
			pthread_cond_wait(&pool->grown, &pool->lock);
		if (ss)
			ss->growing--;
		if (atomic_load(&pool->dead)) {
			sop__growth_pass(pool); /* the next waiter finds it dead too */
			return CUDA_ERROR_INVALID_VALUE;
		}
		return CUDA_ERROR_NOT_READY;
	}
	pool->growing = true;
	/* The plan counts on the blocks next to the hole. Those cached on ss may be taken by
	 * another thread on ss while the driver maps (the pool lock does not keep them): then
	 * the result is too small, goes back, and the plan is made again. */
	for (tries = 0; tries < 4; tries++) {
		r = grow(pool, ss, size, roomy, out, from);
		if (r != CUDA_SUCCESS || (*out)->size >= size)
			break;
		if (*from) {
			sop__lock_take(&ss->lock);
			sop__block_set_owner(*out, ss);
			sop__bins_insert(&ss->cache, *out);
			sop__lock_drop(&ss->lock);
		} else {
			sop__bins_insert(&pool->heap, *out);
		}
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	pool->growing = false;
	sop__growth_pass(pool);
	if (ss)
		ss->growing--;
	return r;
}

bool
sop__segments_disown(struct sop_pool *pool, const struct sop__sstream *ss, size_t used)
{
	struct sop__segment *seg;
	size_t mapped = 0;
	bool any = false;

	for (seg = pool->segments; seg; seg = seg->next)
		if (seg->home == ss) {
			mapped += seg->mapped;
			any = true;
		}
	if (!any)
		return true;
	if (used >= mapped / 2)
		return false;
	for (seg = pool->segments; seg; seg = seg->next)
		if (seg->home == ss)
			seg->home = NULL;
	return true;
}
