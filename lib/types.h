/* types.h - the data that lib/'s files share: sizes and limits, the lock, every struct, and the
 * inline readers and writers of their fields. internal.h, the map of the source tree, has the
 * functions. Nothing here is public.
 */
#ifndef SOP_TYPES_H
#define SOP_TYPES_H

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

/* ---- Sizes ------------------------------------------------------------------------------- */

/* Every block is a multiple of 512 bytes and 512-byte aligned, the driver's own spacing. */
#define SOP_ALIGN_LOG2 9
#define SOP_ALIGN ((size_t)1 << SOP_ALIGN_LOG2)
/* Physical memory is added at least this much at a time (the driver's pool grows in 32 MiB
 * steps), or what a larger request needs beyond the free memory next to where it goes. */
#define SOP_SEGMENT_MIN ((size_t)32 << 20)
/* Once threads have met in a pool, a stream's own segment grows by this much (grow.c,
 * growth_step). */
#define SOP_OWN_STEP (SOP_SEGMENT_MIN / 4)
/* Growth maps at most this much in one physical allocation, so that memory freed in a pool's
 * large blocks comes back whole as idle pieces, to be moved where growth needs it (grow.c);
 * but in a pool whose memory may be exported, whose pieces stay where they were made. Smaller
 * pieces pack tighter but move more, and a move costs by the piece (about 55 us on the H200,
 * however the calls are grouped): random sizes up to 1 GiB held 1.33x their live peak at 16-17
 * times the driver's pool's speed with 128 MiB, 1.32x at 9-10 times with 64 MiB, 1.36-1.40x at
 * 27-61 times with 256 (bench/results/2026-11-28-h200-piece-costs/). */
#ifndef SOP_PIECE_MAX_MIB /* given to the compiler to measure others */
#define SOP_PIECE_MAX_MIB 256
#endif
#define SOP_PIECE_MAX ((size_t)SOP_PIECE_MAX_MIB << 20)
/* Growth moves idle pieces rather than adds memory once the pool would reserve more than this
 * many tenths of its live memory, and more than it ever held (reuse.c, roomy). Random sizes up
 * to 1 GiB on the H100, reserved-high over live peak and the warm pool's speed (the driver's
 * pool: 1.062, 0.0097 M operations a second; sop without moves 1.506): past 1.2 times, 1.338 at
 * 0.126; past 1.3, 1.38-1.42 at 0.23-0.28; past 1.4, 1.462 at 0.45; past 1.5, 1.50. */
#ifndef SOP_MOVE_PAST_TENTHS
#define SOP_MOVE_PAST_TENTHS 13
#endif
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
/* Host locations with a default and a current pool (devices.c): HOST, and HOST_NUMA for nodes
 * below SOP_NUMA_NODES. */
#define SOP_NUMA_NODES 64
#define SOP_HOST_SLOTS (1 + SOP_NUMA_NODES)
/* Each pool reserves this many times the device's memory of virtual addresses (a host pool:
 * the host's). */
#define SOP_VA_FACTOR 4
/* Reservations are aligned to and sized in units of this, the registry's granule. */
#define SOP_VA_GRANULE_LOG2 30
/* At most 2 TiB of virtual addresses per pool: the block map's directory takes 8 bytes of host
 * addresses per 64 KiB of them (backed only where segments are). */
#define SOP_VA_MAX ((size_t)1 << 41)
/* Slots per block-map leaf, as a power of two: a leaf covers 64 KiB of addresses (one span of
 * the directory) in 512-byte slots. Spans are small so that blocks of megabytes, which start
 * far apart, mostly have a span each and need no leaf (blockmap.c). */
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

/* ---- Lock ranks (locks.c) ----------------------------------------------------------------
 * The order locks are taken in: a thread takes a lock only while every lock it holds ranks
 * below it. A trylock, which cannot wait, may be taken out of order (a free that takes back
 * FREE memory tries its pool's lock under its stream's: stream.c). Built with -Dchecks=true
 * (the test suite's builds), every take is checked against the locks the thread holds, and a
 * function that needs a lock held says so with SOP_HELD; otherwise none of it is compiled. */
#ifndef SOP_CHECKS
#define SOP_CHECKS 0
#endif

enum sop__rank {
	SOP_RANK_NONE,        /* never: a lock whose rank was not set */
	SOP_RANK_IMPORT,      /* an imported pool's requests to its exporter (import.c) */
	SOP_RANK_DEV,         /* sop__dev_lock (registry.c): default and current pools */
	SOP_RANK_POOL,        /* a pool's lock */
	SOP_RANK_STATE,       /* a stream state's lock (sstream.c) */
	SOP_RANK_SWEEP,       /* the record table's sweep (order.c), only ever tried */
	SOP_RANK_SHARD,       /* a shard of the record table (order.c) */
	SOP_RANK_RECORD,      /* a stream record's lock (order.c) */
	SOP_RANK_SPARES,      /* the probe events of freed records (order.c) */
	SOP_RANK_EVENT,       /* a shard of the event table (event.c) */
	SOP_RANK_REG,         /* reg_lock (registry.c) */
	SOP_RANK_HANDLE,      /* handle_lock (registry.c) */
	SOP_RANK_KEPT,        /* the kept reservations' lock (vmm.c) */
	SOP_RANK_SEGMENT,     /* a segment's lock */
	SOP_RANK_LEAF,        /* a pool's leaf_lock (blockmap.c) */
	SOP_RANK_EPOCH,       /* the epoch lock (epoch.c): retirement takes it under any other */
};

#if SOP_CHECKS
/* Check that the thread may take lock of this rank now, and count it held. */
void sop__rank_take(const void *lock, enum sop__rank rank);
/* Count a lock a trylock took as held, out of order or not. */
void sop__rank_took(const void *lock, enum sop__rank rank);
void sop__rank_drop(const void *lock);
/* Abort, saying where, unless the thread holds lock. */
void sop__rank_held(const void *lock, const char *what, const char *file, int line);
#define SOP_HELD(lock) sop__rank_held((lock), #lock, __FILE__, __LINE__)
#else
static inline void
sop__rank_take(const void *lock, enum sop__rank rank)
{
	(void)lock, (void)rank;
}
static inline void
sop__rank_took(const void *lock, enum sop__rank rank)
{
	(void)lock, (void)rank;
}
static inline void
sop__rank_drop(const void *lock)
{
	(void)lock;
}
#define SOP_HELD(lock) ((void)0)
#endif

/* The mutexes that have a rank, taken and dropped through these. */
static inline void
sop__mutex_take(pthread_mutex_t *m, enum sop__rank rank)
{
	sop__rank_take(m, rank);
	pthread_mutex_lock(m);
}

static inline bool
sop__mutex_try(pthread_mutex_t *m, enum sop__rank rank)
{
	if (pthread_mutex_trylock(m))
		return false;
	sop__rank_took(m, rank);
	return true;
}

static inline void
sop__mutex_drop(pthread_mutex_t *m)
{
	sop__rank_drop(m);
	pthread_mutex_unlock(m);
}

/* ---- A small spin lock for per-stream and per-segment state ------------------------------
 * Held for a few dozen instructions and rarely contended (one thread per stream is the common
 * case), so it beats a mutex. A waiter spins a while, which is all a holder on another core
 * needs, and yields only after that, for a holder that was preempted. */
struct sop__lock {
	atomic_int held;
#if SOP_CHECKS
	enum sop__rank rank;
#endif
};

/* A lock in zeroed memory gets its rank before its first use. */
static inline void
sop__lock_init(struct sop__lock *l, enum sop__rank rank)
{
	atomic_store_explicit(&l->held, 0, memory_order_relaxed);
#if SOP_CHECKS
	l->rank = rank;
#else
	(void)rank;
#endif
}

#if SOP_CHECKS
#define SOP_LOCK_RANK(l) ((l)->rank)
#else
#define SOP_LOCK_RANK(l) SOP_RANK_NONE
#endif

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
sop__lock_spin(struct sop__lock *l)
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
sop__lock_take(struct sop__lock *l)
{
	sop__rank_take(l, SOP_LOCK_RANK(l));
	sop__lock_spin(l);
}

static inline void
sop__lock_drop(struct sop__lock *l)
{
	sop__rank_drop(l);
	atomic_store_explicit(&l->held, 0, memory_order_release);
}

/* Take a lock if it is free at once; true if taken. */
static inline bool
sop__lock_try(struct sop__lock *l)
{
	if (atomic_load_explicit(&l->held, memory_order_relaxed) ||
	    atomic_exchange_explicit(&l->held, 1, memory_order_acquire))
		return false;
	sop__rank_took(l, SOP_LOCK_RANK(l));
	return true;
}

/* Take a lock; true if it had to wait for it. */
static inline bool
sop__lock_take_waited(struct sop__lock *l)
{
	sop__rank_take(l, SOP_LOCK_RANK(l));
	if (SOP_LIKELY(!atomic_exchange_explicit(&l->held, 1, memory_order_acquire)))
		return false;
	sop__lock_spin(l);
	return true;
}

/* ---- The driver's table and call counts (driver.c) --------------------------------------- */

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
	X(cuStreamIsCapturing)                                                                     \
	X(cuThreadExchangeStreamCaptureMode)                                                       \
	X(cuStreamDestroy)                                                                         \
	X(cuStreamSynchronize)                                                                     \
	X(cuStreamQuery)                                                                           \
	X(cuStreamWaitEvent)                                                                       \
	X(cuEventCreate)                                                                           \
	X(cuEventDestroy)                                                                          \
	X(cuEventRecord)                                                                           \
	X(cuEventQuery)                                                                            \
	X(cuEventSynchronize)                                                                      \
	X(cuMemAllocAsync)                                                                         \
	X(cuMemFreeAsync)                                                                          \
	X(cuMemGetAllocationGranularity)                                                           \
	X(cuMemAddressReserve)                                                                     \
	X(cuMemAddressFree)                                                                        \
	X(cuMemCreate)                                                                             \
	X(cuMemRelease)                                                                            \
	X(cuMemMap)                                                                                \
	X(cuMemUnmap)                                                                              \
	X(cuMemSetAccess)                                                                          \
	X(cuMemExportToShareableHandle)                                                            \
	X(cuMemImportFromShareableHandle)                                                          \
	X(cuDeviceGetUuid)

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

/* ---- Deferred reclamation (epoch.c) ------------------------------------------------------ */

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

/* ---- Free lists (bins.c) ----------------------------------------------------------------- */

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

/* ---- Blocks, pieces and segments (block.c, vmm.c, segment.c) ----------------------------- */

enum sop__state {
	SOP_BLOCK_DEAD = 0,   /* descriptor on the pool's spare list */
	SOP_BLOCK_FREE = 1,   /* in the pool heap: reusable by any stream */
	SOP_BLOCK_ALLOC = 2,  /* handed to the application */
	SOP_BLOCK_CACHED = 3, /* freed on a stream, pending there: reusable by that stream only */
	SOP_BLOCK_HOLE = 4,   /* a range of its segment with no physical memory behind it */
	/* A range a growth claimed while the driver maps it, the pool lock dropped (grow.c):
	 * in no list, joined with nothing, found by no search, until the growth ends. */
	SOP_BLOCK_MAPPING = 5,
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
	/* ALLOC: 0, or the pool's export serial once the allocation has been exported, which the
	 * export data carries so that data of a block freed since is refused (share.c). Cleared
	 * when the block is handed out; read and set under the pool lock. */
	uint64_t gen;
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
	/* Names the piece to importers: the pool's count of pieces made when it was made. */
	uint64_t serial;
	/* An imported piece (import.c): the live and pending imported pointers that it backs. */
	size_t refs;
	/* An exported pool's piece: its shareable descriptor plus one, once an importer asked for
	 * it (share.c), kept open until the piece is released or the pool keeps too many (exporting
	 * one costs 0.6 ms), and when it last served a request (the pool's fd_clock then). */
	int fd_plus1;
	uint64_t fd_used;
	/* A pointer it backs was exported before it had a descriptor: the broker exports it ahead
	 * of the importer's request (share.c, ahead_mark), with the pool lock dropped while
	 * exporting, when no release may unmap it (release.c). Pool lock. */
	bool ahead, exporting;
};

/* A growth's claim whose pieces the driver would not unmap once the growth had failed (grow.c):
 * the range stays claimed, so that no later growth maps over it, and the unmaps are retried
 * before each release (release.c). */
struct sop__stuck {
	struct sop__stuck *next;
	struct sop__block *claim; /* MAPPING, counted in its segment's claims */
	size_t size;              /* the claim's bytes, still counted in the pool's mapping */
	size_t n;                 /* pieces still mapped, with their handles */
	struct sop__piece *pc[];
};

/* Spare block-map leaves (blockmap.c): at most this many on hand. */
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
	/* Growths mapping in it with the pool lock dropped: it is not dropped while any is (pool
	 * lock). */
	size_t claims;
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

/* Take a segment's lock, noting whether anyone had to wait. */
static inline void
sop__segment_lock(struct sop__segment *seg)
{
	if (SOP_UNLIKELY(sop__lock_take_waited(&seg->lock)))
		atomic_store_explicit(seg->met, true, memory_order_relaxed);
}

/* ---- Stream records (order.c) ------------------------------------------------------------ */

#define SOP_PROBES 4
#define SOP_DEPS 16

struct sop__stream;

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
	atomic_bool gone;         /* its stream is being destroyed (sop_stream_destroy) */
	CUcontext ctx;
	uint64_t ctx_id;          /* cuCtxGetId: a context's handle value is reused too */
	CUdevice device;
	bool probes_ok;           /* ctx is a primary context sop keeps alive: probes allowed */
	_Atomic uint64_t epoch;   /* frees are tagged with it; marks advance it; starts at 1 */
	_Atomic uint64_t done;    /* frees up to here are complete (a probe or a sync said so) */
	_Atomic uint64_t newest;  /* epoch of the newest probe, 0 if none */
	_Atomic uint64_t last_free; /* the tag of the latest free on it, in any pool */
	atomic_uint frees_since;  /* frees since the last probe */
	/* Its pace, as its pools' slow paths see it (sop__stream_pace): frees since pace_ns (the
	 * first of them), and how many of its next frees get a probe each for its being slow. */
	atomic_uint frees_paced;
	atomic_uint slow_probes;
	_Atomic uint64_t pace_ns;
	uint64_t born_ns;         /* when sop first saw it (sop__now_ns): young streams get no
				   * probes by count (sop__stream_after_free) */
	_Atomic uint64_t next_poll_ns; /* do not query running probes again before this */
	_Atomic uint64_t probe_ns; /* when its newest probe was recorded (sop__now_ns) */
	pthread_mutex_t lock;     /* probes, deps and claims */
	struct sop__probe probe[SOP_PROBES];
	uint64_t events_reset; /* primary resets before its events were made (order.c) */
	unsigned next_probe;
	/* What this stream's future work is ordered after: deps, because sop made it wait for
	 * a probe (proven); claims, from events waited on (order.c says what proves them). */
	struct sop__clock deps, claims;
	atomic_uint n_order;      /* deps.n + claims.n, to read without the lock */
	/* The pools whose states hold this record, by handle (0: none), and how many more there
	 * are than fit: the stream's synchronization and destruction visit only those pools. */
	_Atomic uint64_t in_pool[2];
	atomic_uint in_more;
	struct sop__stream *hash_next;
	struct sop__retired retired;
};

/* A free on st was tagged seq (for events, which prove what they claim with a probe that covers
 * the frees before them, and for the probe a stream's destroy records). A load, and once per
 * epoch a compare-and-swap: frees racing on one stream from two threads, with a store, could
 * leave the smaller tag, and the destroy would then record no probe for the larger one's free,
 * which would wait for a synchronization of the context. */
static inline void
sop__stream_freed(struct sop__stream *st, uint64_t seq)
{
	uint64_t last = atomic_load_explicit(&st->last_free, memory_order_relaxed);

	while (last < seq && !atomic_compare_exchange_weak_explicit(&st->last_free, &last, seq,
								    memory_order_relaxed,
								    memory_order_relaxed))
		;
}

/* A state of the pool with this handle now holds st, or no longer does (sstream.c). Sequentially
 * consistent: a synchronization that marked the stream after a free in that state, which came
 * after the state was made, finds the pool here. */
static inline void
sop__stream_pool_add(struct sop__stream *st, uint64_t pool)
{
	unsigned i;

	for (i = 0; i < 2; i++) {
		uint64_t none = 0;
		if (atomic_compare_exchange_strong(&st->in_pool[i], &none, pool))
			return;
	}
	atomic_fetch_add(&st->in_more, 1);
}

static inline void
sop__stream_pool_drop(struct sop__stream *st, uint64_t pool)
{
	unsigned i;

	for (i = 0; i < 2; i++) {
		uint64_t was = pool;
		if (atomic_compare_exchange_strong(&st->in_pool[i], &was, 0))
			return;
	}
	atomic_fetch_sub(&st->in_more, 1);
}

/* Whether a state of the pool with this handle may hold st. */
static inline bool
sop__stream_in_pool(struct sop__stream *st, uint64_t pool)
{
	return atomic_load(&st->in_pool[0]) == pool || atomic_load(&st->in_pool[1]) == pool ||
	       atomic_load(&st->in_more) != 0;
}

/* ---- A pool's stream states (sstream.c) -------------------------------------------------- */

/* A pool's view of one stream: the blocks freed on it that only it may reuse yet, each tagged
 * with the stream's epoch at its free. The lock guards the cache and the identity; a state
 * whose id is 0 is retired. A block is CACHED with owner ss exactly while it is in ss's cache
 * or ss's lock is held over it: a block taken out for carving by another path first loses its
 * owner, so that the stream's own merging never reaches for a block that is in no bin. */
struct sop__sstream {
	/* What walks of the pool's list read (finding a stream's state, synchronizations, idle
	 * passes), on a line of its own: the stream's thread writes the lock and the cache on
	 * every call, and sixteen threads walking twenty states each missed on every one. */
	struct sop_pool *pool;
	uint64_t id;            /* cuStreamGetId: unique for the process's lifetime; 0 once retired */
	struct sop__stream *st; /* the stream's record (order.c) */
	struct sop__sstream *next; /* pool->streams */
	atomic_bool gone;          /* its stream is known to be destroyed (stream.c) */
	/* Whether a segment may have it as home: set where one may become its (the slow path),
	 * cleared where all of its were given up (sop__segments_disown), so that the destruction
	 * of a stream whose synchronization gave them up takes no pool lock. */
	atomic_bool may_home;
	_Alignas(64) struct sop__lock lock;
	/* Used memory, sharded: bytes allocated on this stream and not yet freed, and the highest
	 * value since the pool last folded the shards (sop__pool_used). used_local and used_hw change
	 * only under the lock, so a same-stream allocation and free cost no locked instruction (their
	 * stores are atomic, for readers without the lock); a free on another stream, or sop_free,
	 * subtracts from used_remote instead. */
	int64_t used_local, used_hw;
	_Atomic int64_t used_remote;
	uint64_t last_seq; /* the tag of the latest free into the cache */
	uint64_t flushed;  /* frees up to here have left the cache (pool lock) */
	bool active;       /* allocated or freed on since the last retirement pass */
	/* The block handed out last (stream lock; compared, never followed: block.c's
	 * sop__block_merge_own). */
	const struct sop__block *handed;
	/* Its request waits for growth with the pool lock dropped (grow.c): not retired
	 * meanwhile, however empty and idle it looks. Pool lock. */
	unsigned growing;
	struct sop__bins cache;
	/* Descriptors for splitting and merging cached blocks under the stream's lock alone; the
	 * last of them too, so that a retired state hands them all back at once (NULL when none). */
	struct sop__block *spare, *spare_last;
	unsigned n_spare;
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

/* ---- Sharing pools between processes (share.c, import.c) --------------------------------- */

/* An exportable pool's broker: a thread that serves importers. The descriptor sop hands out is
 * `a`, one end of a SOCK_SEQPACKET pair; the thread reads `b`, where each importer's first
 * message brings a private connection (a socket of its own), on which its requests for pieces
 * are then answered. */
struct sop__broker {
	struct sop_pool *pool;
	pthread_t thread;
	int a, b;
	int wake[2]; /* a pipe: its write end stops the thread */
	/* The thread that exports pieces ahead of importers' requests (share.c, ahead_main): a
	 * byte on hint wakes it, wake stops it too; exported is signalled, under the pool lock,
	 * when a piece it exported is no longer marked exporting. */
	pthread_t ahead_thread;
	int hint[2];
	pthread_cond_t exported;
	/* The importers' connections, changed only under share.c's list lock, so that a forked
	 * child closes its copies of them all. */
	int *conn;
	size_t n_conn, cap_conn;
	struct sop__broker *next; /* every running broker, for fork */
};

/* The board: a table in memory the exporter shares with its importers, of the allocations it
 * exported that are still live (slot: export serial, offset, requested size, and the serial of
 * the one piece under it, 0 if several), so that an importer imports a pointer whose piece it
 * maps already without asking the broker. Written by the exporter only: at an export (pool lock)
 * and at the allocation's free (gen cleared). An allocation not on it (full) is asked for. */
struct sop__board_slot {
	_Atomic uint64_t gen, off, size, serial;
};
#define SOP_BOARD_SLOTS 16384
#define SOP_BOARD_PROBES 16
#define SOP_BOARD_BYTES (SOP_BOARD_SLOTS * sizeof(struct sop__board_slot))

static inline size_t
sop__board_hash(uint64_t off)
{
	return (size_t)(((off >> 9) * 0x9e3779b97f4a7c15ull) >> 32) & (SOP_BOARD_SLOTS - 1);
}

/* A pointer imported into an imported pool. */
struct sop__imported {
	CUdeviceptr ptr;
	size_t size;     /* the allocation's requested bytes */
	size_t count;    /* imports of it not yet freed */
	CUevent done;    /* its free, once freed: the mapping goes when this has completed */
};

/* An imported pool: the connection to the exporter's broker, the exporter's pieces mapped here
 * (at the exporter's offsets in a reservation of its size) and the pointers imported. */
struct sop__import {
	pthread_mutex_t lock; /* one request at a time; taken before the pool lock */
	int fd;               /* the private connection; -1 once closed */
	/* The rest under the pool lock. */
	struct sop__piece **pieces; /* mapped, by address */
	size_t n_pieces, cap_pieces;
	struct sop__imported *ptrs; /* live and pending, by address */
	size_t n_ptrs, cap_ptrs, n_pending;
	/* A piece no pointer uses is still mapped: the driver refused its unmap. Retried at each
	 * synchronization point, and before the range is mapped again. */
	bool kept;
	uint64_t used, used_high; /* bytes of live imported pointers */
	struct sop__import *next; /* every connected import, for fork */
};

/* The wire, between an importer and a broker (SOCK_SEQPACKET: a message is read whole). */
#define SOP_WIRE_MAGIC 0x736f7049u /* "sopI" */
#define SOP_WIRE_VERSION 1
/* Export data, in a CUmemPoolPtrExportData (64 bytes). */
struct sop__export_data {
	uint32_t magic;
	uint16_t version, zero;
	uint64_t token; /* the pool's */
	uint64_t off;   /* of the allocation in the pool's reservation */
	uint64_t size;  /* requested bytes */
	uint64_t gen;   /* the block's export serial */
	uint64_t check; /* a function of the above and the token */
	uint64_t pad[2];
};
enum sop__wire_op { SOP_WIRE_HELLO = 1, SOP_WIRE_WELCOME, SOP_WIRE_PIECES, SOP_WIRE_ANSWER };
struct sop__wire_hello {
	uint32_t magic, version, op, zero; /* and, as SCM_RIGHTS, the private connection */
};
struct sop__wire_welcome {
	uint32_t magic, version, op;
	int32_t status; /* a CUresult */
	uint64_t token, va_size, granularity, max_size;
	CUmemLocation location;
	uint32_t handle_types;
	CUuuid uuid; /* the resident device's */
};
/* Pieces an importer already maps are named in have, so that their handles do not travel. */
#define SOP_WIRE_HAVE 32
struct sop__wire_request {
	uint32_t magic, version, op, n_have;
	struct sop__export_data data;
	uint64_t have[SOP_WIRE_HAVE];
};
/* At most this many pieces per answer message; n_total says how many follow in all. Each
 * piece with fd set comes with a descriptor, in order, as SCM_RIGHTS. */
#define SOP_WIRE_PIECES_MAX 64
struct sop__wire_piece {
	uint64_t serial, off, size;
	uint32_t fd, zero;
};
struct sop__wire_answer {
	uint32_t magic, version, op;
	int32_t status;
	uint32_t n_total, n_here;
	struct sop__wire_piece pieces[SOP_WIRE_PIECES_MAX];
};

/* ---- Pools (pool.c) ---------------------------------------------------------------------- */

/* The hot paths of many threads read the first group of a pool's fields on every call: they
 * must not lose its line each time the slow path writes the heap or the lock. */
struct sop_pool {
	/* Read on every call, written only at creation and teardown (or rarely, by attribute
	 * writes). */
	uint64_t handle; /* its sop_pool_t: slot and generation (registry.c); never reused */
	CUmemPoolProps props;
	/* The device whose memory it holds; for a host pool, the device whose context its driver
	 * calls are made in (the one current at its creation, else 0), which owns nothing. */
	CUdevice device;
	bool host; /* located on the host (HOST or HOST_NUMA): pinned host memory */
	CUcontext ctx; /* the device's primary context, retained for driver calls */
	bool is_default;
	bool imported; /* made by sop_pool_import_from_shareable_handle: pool->import */
	atomic_bool destroyed; /* sop_pool_destroy was called; torn down once empty */
	atomic_bool dead; /* torn down; the object is freed once no call can be reading it */
	size_t granularity;
	size_t max_size; /* 0: no cap besides the device */
	CUdeviceptr va_base;
	size_t va_size;
	_Atomic(uintptr_t) *map_dir; /* the block map, an entry per 64 KiB (blockmap.c) */
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
	struct sop__stuck *stuck; /* claims whose unmaps are owed */
	/* Host memory mapped at va_base from the first release that left the pool empty, so that
	 * the driver keeps the page tables there (vmm.c, sop__anchor_make). */
	CUmemGenericAllocationHandle anchor;
	bool anchored, anchor_tried;
	/* The reservation was a pool's before (vmm.c, sop__va_reserve). */
	bool va_reused;
	struct sop__bins heap;

	struct sop__block *spare; /* descriptors not in use, in chains (block.c) */
	void **slabs;
	size_t n_slabs, cap_slabs;

	/* Its stream states. Changed under the pool lock, with atomic stores where a lookup may
	 * be walking it without the lock (sstream.c). */
	struct sop__sstream *streams;
	/* A retirement pass when n_streams reaches retire_at. n_streams is stored atomically:
	 * frees read it without the lock (sop__free_async). */
	size_t n_streams, retire_at;
	int64_t retired_hw; /* the highs of states retired since the last fold (sop__pool_used) */

	/* Sharing: the token that export data carries, counts that name pieces and exports, the
	 * broker of an exported pool, the state of an imported one (what it maps and has imported
	 * keeps the pool from being torn down: pool.c reads its counts). */
	uint64_t token, piece_serial, export_serial;
	struct sop__broker *broker;
	struct sop__import *import;
	struct sop__board_slot *board; /* exporter: read-write; importer: the exporter's, read-only */
	int board_fd_plus1;            /* exporter: its memfd plus one, else 0 */
	size_t fds_kept;               /* exporter: pieces' descriptors open (pool lock) */
	uint64_t fd_clock;             /* exporter: requests for pieces' descriptors (pool lock) */
	CUmemAccessDesc *access; /* peers granted access, besides the owner */
	size_t n_access;
	uint64_t access_gen; /* counts changes of access, which growths in flight catch up on */
	/* A growth is mapping with the pool lock dropped (grow.c): the next one waits on grown,
	 * then looks again. mapping: the bytes it maps, counted with reserved against maxSize. */
	bool growing;
	pthread_cond_t grown;
	size_t mapping;
	unsigned mapping_leaves; /* spare leaves the growth in flight holds for its splits */
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
	/* Some thread has waited for a segment's lock, or for the pool lock where a request takes
	 * it (sop__pool_lock_noting): streams of this pool run on several threads at once, and the
	 * slow path keeps each one's memory in segments of its own. Until then it places by best
	 * fit alone. */
	atomic_bool threads_met;
	_Atomic uint64_t release_threshold;
	_Atomic uint64_t reserved, reserved_high;
	/* Descriptors streams gave back without the pool lock; taken whole under it. */
	_Atomic(struct sop__block *) returned;
	SOP_PAD(pad2);

	/* The block map's spare leaves, under leaf_lock, which segment lock holders take now and
	 * then to refill or shed their own spares (blockmap.c). */
	struct sop__lock leaf_lock;
	struct sop__map_leaf **leaf_spare;
	size_t n_leaf_spare, cap_leaf_spare, n_leaves;
	struct sop__leaf_slab *leaf_slabs;

	struct sop_pool *next; /* registry list */
	struct sop__retired retired; /* once torn down (epoch.c) */
};

/* Take the pool lock where threads of a busy pool meet (the slow path, a stream's first request,
 * a synchronization): try it SOP_POOL_SPINS times before sleeping. Those hold it 1-10 us, and
 * a thread that went to sleep for it waited about 300 us on the H100 (the futex's wake-up, then
 * often the lock taken again meanwhile): sixteen threads whose tasks each make a stream spent a
 * third of their time there, with the lock held 40% of the time. The mutex's own adaptive spin
 * gives up after a hundred tries. */
#define SOP_POOL_SPINS 1000

static inline void
sop__pool_lock_spun(struct sop_pool *pool)
{
	int i;

	sop__rank_take(&pool->lock, SOP_RANK_POOL);
	for (i = 0; i < SOP_POOL_SPINS; i++) {
		if (!pthread_mutex_trylock(&pool->lock))
			return;
		sop__cpu_relax();
	}
	pthread_mutex_lock(&pool->lock);
}

/* Take the pool lock for a stream's first request in the pool or an allocation's slow path,
 * noting whether anyone had to wait. Threads that start at once on a fresh pool make their
 * streams known and fill their first blocks there, one after another, and would wait on no
 * segment lock until they free: by then their blocks lay in shared segments, where every split
 * and merge of sixteen threads took the same few segment locks (half their time on the H100, at
 * 2.8-6.4 M pairs/s against 28-34 once a wait here counted). */
static inline void
sop__pool_lock_noting(struct sop_pool *pool)
{
	if (SOP_LIKELY(!pthread_mutex_trylock(&pool->lock))) {
		sop__rank_take(&pool->lock, SOP_RANK_POOL);
		return;
	}
	if (!atomic_load_explicit(&pool->threads_met, memory_order_relaxed))
		atomic_store_explicit(&pool->threads_met, true, memory_order_relaxed);
	sop__pool_lock_spun(pool);
}

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
	return __atomic_load_n(&ss->used_local, __ATOMIC_RELAXED) +
	       atomic_load_explicit(&ss->used_remote, memory_order_relaxed);
}

/* Count an allocation of req bytes on ss. Its lock held. */
static inline void
sop__used_add(struct sop__sstream *ss, struct sop__block *b, size_t req)
{
	int64_t now;

	__atomic_store_n(&ss->used_local, ss->used_local + (int64_t)req, __ATOMIC_RELAXED);
	now = sop__sstream_used(ss);
	if (now > ss->used_hw)
		__atomic_store_n(&ss->used_hw, now, __ATOMIC_RELAXED);
	__atomic_store_n(&b->alloc_ss, ss, __ATOMIC_RELAXED); /* peeked at by frees: stream.c */
	__atomic_store_n(&b->req, req, __ATOMIC_RELAXED); /* a broker may be reading it (share.c) */
}

/* Uncount a free; ss is the freeing stream's state with its lock held, or NULL. */
static inline void
sop__used_sub(struct sop__block *b, struct sop__sstream *ss)
{
	if (b->alloc_ss == ss)
		__atomic_store_n(&ss->used_local, ss->used_local - (int64_t)b->req, __ATOMIC_RELAXED);
	else
		atomic_fetch_sub_explicit(&b->alloc_ss->used_remote, (int64_t)b->req,
					  memory_order_relaxed);
	/* sop_pointer_get_pool may be reading it, under other locks, for a free on its way. */
	__atomic_store_n(&b->req, 0, __ATOMIC_RELAXED);
}

/* ---- Pool handles (registry.c) ----------------------------------------------------------- */

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

static inline sop_pool_t
sop__pool_handle(const struct sop_pool *pool)
{
	return (sop_pool_t)(uintptr_t)pool->handle;
}

#endif /* SOP_TYPES_H */
