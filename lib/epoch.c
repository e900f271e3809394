/* epoch.c - deferred reclamation: an object is freed once no call can be reading it.
 *
 * A pool is found without its lock in several places: a handle's slot, the address registry (a
 * free names only a pointer), a device's current pool, a synchronization's snapshot of the live
 * pools. Teardown unlinks it from all of them, but a thread may have found it a moment before
 * and still be using it, with its stream states, descriptors and block map. So the object is
 * not freed at teardown: it is retired, and freed once every call that was running then has
 * returned (a grace period, as in RCU or epoch-based reclamation). Stream states (which thread
 * caches name) and stream records (which calls look up and keep through the call) go the same
 * way:
 *
 *  - a public call that reads pools pins its thread (sop__pin, internal.h): it counts up a word
 *    of its own, odd while pinned, even once it returns;
 *  - a retired pool waits for a reclamation. That one makes sure the unlinking is seen
 *    everywhere (a barrier on every thread, below), then reads every thread's word: a pool
 *    retired before can only still be held by the threads pinned at that moment, in that very
 *    pin. Those are noted with the pools, as a batch; a thread that pins afterwards can no
 *    longer find them;
 *  - the batch is freed once each of those words has moved on.
 * A long call holds back only the pools retired while it ran, not every later one (with one
 * global epoch that every pinned thread must have seen before anything could go, four threads
 * each making a pool per job kept 400 to 700 pools waiting on the simulated driver, up to
 * 30 MiB).
 *
 * A pin orders its store before the loads that find pools (or the reclamation could miss a pin
 * whose thread then reads a pointer just unlinked). A full barrier there would cost the hot
 * path a locked instruction per call; instead the reclamation, before it reads the words, makes
 * every running thread of the process execute one (membarrier(2), private expedited: an
 * interrupt to the CPUs running its threads, half a microsecond here), and the pin only keeps
 * the compiler from moving loads above it (sop__epoch.cheap). Where the kernel refuses
 * membarrier, a pin runs a barrier of its own.
 *
 * Reclamation does not wait for anyone: pools whose readers are still pinned wait for a later
 * pool creation, destruction, sop_free or synchronization to find them gone. No pin is held
 * across a driver synchronization, so that is soon. Only a pool creation that finds more than
 * SOP_RETIRED_MAX pools waiting waits, unpinned, for the calls that hold them back to return:
 * the host memory of torn-down pools is bounded by that many pools (and one per thread tearing
 * one down), whatever the scheduler does to pinned threads.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/membarrier.h>
#include <sys/syscall.h>
#endif

#include "internal.h"

struct sop__epoch_global sop__epoch;
__thread struct sop__pin *sop__pin_self __attribute__((tls_model("initial-exec")));

/* Objects retired together, and the threads that were pinned when the unlinking had been seen
 * everywhere, with the word each had then. */
struct batch {
	struct batch *next;
	struct sop__retired *objs; /* linked through next */
	size_t n;
	struct {
		struct sop__pin *pin; /* NULL once its thread has exited */
		uint64_t word;
	} e[];
};

/* Everything below, under this lock. */
static pthread_mutex_t epoch_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sop__pin *pins;
static struct sop__retired *fresh; /* retired since the last reclamation, linked through next */
static struct batch *waiting;    /* each waits for its threads to unpin */
/* Threads pinned without a record of their own (no host memory for one): while any is, pools
 * retired before wait, since who they are is not known. */
static atomic_uint n_counted;

static pthread_key_t pin_key;
static pthread_once_t pin_once = PTHREAD_ONCE_INIT;

#if defined(__linux__) && defined(SYS_membarrier)
static long
membarrier(int cmd)
{
	return syscall(SYS_membarrier, cmd, 0, 0);
}
#endif

void
sop__epoch_init(void)
{
#if defined(__linux__) && defined(SYS_membarrier)
	/* Registering once lets the process use the expedited command, which interrupts only
	 * the CPUs running its threads and returns when they have all run a barrier. */
	if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
	    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
		sop__epoch.cheap = true;
#endif
}

void
sop__barrier(void)
{
#ifdef __SANITIZE_THREAD__
	/* ThreadSanitizer does not model fences (GCC warns about them); a locked read-modify-write
	 * is a full barrier on the machines sop runs on. */
	static atomic_int scratch;

	atomic_fetch_add_explicit(&scratch, 0, memory_order_seq_cst);
#else
	atomic_thread_fence(memory_order_seq_cst);
#endif
}

/* The barrier the reclamation runs before it reads the words: on every thread where pins run
 * none. False if it could not be had, and then nothing may be freed. */
static bool
barrier_everywhere(void)
{
	sop__barrier();
#if defined(__linux__) && defined(SYS_membarrier)
	if (sop__epoch.cheap)
		return membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
#endif
	return true;
}

/* ---- Pins ------------------------------------------------------------------------------- */

/* At thread exit: the thread's record leaves the list, and the batches stop waiting for it
 * (it is not pinned: no call of its is running). */
static void
pin_release(void *arg)
{
	struct sop__pin *p = arg;
	struct batch *b;
	size_t i;

	sop__mutex_take(&epoch_lock, SOP_RANK_EPOCH);
	if (p->prev)
		p->prev->next = p->next;
	else
		pins = p->next;
	if (p->next)
		p->next->prev = p->prev;
	for (b = waiting; b; b = b->next)
		for (i = 0; i < b->n; i++)
			if (b->e[i].pin == p)
				b->e[i].pin = NULL;
	sop__mutex_drop(&epoch_lock);
	if (sop__pin_self == p)
		sop__pin_self = NULL;
	free(p);
}

static void
pin_key_make(void)
{
	pthread_key_create(&pin_key, pin_release);
}

struct sop__pin *
sop__pin_slow(void)
{
	struct sop__pin *p;

	pthread_once(&pin_once, pin_key_make);
	/* On a line of its own: other threads read it only when reclaiming. */
	p = aligned_alloc(_Alignof(struct sop__pin), sizeof *p);
	if (p && pthread_setspecific(pin_key, p) != 0) {
		free(p);
		p = NULL;
	}
	if (!p) {
		atomic_fetch_add_explicit(&n_counted, 1, memory_order_seq_cst);
		sop__barrier();
		return NULL;
	}
	memset(p, 0, sizeof *p);
	sop__mutex_take(&epoch_lock, SOP_RANK_EPOCH);
	p->next = pins;
	if (pins)
		pins->prev = p;
	pins = p;
	sop__mutex_drop(&epoch_lock);
	sop__pin_self = p;
	return sop__pin();
}

void
sop__unpin_counted(void)
{
	atomic_fetch_sub_explicit(&n_counted, 1, memory_order_release);
}

/* ---- Retirement ------------------------------------------------------------------------- */

void
sop__epoch_retire(struct sop__retired *r, void (*free_fn)(struct sop__retired *), bool bounded)
{
	r->free = free_fn;
	r->bounded = bounded;
	if (sop__pin_self)
		sop__pin_self->retired = true;
	sop__mutex_take(&epoch_lock, SOP_RANK_EPOCH);
	r->next = fresh;
	fresh = r;
	if (bounded)
		atomic_fetch_add_explicit(&sop__epoch.n_retired, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&sop__epoch.n_all, 1, memory_order_relaxed);
	sop__mutex_drop(&epoch_lock);
}

/* Whether every thread the batch waits for has unpinned since. Epoch lock held. */
static bool
batch_done(const struct batch *b)
{
	size_t i;

	for (i = 0; i < b->n; i++)
		if (b->e[i].pin &&
		    atomic_load_explicit(&b->e[i].pin->word, memory_order_acquire) == b->e[i].word)
			return false;
	return true;
}

/* Move the fresh objects into a batch that waits for the threads pinned now, or into *ready if
 * none is. Epoch lock held. */
static void
fresh_seal(struct sop__retired **ready)
{
	struct sop__pin *p;
	struct batch *b;
	size_t n = 0, k = 0;

	/* Room for every thread: the list does not change under the lock, but which of them
	 * are pinned does, between any two looks. */
	for (p = pins; p; p = p->next)
		n++;
	b = malloc(sizeof *b + n * sizeof b->e[0]);
	if (!b)
		return; /* they stay fresh, for the next time */
	/* The objects were unlinked before they were retired: once every thread has run a barrier,
	 * a thread that is not pinned now will not find them when it pins. */
	if (!barrier_everywhere() || atomic_load(&n_counted)) {
		free(b);
		return;
	}
	for (p = pins; p; p = p->next) {
		uint64_t w = atomic_load_explicit(&p->word, memory_order_acquire);
		if (w & 1) {
			b->e[k].pin = p;
			b->e[k].word = w;
			k++;
		}
	}
	if (!k) {
		free(b);
		*ready = fresh;
		fresh = NULL;
		return;
	}
	b->n = k;
	b->objs = fresh;
	fresh = NULL;
	b->next = waiting;
	waiting = b;
}

void
sop__epoch_reclaim(void)
{
	struct sop__retired *ready = NULL, *r, *next;
	struct batch **bp, *b;

	if (!atomic_load_explicit(&sop__epoch.n_all, memory_order_relaxed))
		return;
	sop__mutex_take(&epoch_lock, SOP_RANK_EPOCH);
	for (bp = &waiting; (b = *bp);) {
		if (!batch_done(b)) {
			bp = &b->next;
			continue;
		}
		*bp = b->next;
		for (r = b->objs; r; r = next) {
			next = r->next;
			r->next = ready;
			ready = r;
		}
		free(b);
	}
	if (fresh) {
		struct sop__retired *now = NULL;
		fresh_seal(&now);
		for (r = now; r; r = next) {
			next = r->next;
			r->next = ready;
			ready = r;
		}
	}
	for (r = ready; r; r = r->next) {
		if (r->bounded)
			atomic_fetch_sub_explicit(&sop__epoch.n_retired, 1, memory_order_relaxed);
		atomic_fetch_sub_explicit(&sop__epoch.n_all, 1, memory_order_relaxed);
	}
	sop__mutex_drop(&epoch_lock);
	/* Outside the lock: freeing may unmap a block map's directory, or destroy events. */
	while ((r = ready)) {
		ready = r->next;
		r->free(r);
	}
}

void
sop__epoch_bound(void)
{
	unsigned tries = 0;

	sop__epoch_reclaim();
	/* Only a thread pinned in one call since the pools were retired holds them: no pinned
	 * call waits for an unpinned thread, so this ends when those calls return. */
	while (atomic_load_explicit(&sop__epoch.n_retired, memory_order_relaxed) >
	       SOP_RETIRED_MAX) {
		if (++tries < 64) {
			sched_yield();
		} else {
			struct timespec ts = {0, 50000};
			nanosleep(&ts, NULL);
		}
		sop__epoch_reclaim();
	}
}

size_t
sop__epoch_retired(void)
{
	return atomic_load(&sop__epoch.n_retired);
}
