/* heap.c - blocks, segments, pieces and the pool-wide heap.
 *
 * A pool reserves one large range of virtual addresses. Segments are runs of it that blocks
 * tile, never crossing a segment's ends; physical memory is mapped into them in pieces (one
 * cuMemCreate handle each, mapped and released whole), and what no piece backs is a HOLE block.
 * Blocks cross piece boundaries freely. Growth maps a piece where it joins free memory if that
 * maps less; a piece that FREE blocks cover whole is idle and can be released on its own,
 * leaving a hole. FREE blocks sit in the pool heap (bins.c) and are merged with FREE neighbours
 * as they arrive; CACHED blocks belong to a stream (stream.c), which splits and merges them
 * under its own lock and the segment's.
 *
 * The block map answers "which block starts at this address" without a lock: a directory over
 * the reservation with leaves of 512-byte slots where blocks start, written under segment
 * locks with atomic stores, read by frees on any thread.
 *
 * The growth and release paths run with the pool lock held.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

/* ---- Descriptors ------------------------------------------------------------------------ */

#define SLAB_BLOCKS 256

/* A pool's first slabs are small (16, then 64 descriptors), so that its first allocation
 * zeroes a page of fresh host memory rather than eight: each first touch of a page is a fault
 * that costs microseconds, and eight of them were half of sop's own time in that allocation. */
static size_t
slab_blocks(const struct sop_pool *pool)
{
	return pool->n_slabs >= 2 ? SLAB_BLOCKS : SLAB_BLOCKS >> (4 - 2 * pool->n_slabs);
}

static bool
slab_add(struct sop_pool *pool)
{
	size_t i, n = slab_blocks(pool);
	struct sop__block *slab;

	if (pool->n_slabs == pool->cap_slabs) {
		size_t cap = pool->cap_slabs ? pool->cap_slabs * 2 : 8;
		void **slabs = realloc(pool->slabs, cap * sizeof *slabs);
		if (!slabs)
			return false;
		pool->slabs = slabs;
		pool->cap_slabs = cap;
	}
	slab = aligned_alloc(_Alignof(struct sop__block), n * sizeof *slab);
	if (!slab)
		return false;
	memset(slab, 0, n * sizeof *slab);
	pool->slabs[pool->n_slabs++] = slab;
	for (i = 0; i < n; i++) {
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
	/* Spares are a list through cold descriptors: fetch the next one's line now, so that the
	 * next call does not stall on it. */
	if (pool->spare)
		__builtin_prefetch(pool->spare, 1);
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

/* A directory with one entry per MAP_SPAN of the reservation. An entry is 0 (no block starts in
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
#define MAP_SPAN (SOP_ALIGN << SOP_MAP_LEAF_LOG2)
#define LEAVES_FILL (SOP_LEAVES_KEPT / 4) /* a segment refills its spares to this many */
#define LEAF_SLAB 16 /* leaves per host allocation (the first few fewer: leaves_get) */

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
	return pool->va_size / MAP_SPAN * sizeof *pool->map_dir;
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
	size_t i, k, first = (seg->va - pool->va_base) / MAP_SPAN;
	long n = 0;

	for (i = first; i < first + seg->size / MAP_SPAN; i++) {
		uintptr_t e = atomic_load(&pool->map_dir[i]);
		struct sop__map_leaf *leaf = entry_leaf(e);
		unsigned int used = 0;

		if (!e)
			continue;
		if (e & MAP_LONE) {
			struct sop__block *b = entry_lone(e);
			if (b->seg != seg || (b->addr - pool->va_base) / MAP_SPAN != i)
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
	uintptr_t e = atomic_load(&pool->map_dir[(addr - pool->va_base) / MAP_SPAN]);

	*count = e ? entry_count(e) : 0;
	return !e ? 0 : e & MAP_LONE ? 1 : 2;
}

/* Bring to up to want spare leaves (at least need) from the pool's, making more if it has
 * none. False only for lack of host memory. */
static bool
leaves_get(struct sop_pool *pool, struct sop__leaves *to, unsigned int need, unsigned int want)
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
		/* Room for every leaf made, so that leaves_put cannot fail. */
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
static void
leaves_put(struct sop_pool *pool, struct sop__leaves *from, unsigned int keep)
{
	sop__lock_take(&pool->leaf_lock);
	while (from->n > keep)
		pool->leaf_spare[pool->n_leaf_spare++] = from->v[--from->n];
	sop__lock_drop(&pool->leaf_lock);
}

/* Take seg's lock with n spare leaves on hand, so that up to n slots can be set under it. */
static bool
segment_lock_leaves(struct sop_pool *pool, struct sop__segment *seg, unsigned int n)
{
	sop__segment_lock(seg);
	if (SOP_LIKELY(seg->leaves.n >= n) || leaves_get(pool, &seg->leaves, n, LEAVES_FILL))
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
	size_t i = (addr - pool->va_base) / MAP_SPAN;

	return (prev - pool->va_base) / MAP_SPAN != i &&
	       end - pool->va_base >= (i + 1) * MAP_SPAN;
}

/* Note b, a block that starts at addr where none did. A span's second block brings a leaf,
 * from spares, which the caller has made sure holds one for each block it may add. A slot is
 * known to be empty, so it is only written: in a leaf just attached its line is cold, and the
 * store does not wait for it. Segment lock held. */
static void
map_add(struct sop_pool *pool, struct sop__leaves *spares, CUdeviceptr addr, struct sop__block *b)
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
static void
map_remove(struct sop_pool *pool, struct sop__segment *seg, CUdeviceptr addr)
{
	uint64_t key = (addr - pool->va_base) >> SOP_ALIGN_LOG2;
	size_t i = key >> SOP_MAP_LEAF_LOG2;
	uintptr_t e = atomic_load_explicit(&pool->map_dir[i], memory_order_relaxed);
	struct sop__map_leaf *leaf = entry_leaf(e);

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
		leaves_put(pool, &seg->leaves, LEAVES_FILL);
	seg->leaves.v[seg->leaves.n++] = leaf;
}

/* ---- Split and merge -------------------------------------------------------------------- */

/* Link rest, a fresh descriptor, as the part of b beyond size bytes, in b's state; its map
 * slot's leaf, if it needs one, comes from spares. Segment lock held. */
static void
block_split(struct sop_pool *pool, struct sop__block *b, struct sop__block *rest, size_t size,
	    enum sop__state state, struct sop__leaves *spares)
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
	if (span_alone(pool, b->addr, rest->addr, rest->addr + rest->size))
		atomic_store_explicit(&pool->map_dir[(rest->addr - pool->va_base) / MAP_SPAN],
				      (uintptr_t)rest | MAP_LONE, memory_order_release);
	else
		map_add(pool, spares, rest->addr, rest);
}

void
sop__block_carve(struct sop_pool *pool, struct sop__block *b, size_t size,
		 struct sop__sstream *from, bool from_held)
{
	struct sop__block *rest;
	enum sop__state state = sop__block_state(b);

	if (b->size - size < SOP_ALIGN)
		return;
	/* A descriptor and a map slot are needed; without host memory the block is handed out
	 * whole, which wastes device memory but stays correct. */
	rest = sop__block_new(pool);
	if (!rest)
		return;
	if (!segment_lock_leaves(pool, b->seg, 1)) {
		sop__block_delete(pool, rest);
		return;
	}
	block_split(pool, b, rest, size, state, &b->seg->leaves);
	sop__lock_drop(&b->seg->lock);
	if (state == SOP_BLOCK_CACHED) {
		if (!from_held)
			sop__lock_take(&from->lock);
		sop__block_set_owner(rest, from);
		sop__bins_insert(&from->cache, rest);
		if (!from_held)
			sop__lock_drop(&from->lock);
	} else {
		sop__block_set_owner(rest, sop__block_owner(b));
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
	if (!rest || !segment_lock_leaves(pool, b->seg, 1))
		return false;
	sop__bins_remove(&ss->cache, b);
	ss->spare = rest->free_next;
	if (ss->spare)
		__builtin_prefetch(ss->spare, 1);
	ss->n_spare--;
	rest->free_next = NULL;
	block_split(pool, b, rest, size, SOP_BLOCK_CACHED, &b->seg->leaves);
	sop__lock_drop(&b->seg->lock);
	sop__block_set_owner(rest, ss);
	sop__bins_insert(&ss->cache, rest);
	return true;
}

void
sop__block_absorb_next(struct sop_pool *pool, struct sop__block *b, struct sop__block **spare)
{
	struct sop__block *n = b->phys_next;

	map_remove(pool, b->seg, n->addr);
	b->size += n->size;
	b->phys_next = n->phys_next;
	if (n->phys_next)
		sop__link_set(&n->phys_next->phys_prev, b);
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

/* Whether b is FREE memory that came from ss's own cache, which a block ss frees next to it
 * takes back. Exact with the pool and segment locks held; a peek without them. */
static inline bool
reclaimable(struct sop__block *b, struct sop__sstream *ss)
{
	return b && sop__block_state(b) == SOP_BLOCK_FREE && sop__block_owner(b) == ss;
}

/* Take the pool lock if ss may take back FREE memory next to a block it frees: only while one
 * thread uses the pool (trying the lock, never waiting for it, out of order under ss's), ss is
 * the stream that last took memory from the heap, and no other stream holds cached memory.
 * Joined to the cached block, that memory is pending on ss until ss's frees are seen complete:
 * another stream that came for it would grow the pool instead (a stream that only allocates,
 * handing its blocks to one that frees them, grew without end when the freeing stream took
 * back what its probes had returned). Apart, the FREE memory and the stream's cached blocks
 * are two sets of pieces, and a request that fits neither alone splits a large one or grows
 * (replaying a training step, a 512 MiB block found the previous step's cut up by the next
 * forward pass's activations). */
static bool
reclaim_begin(struct sop_pool *pool, struct sop__sstream *ss)
{
	/* A look first, so that the free of a stream that may not take back (say, one freeing
	 * what another allocates) does not try the lock each time; then again under it. */
	if (atomic_load_explicit(&pool->threads_met, memory_order_relaxed) ||
	    atomic_load_explicit(&pool->heap_user, memory_order_relaxed) != ss ||
	    pthread_mutex_trylock(&pool->lock))
		return false;
	if (atomic_load_explicit(&pool->heap_user, memory_order_relaxed) == ss &&
	    !sop__others_cache(pool, ss, 1))
		return true;
	pthread_mutex_unlock(&pool->lock);
	return false;
}

struct sop__block *
sop__block_merge_own(struct sop_pool *pool, struct sop__sstream *ss, struct sop__block *b)
{
	struct sop__block *p = sop__link_peek(&b->phys_prev), *n = sop__link_peek(&b->phys_next);
	struct sop__segment *seg = b->seg;
	bool reclaim = (reclaimable(n, ss) || reclaimable(p, ss)) && reclaim_begin(pool, ss);

	/* A look without the segment lock first, so that a free with nothing to merge (the common
	 * case when streams share a segment) touches no shared line. It is exact: only ss's lock
	 * holder makes a block cached on ss or changes b's next link, and a prev link that another
	 * thread rewrites points at a block not cached on ss before and after. */
	if (!reclaim && !mergeable(n, b->size, ss) && !mergeable(p, b->size, ss))
		return b;
	sop__segment_lock(seg);
	for (;;) {
		n = b->phys_next;
		if (reclaim && reclaimable(n, ss)) {
			sop__bins_remove(&pool->heap, n);
		} else if (mergeable(n, b->size, ss)) {
			sop__bins_remove(&ss->cache, n);
			if (n->seq > b->seq)
				b->seq = n->seq;
		} else {
			break;
		}
		sop__block_absorb_next(pool, b, &ss->spare);
		ss->n_spare++;
	}
	for (;;) {
		p = b->phys_prev;
		if (reclaim && reclaimable(p, ss)) {
			/* Cached on ss from here on, with b's pending work. */
			sop__bins_remove(&pool->heap, p);
			p->seq = b->seq;
			atomic_store_explicit(&p->tag, sop__tag(p->addr, SOP_BLOCK_CACHED),
					      memory_order_release);
		} else if (mergeable(p, b->size, ss)) {
			sop__bins_remove(&ss->cache, p);
			if (b->seq > p->seq)
				p->seq = b->seq;
		} else {
			break;
		}
		sop__block_absorb_next(pool, p, &ss->spare);
		ss->n_spare++;
		b = p;
	}
	sop__lock_drop(&seg->lock);
	if (reclaim)
		pthread_mutex_unlock(&pool->lock);
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

struct sop__block *
sop__heap_put(struct sop_pool *pool, struct sop__block *b)
{
	struct sop__segment *seg = b->seg;
	struct sop__block *p, *n;

	b->req = 0;
	b->seq = 0;
	sop__segment_lock(seg);
	p = b->phys_prev;
	n = b->phys_next;
	if (n && sop__block_state(n) == SOP_BLOCK_FREE) {
		sop__bins_remove(&pool->heap, n);
		if (sop__block_owner(n) != sop__block_owner(b))
			sop__block_set_owner(b, NULL);
		sop__block_absorb_next(pool, b, &pool->spare);
	}
	if (p && sop__block_state(p) == SOP_BLOCK_FREE) {
		sop__bins_remove(&pool->heap, p);
		if (sop__block_owner(p) != sop__block_owner(b))
			sop__block_set_owner(p, NULL);
		sop__block_absorb_next(pool, p, &pool->spare);
		b = p;
	}
	atomic_store_explicit(&b->tag, sop__tag(b->addr, SOP_BLOCK_FREE), memory_order_release);
	sop__lock_drop(&seg->lock);
	sop__bins_insert(&pool->heap, b);
	if (b->size == seg->mapped)
		seg->home = NULL; /* empty: nobody's until a stream takes memory from it */
	return b;
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

/* ---- Segments and pieces ---------------------------------------------------------------- */

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

/* HOLE blocks are in no bin; the pool keeps them on a list of their own for growth to search. */
static void
hole_link(struct sop_pool *pool, struct sop__block *h)
{
	h->free_prev = NULL;
	h->free_next = pool->holes;
	if (pool->holes)
		pool->holes->free_prev = h;
	pool->holes = h;
}

static void
hole_unlink(struct sop_pool *pool, struct sop__block *h)
{
	if (h->free_prev)
		h->free_prev->free_next = h->free_next;
	else
		pool->holes = h->free_next;
	if (h->free_next)
		h->free_next->free_prev = h->free_prev;
	h->free_next = h->free_prev = NULL;
}

/* A new segment of size bytes of the reservation (min if that much is not to be had), all one
 * HOLE block. */
static struct sop__segment *
segment_new(struct sop_pool *pool, size_t size, size_t min, const struct sop__sstream *home)
{
	struct sop__segment *seg = calloc(1, sizeof *seg);
	size_t unit = pool->granularity > MAP_SPAN ? pool->granularity : MAP_SPAN;
	struct sop__block *h = NULL;
	size_t off;

	if (!seg)
		return NULL;
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
	map_add(pool, &seg->leaves, h->addr, h);
	hole_link(pool, h);
	segment_link(pool, seg);
	return seg;
}

/* Give back a segment that is one HOLE block again. */
static void
segment_drop(struct sop_pool *pool, struct sop__segment *seg)
{
	struct sop__block *h = seg->first;

	hole_unlink(pool, h);
	map_remove(pool, seg, h->addr);
	leaves_put(pool, &seg->leaves, 0);
	sop__block_delete(pool, h);
	segment_unlink(pool, seg);
	va_give(pool, seg->va - pool->va_base, seg->size);
	free(seg->pieces);
	free(seg);
}

/* Create, map and open one physical allocation of size bytes at va. */
static CUresult
piece_map(struct sop_pool *pool, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle *h)
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

/* Room in seg's array for one more piece, made before the piece is mapped so that linking it
 * cannot fail. Pool lock held. */
static bool
pieces_reserve(struct sop__segment *seg)
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
static size_t
piece_search(const struct sop__segment *seg, CUdeviceptr addr)
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
static void
piece_link(struct sop__segment *seg, struct sop__piece *pc)
{
	size_t i = piece_search(seg, pc->va);

	memmove(&seg->pieces[i + 1], &seg->pieces[i], (seg->n_pieces - i) * sizeof *seg->pieces);
	seg->pieces[i] = pc;
	seg->n_pieces++;
	seg->mapped += pc->size;
}

static void
piece_unlink(struct sop__segment *seg, struct sop__piece *pc)
{
	size_t i = piece_search(seg, pc->va);

	memmove(&seg->pieces[i], &seg->pieces[i + 1],
		(seg->n_pieces - i - 1) * sizeof *seg->pieces);
	seg->n_pieces--;
	seg->mapped -= pc->size;
}

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

/* The bytes to map in room bytes of a hole so that, joined with have bytes next to it, a block
 * of size bytes fits: whole granules, and at least a growth step (the driver's, or a compacting
 * pool's), except near maxSize, where only what is needed. 0 if it cannot fit there. */
static size_t
span(struct sop_pool *pool, size_t size, size_t have, size_t room, size_t *least)
{
	size_t g = pool->granularity;
	size_t lo = size > have ? sop__round_up(size - have, g) : g;
	size_t want = sop__round_up(atomic_load_explicit(&pool->compact, memory_order_relaxed)
					    ? SOP_COMPACT_PIECE
					    : SOP_SEGMENT_MIN,
				    g);
	uint64_t reserved = atomic_load(&pool->reserved);

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
			n = span(pool, size, l, h->size, &least);
			plan_offer(pl, h, false, rank, n, least);
		}
		if (r) {
			n = span(pool, size, r, h->size, &least);
			plan_offer(pl, h, true, rank, n, least);
		}
		/* Filled whole, a hole joins the free memory on both sides. */
		if (l && r && size <= l + h->size + r &&
		    (!pool->max_size || atomic_load(&pool->reserved) + h->size <= pool->max_size))
			plan_offer(pl, h, false, rank, h->size, h->size);
		if (rank < 2 || any) {
			n = span(pool, size, 0, h->size, &least);
			plan_offer(pl, h, false, rank, n, least);
		}
	}
	n = span(pool, size, 0, SIZE_MAX, &least);
	if (pl->size && (pl->rank < 2 || pl->size < n || !n || any))
		return true;
	if (any)
		return false;
	memset(pl, 0, sizeof *pl);
	pl->size = n;
	pl->least = least;
	return n != 0;
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
	leaf = segment_lock_leaves(pool, seg, 1);
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
		block_split(pool, b, d, size - p->size, SOP_BLOCK_FREE, &seg->leaves);
		sop__bins_insert(&pool->heap, d);
		d = NULL;
	} else if (own_n && !own_p && n->size + b->size - size >= SOP_ALIGN && leaf) {
		struct sop__block *head = b;
		block_split(pool, b, d, b->size - (size - n->size), SOP_BLOCK_FREE, &seg->leaves);
		b = d;
		d = NULL;
		sop__bins_insert(&pool->heap, head);
	}
	if (d)
		sop__block_delete(pool, d);
	if (own_p || own_n) {
		if (own_p) {
			sop__bins_remove(&ss->cache, p);
			sop__block_absorb_next(pool, p, &pool->spare);
			b = p;
		} else {
			b->seq = 0;
		}
		if (own_n) {
			sop__bins_remove(&ss->cache, n);
			if (n->seq > b->seq)
				b->seq = n->seq;
			sop__block_absorb_next(pool, b, &pool->spare);
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

static CUresult release_idle(struct sop_pool *pool, size_t target, size_t floor,
			     size_t at_least);

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

/* The size of each physical allocation that maps size bytes of growth: one for the whole, or,
 * in a compacting pool, pieces of SOP_COMPACT_PIECE (at most SOP_COMPACT_PIECES of them), each
 * given back on its own once idle. */
static size_t
piece_unit(struct sop_pool *pool, size_t size)
{
	size_t unit;

	if (!atomic_load_explicit(&pool->compact, memory_order_relaxed))
		return size;
	unit = sop__round_up((size + SOP_COMPACT_PIECES - 1) / SOP_COMPACT_PIECES,
			     pool->granularity);
	return unit > SOP_COMPACT_PIECE ? unit : sop__round_up(SOP_COMPACT_PIECE, pool->granularity);
}

/* Map size bytes at va as pieces of seg (piece_unit), linked into seg as they are made; on a
 * failure, what was made is unmapped, released and unlinked again. Pool lock held, context
 * current. */
static CUresult
pieces_map(struct sop_pool *pool, struct sop__segment *seg, CUdeviceptr va, size_t size)
{
	size_t unit = piece_unit(pool, size), off, n = 0;
	CUresult r = CUDA_SUCCESS;

	for (off = 0; off < size; off += unit, n++) {
		struct sop__piece *pc;

		if (!pieces_reserve(seg) || !(pc = calloc(1, sizeof *pc))) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
			break;
		}
		pc->va = va + off;
		pc->size = size - off < unit ? size - off : unit;
		r = piece_map(pool, pc->va, pc->size, &pc->handle);
		if (r != CUDA_SUCCESS) {
			free(pc);
			break;
		}
		piece_link(seg, pc);
	}
	if (r == CUDA_SUCCESS)
		return r;
	while (n--) {
		struct sop__piece *pc = seg->pieces[piece_search(seg, va + n * unit)];

		piece_unlink(seg, pc);
		SOP_DRV(cuMemUnmap)(pc->va, pc->size);
		SOP_DRV(cuMemRelease)(pc->handle);
		free(pc);
	}
	return r;
}

static CUresult
grow(struct sop_pool *pool, struct sop__sstream *ss, size_t size, struct sop__block **out,
     struct sop__sstream **from)
{
	struct sop__block *d[2] = {NULL, NULL}, *h, *b;
	struct sop__segment *fresh = NULL, *seg;
	struct sop__leaves lv = {0}; /* for the map slots of the two splits */
	CUdeviceptr at;
	struct plan pl;
	CUresult r;
	int k = 0;

	if (!plan_make(pool, ss, size, false, &pl))
		return CUDA_ERROR_OUT_OF_MEMORY;
	/* Wholly free pieces that add up to what would be mapped are given back first: the new
	 * piece replaces memory that could not serve the request instead of adding to it (the
	 * driver's "defragment by remapping unused memory"). The releases may open a better
	 * place, so the plan is made again. */
	if (release_idle(pool, (size_t)atomic_load(&pool->reserved) - pl.size, 0, pl.size) ==
		    CUDA_SUCCESS &&
	    !plan_make(pool, ss, size, false, &pl))
		return CUDA_ERROR_OUT_OF_MEMORY;

	d[0] = sop__block_new(pool);
	d[1] = sop__block_new(pool);
	if (!d[0] || !d[1] || !leaves_get(pool, &lv, 2, 2)) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail;
	}
	if (!pl.hole) {
		size_t room = segment_room(pool);
		fresh = segment_new(pool, room > pl.size ? room : pl.size, pl.size, ss);
		if (fresh) {
			pl.hole = fresh->first;
		} else if (!plan_make(pool, ss, size, true, &pl)) {
			/* No addresses for a new segment: any hole that fits. */
			r = CUDA_ERROR_OUT_OF_MEMORY;
			goto fail;
		}
	}
	h = pl.hole;
	seg = h->seg;
	r = sop__pool_ctx_push(pool);
	if (r != CUDA_SUCCESS)
		goto fail;
	for (;;) {
		at = pl.at_end ? h->addr + h->size - pl.size : h->addr;
		r = pieces_map(pool, seg, at, pl.size);
		/* The device cannot back the full step; it may still back the request. */
		if (r != CUDA_ERROR_OUT_OF_MEMORY || pl.size == pl.least)
			break;
		pl.size = pl.least;
	}
	sop__pool_ctx_pop(pool);
	if (r != CUDA_SUCCESS)
		goto fail;

	sop__segment_lock(seg);
	b = h;
	if (at > h->addr) {
		block_split(pool, h, d[k], at - h->addr, SOP_BLOCK_HOLE, &lv);
		b = d[k++];
	} else {
		hole_unlink(pool, h);
	}
	if (b->size > pl.size) {
		block_split(pool, b, d[k], pl.size, SOP_BLOCK_HOLE, &lv);
		hole_link(pool, d[k++]);
	}
	sop__lock_drop(&seg->lock);
	leaves_put(pool, &lv, 0);
	reserved_add(pool, pl.size);
	while (k < 2)
		sop__block_delete(pool, d[k++]);
	b = sop__heap_put(pool, b);
	sop__bins_remove(&pool->heap, b);
	if (!seg->home)
		seg->home = ss;
	*out = join_own(pool, ss, b, size, from);
	return CUDA_SUCCESS;
fail:
	if (fresh)
		segment_drop(pool, fresh);
	for (k = 0; k < 2; k++)
		if (d[k])
			sop__block_delete(pool, d[k]);
	leaves_put(pool, &lv, 0);
	return r;
}

CUresult
sop__heap_grow(struct sop_pool *pool, struct sop__sstream *ss, size_t size,
	       struct sop__block **out, struct sop__sstream **from)
{
	int tries;

	/* The plan counts on the blocks next to the hole. Those cached on ss may be taken by
	 * another thread on ss while the driver maps (the pool lock does not keep them): then
	 * the result is too small, goes back, and the plan is made again. */
	for (tries = 0; tries < 4; tries++) {
		CUresult r = grow(pool, ss, size, out, from);

		if (r != CUDA_SUCCESS || (*out)->size >= size)
			return r;
		if (*from) {
			sop__lock_take(&ss->lock);
			sop__block_set_owner(*out, ss);
			sop__bins_insert(&ss->cache, *out);
			sop__lock_drop(&ss->lock);
		} else {
			sop__bins_insert(&pool->heap, *out);
		}
	}
	return CUDA_ERROR_OUT_OF_MEMORY;
}

void
sop__segments_disown(struct sop_pool *pool, const struct sop__sstream *ss, size_t used)
{
	struct sop__segment *seg;
	size_t mapped = 0;

	for (seg = pool->segments; seg; seg = seg->next)
		if (seg->home == ss)
			mapped += seg->mapped;
	if (used >= mapped / 2)
		return;
	for (seg = pool->segments; seg; seg = seg->next)
		if (seg->home == ss)
			seg->home = NULL;
}

/* ---- Release ---------------------------------------------------------------------------- */

/* A piece that one FREE block covers whole. */
struct idle {
	struct sop__piece *pc;
	struct sop__block *f;
};

/* Every idle piece, found from the FREE blocks (few, since they merge), never from walking
 * every block. Pool lock held. */
static struct idle *
idle_collect(struct sop_pool *pool, size_t *count, size_t *bytes)
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

				/* The pieces that start inside f, while they end inside it. */
				for (i = piece_search(seg, f->addr);
				     i < seg->n_pieces &&
				     seg->pieces[i]->va + seg->pieces[i]->size <= end;
				     i++) {
					struct sop__piece *pc = seg->pieces[i];

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
	struct sop__block *m = f, *left = NULL, *right = NULL, *x;
	int k = 0;

	sop__bins_remove(&pool->heap, f);
	sop__segment_lock(seg);
	if (pc->va > f->addr) {
		block_split(pool, f, d[k], pc->va - f->addr, SOP_BLOCK_FREE, lv);
		left = f;
		m = d[k++];
	}
	if (m->size > pc->size) {
		block_split(pool, m, d[k], pc->size, SOP_BLOCK_FREE, lv);
		right = d[k++];
	}
	atomic_store_explicit(&m->tag, sop__tag(m->addr, SOP_BLOCK_HOLE), memory_order_release);
	m->seq = 0;
	hole_link(pool, m);
	if ((x = m->phys_next) && sop__block_state(x) == SOP_BLOCK_HOLE) {
		hole_unlink(pool, x);
		sop__block_absorb_next(pool, m, &pool->spare);
	}
	if ((x = m->phys_prev) && sop__block_state(x) == SOP_BLOCK_HOLE) {
		hole_unlink(pool, m);
		sop__block_absorb_next(pool, x, &pool->spare);
	}
	sop__lock_drop(&seg->lock);
	if (left)
		sop__bins_insert(&pool->heap, left);
	if (right)
		sop__bins_insert(&pool->heap, right);
	while (k < 2)
		sop__block_delete(pool, d[k++]);
	return right;
}

/* Keep a handle whose range is unmapped but whose cuMemRelease failed, for orphans_release to
 * retry. Without host memory to note it in, it is lost (to the process, not to correctness). */
static void
orphan_keep(struct sop_pool *pool, CUmemGenericAllocationHandle h)
{
	CUmemGenericAllocationHandle *o =
		realloc(pool->orphans, (pool->n_orphans + 1) * sizeof *o);

	if (o) {
		o[pool->n_orphans++] = h;
		pool->orphans = o;
	}
}

/* Unmap and release one idle piece inside f. */
static CUresult
piece_release(struct sop_pool *pool, struct sop__block *f, struct sop__piece *pc,
	      struct sop__block **right)
{
	struct sop__segment *seg = f->seg;
	struct sop__leaves lv = {0};
	struct sop__block *d[2];
	CUresult r;

	*right = NULL;
	/* What the surgery needs, before anything is given up. */
	if (!leaves_get(pool, &lv, 2, 2)) {
		leaves_put(pool, &lv, 0);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	d[0] = sop__block_new(pool);
	d[1] = d[0] ? sop__block_new(pool) : NULL;
	if (!d[1]) {
		if (d[0])
			sop__block_delete(pool, d[0]);
		leaves_put(pool, &lv, 0);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	r = SOP_DRV(cuMemUnmap)(pc->va, pc->size);
	if (r != CUDA_SUCCESS) {
		/* Still mapped: the piece stays, whole and usable. */
		sop__block_delete(pool, d[0]);
		sop__block_delete(pool, d[1]);
		leaves_put(pool, &lv, 0);
		return r;
	}
	/* Unmapped: the range leaves the pool whatever the release says. */
	r = SOP_DRV(cuMemRelease)(pc->handle);
	if (r != CUDA_SUCCESS)
		orphan_keep(pool, pc->handle);
	*right = piece_unback(pool, f, pc, d, &lv);
	leaves_put(pool, &lv, 0);
	piece_unlink(seg, pc);
	atomic_store(&pool->reserved, atomic_load(&pool->reserved) - pc->size);
	free(pc);
	if (!seg->mapped)
		segment_drop(pool, seg);
	return r;
}

/* Retry the releases that failed before. Context current. */
static CUresult
orphans_release(struct sop_pool *pool)
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
static void
anchor_make(struct sop_pool *pool)
{
	CUmemAllocationProp prop = {0};
	CUmemAccessDesc desc = {0};
	CUmemGenericAllocationHandle h;
	size_t gran = 0;

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
		SOP_DRV(cuMemRelease)(h);
		return;
	}
	desc.location = pool->props.location;
	desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
	if (SOP_DRV(cuMemSetAccess)(pool->va_base, pool->granularity, &desc, 1) != CUDA_SUCCESS) {
		SOP_DRV(cuMemUnmap)(pool->va_base, pool->granularity);
		SOP_DRV(cuMemRelease)(h);
		return;
	}
	pool->anchor = h;
	pool->anchored = true;
}

CUresult
sop__heap_anchor_drop(struct sop_pool *pool)
{
	CUresult r;

	if (!pool->anchored)
		return CUDA_SUCCESS;
	r = SOP_DRV(cuMemUnmap)(pool->va_base, pool->granularity);
	if (r != CUDA_SUCCESS)
		return r;
	pool->anchored = false;
	r = SOP_DRV(cuMemRelease)(pool->anchor);
	if (r != CUDA_SUCCESS)
		orphan_keep(pool, pool->anchor);
	return r;
}

/* Release idle pieces, largest first, while reserved > target, keeping reserved >= floor; only
 * if they add up to at_least bytes. */
static CUresult
release_idle(struct sop_pool *pool, size_t target, size_t floor, size_t at_least)
{
	uint64_t reserved = atomic_load(&pool->reserved);
	struct sop__block *prev_f = NULL, *next_f = NULL;
	size_t n = 0, i, picked = 0, bytes = 0;
	struct idle *v = NULL;
	CUresult r;

	if (reserved > target) {
		v = idle_collect(pool, &n, &bytes);
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
	if (!picked && !pool->n_orphans) {
		free(v);
		return CUDA_SUCCESS;
	}
	r = sop__pool_ctx_push(pool);
	if (r != CUDA_SUCCESS) {
		free(v);
		return r;
	}
	r = orphans_release(pool);
	if (picked && !reserved && !pool->anchor_tried && !atomic_load(&pool->destroyed))
		anchor_make(pool);
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

CUresult
sop__heap_release(struct sop_pool *pool, size_t target, size_t floor)
{
	return release_idle(pool, target, floor, 0);
}

void
sop__heap_free_extents(struct sop_pool *pool, size_t *largest, size_t *total)
{
	struct sop__segment *seg;
	size_t most = 0, sum = 0;

	pthread_mutex_lock(&pool->lock);
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
	pthread_mutex_unlock(&pool->lock);
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
	/* All or nothing: put back what changed before the failure. */
	for (seg = pool->segments; failed && seg; seg = seg->next)
		for (i = 0; i < seg->n_pieces; i++) {
			pc = seg->pieces[i];
			if (pc == failed)
				return r;
			SOP_DRV(cuMemSetAccess)(pc->va, pc->size, was, n);
		}
	return r;
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
	pool->holes = NULL;
	atomic_store(&pool->returned, NULL);
	memset(&pool->heap, 0, sizeof pool->heap);
}
