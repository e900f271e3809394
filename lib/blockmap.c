/* blockmap.c - the block map: which block starts at an address, answered without a lock.
 *
 * A directory over the pool's reservation with leaves of 512-byte slots where blocks start,
 * written under segment locks with atomic stores, read by frees on any thread; and the spare
 * leaves that segments and the pool keep, so that splitting a block finds a leaf without
 * allocating under a segment lock.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

/* ---- The block map ---------------------------------------------------------------------- */

/* A directory with one entry per SOP_MAP_SPAN of the reservation. An entry is 0 (no block starts in
 * the span), the descriptor of the one block that does (tagged with the low bit), or a leaf of
 * slots, one per 512 bytes, with the count of blocks in its low bits. Blocks of megabytes
 * start a span or more apart: most spans hold one block, and a lookup of it costs one load
 * before the descriptor, which the caller reads anyway. A span that gains a second block gets
 * a leaf, and keeps it until its last block is gone: only a leaf that names no block is ever
 * detached, which makes the lock-free reading below safe. Leaves thus follow the blocks the
 * pool has now, not every address it ever split at (random sizes spread split points over the
 * whole of a segment: leaves kept for all of them grew by a page fault every few operations,
 * a third of the time of a warm pool on the simulated driver).
 *
 * Segments are sized in whole spans, so that each span lies in one segment and its entry and
 * leaf are written under that segment's lock. Detached leaves go to the segment's spares;
 * the pool keeps the rest, under leaf_lock, which a segment takes only to refill or shed in
 * batches. Spares are arrays of pointers: moving a leaf touches none of its lines.
 *
 * A reader without a lock may hold an entry that is stale: a descriptor since absorbed into a
 * neighbour and reused, or a leaf since detached and attached elsewhere. What it finds then
 * names some other block, whose tag (which holds the block's address) tells: sop__map_get
 * checks a lone descriptor's, callers check a slot's as they claim. A block being freed is
 * ALLOC, so its descriptor is not reused and its leaf, which names it, is not detached. Leaves
 * are freed only with the pool. */

#define MAP_LEAF ((size_t)1 << SOP_MAP_LEAF_LOG2)
#define LEAVES_FILL (SOP_LEAVES_KEPT / 4) /* a segment refills its spares to this many */
#define LEAF_SLAB 16 /* leaves per host allocation (the first few fewer: sop__leaves_get) */

typedef _Atomic(struct sop__block *) map_slot;

/* Aligned so that a leaf's entry can hold its count of blocks in the low bits. */
struct sop__map_leaf {
	_Alignas(1024) map_slot slot[MAP_LEAF];
};

/* A slab is n leaves followed by this, on a leaf's alignment: freed with the pool. */
struct sop__leaf_slab {
	struct sop__leaf_slab *next;
	void *mem; /* the allocation: the leaves start there */
};

#define MAP_LONE ((uintptr_t)1)
#define MAP_COUNT_ONE ((uintptr_t)2) /* a leaf entry's count, above the tag bit */
#define MAP_LEAF_BITS ((uintptr_t)_Alignof(struct sop__map_leaf) - 1)

_Static_assert(_Alignof(struct sop__block) > 1, "a descriptor's low bit tags a lone block");
_Static_assert(MAP_LEAF * MAP_COUNT_ONE <= MAP_LEAF_BITS, "a leaf's count fits below it");

static inline struct sop__map_leaf *
entry_leaf(uintptr_t e)
{
	return (struct sop__map_leaf *)(e & ~MAP_LEAF_BITS);
}

static inline unsigned int
entry_count(uintptr_t e)
{
	return e & MAP_LONE ? 1 : (unsigned int)((e & MAP_LEAF_BITS) / MAP_COUNT_ONE);
}

static inline struct sop__block *
entry_lone(uintptr_t e)
{
	return (struct sop__block *)(e & ~MAP_LONE);
}

static inline CUdeviceptr
block_addr_of_tag(const struct sop__block *b)
{
	return (CUdeviceptr)(atomic_load_explicit(&b->tag, memory_order_acquire) >> 3)
	       << SOP_ALIGN_LOG2;
}

static size_t
map_bytes(const struct sop_pool *pool)
{
	return pool->va_size / SOP_MAP_SPAN * sizeof *pool->map_dir;
}

/* Directories of destroyed pools, all 0 again (a pool is destroyed with no segment left),
 * kept for the next pools of the same size: in a fresh mapping every page a pool touches costs
 * a page fault (4 to 5 us on the GPU machine, two of them in a pool's first allocation). */
#define DIR_CACHE 4
static pthread_mutex_t dir_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	void *dir;
	size_t bytes;
} dir_cache[DIR_CACHE];

bool
sop__map_init(struct sop_pool *pool)
{
	size_t bytes = map_bytes(pool);
	void *dir = NULL;
	int i;

	pthread_mutex_lock(&dir_cache_lock);
	for (i = 0; i < DIR_CACHE && !dir; i++) {
		if (dir_cache[i].dir && dir_cache[i].bytes == bytes) {
			dir = dir_cache[i].dir;
			dir_cache[i].dir = NULL;
		}
	}
	pthread_mutex_unlock(&dir_cache_lock);
	if (!dir) {
		/* 8 bytes per 64 KiB: up to 256 MiB for the largest reservation, of which the
		 * system backs only the pages that segments use. */
		dir = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (dir == MAP_FAILED)
			return false;
#ifdef MADV_NOHUGEPAGE
		/* Small pages where transparent huge pages are the default: a pool's first
		 * allocation touches two entries, and huge pages would zero 4 MiB for them. */
		madvise(dir, bytes, MADV_NOHUGEPAGE);
#endif
	}
	pool->map_dir = dir;
	return true;
}

void
sop__map_destroy(struct sop_pool *pool)
{
	struct sop__leaf_slab *s;
	int i;

	if (pool->map_dir) {
		void *dir = (void *)pool->map_dir;

		pthread_mutex_lock(&dir_cache_lock);
		for (i = 0; i < DIR_CACHE && dir; i++) {
			if (!dir_cache[i].dir) {
				dir_cache[i].dir = dir;
				dir_cache[i].bytes = map_bytes(pool);
				dir = NULL;
			}
		}
		pthread_mutex_unlock(&dir_cache_lock);
		if (dir)
			munmap(dir, map_bytes(pool));
	}
	pool->map_dir = NULL;
	while ((s = pool->leaf_slabs)) {
		pool->leaf_slabs = s->next;
		free(s->mem);
	}
	free(pool->leaf_spare);
	pool->leaf_spare = NULL;
	pool->n_leaf_spare = pool->cap_leaf_spare = pool->n_leaves = 0;
}

struct sop__block *
sop__map_get(struct sop_pool *pool, CUdeviceptr addr)
{
	uint64_t key;
	uintptr_t e;

	if (addr < pool->va_base || addr - pool->va_base >= pool->va_size ||
	    (addr & (SOP_ALIGN - 1)))
		return NULL;
	key = (addr - pool->va_base) >> SOP_ALIGN_LOG2;
	e = atomic_load_explicit(&pool->map_dir[key >> SOP_MAP_LEAF_LOG2], memory_order_acquire);
	if (e & MAP_LONE) {
		struct sop__block *b = entry_lone(e);
		return block_addr_of_tag(b) == addr ? b : NULL;
	}
	if (!e)
		return NULL;
	return atomic_load_explicit(&entry_leaf(e)->slot[key & (MAP_LEAF - 1)],
				    memory_order_acquire);
}

long
sop__map_census(struct sop_pool *pool, const struct sop__segment *seg, size_t *leaves)
{
	size_t i, k, first = (seg->va - pool->va_base) / SOP_MAP_SPAN;
	long n = 0;

	for (i = first; i < first + seg->size / SOP_MAP_SPAN; i++) {
		uintptr_t e = atomic_load(&pool->map_dir[i]);
		struct sop__map_leaf *leaf = entry_leaf(e);
		unsigned int used = 0;

		if (!e)
			continue;
		if (e & MAP_LONE) {
			struct sop__block *b = entry_lone(e);
			if (b->seg != seg || (b->addr - pool->va_base) / SOP_MAP_SPAN != i)
				return -1;
			n++;
			continue;
		}
		for (k = 0; k < MAP_LEAF; k++) {
			struct sop__block *b = atomic_load(&leaf->slot[k]);
			if (!b)
				continue;
			if (b->addr != pool->va_base + (i * MAP_LEAF + k) * SOP_ALIGN || b->seg != seg)
				return -1;
			used++;
		}
		if (!used || used != entry_count(e))
			return -1;
		n += used;
		++*leaves;
	}
	return n;
}

size_t
sop__map_spare_leaves(struct sop_pool *pool)
{
	size_t n;

	sop__lock_take(&pool->leaf_lock);
	n = pool->n_leaf_spare;
	sop__lock_drop(&pool->leaf_lock);
	return n;
}

int
sop__map_span(struct sop_pool *pool, CUdeviceptr addr, unsigned int *count)
{
	uintptr_t e = atomic_load(&pool->map_dir[(addr - pool->va_base) / SOP_MAP_SPAN]);

	*count = e ? entry_count(e) : 0;
	return !e ? 0 : e & MAP_LONE ? 1 : 2;
}

/* Bring to up to want spare leaves (at least need) from the pool's, making more if it has
 * none. False only for lack of host memory. */
bool
sop__leaves_get(struct sop_pool *pool, struct sop__leaves *to, unsigned int need, unsigned int want)
{
	sop__lock_take(&pool->leaf_lock);
	while (to->n < want) {
		/* As many leaves as the pool has (2 at first), up to LEAF_SLAB: a pool's first
		 * growth then zeroes 2 KiB, not 16 (page faults; see slab_blocks). */
		size_t i, n = pool->n_leaves < 2 ? 2 : pool->n_leaves < LEAF_SLAB ? pool->n_leaves
										   : LEAF_SLAB;
		struct sop__map_leaf *leaf;
		struct sop__leaf_slab *s;

		if (pool->n_leaf_spare) {
			to->v[to->n++] = pool->leaf_spare[--pool->n_leaf_spare];
			continue;
		}
		/* Room for every leaf made, so that sop__leaves_put cannot fail. */
		if (pool->cap_leaf_spare < pool->n_leaves + n) {
			size_t cap = pool->cap_leaf_spare * 2 + LEAF_SLAB;
			struct sop__map_leaf **v = realloc(pool->leaf_spare, cap * sizeof *v);
			if (!v)
				break;
			pool->leaf_spare = v;
			pool->cap_leaf_spare = cap;
		}
		leaf = aligned_alloc(_Alignof(struct sop__map_leaf), (n + 1) * sizeof *leaf);
		if (!leaf)
			break;
		memset(leaf, 0, n * sizeof *leaf);
		s = (struct sop__leaf_slab *)&leaf[n];
		s->mem = leaf;
		s->next = pool->leaf_slabs;
		pool->leaf_slabs = s;
		pool->n_leaves += n;
		for (i = 0; i < n; i++)
			pool->leaf_spare[pool->n_leaf_spare++] = &leaf[i];
	}
	sop__lock_drop(&pool->leaf_lock);
	return to->n >= need;
}

/* Give the pool all but keep of from's spare leaves. The pool's array has room for every leaf
 * it made. */
void
sop__leaves_put(struct sop_pool *pool, struct sop__leaves *from, unsigned int keep)
{
	sop__lock_take(&pool->leaf_lock);
	while (from->n > keep)
		pool->leaf_spare[pool->n_leaf_spare++] = from->v[--from->n];
	sop__lock_drop(&pool->leaf_lock);
}

/* Take seg's lock with n spare leaves on hand, so that up to n slots can be set under it. */
bool
sop__segment_lock_leaves(struct sop_pool *pool, struct sop__segment *seg, unsigned int n)
{
	sop__segment_lock(seg);
	if (SOP_LIKELY(seg->leaves.n >= n) || sop__leaves_get(pool, &seg->leaves, n, LEAVES_FILL))
		return true;
	sop__lock_drop(&seg->lock);
	return false;
}

/* Whether a block from addr to end is the only one that starts in addr's span, known from
 * the block before it, which starts at prev: in an earlier span, so that nothing starts in
 * this one before addr, and with the block reaching the span's end, so that nothing starts in
 * it after. Then a split that makes the block finds the span's entry empty, and writes it
 * without reading it: with large blocks the entries splits touch are far apart and their
 * lines long out of the cache. (A merge that removes such a block must read the entry: a
 * span's last block may still be in the leaf its second one brought.) */
static inline bool
span_alone(const struct sop_pool *pool, CUdeviceptr prev, CUdeviceptr addr, CUdeviceptr end)
{
	size_t i = (addr - pool->va_base) / SOP_MAP_SPAN;

	return (prev - pool->va_base) / SOP_MAP_SPAN != i &&
	       end - pool->va_base >= (i + 1) * SOP_MAP_SPAN;
}

/* Note b, a block that starts at addr where none did. A span's second block brings a leaf,
 * from spares, which the caller has made sure holds one for each block it may add. A slot is
 * known to be empty, so it is only written: in a leaf just attached its line is cold, and the
 * store does not wait for it. Segment lock held. */
void
sop__map_add(struct sop_pool *pool, struct sop__leaves *spares, CUdeviceptr addr,
	     struct sop__block *b)
{
	uint64_t key = (addr - pool->va_base) >> SOP_ALIGN_LOG2;
	size_t i = key >> SOP_MAP_LEAF_LOG2;
	uintptr_t e = atomic_load_explicit(&pool->map_dir[i], memory_order_relaxed);
	struct sop__map_leaf *leaf;

	if (!e) {
		atomic_store_explicit(&pool->map_dir[i], (uintptr_t)b | MAP_LONE,
				      memory_order_release);
		return;
	}
	if (e & MAP_LONE) {
		struct sop__block *lone = entry_lone(e);
		leaf = spares->v[--spares->n];
		atomic_store_explicit(&leaf->slot[(lone->addr - pool->va_base) / SOP_ALIGN &
						  (MAP_LEAF - 1)],
				      lone, memory_order_relaxed);
		atomic_store_explicit(&leaf->slot[key & (MAP_LEAF - 1)], b, memory_order_relaxed);
		atomic_store_explicit(&pool->map_dir[i], (uintptr_t)leaf + 2 * MAP_COUNT_ONE,
				      memory_order_release);
		return;
	}
	atomic_store_explicit(&entry_leaf(e)->slot[key & (MAP_LEAF - 1)], b, memory_order_release);
	atomic_store_explicit(&pool->map_dir[i], e + MAP_COUNT_ONE, memory_order_release);
}

/* Forget the block that starts at addr, in seg. A leaf left naming no block goes to seg's
 * spares. Segment lock held. */
void
sop__map_remove(struct sop_pool *pool, struct sop__segment *seg, CUdeviceptr addr)
{
	uint64_t key = (addr - pool->va_base) >> SOP_ALIGN_LOG2;
	size_t i = key >> SOP_MAP_LEAF_LOG2;
	uintptr_t e = atomic_load_explicit(&pool->map_dir[i], memory_order_relaxed);
	struct sop__map_leaf *leaf = entry_leaf(e);

	SOP_HELD(&seg->lock);
	if (e & MAP_LONE) {
		atomic_store_explicit(&pool->map_dir[i], 0, memory_order_release);
		return;
	}
	atomic_store_explicit(&leaf->slot[key & (MAP_LEAF - 1)], NULL, memory_order_release);
	if (entry_count(e) > 1) {
		atomic_store_explicit(&pool->map_dir[i], e - MAP_COUNT_ONE, memory_order_release);
		return;
	}
	atomic_store_explicit(&pool->map_dir[i], 0, memory_order_release);
	if (seg->leaves.n == SOP_LEAVES_KEPT)
		sop__leaves_put(pool, &seg->leaves, LEAVES_FILL);
	seg->leaves.v[seg->leaves.n++] = leaf;
}

/* Link rest, a fresh descriptor, as the part of b beyond size bytes, in b's state; its map
 * slot's leaf, if it needs one, comes from spares. Segment lock held. */
void
sop__block_split(struct sop_pool *pool, struct sop__block *b, struct sop__block *rest, size_t size,
		 enum sop__state state, struct sop__leaves *spares)
{
	SOP_HELD(&b->seg->lock);
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
	if (span_alone(pool, b->addr, rest->addr, rest->addr + rest->size))
		atomic_store_explicit(&pool->map_dir[(rest->addr - pool->va_base) / SOP_MAP_SPAN],
				      (uintptr_t)rest | MAP_LONE, memory_order_release);
	else
		sop__map_add(pool, spares, rest->addr, rest);
}
