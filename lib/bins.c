/* bins.c - segregated-fit free lists, as in TLSF (Masmano et al.; mattconte/tlsf).
 *
 * A size maps to a first-level index (its power of two) and a second-level index (which of 32
 * equal slices of that power it falls in); sizes below 16 KiB map linearly into the first row.
 * Two bitmaps say which lists are non-empty, so finding a list whose every block fits is two bit
 * scans. The lists hold block descriptors by their free_prev/free_next links; the bins know
 * nothing of block state, segments or locks. The pool heap and every stream cache are bins.
 */
#include "internal.h"

static inline unsigned
msb64(uint64_t x)
{
	return 63u - (unsigned)__builtin_clzll(x);
}

void
sop__bins_index(size_t size, unsigned *fl, unsigned *sl)
{
	if (size < ((size_t)1 << SOP_FL_SHIFT)) {
		*fl = 0;
		*sl = (unsigned)(size >> SOP_ALIGN_LOG2);
	} else {
		unsigned m = msb64(size);
		*fl = m - SOP_FL_SHIFT + 1;
		*sl = (unsigned)(size >> (m - SOP_SL_LOG2)) & (SOP_SL_COUNT - 1);
	}
}

/* The first list whose every block holds size bytes: round size up to the next list start. */
static void
search_index(size_t size, unsigned *fl, unsigned *sl)
{
	if (size >= ((size_t)1 << SOP_FL_SHIFT)) {
		size_t round = ((size_t)1 << (msb64(size) - SOP_SL_LOG2)) - 1;
		size += round;
	}
	sop__bins_index(size, fl, sl);
}

void
sop__bins_insert(struct sop__bins *bins, struct sop__block *b)
{
	unsigned fl, sl;
	struct sop__block *head;

	sop__bins_index(b->size, &fl, &sl);
	head = bins->head[fl][sl];
	b->free_prev = NULL;
	b->free_next = head;
	if (head)
		head->free_prev = b;
	bins->head[fl][sl] = b;
	if (!(bins->fl_bitmap >> fl & 1)) {
		bins->fl_bitmap |= (uint64_t)1 << fl;
		atomic_store_explicit(&bins->fl_hint, bins->fl_bitmap, memory_order_relaxed);
	}
	bins->sl_bitmap[fl] |= 1u << sl;
	bins->n_blocks++;
	__atomic_store_n(&bins->n_bytes, bins->n_bytes + b->size, __ATOMIC_RELAXED);
}

void
sop__bins_remove(struct sop__bins *bins, struct sop__block *b)
{
	unsigned fl, sl;

	sop__bins_index(b->size, &fl, &sl);
	if (b->free_prev)
		b->free_prev->free_next = b->free_next;
	else
		bins->head[fl][sl] = b->free_next;
	if (b->free_next)
		b->free_next->free_prev = b->free_prev;
	if (!bins->head[fl][sl]) {
		bins->sl_bitmap[fl] &= ~(1u << sl);
		if (!bins->sl_bitmap[fl]) {
			bins->fl_bitmap &= ~((uint64_t)1 << fl);
			atomic_store_explicit(&bins->fl_hint, bins->fl_bitmap,
					      memory_order_relaxed);
		}
	}
	b->free_prev = b->free_next = NULL;
	bins->n_blocks--;
	__atomic_store_n(&bins->n_bytes, bins->n_bytes - b->size, __ATOMIC_RELAXED);
}

/* The head of the first non-empty list at or after (fl, sl), or NULL. */
static struct sop__block *
first_from(struct sop__bins *bins, unsigned fl, unsigned sl)
{
	uint32_t sl_map;
	uint64_t fl_map;

	if (fl >= SOP_FL_COUNT)
		return NULL;
	sl_map = sl < SOP_SL_COUNT ? bins->sl_bitmap[fl] & (~0u << sl) : 0;
	if (!sl_map) {
		fl_map = fl + 1 < 64 ? bins->fl_bitmap & (~(uint64_t)0 << (fl + 1)) : 0;
		if (!fl_map)
			return NULL;
		fl = (unsigned)__builtin_ctzll(fl_map);
		sl_map = bins->sl_bitmap[fl];
	}
	sl = (unsigned)__builtin_ctz(sl_map);
	return bins->head[fl][sl];
}

struct sop__block *
sop__bins_find(struct sop__bins *bins, size_t size)
{
	unsigned fl, sl;

	search_index(size, &fl, &sl);
	return first_from(bins, fl, sl);
}

struct sop__block *
sop__bins_scan(struct sop__bins *bins, size_t size, unsigned *probes,
	       bool (*pick)(const struct sop__block *b, const void *arg), const void *arg)
{
	unsigned fl, sl;

	search_index(size, &fl, &sl);
	for (;;) {
		struct sop__block *b = first_from(bins, fl, sl);

		if (!b)
			return NULL;
		sop__bins_index(b->size, &fl, &sl);
		for (; b; b = b->free_next) {
			if (!*probes)
				return NULL;
			--*probes;
			if (pick(b, arg))
				return b;
		}
		if (++sl == SOP_SL_COUNT) {
			sl = 0;
			fl++;
		}
	}
}

struct sop__block *
sop__bins_find_lowest(struct sop__bins *bins, size_t size, unsigned probes)
{
	struct sop__block *best = NULL, *b;
	unsigned fl, sl;

	search_index(size, &fl, &sl);
	while (probes && (b = first_from(bins, fl, sl))) {
		sop__bins_index(b->size, &fl, &sl);
		for (; b && probes; b = b->free_next, probes--)
			if (!best || b->addr < best->addr)
				best = b;
		if (++sl == SOP_SL_COUNT) {
			sl = 0;
			fl++;
		}
	}
	return best;
}

/* How many blocks of the request's own list the hot path looks at before moving on. */
#define CLOSE_PROBES 4

struct sop__block *
sop__bins_find_close(struct sop__bins *bins, size_t size, size_t limit)
{
	unsigned fl, sl, n;
	struct sop__block *b;

	sop__bins_index(size, &fl, &sl);
	b = bins->head[fl][sl];
	for (n = 0; b && n < CLOSE_PROBES; n++, b = b->free_next) {
		if (b->size >= size && b->size <= limit)
			return b;
	}
	b = sop__bins_find(bins, size);
	return b && b->size <= limit ? b : NULL;
}

bool
sop__bins_list_empty(const struct sop__bins *bins, size_t size)
{
	unsigned fl, sl;

	sop__bins_index(size, &fl, &sl);
	return !bins->head[fl][sl];
}

bool
sop__bins_hint_smaller(struct sop__bins *bins, size_t size, size_t have)
{
	uint64_t hint = atomic_load_explicit(&bins->fl_hint, memory_order_relaxed);
	unsigned lo, hi, sl;

	search_index(size, &lo, &sl);
	sop__bins_index(have, &hi, &sl);
	return lo < hi && (hint & (((uint64_t)1 << hi) - ((uint64_t)1 << lo)));
}
