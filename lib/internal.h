/* internal.h - the map of the source tree: the files of lib/, each calling only files listed
 * above it (test/check-layers.sh checks that on the objects), then every cross-file function,
 * grouped under the file that defines it, in the same order. The types they share, with the
 * inline accessors of their fields, are in types.h. Nothing here is public.
 *
 * Checks
 *   locks.c     in a build with -Dchecks=true, the locks each thread holds, every take checked
 *               against the order of types.h's ranks; empty otherwise
 * The driver
 *   driver.c    the only file through which sop calls cu*: a table of entry points loaded with
 *               dlopen, call counts, primary contexts, a pool's context pushed and popped, the
 *               relaxed capture mode paid at the first call of a stretch that owes it
 *   limit.c     device memory limits: each device's cap and what sop's pools hold against it
 * Process-wide state
 *   epoch.c     deferred reclamation: an object is freed once no call can be reading it
 *   bins.c      segregated-fit free lists (TLSF): two bitmaps and 32 lists per power of two
 *   registry.c  driver initialisation, devices, pool handles, the address-to-pool table, the
 *               tables of each device's default and current pool
 * Physical memory
 *   vmm.c       physical pieces through the driver's virtual memory calls: create, map and
 *               open one (device or pinned host memory); whether the driver makes host memory;
 *               releases retried; the anchor that keeps an empty pool's page tables;
 *               reservations, with their anchors, kept for the next pool
 * Blocks and the pool heap
 *   blockmap.c  the block map: which block starts at an address, lock-free to read
 *   block.c     descriptors, carve and split, merge, the pool heap of FREE blocks, spares
 *   segment.c   the pool's address space: free extents of the reservation, segments, holes,
 *               piece arrays, a segment cut for a stream to adopt a part; free extents and peer
 *               access over every piece
 *   release.c   idle pieces back to the driver, or out of the pool for growth to move; the
 *               host side of a pool at teardown
 *   grow.c      growth: where physical memory is mapped for a request
 * Stream order and stream caches
 *   order.c     who a stream is (by id), its record, epochs and probe events
 *   event.c     what orders a stream after another: waits on probes, clocks events carry
 *   sstream.c   a pool's stream states: caches of pending frees, used memory, retirement
 *   reuse.c     the slow path: what memory a request takes, in doc/reuse.md's order
 * Pools
 *   pool.c      pool objects: create, destroy, reap, attributes, access, trim
 *   share.c     a pool shared with other processes, the exporting side: export data, and the
 *               broker that hands the pool's pieces to importers over a socket (two threads:
 *               one answers, one exports pieces ahead of the requests)
 *   import.c    the importing side: a pool that stands for an exported one, pointers imported
 *               into it (the exporter's pieces mapped at their offsets), their frees
 *   sync.c      synchronization points, across every pool
 * Allocation and the API
 *   stream.c    the hot path, and the thread-local cache of stream states it reaches them by
 *   devices.c   what concerns every pool of a device: its default pool (made on first use) and
 *               current pool; at its memory limit, idle memory given back and the report; the
 *               same tables for host locations, and a device's closest host location
 *   sop.c       public entry points: check arguments, take locks, call in
 *   check.c     sop__pool_check, the invariant walker (for tests; reads every layer)
 *   preload.c   the interposer, libsop-preload.so (not in libsop): the driver's stream-ordered
 *               allocator and the calls sop learns stream order from, as unchanged programs reach
 *               them (their symbols, dlsym, cuGetProcAddress), served by sop's public calls; what
 *               sop does not serve goes to the driver's own entry points. The one call up into
 *               it: driver.c, built into it, resolves the driver through its real dlsym
 */
#ifndef SOP_INTERNAL_H
#define SOP_INTERNAL_H

#include "types.h"

/* ---- driver.c ---------------------------------------------------------------------------- */

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

/* A relaxed capture mode owed before the thread's next driver call (sop__capture_relax_lazy,
 * order.c): SOP_RELAX_DUE until a call pays it, SOP_RELAX_PAID once the mode was exchanged
 * (the thread's own mode kept in sop__relax_saved), SOP_RELAX_NONE outside such a stretch. */
enum { SOP_RELAX_NONE, SOP_RELAX_DUE, SOP_RELAX_PAID };
extern __thread int sop__relax_state __attribute__((tls_model("initial-exec")));
extern __thread int sop__relax_saved __attribute__((tls_model("initial-exec")));
void sop__relax_pay(void);

static inline void
sop__relax_due(void)
{
	if (SOP_UNLIKELY(sop__relax_state == SOP_RELAX_DUE))
		sop__relax_pay();
}

#define SOP_DRV(name) (sop__count(SOP_N_##name), sop__relax_due(), sop__drv.name)

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
/* The device's primary context if sop__driver_primary retained it, else NULL; no driver call. */
CUcontext sop__driver_primary_held(CUdevice device);
/* Make the pool's context current around driver calls that need one: pushed and popped only
 * where the thread has another current, or none. */
CUresult sop__pool_ctx_push(struct sop_pool *pool);
void sop__pool_ctx_pop(struct sop_pool *pool);

/* ---- limit.c ----------------------------------------------------------------------------- */

/* Read SOP_DEVICE_MEMORY_LIMIT(_<ordinal>) and SOP_OOM_REPORT (sop__init). CUDA_ERROR_INVALID_VALUE
 * for a limit that is not a size. */
CUresult sop__limits_init(int n_devices);
/* Count size bytes of physical memory against the device's cap before they are created: false,
 * and nothing counted, if that would pass it. */
bool sop__limit_charge(CUdevice device, size_t size);
/* Uncount size bytes: a charge whose allocation failed, or a piece unmapped. */
void sop__limit_discharge(CUdevice device, size_t size);
/* The device's cap (0: none) and the bytes sop's pools hold on it. */
void sop__limit_get(CUdevice device, size_t *limit, size_t *held);
void sop__limit_set(CUdevice device, size_t limit);
/* Whether SOP_OOM_REPORT asks for the out-of-memory report. */
bool sop__limit_reporting(void);

/* ---- epoch.c ----------------------------------------------------------------------------- */

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
/* Whether the list a block of this size would go to holds no block. */
bool sop__bins_list_empty(const struct sop__bins *bins, size_t size);
/* The list a block of this size lives in (for checks). */
void sop__bins_index(size_t size, unsigned *fl, unsigned *sl);

/* ---- registry.c -------------------------------------------------------------------------- */

/* Driver init plus the process-wide tables; every public call starts here. */
CUresult sop__init(void);
int sop__device_count(void);

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
/* Each device's default and current pool (NULL: the default; a mark while it is not sop's:
 * devices.c), read without a lock, written under sop__dev_lock (devices.c). */
extern pthread_mutex_t sop__dev_lock;
extern _Atomic(struct sop_pool *) *sop__default_pools;
extern _Atomic(struct sop_pool *) *sop__current_pools;
/* The same for host locations, by sop__host_slot. */
extern _Atomic(struct sop_pool *) sop__host_default_pools[SOP_HOST_SLOTS];
extern _Atomic(struct sop_pool *) sop__host_current_pools[SOP_HOST_SLOTS];

/* The slot of a host location in those tables: 0 for HOST, 1 + id for HOST_NUMA nodes below
 * SOP_NUMA_NODES; -1 for any other location. */
static inline int
sop__host_slot(const CUmemLocation *loc)
{
	if (loc->type == CU_MEM_LOCATION_TYPE_HOST)
		return 0;
	if (loc->type == CU_MEM_LOCATION_TYPE_HOST_NUMA && loc->id >= 0 && loc->id < SOP_NUMA_NODES)
		return 1 + loc->id;
	return -1;
}
/* A pool is going away: mark it destroyed and make the default current again where it was
 * current, both under the lock that sop__set_current_pool takes, so that no device can be left
 * with a destroyed pool as current. False, with nothing changed, if it was marked already: of
 * destroys that race, one goes on. */
bool sop__forget_current(struct sop_pool *pool);

/* ---- vmm.c ------------------------------------------------------------------------------- */

/* The access descriptors of a piece of the pool: the owner's, then each peer granted access;
 * *n of them, malloc'd (NULL without memory). Pool lock held. */
CUmemAccessDesc *sop__access_list(const struct sop_pool *pool, size_t *n);
/* Map a physical allocation (made here, or imported) at va, open to the pool's owner and the
 * devices granted access; on a failure nothing stays mapped, unless the driver refused the
 * unmap as well: then *stuck is set, and the caller owes the unmap. Context current, pool lock
 * held. */
CUresult sop__piece_open(struct sop_pool *pool, CUdeviceptr va, size_t size,
			 CUmemGenericAllocationHandle h, bool *stuck);
/* Create, map and open one physical allocation of size bytes at va, with the n access
 * descriptors desc (sop__access_list). On a failure *left says what the driver's refusals
 * left to the caller: nothing; *h mapped still (it would not unmap what could not be opened),
 * counted against the device's limit, for the caller to unmap and release later; or *h
 * unmapped, its release refused. Context current; the pool lock need not be held. */
enum sop__left { SOP_LEFT_NONE, SOP_LEFT_MAPPED, SOP_LEFT_HANDLE };
CUresult sop__piece_map(struct sop_pool *pool, CUdeviceptr va, size_t size,
			const CUmemAccessDesc *desc, size_t n, CUmemGenericAllocationHandle *h,
			enum sop__left *left);
/* Map at pc->va, and open as desc says, a piece of the pool that was unmapped elsewhere
 * (sop__idle_take) with its handle and charge kept. On a failure, *left as sop__piece_map says,
 * and with nothing left mapped the handle is released and uncounted (sop__piece_let_go).
 * Context current; the pool lock need not be held. */
CUresult sop__piece_remap(struct sop_pool *pool, const struct sop__piece *pc,
			  const CUmemAccessDesc *desc, size_t n, enum sop__left *left);
/* Release an unmapped piece's handle and uncount it from the device's limit; the driver's code
 * (a refused release leaves the handle the caller's to keep as an orphan). Context current; the
 * pool lock need not be held. */
CUresult sop__piece_let_go(struct sop_pool *pool, const struct sop__piece *pc);
/* Unmap a piece made by sop__piece_map and release its handle, uncounted from the device's
 * limit: false, and nothing done, if the driver refuses the unmap; *orphaned if it refused the
 * release, the handle then the caller's to keep (sop__orphan_keep). Context current; the pool
 * lock need not be held. */
bool sop__piece_unmake(struct sop_pool *pool, const struct sop__piece *pc, bool *orphaned);
/* Create one physical allocation of size bytes and release it: whether the driver makes memory
 * as prop asks (a host pool's creation asks, as drivers differ: doc/differences.md), with its
 * code; a release the driver refuses leaves the handle to the pool's orphans. Context
 * current. */
CUresult sop__piece_probe(struct sop_pool *pool, const CUmemAllocationProp *prop, size_t size);
/* Keep a handle whose range is unmapped but whose cuMemRelease failed, to be released again;
 * retry the releases that failed before (context current). */
void sop__orphan_keep(struct sop_pool *pool, CUmemGenericAllocationHandle h);
CUresult sop__orphans_release(struct sop_pool *pool);
/* Map a granule of host memory at the start of the reservation before a release leaves the
 * pool empty, or as a reservation taken again is kept for the next pool (sop__pool_reap), so
 * that the driver keeps its page tables there. Context current, pool lock held. */
void sop__anchor_make(struct sop_pool *pool);
/* Unmap and release the anchor, if any. Context current, pool lock held. */
CUresult sop__heap_anchor_drop(struct sop_pool *pool);
/* The pool's reservation (pool->va_size bytes at pool->va_base): one a pool of the same
 * location, size and granularity left at its teardown, with that pool's anchor if it had one,
 * else a new one from the driver. Context current. */
CUresult sop__va_reserve(struct sop_pool *pool);
/* Promise a torn-down pool's reservation a place among those kept (false: no room, the caller
 * gives it back); sop__va_keep then keeps it, with its anchor, once no table names the pool, or
 * sop__va_unclaim takes the promise back. */
bool sop__va_claim(void);
void sop__va_unclaim(void);
void sop__va_keep(struct sop_pool *pool);
/* Unmap and release the anchor, then free the reservation; the driver's code. Context
 * current, pool lock held. */
CUresult sop__va_give_back(struct sop_pool *pool);
/* What the kept reservations hold, for tests that count the driver's objects; and give them
 * all back to the driver (tests), the driver's first refusal if any. */
void sop__va_kept(long *reservations, long *anchors, size_t *anchor_bytes);
CUresult sop__va_kept_free(void);
/* Keep at most n from now on (tests: 0 for pools that always reserve and free their own);
 * returns the bound before. */
int sop__va_kept_max(int n);

/* ---- blockmap.c -------------------------------------------------------------------------- */

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
/* Spare leaves taken for a segment's splits (need at least, want if they come
 * cheaply; false without host memory) and given back down to keep; a segment's lock with n
 * spare leaves in hand; a block entered in the map and taken out. Segment lock held. */
bool sop__leaves_get(struct sop_pool *pool, struct sop__leaves *to, unsigned int need,
		     unsigned int want);
void sop__leaves_put(struct sop_pool *pool, struct sop__leaves *from, unsigned int keep);
bool sop__segment_lock_leaves(struct sop_pool *pool, struct sop__segment *seg, unsigned int n);
void sop__map_add(struct sop_pool *pool, struct sop__leaves *spares, CUdeviceptr addr,
		  struct sop__block *b);
void sop__map_remove(struct sop_pool *pool, struct sop__segment *seg, CUdeviceptr addr);
/* Split b at size into b and rest (a fresh descriptor) of the given state, rest
 * entered in the map. Segment lock held. */
void sop__block_split(struct sop_pool *pool, struct sop__block *b, struct sop__block *rest,
		      size_t size, enum sop__state state, struct sop__leaves *spares);

/* ---- block.c ----------------------------------------------------------------------------- */

/* Descriptors come from a per-pool slab: the heap never calls malloc per block on its paths. */
struct sop__block *sop__block_new(struct sop_pool *pool);
void sop__block_delete(struct sop_pool *pool, struct sop__block *b);
/* Take size bytes (a multiple of SOP_ALIGN) out of a free or cached block b that has been
 * removed from its bins; the remainder goes back where b came from: the heap if b is FREE,
 * else the cache of from, whose lock the caller holds if from_held. Pool lock held. */
void sop__block_carve(struct sop_pool *pool, struct sop__block *b, size_t size,
		      struct sop__sstream *from, bool from_held);
/* The same on a FREE block b, for a stream ss that takes more than it asked for: up to keep bytes
 * past the request go to ss's cache as memory with nothing pending (seq 0), what lies beyond back
 * to the heap. Pool lock and ss's lock held. */
void sop__block_carve_refill(struct sop_pool *pool, struct sop__block *b, size_t size, size_t keep,
			     struct sop__sstream *ss);
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
 * to ss's spares (ss's lock held), or with ss NULL to the pool's (pool lock held). Segment lock
 * held. */
void sop__block_absorb_next(struct sop_pool *pool, struct sop__block *b, struct sop__sstream *ss);
/* Return a block to the heap as FREE, merging with FREE neighbours; returns the merged block.
 * Its owner stays as the stream whose cache it leaves (or NULL), and is NULL once joined with
 * another stream's. Pool lock held. */
struct sop__block *sop__heap_put(struct sop_pool *pool, struct sop__block *b);

/* ---- segment.c --------------------------------------------------------------------------- */

/* The growth and release paths' pieces of a segment, pool lock held: reserved memory counted;
 * HOLE blocks linked in the pool's list; a segment of at least min bytes (size if the
 * reservation has room) placed in the reservation with its blocks and map, and dropped; room
 * for one more piece in its array, a piece found (the first at or after addr), linked and
 * unlinked. */
void sop__reserved_add(struct sop_pool *pool, size_t size);
void sop__hole_link(struct sop_pool *pool, struct sop__block *h);
void sop__hole_unlink(struct sop_pool *pool, struct sop__block *h);
/* Turn m (out of every list) into a HOLE, linked, and joined with HOLE neighbours. Pool and
 * segment lock held. */
void sop__hole_make(struct sop_pool *pool, struct sop__block *m);
struct sop__segment *sop__segment_new(struct sop_pool *pool, size_t size, size_t min,
				      const struct sop__sstream *home);
void sop__segment_drop(struct sop_pool *pool, struct sop__segment *seg);
bool sop__pieces_reserve(struct sop__segment *seg);
size_t sop__piece_search(const struct sop__segment *seg, CUdeviceptr addr);
void sop__piece_link(struct sop__segment *seg, struct sop__piece *pc);
void sop__piece_unlink(struct sop__segment *seg, struct sop__piece *pc);
/* Make h's segment, nobody's, ss's: all of it, or, if it maps more than twice part bytes, the
 * part from the first piece boundary in h to the first one part bytes (or the request's size)
 * past it, cut off as a segment of its own where the rest on either side can be (every block
 * from the cut to the segment's end FREE or HOLE; pieces on both sides), the rest left nobody's.
 * Returns the FREE block in the part that serves the request of size bytes h served: h, or the
 * part's first. Pool lock held, and ss's. */
struct sop__block *sop__segment_adopt(struct sop_pool *pool, struct sop__block *h, size_t size,
				      size_t part, const struct sop__sstream *ss);
/* Set the access of every piece to want[0..n); on a failure, set those done back to
 * was[0..n) and return the error. Pool lock held, context current. */
CUresult sop__heap_set_access(struct sop_pool *pool, const CUmemAccessDesc *want,
			      const CUmemAccessDesc *was, size_t n);
/* The bytes of the pool's FREE and CACHED blocks, and the longest run of them at contiguous
 * addresses (sop_pool_get_free_extents). Takes the pool lock. */
void sop__heap_free_extents(struct sop_pool *pool, size_t *largest, size_t *total);

/* ---- release.c --------------------------------------------------------------------------- */

/* Release pieces that FREE blocks cover whole, largest first, while reserved > target and the
 * release keeps reserved >= floor. Pool lock held. Stops at the first driver error and returns it. */
CUresult sop__heap_release(struct sop_pool *pool, size_t target, size_t floor);
/* Release idle pieces, largest first, while reserved > target, keeping reserved >= floor; only
 * if they add up to at_least bytes. None inside the FREE blocks spare names (NULL entries, or
 * spare NULL: none spared): growth keeps the free memory its new piece is to join. Pool lock
 * held. */
CUresult sop__release_idle(struct sop_pool *pool, size_t target, size_t floor, size_t at_least,
			   struct sop__block *const spare[2]);
/* Take idle pieces out of the pool to be mapped again where growth needs memory (grow.c):
 * largest first, those that fit in want bytes together, none inside the FREE blocks spare
 * names; each unmapped, its range a hole, its bytes off reserved, its handle and charge kept.
 * Returns their bytes, the pieces in *out (n_out of them; the caller frees the array and owns
 * the pieces). Stops at the first piece the driver will not unmap. Pool lock held. */
size_t sop__idle_take(struct sop_pool *pool, size_t want, struct sop__block *const spare[2],
		      struct sop__piece ***out, size_t *n_out);
/* A failed growth's claim whose n pieces pc the driver would not unmap: kept claimed, with the
 * pieces' handles and charges, until a later release unmaps them (every release retries them;
 * a pool is not torn down while any stays). Pool lock held. */
void sop__stuck_keep(struct sop_pool *pool, struct sop__block *claim, size_t size,
		     struct sop__piece *const *pc, size_t n);
/* Free the host side of a pool whose segments have all been released. */
void sop__heap_destroy(struct sop_pool *pool);

/* ---- grow.c ------------------------------------------------------------------------------ */

/* Map physical memory for a block of at least size bytes and take it (*out): next to free
 * memory (FREE, or cached on ss) if that maps less, else in a hole of a segment of ss's own or
 * of a new one; wholly free pieces are moved there, or released first when they add up to what
 * is mapped (roomy: what the pool may reserve before growth moves them, sop__pieces_move). The
 * block is out of every bin: FREE (*from NULL), or cached on ss without an owner (*from ss), as
 * sop__block_carve takes it. Pool lock held, and dropped while the driver maps (grow.c,
 * Claims): the caller holds nothing it found under the lock across the call, but its own
 * stream state. One growth at a time: CUDA_ERROR_NOT_READY after waiting for another's (the
 * heap may now serve the request). CUDA_ERROR_OUT_OF_MEMORY when maxSize, the reservation or
 * the device is exhausted. */
CUresult sop__heap_grow(struct sop_pool *pool, struct sop__sstream *ss, size_t size,
			uint64_t roomy, struct sop__block **out, struct sop__sstream **from);
/* After sop__heap_grow answered CUDA_ERROR_NOT_READY and the request found its fit in the
 * heap: wake the next request waiting for growth, which the growth's end did not. Pool lock
 * held. */
void sop__growth_pass(struct sop_pool *pool);
/* Whether growth moves idle pieces where it needs memory (sop__idle_take) rather than give
 * them back: not in a pool whose memory may be exported, where an importer names a piece by
 * where it was made (share.c), nor in a compacting one, which gives idle pieces back at each
 * growth (test/large.c: moved only past 1.3 times the live memory, it held 1.30 times its
 * peak, against 1.12-1.15). */
bool sop__pieces_move(const struct sop_pool *pool);
/* Make the segments whose home is ss nobody's, if used (ss's live bytes) is less than half of
 * what they map (0: always): the rest is free memory that only ss would take while they are its.
 * True when none is left whose home is ss. Pool lock held. */
bool sop__segments_disown(struct sop_pool *pool, const struct sop__sstream *ss, size_t used);

/* ---- order.c ----------------------------------------------------------------------------- */

/* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: a stream of the current context. */
static inline bool
sop__stream_special(CUstream s)
{
	return (uintptr_t)s <= (uintptr_t)CU_STREAM_PER_THREAD;
}

/* Stream capture. Whether a stream is capturing costs a driver call (cuStreamIsCapturing), so it
 * is asked only where a capture may be in flight: always, unless the interposer, which sees every
 * capture begin and end, has said it watches (sop__capture_watch) and counts none in flight. */
void sop__capture_watch(void);
/* A capture is about to begin (+1), or began not or ended (-1): the interposer's count. */
void sop__capture_count(int delta);
/* Whether some capture may be in flight (the gate): a load. */
bool sop__capture_possible(void);
/* Whether the stream a handle names is capturing (active or invalidated); false without asking
 * when the gate says no capture is in flight. The driver's code for a handle it refuses. */
CUresult sop__stream_capturing(CUstream stream, bool *capturing);
/* The same where a capture was ever seen: what a free asks. Under the interposer it asks exactly
 * when sop__stream_capturing does; without it, only once some stream was found capturing (at an
 * allocation, which must always know), so that a program that never captures pays nothing per
 * free. */
CUresult sop__stream_capturing_seen(CUstream stream, bool *capturing);
/* Put the calling thread in the relaxed capture mode around driver calls sop makes in its own
 * name (growth, release, probe queries), so that they never invalidate a capture in global mode
 * running in another thread; restore with what it returned. Nothing where no capture may be in
 * flight. */
int sop__capture_relax(void);
void sop__capture_restore(int saved);
/* The same for a stretch of sop's own work that mostly makes no driver call (an allocation's
 * slow path): the mode is exchanged only before the stretch's first driver call, if it makes
 * one, and restored by sop__capture_restore_lazy with what this returned. */
int sop__capture_relax_lazy(void);
void sop__capture_restore_lazy(int token);

/* The interposer sees every call that destroys streams (sop__stream_destroys_watch); it, and
 * sop_stream_destroy, report each before the driver's call (sop__stream_destroy_begin) and after
 * it (sop__stream_destroy_end), with the stream's handle, or NULL for a context's streams. While
 * none that could concern a handle is reported, sop__stream_id answers a thread's last handles
 * again without asking. */
void sop__stream_destroys_watch(void);
void sop__stream_destroy_begin(CUstream stream);
void sop__stream_destroy_end(CUstream stream);
/* The id of the stream a handle names now (cuStreamGetId); CUDA_ERROR_INVALID_CONTEXT for a
 * special handle with no current context, or the driver's code for a bad handle.
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED for a stream that is capturing, which has no id for sop:
 * the driver refuses cuStreamGetId there, and invalidates the capture as it does (so where a
 * capture may be in flight, this asks cuStreamIsCapturing first). */
CUresult sop__stream_id(CUstream stream, uint64_t *id);
/* The device of the stream a handle names, asked of the driver, without its id (a capturing
 * stream has none for sop). */
CUresult sop__stream_device_of(CUstream stream, CUdevice *device);
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
/* The primary context ctx is about to be reset, which destroys its events: every probe event
 * of its records (found by its handle, which outlives resets), and every spare of it, destroyed
 * now, and the probes they stood for forgotten (what they would have shown is learnt later,
 * never early). */
void sop__stream_ctx_reset(CUcontext ctx);
/* Records in the table, for tests. */
size_t sop__streams_live(void);
/* The stream with this id, which stream names now, is about to be destroyed: a last probe
 * covers its frees, so that they become reusable once its work is done. Returns its record
 * (readable while pinned), or NULL if it has none: then no pool holds anything of it. Pinned. */
struct sop__stream *sop__stream_ending(CUstream stream, uint64_t id);
/* The device of the stream with this id, which stream names now (cached per thread). Pinned. */
CUresult sop__stream_device(CUstream stream, uint64_t id, CUdevice *device);
/* More than one stream has been seen: observing completion can pay off. */
bool sop__streams_interact(void);
/* Mark the stream's current point: returns the epoch it closes. Call before the driver call
 * that marks the point (record, synchronize). */
uint64_t sop__stream_mark(struct sop__stream *st);
/* After a free tagged seq on the stream, named by handle in the current call: record a probe if
 * one is due. checked: the call asked the driver who handle is (else this does, before a
 * record). lone: the pool freed to has no stream state but the freeing stream's. */
void sop__stream_after_free(struct sop__stream *st, CUstream handle, uint64_t seq, bool pressure,
			    bool checked, bool lone);
/* Record a probe on the stream (named by handle in the current call, checked) now, unless one
 * already covers frees tagged seq. A failure only loses a chance to learn. */
void sop__stream_probe(struct sop__stream *st, CUstream handle, uint64_t seq);
/* A probe covering every free on st so far, unless one already does; handle names st in the
 * current call, checked. */
void sop__probe_all_frees(struct sop__stream *st, CUstream handle);
/* From a slow path of one of the stream's pools, and from every 16th free on it (order.c,
 * PACE_FREES): if a millisecond or more has passed since the first free after the last time,
 * whether the stream freed slowly since (then its next frees get a probe each, and it grows
 * for no segment affinity). */
void sop__stream_pace(struct sop__stream *st);
/* Whether the stream freed slowly when last paced. */
bool sop__stream_slow(const struct sop__stream *st);
/* Frees on the stream up to epoch are known complete (a synchronization or a probe said so). */
void sop__stream_completed(struct sop__stream *st, uint64_t epoch);
/* Query the stream's pending probes (not again within a few microseconds of a query that found
 * one running); returns the epoch up to which its frees are complete. */
uint64_t sop__stream_poll(struct sop__stream *st);
/* The same, asking now: what an event's completion should have proven. */
uint64_t sop__stream_prove(struct sop__stream *st);
/* Ask the driver whether all work on the stream (named by handle in the current call, checked)
 * has completed; if it has, so have its frees so far. Returns the epoch up to which its frees
 * are complete. Context as for any call on the stream. */
uint64_t sop__stream_query(struct sop__stream *st, CUstream handle);
/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t sop__now_ns(void);

/* ---- event.c ----------------------------------------------------------------------------- */

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

/* ---- sstream.c --------------------------------------------------------------------------- */

/* The pool's state for a stream id, or NULL. Pool lock held. */
struct sop__sstream *sop__sstream_find(struct sop_pool *pool, uint64_t id);
/* The same without the pool lock, pinned: NULL also when a state is missed while the list
 * changes (then look under the lock). Check the id under the state's lock before trusting it. */
struct sop__sstream *sop__sstream_find_unlocked(struct sop_pool *pool, uint64_t id);
/* The pool's state for the stream with this id, made if the pool has none (the
 * thread cache's miss); every cached block of a stream, gathered so the caller may change the
 * bins while it walks (stream lock held; NULL, *n = 0 when none or no host memory). */
CUresult sop__sstream_lookup(struct sop_pool *pool, CUstream stream, uint64_t id,
			     struct sop__stream_ref *out);
struct sop__block **sop__cache_collect(struct sop__sstream *ss, size_t *n);
/* sop__segments_disown for ss, noting when no segment is left whose home it is (may_home).
 * Pool lock held. */
void sop__sstream_disown(struct sop_pool *pool, struct sop__sstream *ss, size_t used);
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
/* The pool's used memory: the sum of its shards. With a fold, also raise the watermark by the
 * sum of the shards' highs since each last started again (exact when one stream allocated in
 * between; never below the true peak) and start the shards' highs again: every shard's
 * (SOP_FOLD_ALL), or those whose lock is free at once (SOP_FOLD_FREE: a synchronization's,
 * where the streams it synchronized are rarely in use); the others are read without their lock
 * and keep their highs. Pool lock held. */
enum sop__fold { SOP_FOLD_NONE, SOP_FOLD_ALL, SOP_FOLD_FREE };
uint64_t sop__pool_used(struct sop_pool *pool, enum sop__fold fold);

/* ---- reuse.c ----------------------------------------------------------------------------- */

/* The slow path of an allocation of size bytes (req asked) on ss, the state of the
 * stream with this id, found unlocked. CUDA_ERROR_NOT_FOUND: the state was retired meanwhile
 * (look it up again). */
CUresult sop__alloc_slow(struct sop_pool *pool, struct sop__sstream *ss, uint64_t id,
			 CUstream stream, size_t size, size_t req, void **ptr);
/* On the slow path, requests of at least this size ask what has completed before carving a
 * loose fit: for them reusing a block just freed beats splitting a large free range. Smaller
 * ones carve without asking, unless nothing fits at all. Frees of at least this size may be
 * covered by a probe at once (stream.c). */
#define SOP_POLL_MIN ((size_t)2 << 20)
/* The same for a host pool, whose memory the CPU fills and reads: reusing the block whose free
 * completed last, still in the CPU's caches, beats carving one that went cold (a 1 MiB staging
 * buffer filled and copied took twice as long cycling through a growth step of them), and a
 * probe's microsecond is nothing beside pinning more. */
#define SOP_HOST_POLL_MIN ((size_t)64 << 10)

static inline size_t
sop__poll_min(const struct sop_pool *pool)
{
	return pool->host ? SOP_HOST_POLL_MIN : SOP_POLL_MIN;
}

/* Hand b out to the application: ALLOC, counted in ss's used memory. Stream lock held. */
static inline void
sop__block_hand_out(struct sop__sstream *ss, struct sop__block *b, size_t req, void **ptr)
{
	sop__block_set_owner(b, NULL);
	sop__used_add(ss, b, req);
	ss->handed = b;
	ss->active = true;
	__atomic_store_n(&b->gen, 0, __ATOMIC_RELAXED); /* not exported yet (share.c) */
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

/* ---- pool.c ------------------------------------------------------------------------------ */

/* A pool; its reservation va_size bytes of addresses, or (0) what its location's memory and
 * maxSize call for. */
CUresult sop__pool_new(const CUmemPoolProps *props, bool is_default, size_t va_size,
		       struct sop_pool **out);
/* A pool marked destroyed (sop__forget_current): give back what nobody uses, and tear it down if
 * nothing is left in it. */
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

/* ---- share.c ----------------------------------------------------------------------------- */

/* The wire between importers and brokers (SOCK_SEQPACKET): one message of n bytes with n_fd
 * descriptors (at most SOP_WIRE_PIECES_MAX) as SCM_RIGHTS, sent whole (MSG_NOSIGNAL added to
 * flags) or not at all; received with up to max_fd descriptors (close-on-exec) into fds, the
 * rest, and all of a message not n bytes long, closed; -1, none kept, for a message cut short.
 * Close the descriptors of a list that are open (>= 0). */
bool sop__wire_send(int sock, const void *buf, size_t n, const int *fds, size_t n_fd, int flags);
ssize_t sop__wire_recv(int sock, void *buf, size_t n, int *fds, size_t max_fd, size_t *n_fd,
		       int flags);
void sop__wire_fds_close(const int *fds, size_t n);
/* A function of export data's fields and token, which data must carry to be taken. */
uint64_t sop__share_check(const struct sop__export_data *d);
/* Export data of the live allocation at addr (its start) of an exportable pool;
 * CUDA_ERROR_INVALID_VALUE for anything else. */
CUresult sop__share_pointer(struct sop_pool *pool, CUdeviceptr addr, CUmemPoolPtrExportData *out);
/* An exported allocation is being freed (b->gen set): off the board. Any lock. */
void sop__share_forget(struct sop_pool *pool, struct sop__block *b);
/* At most this many pieces' descriptors an exported pool keeps open (a variable for tests). */
extern size_t sop__share_fds_max;
/* A new descriptor of the pool's broker, started on first use. */
CUresult sop__share_export(struct sop_pool *pool, int *fd);
/* Stop the broker, if any (the pool is being destroyed): importers' later calls fail. */
void sop__share_stop(struct sop_pool *pool);

/* ---- import.c ---------------------------------------------------------------------------- */

/* A pool for the one the broker at the other end of shared serves. */
CUresult sop__import_pool(int shared, struct sop_pool **out);
/* Map the allocation the export data names; its address here. */
CUresult sop__import_pointer(struct sop_pool *pool, const CUmemPoolPtrExportData *data,
			     void **out);
/* Free an imported pointer: in the order of stream (the mapping goes once that has run), or
 * now. */
CUresult sop__import_free(struct sop_pool *pool, CUdeviceptr addr, CUstream stream, bool now);
/* The live imported pointer that holds addr: its start and size. */
CUresult sop__import_block(struct sop_pool *pool, CUdeviceptr addr, CUdeviceptr *start,
			   size_t *size);
/* USED_MEM_CURRENT or USED_MEM_HIGH of an imported pool, read, or (set) the high reset. */
CUresult sop__import_used(struct sop_pool *pool, CUmemPool_attribute attr, void *value, bool set);
/* At a synchronization point: unmap what frees that completed leave unused, and finish a
 * destroyed import. With wait, every pending free is waited for first: before a reset of the
 * context its frees' events are in, which would destroy them (the reset waits for that work
 * anyway). Pinned. */
void sop__import_sync(struct sop_pool *pool, bool wait);
/* sop_pool_destroy of an imported pool: no more imports; torn down once every imported pointer
 * has been freed and its free has completed. False if another call destroyed it first. */
bool sop__import_destroy(struct sop_pool *pool);

/* ---- sync.c ------------------------------------------------------------------------------ */

/* Synchronize, then make the frees the synchronization covered reusable by every stream and
 * apply the release thresholds of the pools concerned. */
CUresult sop__sync_stream(CUstream stream);
/* The stream of st (sop__stream_ending) is about to be destroyed: every pool's state for it may
 * be retired as soon as nothing is cached or allocated on it. Pinned. */
void sop__pools_stream_gone(struct sop__stream *st);
CUresult sop__sync_ctx(void);
/* The program destroys a context it made through destroy (the driver's cuCtxDestroy, which waits
 * for the context's work first): once it has, the frees on the context's streams are complete
 * and their memory reusable, as after a synchronization of it. Returns destroy's code. */
CUresult sop__sync_ctx_destroy(CUcontext ctx, CUresult(CUDAAPI *destroy)(CUcontext));
/* The program resets device's primary context through reset (the driver's
 * cuDevicePrimaryCtxReset, which waits for the context's work, then destroys its streams and
 * events; memory made with cuMemCreate stays): sop's probe events there are destroyed first
 * (sop__stream_ctx_reset), and so are the events of pending frees of pointers imported into the
 * device's pools, once those frees complete (sop__import_sync); once the reset has returned,
 * the frees on the context's streams are complete, as after a synchronization of it. Returns
 * reset's code. */
CUresult sop__sync_primary_reset(CUdevice device, CUresult(CUDAAPI *reset)(CUdevice));
CUresult sop__sync_event(CUevent event);

/* ---- stream.c ---------------------------------------------------------------------------- */

/* Allocation in stream order, on the stream stream names now and whose id the caller asked
 * (sop__stream_id). */
CUresult sop__alloc(struct sop_pool *pool, CUstream stream, uint64_t id, size_t req, void **ptr);
/* Free in stream order. */
CUresult sop__free_async(struct sop_pool *pool, CUdeviceptr addr, CUstream stream);

/* ---- devices.c --------------------------------------------------------------------------- */

/* The device's default pool, made on first use. */
CUresult sop__default_pool(CUdevice device, struct sop_pool **out);
CUresult sop__current_pool(CUdevice device, struct sop_pool **out);
/* CUDA_ERROR_INVALID_VALUE for a pool of another device or one being destroyed. */
CUresult sop__set_current_pool(CUdevice device, struct sop_pool *pool);
/* The same for a host location (HOST, or HOST_NUMA of a node below SOP_NUMA_NODES; else
 * CUDA_ERROR_INVALID_VALUE): its default pool, made on first use, its current pool, and setting
 * it (CUDA_ERROR_INVALID_VALUE for a pool of another location or one being destroyed). */
CUresult sop__host_default_pool(const CUmemLocation *loc, struct sop_pool **out);
CUresult sop__host_current_pool(const CUmemLocation *loc, struct sop_pool **out);
CUresult sop__host_set_current_pool(const CUmemLocation *loc, struct sop_pool *pool);
/* The location's current pool is one sop did not make (on), or no longer (off: the default
 * again, unless a pool of sop's was made current meanwhile): for the interposer, which hands
 * such a pool to the driver. While it is, sop's calls that take the current pool answer
 * CUDA_ERROR_NOT_SUPPORTED, and making a pool of sop's current ends it. A device (else
 * CUDA_ERROR_INVALID_DEVICE) or a host location with a slot (else CUDA_ERROR_INVALID_VALUE). */
CUresult sop__set_current_foreign(const CUmemLocation *loc, bool on);
/* The host location closest to the device: HOST_NUMA of CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, or HOST
 * where the device names no node. */
CUresult sop__device_host_location(CUdevice device, CUmemLocation *loc);
/* An allocation of size bytes from pool failed for lack of memory: if the device's cap is why,
 * every pool of the device gives back its idle memory; true if that gave back anything, and the
 * allocation is worth another try. No pool lock held; pinned. */
bool sop__limit_reclaim(struct sop_pool *pool, size_t size);
/* Under SOP_OOM_REPORT, write to stderr what each pool of the device holds. No pool lock held;
 * pinned. */
void sop__oom_report(struct sop_pool *pool, size_t size);

/* ---- sop.c ------------------------------------------------------------------------------- */

/* The public API, sop.h, and for the interposer, which calls only sop.c: */

/* sop_pointer_get_pool, and the allocation ptr lies in: its start and the bytes requested (for
 * the interposer's pointer attributes). start and size may be NULL. */
CUresult sop__pointer_block(const void *ptr, sop_pool_t *pool, CUdeviceptr *start, size_t *size);

/* ---- check.c ----------------------------------------------------------------------------- */

/* Walk every structure of the pool and check its invariants. Returns 0, or the source line of
 * the first invariant that does not hold; 0 for NULL or a torn-down pool (nothing to check).
 * Takes the pool lock; call it when no other thread is using the pool. */
int sop__pool_check(struct sop_pool *pool);

/* ---- preload.c --------------------------------------------------------------------------- */

/* glibc's dlsym, which the interposer overrides: driver.c, built into it (SOP_PRELOAD), resolves
 * sop's table through this. */
void *sop__preload_dlsym(void *handle, const char *name);

#endif /* SOP_INTERNAL_H */
