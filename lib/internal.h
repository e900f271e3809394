/* internal.h - the map of the source tree: every type shared between files and every
 * cross-file function, grouped under the file that defines it. Nothing here is public.
 *
 * Files:
 *   driver.c   the only file through which sop calls cu*: a table of entry points loaded with
 *              dlopen
 *   epoch.c    deferred reclamation: an object is freed once no call can be reading it
 *   bins.c     segregated-fit free lists (TLSF): two bitmaps and 32 lists per power of two
 *   heap.c     blocks, segments, pieces and the pool-wide heap: split, merge, grow, release
 *   order.c    who a stream is (by id), epochs, probe events, what events carry
 *   stream.c   per-stream free caches, the thread-local stream cache and the hot path
 *   pool.c     pool objects: create, destroy, attributes, access, trim, synchronization
 *   registry.c process-wide state: pool handles, the address-to-pool table, default and current
 *              pools
 *   check.c    sop__pool_check, the invariant walker
 *   sop.c      public entry points: check arguments, take locks, call in
 *   preload.c  the interposer, libsop-preload.so (not in libsop): the driver's stream-ordered
 *              allocator and the calls sop learns stream order from, as unchanged programs reach
 *              them (their symbols, dlsym, cuGetProcAddress), served by sop's public calls; what
 *              sop does not serve goes to the driver's own entry points
 */
#ifndef SOP_INTERNAL_H
#define SOP_INTERNAL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sop.h"

#define SOP_API __attribute__((visibility("default")))

#define SOP_LIKELY(x) __builtin_expect(!!(x), 1)
#define SOP_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- Sizes ------------------------------------------------------------------------------ */

/* Every block is a multiple of 512 bytes and 512-byte aligned, the driver's own spacing. */
#define SOP_ALIGN_LOG2 9
#define SOP_ALIGN ((size_t)1 << SOP_ALIGN_LOG2)
/* Physical memory is added at least this much at a time (the driver's pool grows in 32 MiB
 * steps), or what a larger request needs beyond the free memory next to where it goes. */
#define SOP_SEGMENT_MIN ((size_t)32 << 20)
/* A compacting pool (sop_pool_set_compaction) grows by at least this much, in physical
 * allocations of this size, or of a sixteenth of the growth if that is more, so that more of
 * its memory can go back idle (design.md, Compaction). */
#define SOP_COMPACT_PIECE ((size_t)8 << 20)
#define SOP_COMPACT_PIECES 16
/* In a compacting pool used from one thread, a request below this size that splits a block
 * takes the lowest-addressed fit among the first SOP_COMPACT_PROBES its bins offer, not the
 * first. */
#define SOP_COMPACT_LOW_MAX ((size_t)2 << 20)
#define SOP_COMPACT_PROBES 64
/* Each pool reserves this many times the device's memory of virtual addresses. */
#define SOP_VA_FACTOR 4
/* Reservations are aligned to and sized in units of this, the registry's granule. */
#define SOP_VA_GRANULE_LOG2 30
/* At most 2 TiB of virtual addresses per pool: the block map's directory takes 8 bytes of host
 * addresses per 64 KiB of them (backed only where segments are). */
#define SOP_VA_MAX ((size_t)1 << 41)
/* Slots per block-map leaf, as a power of two: a leaf covers 64 KiB of addresses (one span of
 * the directory) in 512-byte slots. Spans are small so that blocks of megabytes, which start
 * far apart, mostly have a span each and need no leaf (heap.c). */
#define SOP_MAP_LEAF_LOG2 7
/* The addresses a leaf covers, a directory entry's span. */
#define SOP_MAP_SPAN (SOP_ALIGN << SOP_MAP_LEAF_LOG2)

static inline size_t
sop__round_up(size_t x, size_t to)
{
	return (x + to - 1) / to * to;
}

/* Cache-line padding between fields, or objects, that different threads write (padding rather
 * than alignment where the objects come from calloc). */
#define SOP_PAD(name) char name[64]

/* ---- A small spin lock for per-stream and per-segment state ------------------------------
 * Held for a few dozen instructions and rarely contended (one thread per stream is the common
 * case), so it beats a mutex. A waiter spins a while, which is all a holder on another core
 * needs, and yields only after that, for a holder that was preempted. */
struct sop__lock {
	atomic_int held;
};

static inline void
sop__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

#define SOP_LOCK_SPINS 64

static inline void
sop__lock_take(struct sop__lock *l)
{
	while (atomic_exchange_explicit(&l->held, 1, memory_order_acquire)) {
		unsigned spins = 0;
		while (atomic_load_explicit(&l->held, memory_order_relaxed)) {
			if (++spins < SOP_LOCK_SPINS)
				sop__cpu_relax();
			else
				sched_yield();
		}
	}
}

static inline void
sop__lock_drop(struct sop__lock *l)
{
	atomic_store_explicit(&l->held, 0, memory_order_release);
}

/* Take a lock; true if it had to wait for it. */
static inline bool
sop__lock_take_waited(struct sop__lock *l)
{
	if (SOP_LIKELY(!atomic_exchange_explicit(&l->held, 1, memory_order_acquire)))
		return false;
	sop__lock_take(l);
	return true;
}

/* ---- driver.c ---------------------------------------------------------------------------- */

/* Every driver entry point sop calls. The names go through cuda.h's macros, so a member and the
 * symbol it is loaded from are the versioned ones (cuMemGetInfo -> cuMemGetInfo_v2). */
#define SOP_DRIVER_ENTRIES(X)                                                                      \
	X(cuInit)                                                                                  \
	X(cuDriverGetVersion)                                                                      \
	X(cuGetErrorString)                                                                        \
	X(cuDeviceGetCount)                                                                        \
	X(cuDeviceGet)                                                                             \
	X(cuDeviceGetAttribute)                                                                    \
	X(cuDeviceTotalMem)                                                                        \
	X(cuDeviceCanAccessPeer)                                                                   \
	X(cuDevicePrimaryCtxRetain)                                                                \
	X(cuDevicePrimaryCtxRelease)                                                               \
	X(cuCtxGetCurrent)                                                                         \
	X(cuCtxPushCurrent)                                                                        \
	X(cuCtxPopCurrent)                                                                         \
	X(cuCtxGetDevice)                                                                          \
	X(cuCtxGetId)                                                                              \
	X(cuCtxSynchronize)                                                                        \
	X(cuDevicePrimaryCtxGetState)                                                              \
	X(cuStreamGetCtx)                                                                          \
	X(cuStreamGetId)                                                                           \
	X(cuStreamDestroy)                                                                         \
	X(cuStreamSynchronize)                                                                     \
	X(cuStreamWaitEvent)                                                                       \
	X(cuEventCreate)                                                                           \
	X(cuEventDestroy)                                                                          \
	X(cuEventRecord)                                                                           \
	X(cuEventQuery)                                                                            \
	X(cuEventSynchronize)                                                                      \
	X(cuMemGetAllocationGranularity)                                                           \
	X(cuMemAddressReserve)                                                                     \
	X(cuMemAddressFree)                                                                        \
	X(cuMemCreate)                                                                             \
	X(cuMemRelease)                                                                            \
	X(cuMemMap)                                                                                \
	X(cuMemUnmap)                                                                              \
	X(cuMemSetAccess)

struct sop__driver {
#define SOP_X(name) __typeof__(name) *name;
	SOP_DRIVER_ENTRIES(SOP_X)
#undef SOP_X
};

/* Every call sop makes goes through SOP_DRV(name)(args): the table's entry, counted. */
enum sop__entry {
#define SOP_X(name) SOP_N_##name,
	SOP_DRIVER_ENTRIES(SOP_X)
#undef SOP_X
	SOP_N_ENTRIES
};

/* Call counts are kept per thread: every allocation asks the driver who its stream is, and one
 * shared counter would bounce its line between all the threads allocating. A thread adds to its
 * own block with a plain load and store; sop_driver_calls sums the blocks. */
struct sop__counts {
	_Atomic unsigned long long n[SOP_N_ENTRIES];
	struct sop__counts *prev, *next;
};
extern __thread struct sop__counts *sop__tcounts __attribute__((tls_model("initial-exec")));
struct sop__counts *sop__counts_slow(void);

static inline void
sop__count(enum sop__entry e)
{
	struct sop__counts *c = sop__tcounts;

	if (SOP_UNLIKELY(!c) && !(c = sop__counts_slow()))
		return;
	atomic_store_explicit(&c->n[e], atomic_load_explicit(&c->n[e], memory_order_relaxed) + 1,
			      memory_order_relaxed);
}

#define SOP_DRV(name) (sop__count(SOP_N_##name), sop__drv.name)

/* Load the driver and call cuInit once; later calls return the first call's result.
 * CUDA_ERROR_NOT_INITIALIZED when no driver library can be loaded. */
CUresult sop__driver_init(void);
/* The loaded table; only valid after sop__driver_init returned CUDA_SUCCESS. */
extern struct sop__driver sop__drv;
/* The dlopen handle of the driver library, for tests that resolve more entry points. */
void *sop__driver_handle(void);
/* The device's primary context, retained once and for the process's lifetime if it is active
 * (sop's probe events live in it: order.c); *out NULL if it is not active. A stream whose context
 * is not this one is of a context the application created. */
CUresult sop__driver_primary(CUdevice device, CUcontext *out);
struct sop_pool;
/* Push and pop the pool's context around driver calls that need one. */
CUresult sop__pool_ctx_push(struct sop_pool *pool);
void sop__pool_ctx_pop(struct sop_pool *pool);

/* ---- epoch.c ----------------------------------------------------------------------------- */

/* Deferred reclamation. A call that reads a pool it found without the pool's lock (through a
 * handle, the address registry, a device's current pool, a snapshot of live pools) pins its
 * thread for the duration; a torn-down pool is retired, and freed only once every thread
 * pinned when its unlinking was seen everywhere has unpinned. */
struct sop__pin {
	/* Written by its thread alone: twice the pins so far, plus one while pinned. */
	_Alignas(64) _Atomic uint64_t word;
	bool retired; /* its thread retired objects in this pin: it reclaims at the unpin */
	struct sop__pin *prev, *next; /* every thread's, under the epoch lock */
};

/* Read on every pin, written at init; and the counts of retired objects, read by every call
 * that may reclaim and written when an object is retired or freed. */
struct sop__epoch_global {
	_Alignas(64) bool cheap; /* membarrier supplies the reclaimer's barrier: a pin needs none */
	atomic_size_t n_retired; /* pools waiting to be freed */
	atomic_size_t n_all;     /* every object waiting to be freed */
};

/* Embedded in an object that can be retired. */
struct sop__retired {
	struct sop__retired *next;
	void (*free)(struct sop__retired *r);
	bool bounded; /* counted in n_retired: a pool */
};
extern struct sop__epoch_global sop__epoch;
extern __thread struct sop__pin *sop__pin_self __attribute__((tls_model("initial-exec")));

/* Once, before the first pin (sop__init). */
void sop__epoch_init(void);
/* The slow pin: the thread's first (it registers), or one without host memory for a record
 * (NULL: counted instead, and unpinned by sop__unpin(NULL)). */
struct sop__pin *sop__pin_slow(void);
void sop__unpin_counted(void);
/* A full barrier, that ThreadSanitizer understands. */
void sop__barrier(void);

/* Pin the calling thread: pools it finds from now on are not freed before sop__unpin. Not
 * nested: a public call pins once. A store to the thread's own line, no locked instruction
 * (the reclamation supplies the barrier, see epoch.c). */
static inline struct sop__pin *
sop__pin(void)
{
	struct sop__pin *p = sop__pin_self;

	if (SOP_UNLIKELY(!p))
		return sop__pin_slow();
	/* Release, like the unpin: a reclamation that reads this word has seen the end of every
	 * earlier pin of the thread. */
	atomic_store_explicit(&p->word, atomic_load_explicit(&p->word, memory_order_relaxed) + 1,
			      memory_order_release);
	if (SOP_LIKELY(sop__epoch.cheap))
		atomic_signal_fence(memory_order_seq_cst);
	else
		sop__barrier();
	return p;
}

void sop__epoch_reclaim(void);

/* Unpin; a call that retired objects then reclaims, so that what it retired is freed as soon as
 * no other call holds it, not at some later pool operation. */
static inline void
sop__unpin(struct sop__pin *p)
{
	if (SOP_LIKELY(p != NULL)) {
		atomic_store_explicit(&p->word,
				      atomic_load_explicit(&p->word, memory_order_relaxed) + 1,
				      memory_order_release);
		if (SOP_UNLIKELY(p->retired)) {
			p->retired = false;
			sop__epoch_reclaim();
		}
	} else {
		sop__unpin_counted();
	}
}

/* Put an object, unlinked from everything that finds it, in line to be freed by free_fn once
 * no pinned call can be reading it. bounded: a pool, which sop__epoch_bound counts. */
void sop__epoch_retire(struct sop__retired *r, void (*free_fn)(struct sop__retired *r),
		       bool bounded);
/* Free the retired objects that no pinned thread can be reading; note which threads the others
 * wait for. Never waits. Call unpinned. */
void sop__epoch_reclaim(void);
/* At most this many retired pools wait to be freed when a pool is made: sop__epoch_bound waits
 * for the threads that hold the others back (a call preempted while pinned holds back every
 * pool retired meanwhile: four threads making a pool per job each had up to 700 waiting on
 * the simulated driver, 30 MiB). */
#define SOP_RETIRED_MAX 64
/* Reclaim, and wait until at most SOP_RETIRED_MAX pools are retired. Call unpinned. */
void sop__epoch_bound(void);
/* Pools retired and not yet freed, for tests. */
size_t sop__epoch_retired(void);

/* ---- bins.c ------------------------------------------------------------------------------ */

#define SOP_SL_LOG2 5
#define SOP_SL_COUNT (1 << SOP_SL_LOG2)
/* Sizes below 2^(SL_LOG2 + ALIGN_LOG2) = 16 KiB map linearly into the first row. */
#define SOP_FL_SHIFT (SOP_SL_LOG2 + SOP_ALIGN_LOG2)
#define SOP_FL_COUNT 36 /* up to 2^49 bytes, the GPU's virtual address space */

struct sop__block;

/* Free lists indexed by size, TLSF style: finding a fit is two bit scans. */
struct sop__bins {
	/* fl_bitmap, for readers without the bins' lock: a hint, stale as soon as it is read. On a
	 * line of its own, so that it changes for them only when fl_bitmap does. */
	char pad0[64];
	_Atomic uint64_t fl_hint;
	char pad1[64];
	uint64_t fl_bitmap;
	uint32_t sl_bitmap[SOP_FL_COUNT];
	struct sop__block *head[SOP_FL_COUNT][SOP_SL_COUNT];
	size_t n_blocks;
	size_t n_bytes; /* stored atomically, for sop__bins_bytes */
};

/* The bytes in bins whose lock the caller does not hold: a hint. */
static inline size_t
sop__bins_bytes(struct sop__bins *bins)
{
	return __atomic_load_n(&bins->n_bytes, __ATOMIC_RELAXED);
}

void sop__bins_insert(struct sop__bins *bins, struct sop__block *b);
/* The first block, in the order sop__bins_find would try them, that fits size bytes and that
 * pick accepts, among at most *probes blocks; NULL if none. *probes is what is left: NULL with
 * some left means no block fits and pick accepts. */
struct sop__block *sop__bins_scan(struct sop__bins *bins, size_t size, unsigned *probes,
				  bool (*pick)(const struct sop__block *b, const void *arg),
				  const void *arg);
void sop__bins_remove(struct sop__bins *bins, struct sop__block *b);
/* A block of at least size bytes in O(1): the head of the first list whose every block fits. */
struct sop__block *sop__bins_find(struct sop__bins *bins, size_t size);
/* The lowest-addressed of the first probes blocks, from the first list whose every block fits
 * onwards, or NULL if none fits. */
struct sop__block *sop__bins_find_lowest(struct sop__bins *bins, size_t size, unsigned probes);
/* The hot path's search: a block of at least size and at most limit bytes, looking first at a
 * few blocks of size's own list (where an equal-size block freed a moment ago sits), then at the
 * head of the next non-empty list. NULL if none is found that cheaply. */
struct sop__block *sop__bins_find_close(struct sop__bins *bins, size_t size, size_t limit);
/* Whether bins may hold a block that fits size and is of a smaller power of two than have,
 * read from the hint without the bins' lock. By powers of two on purpose: it also answers yes
 * for a block of size's own power of two that is too small, which sends a large request with a
 * loose fit in its stream's cache to the slow path, whose flush and best fit keep memory down.
 * Counting only the lists that fit made random sizes up to 64 MiB a quarter faster on the H100,
 * but a replayed training step then reserved more than the driver's pool (design.md). */
bool sop__bins_hint_smaller(struct sop__bins *bins, size_t size, size_t have);
/* The list a block of this size lives in (for checks). */
void sop__bins_index(size_t size, unsigned *fl, unsigned *sl);

/* ---- heap.c ------------------------------------------------------------------------------ */

enum sop__state {
	SOP_BLOCK_DEAD = 0,   /* descriptor on the pool's spare list */
	SOP_BLOCK_FREE = 1,   /* in the pool heap: reusable by any stream */
	SOP_BLOCK_ALLOC = 2,  /* handed to the application */
	SOP_BLOCK_CACHED = 3, /* freed on a stream, pending there: reusable by that stream only */
	SOP_BLOCK_HOLE = 4,   /* a range of its segment with no physical memory behind it */
};

/* Bookkeeping for one range of device memory, kept on the host (device memory cannot hold
 * headers). Blocks tile their segment; phys_prev/phys_next link neighbours within it. */
struct sop__block {
	/* The first cache line holds what the hot paths touch, the neighbours' merging included;
	 * descriptors are 64-byte aligned and two lines long, so no two share a line: each is
	 * written by the thread whose stream uses the block, and a shared line would bounce
	 * between threads that never share a block. */
	/* State and address in one word, so that a free can claim a block with one compare-and-swap
	 * that fails for a stale, reused or already freed descriptor. */
	_Alignas(64) _Atomic uint64_t tag;
	/* CACHED: the stream it is pending on. FREE: the stream from whose cache it came to the
	 * heap, or NULL (new memory, or joined from several streams' frees), which may take it
	 * back (sop__block_merge_own). Written under that stream's lock or the pool's, read by
	 * other streams' coalescing under theirs: atomic, relaxed (they only compare it to
	 * themselves, and only once the state says which meaning it has). */
	_Atomic(struct sop__sstream *) owner;
	size_t size;     /* multiple of SOP_ALIGN */
	uint64_t seq;    /* CACHED: the stream's epoch at the free */
	struct sop__block *phys_prev, *phys_next;
	struct sop__block *free_prev, *free_next;
	CUdeviceptr addr;
	size_t req;      /* ALLOC: the requested bytes */
	struct sop__sstream *alloc_ss; /* ALLOC: whose used-memory counter holds req */
	struct sop__segment *seg;
};

/* A prev link is rewritten by whoever changes the neighbour before it, under the segment lock,
 * and may be peeked at without it (sop__block_merge_own): stores and peeks are atomic. */
static inline void
sop__link_set(struct sop__block **link, struct sop__block *to)
{
	__atomic_store_n(link, to, __ATOMIC_RELAXED);
}

static inline struct sop__block *
sop__link_peek(struct sop__block **link)
{
	return __atomic_load_n(link, __ATOMIC_RELAXED);
}

static inline uint64_t
sop__tag(CUdeviceptr addr, enum sop__state state)
{
	return ((uint64_t)addr >> SOP_ALIGN_LOG2) << 3 | (uint64_t)state;
}

static inline struct sop__sstream *
sop__block_owner(struct sop__block *b)
{
	return atomic_load_explicit(&b->owner, memory_order_relaxed);
}

static inline void
sop__block_set_owner(struct sop__block *b, struct sop__sstream *ss)
{
	atomic_store_explicit(&b->owner, ss, memory_order_relaxed);
}

static inline enum sop__state
sop__block_state(const struct sop__block *b)
{
	return (enum sop__state)(atomic_load_explicit(&b->tag, memory_order_acquire) & 7);
}

/* One physical allocation: a cuMemCreate handle mapped at [va, va + size) and released whole
 * (the unit of release is the handle as mapped, a rule of the virtual memory API). */
struct sop__piece {
	CUdeviceptr va;
	size_t size;
	CUmemGenericAllocationHandle handle;
};

/* Spare block-map leaves (heap.c): at most this many on hand. */
#define SOP_LEAVES_KEPT 32
struct sop__map_leaf;
struct sop__leaves {
	unsigned int n;
	struct sop__map_leaf *v[SOP_LEAVES_KEPT];
};

/* A run of the reservation that blocks tile, never crossing its ends. Pieces back parts of it;
 * the rest are HOLE blocks, where a piece may be mapped later. Blocks cross piece boundaries
 * freely, so a request can be served by memory of several pieces, and a piece next to free
 * memory makes it larger without moving anything.
 *
 * Its lock guards the extents of its blocks: their sizes and phys links change, and a block's
 * neighbours are read, only under it. It is the innermost lock but for the pool's leaf_lock,
 * taken under it to move spare block-map leaves: a stream splits and merges its
 * own cached blocks under its own lock and this one, without the pool lock, while the pool lock
 * holder works on FREE blocks next to them. */
struct sop__segment {
	struct sop__lock lock;
	struct sop__leaves leaves; /* spare leaves for slots in its range; segment lock */
	atomic_bool *met; /* the pool's threads_met, set when a thread waits for this lock */
	CUdeviceptr va;
	size_t size;
	size_t mapped; /* bytes of its pieces */
	/* Its pieces in address order (found by bisection: release looks for those inside each
	 * FREE block). Pool lock. */
	struct sop__piece **pieces;
	size_t n_pieces, cap_pieces;
	struct sop__block *first;
	/* The stream whose memory it holds, compared only: the stream whose growth made it, or
	 * the first to take memory from it once it was nobody's again (all free, or given up by
	 * its stream at a synchronization: sop__segments_disown). The slow path serves a stream
	 * from its own segments first, and its growth with nothing to join goes there, so that
	 * streams on different threads split and merge under different segment locks.
	 * Pool lock. */
	const struct sop__sstream *home;
	struct sop__segment *prev, *next; /* address order */
	SOP_PAD(pad); /* the next segment's lock on another line */
};

/* A free range of the pool's reservation, for placing new segments (growth path only). */
struct sop__va_extent {
	size_t off, size;
	struct sop__va_extent *next;
};

struct sop_pool;

/* Descriptors come from a per-pool slab: the heap never calls malloc per block on its paths. */
struct sop__block *sop__block_new(struct sop_pool *pool);
void sop__block_delete(struct sop_pool *pool, struct sop__block *b);

/* The block map: the descriptor of the block starting at addr, or NULL. Lock-free to read;
 * a slot is written under the lock of the segment that holds addr. A descriptor it returns
 * may be stale: only its tag says whether it is the block at addr in a given state. */
struct sop__block *sop__map_get(struct sop_pool *pool, CUdeviceptr addr);
/* The directory, at pool creation (false: no host memory) and teardown. */
bool sop__map_init(struct sop_pool *pool);
void sop__map_destroy(struct sop_pool *pool);
/* For the consistency check: the blocks the map names in seg's range, or -1 if an entry names a
 * block that does not start there or a leaf's count is wrong; adds the leaves attached there to
 * *leaves. Every lock held. */
long sop__map_census(struct sop_pool *pool, const struct sop__segment *seg, size_t *leaves);
/* The pool's spare leaves (each segment keeps some more). */
size_t sop__map_spare_leaves(struct sop_pool *pool);
/* For tests: how the span of addr is held (0 no block, 1 a lone block, 2 a leaf) and how many
 * blocks start in it. */
int sop__map_span(struct sop_pool *pool, CUdeviceptr addr, unsigned int *count);

/* Take a segment's lock, noting whether anyone had to wait. */
static inline void
sop__segment_lock(struct sop__segment *seg)
{
	if (SOP_UNLIKELY(sop__lock_take_waited(&seg->lock)))
		atomic_store_explicit(seg->met, true, memory_order_relaxed);
}

/* Take size bytes (a multiple of SOP_ALIGN) out of a free or cached block b that has been
 * removed from its bins; the remainder goes back where b came from: the heap if b is FREE,
 * else the cache of from, whose lock the caller holds if from_held. Pool lock held. */
void sop__block_carve(struct sop_pool *pool, struct sop__block *b, size_t size,
		      struct sop__sstream *from, bool from_held);
/* The same on a block in ss's cache, with the stream's lock held instead of the pool's: takes
 * b out of the cache and splits it, with a descriptor from the stream's spares. False, and b
 * left in the cache, if there is no spare descriptor or no host memory for the map. */
bool sop__block_carve_own(struct sop_pool *pool, struct sop__sstream *ss, struct sop__block *b,
			  size_t size);
/* A block ss has just claimed as CACHED, merged with its neighbours cached on ss; returns the
 * merged block, out of every bin. Stream lock held. */
struct sop__block *sop__block_merge_own(struct sop_pool *pool, struct sop__sstream *ss,
					struct sop__block *b);
/* Keep a stream's spare descriptors between a few and a few dozen. Pool and stream locks held. */
void sop__spares_balance(struct sop_pool *pool, struct sop__sstream *ss);
/* Give all of a stream's spare descriptors back to the pool. Pool lock held. */
void sop__spares_return(struct sop_pool *pool, struct sop__sstream *ss);
/* Absorb b's next neighbour into b; the neighbour is out of every bin and its descriptor goes
 * to *spare. Segment lock held. */
void sop__block_absorb_next(struct sop_pool *pool, struct sop__block *b, struct sop__block **spare);
/* Return a block to the heap as FREE, merging with FREE neighbours; returns the merged block.
 * Its owner stays as the stream whose cache it leaves (or NULL), and is NULL once joined with
 * another stream's. Pool lock held. */
struct sop__block *sop__heap_put(struct sop_pool *pool, struct sop__block *b);
/* Map physical memory for a block of at least size bytes and take it (*out): next to free
 * memory (FREE, or cached on ss) if that maps less, else in a hole of a segment of ss's own or
 * of a new one; wholly free pieces are released first when they add up to what is mapped. The
 * block is out of every bin: FREE (*from NULL), or cached on ss without an owner (*from ss), as
 * sop__block_carve takes it. Pool lock held. CUDA_ERROR_OUT_OF_MEMORY when maxSize, the
 * reservation or the device is exhausted. */
CUresult sop__heap_grow(struct sop_pool *pool, struct sop__sstream *ss, size_t size,
			struct sop__block **out, struct sop__sstream **from);
/* Make the segments whose home is ss nobody's, if used (ss's live bytes) is less than half of
 * what they map (0: always): the rest is free memory that only ss would take while they are its.
 * Pool lock held. */
void sop__segments_disown(struct sop_pool *pool, const struct sop__sstream *ss, size_t used);
/* Release pieces that FREE blocks cover whole, largest first, while reserved > target and the
 * release keeps reserved >= floor. Pool lock held. Stops at the first driver error and returns it. */
CUresult sop__heap_release(struct sop_pool *pool, size_t target, size_t floor);
/* Set the access of every piece to want[0..n); on a failure, set those done back to
 * was[0..n) and return the error. Pool lock held, context current. */
CUresult sop__heap_set_access(struct sop_pool *pool, const CUmemAccessDesc *want,
			      const CUmemAccessDesc *was, size_t n);
/* Free the host side of a pool whose segments have all been released. */
void sop__heap_destroy(struct sop_pool *pool);
/* The bytes of the pool's FREE and CACHED blocks, and the longest run of them at contiguous
 * addresses (sop_pool_get_free_extents). Takes the pool lock. */
void sop__heap_free_extents(struct sop_pool *pool, size_t *largest, size_t *total);
/* Unmap and release the anchor, if any. Context current, pool lock held. */
CUresult sop__heap_anchor_drop(struct sop_pool *pool);

/* blockmap.c: spare leaves taken for a segment's splits (need at least, want if they come
 * cheaply; false without host memory) and given back down to keep; a segment's lock with n
 * spare leaves in hand; a block entered in the map and taken out. Segment lock held. */
bool sop__leaves_get(struct sop_pool *pool, struct sop__leaves *to, unsigned int need,
		     unsigned int want);
void sop__leaves_put(struct sop_pool *pool, struct sop__leaves *from, unsigned int keep);
bool sop__segment_lock_leaves(struct sop_pool *pool, struct sop__segment *seg, unsigned int n);
void sop__map_add(struct sop_pool *pool, struct sop__leaves *spares, CUdeviceptr addr,
		  struct sop__block *b);
void sop__map_remove(struct sop_pool *pool, struct sop__segment *seg, CUdeviceptr addr);
/* blockmap.c: split b at size into b and rest (a fresh descriptor) of the given state, rest
 * entered in the map. Segment lock held. */
void sop__block_split(struct sop_pool *pool, struct sop__block *b, struct sop__block *rest,
		      size_t size, enum sop__state state, struct sop__leaves *spares);
/* segment.c */
void sop__reserved_add(struct sop_pool *pool, size_t size);
void sop__hole_link(struct sop_pool *pool, struct sop__block *h);
void sop__hole_unlink(struct sop_pool *pool, struct sop__block *h);
struct sop__segment *sop__segment_new(struct sop_pool *pool, size_t size, size_t min,
				      const struct sop__sstream *home);
void sop__segment_drop(struct sop_pool *pool, struct sop__segment *seg);
bool sop__pieces_reserve(struct sop__segment *seg);
size_t sop__piece_search(const struct sop__segment *seg, CUdeviceptr addr);
void sop__piece_link(struct sop__segment *seg, struct sop__piece *pc);
void sop__piece_unlink(struct sop__segment *seg, struct sop__piece *pc);
/* vmm.c */
CUresult sop__piece_map(struct sop_pool *pool, CUdeviceptr va, size_t size,
			CUmemGenericAllocationHandle *h);
void sop__orphan_keep(struct sop_pool *pool, CUmemGenericAllocationHandle h);
CUresult sop__orphans_release(struct sop_pool *pool);
void sop__anchor_make(struct sop_pool *pool);
/* release.c */
CUresult sop__release_idle(struct sop_pool *pool, size_t target, size_t floor, size_t at_least);

/* ---- order.c ----------------------------------------------------------------------------- */

#define SOP_PROBES 4
#define SOP_DEPS 16

struct sop__stream;

/* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: a stream of the current context. */
static inline bool
sop__stream_special(CUstream s)
{
	return (uintptr_t)s <= (uintptr_t)CU_STREAM_PER_THREAD;
}

/* A set of (stream, epoch): "ordered after the work of each stream up to its epoch". A stream is
 * named by its record's incarnation (gen, unique) and its id, never by address: a clock may
 * outlive the record. */
struct sop__clock {
	unsigned n;
	struct {
		uint64_t id, gen, epoch;
	} e[SOP_DEPS];
};

/* An event sop recorded on a stream to learn when the frees before it have completed. */
struct sop__probe {
	CUevent ev;
	uint64_t epoch; /* the stream's epoch the record marked */
	bool pending;   /* recorded, not yet seen complete */
};

/* One per stream sop has seen (by cuStreamGetId), shared by every pool; freed once nobody
 * holds it or has used it for a while (order.c). */
struct sop__stream {
	uint64_t id;
	uint64_t gen;             /* this record's incarnation: unique, never reused */
	atomic_uint refs;         /* pool stream states, synchronizations waiting for the driver */
	atomic_bool used;         /* looked up since the last sweep */
	CUcontext ctx;
	uint64_t ctx_id;          /* cuCtxGetId: a context's handle value is reused too */
	CUdevice device;
	bool probes_ok;           /* ctx is a primary context sop keeps alive: probes allowed */
	_Atomic uint64_t epoch;   /* frees are tagged with it; marks advance it; starts at 1 */
	_Atomic uint64_t done;    /* frees up to here are complete (a probe or a sync said so) */
	_Atomic uint64_t newest;  /* epoch of the newest probe, 0 if none */
	_Atomic uint64_t last_free; /* the tag of the latest free on it, in any pool */
	atomic_uint frees_since;  /* frees since the last probe */
	_Atomic uint64_t next_poll_ns; /* do not query running probes again before this */
	pthread_mutex_t lock;     /* probes, deps and claims */
	struct sop__probe probe[SOP_PROBES];
	unsigned next_probe;
	/* What this stream's future work is ordered after: deps, because sop made it wait for
	 * a probe (proven); claims, from events waited on (order.c says what proves them). */
	struct sop__clock deps, claims;
	atomic_uint n_order;      /* deps.n + claims.n, to read without the lock */
	struct sop__stream *hash_next;
	struct sop__retired retired;
};

/* The id of the stream a handle names now (cuStreamGetId); CUDA_ERROR_INVALID_CONTEXT for a
 * special handle with no current context, or the driver's code for a bad handle. */
CUresult sop__stream_id(CUstream stream, uint64_t *id);
/* The record of the stream with this id, which stream names in the current call; made on
 * first sight. It stays readable while the caller is pinned (epoch.c); with hold, until
 * sop__stream_release too. CUDA_ERROR_OUT_OF_MEMORY without host memory, or the driver's code. */
CUresult sop__stream_of(CUstream stream, uint64_t id, bool hold, struct sop__stream **out);
/* Both: the record of the stream a handle names now. */
CUresult sop__stream_lookup(CUstream stream, bool hold, struct sop__stream **out);
/* Let go of a record held through sop__stream_of, sop__stream_find or sop__stream_all. */
void sop__stream_release(struct sop__stream *st);
/* The record of this incarnation, held; NULL if it is gone. */
struct sop__stream *sop__stream_find(uint64_t id, uint64_t gen);
/* Every record of the context with this id that a pool's state holds (the others have nothing
 * cached anywhere), held, in a malloc'd array. */
struct sop__stream **sop__stream_all(uint64_t ctx_id, size_t *n);
/* Records in the table, for tests. */
size_t sop__streams_live(void);
/* The stream with this id, which stream names now, is about to be destroyed: a last probe
 * covers its frees, so that they become reusable once its work is done. Pinned. */
void sop__stream_ending(CUstream stream, uint64_t id);
/* The device of the stream with this id, which stream names now (cached per thread). Pinned. */
CUresult sop__stream_device(CUstream stream, uint64_t id, CUdevice *device);
/* More than one stream has been seen: observing completion can pay off. */
bool sop__streams_interact(void);
/* Mark the stream's current point: returns the epoch it closes. Call before the driver call
 * that marks the point (record, synchronize). */
uint64_t sop__stream_mark(struct sop__stream *st);
/* A free on st was tagged seq (for events, which prove what they claim with a probe that covers
 * the frees before them). A load, and a store once per epoch. */
static inline void
sop__stream_freed(struct sop__stream *st, uint64_t seq)
{
	if (atomic_load_explicit(&st->last_free, memory_order_relaxed) < seq)
		atomic_store_explicit(&st->last_free, seq, memory_order_relaxed);
}
/* After a free tagged seq on the stream, named by handle in the current call: record a probe if
 * one is due. checked: the call asked the driver who handle is (else this does, before a
 * record). */
void sop__stream_after_free(struct sop__stream *st, CUstream handle, uint64_t seq, bool pressure,
			    bool checked);
/* Record a probe on the stream (named by handle in the current call, checked) now, unless one
 * already covers frees tagged seq. A failure only loses a chance to learn. */
void sop__stream_probe(struct sop__stream *st, CUstream handle, uint64_t seq);
/* A probe covering every free on st so far, unless one already does; handle names st in the
 * current call, checked. */
void sop__probe_all_frees(struct sop__stream *st, CUstream handle);
/* Frees on the stream up to epoch are known complete (a synchronization or a probe said so). */
void sop__stream_completed(struct sop__stream *st, uint64_t epoch);
/* Query the stream's pending probes (not again within a few microseconds of a query that found
 * one running); returns the epoch up to which its frees are complete. */
uint64_t sop__stream_poll(struct sop__stream *st);
/* The same, asking now: what an event's completion should have proven. */
uint64_t sop__stream_prove(struct sop__stream *st);
/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t sop__now_ns(void);
/* What t's future work is ordered after, proven (deps) and claimed (claims), copied. */
void sop__stream_order(struct sop__stream *t, struct sop__clock *deps, struct sop__clock *claims);
/* Make t (named by t_handle) wait for a probe of s that covers seq, and remember it in t's deps.
 * CUDA_ERROR_NOT_FOUND if no probe covers seq. */
CUresult sop__stream_wait_for(struct sop__stream *t, CUstream t_handle, struct sop__stream *s,
			      uint64_t seq);
/* Events: record with the recording stream's clock; wait and merge it into the waiting
 * stream's claims; the clock an event carries; forget an event. */
CUresult sop__event_record(CUevent ev, CUstream stream);
CUresult sop__event_wait(CUstream stream, CUevent ev, unsigned int flags);
bool sop__event_clock(CUevent ev, struct sop__clock *out);
void sop__event_forget(CUevent ev);
/* Events whose claims sop keeps, for tests (at most 2048). */
size_t sop__events_live(void);

/* ---- stream.c ---------------------------------------------------------------------------- */

/* A pool's view of one stream: the blocks freed on it that only it may reuse yet, each tagged
 * with the stream's epoch at its free. The lock guards the cache and the identity; a state
 * whose id is 0 is retired. A block is CACHED with owner ss exactly while it is in ss's cache
 * or ss's lock is held over it: a block taken out for carving by another path first loses its
 * owner, so that the stream's own merging never reaches for a block that is in no bin. */
struct sop__sstream {
	struct sop__lock lock;
	struct sop_pool *pool;
	uint64_t id;            /* cuStreamGetId: unique for the process's lifetime; 0 once retired */
	struct sop__stream *st; /* the stream's record (order.c) */
	/* Used memory, sharded: bytes allocated on this stream and not yet freed, and the highest
	 * value since the pool last folded the shards (pool.c). used_local and used_hw change only
	 * under the lock, so a same-stream allocation and free cost no atomic operation; a free on
	 * another stream, or sop_free, subtracts from used_remote instead. */
	int64_t used_local, used_hw;
	_Atomic int64_t used_remote;
	uint64_t last_seq; /* the tag of the latest free into the cache */
	uint64_t flushed;  /* frees up to here have left the cache (pool lock) */
	bool active;       /* allocated or freed on since the last retirement pass */
	atomic_bool gone;  /* its stream is known to be destroyed (stream.c) */
	struct sop__bins cache;
	/* Descriptors for splitting and merging cached blocks under the stream's lock alone. */
	struct sop__block *spare;
	unsigned n_spare;
	struct sop__sstream *next; /* pool->streams */
	struct sop__retired retired;
};

/* Bytes cached on a stream, read under its lock (a free may be adding to them). */
static inline size_t
sop__sstream_cached(struct sop__sstream *ss)
{
	size_t n;

	sop__lock_take(&ss->lock);
	n = ss->cache.n_bytes;
	sop__lock_drop(&ss->lock);
	return n;
}

/* A stream as the pool sees it: its state, and the id that state had when it was looked up.
 * Operations take ss->lock and check ss->id == id before trusting the state. */
struct sop__stream_ref {
	struct sop__sstream *ss;
	uint64_t id;
};

/* The pool's state for a stream id, or NULL. Pool lock held. */
struct sop__sstream *sop__sstream_find(struct sop_pool *pool, uint64_t id);
/* Allocation in stream order, on the stream stream names now and whose id the caller asked
 * (sop__stream_id). */
CUresult sop__alloc(struct sop_pool *pool, CUstream stream, uint64_t id, size_t req, void **ptr);
/* Free in stream order. */
CUresult sop__free_async(struct sop_pool *pool, CUdeviceptr addr, CUstream stream);
/* Move the cached blocks of ss freed up to epoch into the heap: their frees have completed.
 * Pool lock held. Returns the number of blocks moved. */
size_t sop__sstream_flush(struct sop__sstream *ss, uint64_t epoch);
/* Retire the pool's stream states that hold nothing and were idle since the last pass, or whose
 * streams are gone. Pool lock held. A pass runs whenever a pool has SOP_STATES_MIN states, or
 * twice what the last pass left, and at context synchronizations: a pool keeps states for the
 * streams used since the last pass, and for those with memory cached or allocated, and never
 * many more. */
void sop__sstream_retire_idle(struct sop_pool *pool);
#define SOP_STATES_MIN 32
/* Free every stream state of a pool being torn down. */
void sop__sstream_destroy_all(struct sop_pool *pool);

/* ---- pool.c ------------------------------------------------------------------------------ */

/* The hot paths of many threads read the first group of a pool's fields on every call: they
 * must not lose its line each time the slow path writes the heap or the lock. */
struct sop_pool {
	/* Read on every call, written only at creation and teardown (or rarely, by attribute
	 * writes). */
	uint64_t handle; /* its sop_pool_t: slot and generation (registry.c); never reused */
	CUmemPoolProps props;
	CUdevice device;
	CUcontext ctx; /* the device's primary context, retained for driver calls */
	bool is_default;
	atomic_bool destroyed; /* sop_pool_destroy was called; torn down once empty */
	atomic_bool dead; /* torn down; the object is freed once no call can be reading it */
	size_t granularity;
	size_t max_size; /* 0: no cap besides the device */
	CUdeviceptr va_base;
	size_t va_size;
	_Atomic(uintptr_t) *map_dir; /* the block map, an entry per 64 KiB (heap.c) */
	/* Moves on when a retirement pass retires stream states: thread caches follow only entries
	 * of the current generation (stream.c). */
	_Atomic uint64_t states_gen;
	atomic_int reuse_follow, reuse_opportunistic, reuse_internal;
	atomic_bool compact; /* sop_pool_set_compaction */
	SOP_PAD(pad0);

	/* Written under the pool lock. */
	pthread_mutex_t lock; /* heap, segments, streams list, teardown */
	struct sop__va_extent *va_free;
	struct sop__segment *segments;
	size_t n_segments;
	struct sop__block *holes; /* every HOLE block, linked through free_next/free_prev */
	/* Handles whose cuMemRelease failed after their range was unmapped: retried before the
	 * next release, so that a transient failure leaks nothing. */
	CUmemGenericAllocationHandle *orphans;
	size_t n_orphans;
	/* Host memory mapped at va_base from the first release that left the pool empty, so that
	 * the driver keeps the page tables there (heap.c, anchor_make). */
	CUmemGenericAllocationHandle anchor;
	bool anchored, anchor_tried;
	struct sop__bins heap;

	struct sop__block *spare; /* descriptors not in use */
	void **slabs;
	size_t n_slabs, cap_slabs;

	struct sop__sstream *streams;
	size_t n_streams, retire_at; /* a retirement pass when n_streams reaches retire_at */
	int64_t retired_hw; /* the highs of states retired since the last fold (sop__pool_used) */

	CUmemAccessDesc *access; /* peers granted access, besides the owner */
	size_t n_access;
	uint64_t used_high; /* pool lock; see sop__pool_used */
	uint64_t loose_poll_ns; /* pool lock; see flush_observed */
	/* The stream that last took memory from the heap, which sop__block_merge_own lets no
	 * other stream hold back. Written under the pool lock; peeked at by frees. */
	_Atomic(struct sop__sstream *) heap_user;
	SOP_PAD(pad1);

	/* Read by every free, written when growth fails, at synchronization points, and when the
	 * pool grows or shrinks. */
	/* Growth failed (maxSize or the device): probe every free, for internal dependencies.
	 * Cleared at synchronization points. */
	atomic_bool pressure;
	/* Frees of large blocks still to be covered by a probe at once (cover_at_once), since a
	 * stream grew the pool while another held enough memory not known complete. */
	atomic_uint starved;
	/* Some thread has waited for a segment's lock: streams of this pool run on several threads
	 * at once, and the slow path keeps each one's memory in segments of its own. Until then it
	 * places by best fit alone. */
	atomic_bool threads_met;
	_Atomic uint64_t release_threshold;
	_Atomic uint64_t reserved, reserved_high;
	/* Descriptors streams gave back without the pool lock; taken whole under it. */
	_Atomic(struct sop__block *) returned;
	SOP_PAD(pad2);

	/* The block map's spare leaves, under leaf_lock, which segment lock holders take now and
	 * then to refill or shed their own spares (heap.c). */
	struct sop__lock leaf_lock;
	struct sop__map_leaf **leaf_spare;
	size_t n_leaf_spare, cap_leaf_spare, n_leaves;
	struct sop__leaf_slab *leaf_slabs;

	struct sop_pool *next; /* registry list */
	struct sop__retired retired; /* once torn down (epoch.c) */
};

/* Whether a stream of pool other than ss holds at least bytes in its cache: a hint, read
 * without their locks. Pool lock held (the list of streams). */
static inline bool
sop__others_cache(struct sop_pool *pool, const struct sop__sstream *ss, size_t bytes)
{
	struct sop__sstream *o;

	for (o = pool->streams; o; o = o->next)
		if (o != ss && sop__bins_bytes(&o->cache) >= bytes)
			return true;
	return false;
}

/* Used memory is counted per stream state (struct sop__sstream), never in one shared counter:
 * the hot path of each stream touches only its own cache lines. */
static inline int64_t
sop__sstream_used(struct sop__sstream *ss)
{
	return ss->used_local + atomic_load_explicit(&ss->used_remote, memory_order_relaxed);
}

/* Count an allocation of req bytes on ss. Its lock held. */
static inline void
sop__used_add(struct sop__sstream *ss, struct sop__block *b, size_t req)
{
	int64_t now;

	ss->used_local += (int64_t)req;
	now = sop__sstream_used(ss);
	if (now > ss->used_hw)
		ss->used_hw = now;
	__atomic_store_n(&b->alloc_ss, ss, __ATOMIC_RELAXED); /* peeked at by frees: stream.c */
	b->req = req;
}

/* Uncount a free; ss is the freeing stream's state with its lock held, or NULL. */
static inline void
sop__used_sub(struct sop__block *b, struct sop__sstream *ss)
{
	if (b->alloc_ss == ss)
		ss->used_local -= (int64_t)b->req;
	else
		atomic_fetch_sub_explicit(&b->alloc_ss->used_remote, (int64_t)b->req,
					  memory_order_relaxed);
	/* sop_pointer_get_pool may be reading it, under other locks, for a free on its way. */
	__atomic_store_n(&b->req, 0, __ATOMIC_RELAXED);
}

/* sstream.c: the pool's state for the stream with this id, made if the pool has none (the
 * thread cache's miss); every cached block of a stream, gathered so the caller may change the
 * bins while it walks (stream lock held; NULL, *n = 0 when none or no host memory). */
CUresult sop__sstream_lookup(struct sop_pool *pool, CUstream stream, uint64_t id,
			     struct sop__stream_ref *out);
struct sop__block **sop__cache_collect(struct sop__sstream *ss, size_t *n);

/* reuse.c: the slow path of an allocation of size bytes (req asked) on ss, the state of the
 * stream with this id, found unlocked. CUDA_ERROR_NOT_FOUND: the state was retired meanwhile
 * (look it up again). */
CUresult sop__alloc_slow(struct sop_pool *pool, struct sop__sstream *ss, uint64_t id,
			 CUstream stream, size_t size, size_t req, void **ptr);
/* On the slow path, requests of at least this size ask what has completed before carving a
 * loose fit: for them reusing a block just freed beats splitting a large free range. Smaller
 * ones carve without asking, unless nothing fits at all. Frees of at least this size may be
 * covered by a probe at once (stream.c). */
#define SOP_POLL_MIN ((size_t)2 << 20)

/* Hand b out to the application: ALLOC, counted in ss's used memory. Stream lock held. */
static inline void
sop__block_hand_out(struct sop__sstream *ss, struct sop__block *b, size_t req, void **ptr)
{
	sop__block_set_owner(b, NULL);
	sop__used_add(ss, b, req);
	ss->active = true;
	atomic_store_explicit(&b->tag, sop__tag(b->addr, SOP_BLOCK_ALLOC), memory_order_release);
	*ptr = (void *)(uintptr_t)b->addr;
}

/* Take a cached block whole on the hot path if it wastes at most an eighth of the request;
 * larger ones are split. */
static inline size_t
sop__close_limit(size_t size)
{
	return size + (size >> 3);
}

/* Whether a request of size bytes splits the lowest-addressed fit rather than the smallest: a
 * small request in a compacting pool that threads have not met in (once they have, placement
 * follows segment affinity, and the search would hold the locks longer on every thread). */
static inline bool
sop__place_low(struct sop_pool *pool, size_t size)
{
	return size < SOP_COMPACT_LOW_MAX &&
	       atomic_load_explicit(&pool->compact, memory_order_relaxed) &&
	       !atomic_load_explicit(&pool->threads_met, memory_order_relaxed);
}

/* The block a request of size bytes splits in bins when none fits closely: the first fit, or,
 * where sop__place_low says so, the lowest-addressed of the first few fits, which gathers small
 * blocks at low addresses and leaves longer free runs elsewhere. */
static inline struct sop__block *
sop__split_fit(struct sop_pool *pool, struct sop__bins *bins, size_t size)
{
	if (sop__place_low(pool, size))
		return sop__bins_find_lowest(bins, size, SOP_COMPACT_PROBES);
	return sop__bins_find(bins, size);
}


/* The pool's used memory: the sum of its shards. With fold, also raise the watermark by the sum
 * of the shards' highs since the last fold (exact when one stream allocated in between; never
 * below the true peak) and start the shards' highs again. Pool lock held. */
uint64_t sop__pool_used(struct sop_pool *pool, bool fold);

CUresult sop__pool_new(const CUmemPoolProps *props, bool is_default, struct sop_pool **out);
/* Mark destroyed and tear down if nothing is left in it. */
void sop__pool_destroy(struct sop_pool *pool);
/* Tear down if destroyed and empty: give everything back to the driver, unlink the pool from
 * every table and retire it (epoch.c). Pool lock held; returns true if it was torn down (the
 * lock has then been released). The caller is pinned: the object stays readable until it
 * unpins. */
bool sop__pool_reap(struct sop_pool *pool);
/* Apply the release threshold after frees became reusable. Pool lock held. */
void sop__pool_apply_threshold(struct sop_pool *pool);
/* The public calls' work, arguments already checked. */
CUresult sop__pool_get_attr(struct sop_pool *pool, CUmemPool_attribute attr, void *value);
CUresult sop__pool_set_attr(struct sop_pool *pool, CUmemPool_attribute attr, void *value);
CUresult sop__pool_get_access(struct sop_pool *pool, const CUmemLocation *loc,
			      CUmemAccess_flags *flags);
CUresult sop__pool_set_access(struct sop_pool *pool, const CUmemAccessDesc *map, size_t count);
CUresult sop__pool_trim(struct sop_pool *pool, size_t keep);
/* Synchronize, then make the frees the synchronization covered reusable by every stream and
 * apply the release thresholds of the pools concerned. */
CUresult sop__sync_stream(CUstream stream);
/* The stream with this id is about to be destroyed: every pool's state for it may be retired as
 * soon as nothing is cached or allocated on it. Pinned. */
void sop__pools_stream_gone(uint64_t id);
CUresult sop__sync_ctx(void);
CUresult sop__sync_event(CUevent event);

/* ---- registry.c -------------------------------------------------------------------------- */

/* Driver init plus the process-wide tables; every public call starts here. */
CUresult sop__init(void);
int sop__device_count(void);

/* Pool handles. A sop_pool_t is gen << SOP_HANDLE_INDEX_BITS | index: a slot of a table and the
 * generation the slot had when the pool took it. A slot names its pool until the pool is torn
 * down, then takes the next generation and goes to the next pool, so a handle kept past its
 * pool's teardown never names a pool again, whatever became of the object. Slots come in chunks
 * that are never freed, so a slot can be read at any time. */
#define SOP_HANDLE_INDEX_BITS 20
#define SOP_HANDLE_CHUNK_LOG2 8
struct sop__handle_slot {
	_Atomic(struct sop_pool *) pool; /* NULL while free */
	uint64_t gen;                    /* of the pool that holds it, else of the next one */
	uint32_t next_free;
};
extern _Atomic(struct sop__handle_slot *)
	sop__handles[1u << (SOP_HANDLE_INDEX_BITS - SOP_HANDLE_CHUNK_LOG2)];

/* The pool a handle names, or NULL (NULL, a handle never given out, or one whose pool has been
 * torn down). The caller is pinned (epoch.c), which keeps the pool readable until it unpins;
 * whether it is still usable is its flags' to say. */
static inline struct sop_pool *
sop__pool_lookup(sop_pool_t handle)
{
	uint64_t h = (uint64_t)(uintptr_t)handle;
	uint64_t i = h & ((1u << SOP_HANDLE_INDEX_BITS) - 1);
	struct sop__handle_slot *chunk;
	struct sop_pool *p;

	chunk = atomic_load_explicit(&sop__handles[i >> SOP_HANDLE_CHUNK_LOG2],
				     memory_order_acquire);
	if (SOP_UNLIKELY(!chunk))
		return NULL;
	p = atomic_load_explicit(&chunk[i & ((1u << SOP_HANDLE_CHUNK_LOG2) - 1)].pool,
				 memory_order_acquire);
	return SOP_LIKELY(p && p->handle == h) ? p : NULL;
}

static inline sop_pool_t
sop__pool_handle(const struct sop_pool *pool)
{
	return (sop_pool_t)(uintptr_t)pool->handle;
}

/* Give the pool a slot (pool->handle), not yet naming it: false without host memory or
 * without a free slot. */
bool sop__handle_take(struct sop_pool *pool);
/* Make the handle name the pool, once it is ready to be used. */
void sop__handle_publish(struct sop_pool *pool);
/* Free the slot for another pool: the handle no longer names anything. */
void sop__handle_drop(struct sop_pool *pool);
/* Slots in use, for tests. */
size_t sop__handles_used(void);

/* Register a pool's reservation (false if the table cannot hold it), or remove it. */
bool sop__registry_add(struct sop_pool *pool);
void sop__registry_remove(struct sop_pool *pool);
/* The pool whose reservation holds addr, or NULL. Lock-free; the caller is pinned. */
struct sop_pool *sop__registry_lookup(CUdeviceptr addr);
/* Every pool not yet torn down, in a malloc'd array (NULL, *n = 0 if none). The caller is pinned,
 * so that the pools stay readable after the lock is dropped; it checks pool->dead under the pool
 * lock. */
struct sop_pool **sop__registry_snapshot(size_t *n);
/* Each device's default and current pool (NULL: the default), read without a lock, written
 * under sop__dev_lock (devices.c). */
extern pthread_mutex_t sop__dev_lock;
extern _Atomic(struct sop_pool *) *sop__default_pools;
extern _Atomic(struct sop_pool *) *sop__current_pools;
/* A pool is going away: mark it destroyed and make the default current again where it was
 * current, both under the lock that sop__set_current_pool takes, so that no device can be left
 * with a destroyed pool as current. */
void sop__forget_current(struct sop_pool *pool);

/* ---- devices.c --------------------------------------------------------------------------- */

/* The device's default pool, made on first use. */
CUresult sop__default_pool(CUdevice device, struct sop_pool **out);
CUresult sop__current_pool(CUdevice device, struct sop_pool **out);
/* CUDA_ERROR_INVALID_VALUE for a pool of another device or one being destroyed. */
CUresult sop__set_current_pool(CUdevice device, struct sop_pool *pool);

/* ---- preload.c --------------------------------------------------------------------------- */

/* glibc's dlsym, which the interposer overrides: driver.c, built into it (SOP_PRELOAD), resolves
 * sop's table through this. */
void *sop__preload_dlsym(void *handle, const char *name);

/* ---- check.c ----------------------------------------------------------------------------- */

/* Walk every structure of the pool and check its invariants. Returns 0, or the source line of
 * the first invariant that does not hold; 0 for NULL or a torn-down pool (nothing to check).
 * Takes the pool lock; call it when no other thread is using the pool. */
int sop__pool_check(struct sop_pool *pool);

#endif /* SOP_INTERNAL_H */
