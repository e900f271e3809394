/* check.c - sop__pool_check: walk every structure of a pool and check its invariants.
 *
 * Tests call it after every operation; it is the definition of a consistent pool:
 *  - segments are in address order, inside the reservation, not overlapping; their pieces are
 *    in address order inside them, in whole granules, and add up to the reserved statistic;
 *  - blocks tile each segment exactly, with consistent neighbour links, 512-byte sizes, tags that
 *    match their address, and a map entry at their start;
 *  - the HOLE blocks are exactly the parts of a segment that no piece backs, each on the pool's
 *    list of holes; no two FREE blocks, and no two HOLE blocks, are neighbours;
 *  - the heap holds exactly the FREE blocks, each stream cache exactly the CACHED blocks of that
 *    stream, every block in the list its size maps to, and the bitmaps (and the lock-free
 *    hint) say which lists are non-empty;
 *  - used memory is the sum of the requested bytes of ALLOC blocks; the watermarks are at least
 *    the current values.
 * test/checker.c breaks a live pool against each of these on purpose and expects the walk to fail.
 */
#include "internal.h"

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			line = __LINE__;                                                           \
			goto out;                                                                  \
		}                                                                                  \
	} while (0)

/* A stream's spare descriptors: n_spare of them, the last one spare_last. Stream lock held. */
static int
spares_check(const struct sop__sstream *ss)
{
	const struct sop__block *b, *last = NULL;
	unsigned n = 0;
	int line = 0;

	for (b = ss->spare; b && n <= ss->n_spare; b = b->free_next) {
		last = b;
		n++;
	}
	CHECK(n == ss->n_spare && last == ss->spare_last);
out:
	return line;
}

/* The pool's spare descriptors: chains, each as long as its first descriptor says and ending
 * where it says, every descriptor in them dead. Pool lock held. */
static int
spare_chains_check(const struct sop_pool *pool)
{
	const struct sop__block *h = pool->spare, *b, *last;
	uint64_t n;
	int line = 0;

	while (h) {
		CHECK(h->seq >= 1);
		for (b = h, n = 0, last = NULL; b && n < h->seq; b = b->free_next, n++) {
			CHECK(sop__block_state(b) == SOP_BLOCK_DEAD);
			last = b;
		}
		CHECK(n == h->seq && last == h->free_prev);
		h = last->free_next;
	}
out:
	return line;
}

/* Check one set of bins; every block in it must satisfy want_state (and owner, if given).
 * Returns 0 or the failing line. */
static int
bins_check(struct sop__bins *bins, enum sop__state want_state, struct sop__sstream *owner)
{
	size_t n = 0, bytes = 0;
	unsigned fl, sl, bfl, bsl;
	struct sop__block *b;
	int line = 0;

	for (fl = 0; fl < SOP_FL_COUNT; fl++) {
		CHECK(!!(bins->fl_bitmap >> fl & 1) == !!bins->sl_bitmap[fl]);
		for (sl = 0; sl < SOP_SL_COUNT; sl++) {
			CHECK(!!(bins->sl_bitmap[fl] >> sl & 1) == !!bins->head[fl][sl]);
			for (b = bins->head[fl][sl]; b; b = b->free_next) {
				CHECK(sop__block_state(b) == want_state);
				CHECK(!owner || sop__block_owner(b) == owner);
				sop__bins_index(b->size, &bfl, &bsl);
				CHECK(bfl == fl && bsl == sl);
				CHECK(!b->free_next || b->free_next->free_prev == b);
				n++;
				bytes += b->size;
			}
		}
	}
	CHECK(n == bins->n_blocks && bytes == bins->n_bytes);
	CHECK(atomic_load(&bins->fl_hint) == bins->fl_bitmap);
out:
	return line;
}

int
sop__pool_check(struct sop_pool *pool)
{
	size_t reserved = 0, n_free = 0, n_cached = 0, n_cached_streams = 0, leaves = 0;
	uint64_t used = 0;
	size_t n_holes = 0, n_claims = 0, all_claims = 0, k;
	struct sop__segment *seg, *prev_seg = NULL;
	struct sop__sstream *ss;
	struct sop__block *b;
	int line = 0;

	if (!pool)
		return 0;
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	if (atomic_load(&pool->dead))
		goto out;
	for (seg = pool->segments; seg; prev_seg = seg, seg = seg->next) {
		CUdeviceptr end = seg->va;
		long n_blocks = 0;

		CHECK(seg->prev == prev_seg);
		CHECK(seg->va >= pool->va_base && seg->va + seg->size <= pool->va_base + pool->va_size);
		CHECK(!prev_seg || prev_seg->va + prev_seg->size <= seg->va);
		CHECK(seg->size && seg->size % pool->granularity == 0);
		CHECK(seg->first && !seg->first->phys_prev);
		/* A segment with nothing mapped lives only while a growth maps in it. */
		CHECK((seg->n_pieces || seg->claims) && seg->n_pieces <= seg->cap_pieces &&
		      (seg->mapped || seg->claims));
		{
			size_t mapped = 0, i;
			CUdeviceptr after = seg->va;

			/* In address order (release bisects the array), not overlapping. */
			for (i = 0; i < seg->n_pieces; i++) {
				struct sop__piece *pc = seg->pieces[i];
				CHECK(pc->va >= after && pc->va + pc->size <= seg->va + seg->size);
				CHECK(pc->size && pc->size % pool->granularity == 0 &&
				      (pc->va - pool->va_base) % pool->granularity == 0);
				after = pc->va + pc->size;
				mapped += pc->size;
			}
			CHECK(mapped == seg->mapped);
			reserved += mapped;
		}
		for (b = seg->first; b; b = b->phys_next) {
			enum sop__state st = sop__block_state(b);
			bool backed = false;
			size_t i;

			/* Backed whole by pieces, or by none at all (a HOLE). */
			{
				CUdeviceptr at = b->addr, bend = b->addr + b->size;
				for (i = 0; i < seg->n_pieces && at < bend; i++) {
					struct sop__piece *pc = seg->pieces[i];
					if (pc->va + pc->size <= at)
						continue;
					if (pc->va > at)
						break;
					at = pc->va + pc->size;
				}
				backed = at >= bend;
				for (i = 0; i < seg->n_pieces; i++) {
					struct sop__piece *pc = seg->pieces[i];
					if (st == SOP_BLOCK_HOLE || st == SOP_BLOCK_MAPPING)
						CHECK(pc->va + pc->size <= b->addr ||
						      pc->va >= bend);
				}
			}
			CHECK(st == SOP_BLOCK_HOLE || st == SOP_BLOCK_MAPPING || backed);

			CHECK(b->addr == end && b->seg == seg);
			CHECK(b->size && b->size % SOP_ALIGN == 0);
			CHECK(atomic_load(&b->tag) == sop__tag(b->addr, st));
			CHECK(sop__map_get(pool, b->addr) == b);
			CHECK(!b->phys_next || b->phys_next->phys_prev == b);
			CHECK(st == SOP_BLOCK_FREE || st == SOP_BLOCK_ALLOC || st == SOP_BLOCK_CACHED ||
			      st == SOP_BLOCK_HOLE || (st == SOP_BLOCK_MAPPING && seg->claims));
			if (st == SOP_BLOCK_HOLE) {
				struct sop__block *h;
				CHECK(!b->phys_next || sop__block_state(b->phys_next) != SOP_BLOCK_HOLE);
				for (h = pool->holes; h && h != b; h = h->free_next)
					;
				CHECK(h == b);
				n_holes++;
			} else if (st == SOP_BLOCK_FREE) {
				CHECK(!b->phys_next || sop__block_state(b->phys_next) != SOP_BLOCK_FREE);
				n_free++;
			} else if (st == SOP_BLOCK_MAPPING) {
				n_claims++;
			} else if (st == SOP_BLOCK_ALLOC) {
				CHECK(b->req && b->req <= b->size);
				used += b->req;
			} else {
				CHECK(sop__block_owner(b) && sop__block_owner(b)->pool == pool);
				n_cached++;
			}
			end += b->size;
			n_blocks++;
		}
		CHECK(end == seg->va + seg->size);
		CHECK(n_claims == seg->claims); /* a growth's claim is one block */
		all_claims += n_claims;
		n_claims = 0;
		/* The map holds these blocks and nothing else in the segment's range. */
		CHECK(sop__map_census(pool, seg, &leaves) == n_blocks);
		leaves += seg->leaves.n;
	}
	/* Every leaf made is attached, or a segment's spare, or the pool's, or held by the growth
	 * in flight: none is lost. */
	CHECK(leaves + sop__map_spare_leaves(pool) + pool->mapping_leaves == pool->n_leaves);
	for (b = pool->holes; b; b = b->free_next)
		n_holes--;
	CHECK(n_holes == 0);
	{
		/* Every claim is the growth in flight's or one whose unmaps are owed, and those
		 * count in mapping. */
		const struct sop__stuck *st;
		size_t n_stuck = 0, stuck_bytes = 0;

		for (st = pool->stuck; st; st = st->next) {
			CHECK(st->n && sop__block_state(st->claim) == SOP_BLOCK_MAPPING &&
			      st->claim->size == st->size);
			n_stuck++;
			stuck_bytes += st->size;
		}
		CHECK(all_claims == n_stuck + (pool->growing && pool->mapping > stuck_bytes));
		CHECK(pool->mapping >= stuck_bytes);
	}
	/* An imported pool's pieces: in address order, apart, referenced (or kept, their unmap
	 * refused), and in the statistic. */
	for (k = 0; pool->import && k < pool->import->n_pieces; k++) {
		const struct sop__piece *pc = pool->import->pieces[k];
		CHECK((pc->refs > 0 || pool->import->kept) && pc->va >= pool->va_base &&
		      pc->va + pc->size <= pool->va_base + pool->va_size);
		CHECK(!k || pool->import->pieces[k - 1]->va + pool->import->pieces[k - 1]->size <=
				    pc->va);
		reserved += pc->size;
	}
	CHECK(reserved == atomic_load(&pool->reserved));
	CHECK(reserved <= atomic_load(&pool->reserved_high));
	CHECK(!pool->max_size || reserved + pool->mapping <= pool->max_size);
	CHECK(used == sop__pool_used(pool, SOP_FOLD_NONE));
	{
		/* The watermark, folded or still in the shards, is at least the current value. */
		int64_t hw = pool->retired_hw;
		for (ss = pool->streams; ss; ss = ss->next) {
			sop__lock_take(&ss->lock);
			hw += ss->used_hw;
			sop__lock_drop(&ss->lock);
		}
		CHECK(used <= pool->used_high || (int64_t)used <= hw);
	}
	line = bins_check(&pool->heap, SOP_BLOCK_FREE, NULL);
	if (line)
		goto out;
	CHECK(pool->heap.n_blocks == n_free);
	for (ss = pool->streams; ss; ss = ss->next) {
		CHECK(ss->pool == pool && ss->id);
		sop__lock_take(&ss->lock);
		line = bins_check(&ss->cache, SOP_BLOCK_CACHED, ss);
		n_cached_streams += ss->cache.n_blocks;
		if (!line)
			line = spares_check(ss);
		sop__lock_drop(&ss->lock);
		if (line)
			goto out;
	}
	CHECK(n_cached == n_cached_streams);
	line = spare_chains_check(pool);
out:
	sop__mutex_drop(&pool->lock);
	return line;
}
