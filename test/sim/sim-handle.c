/*
 * Handle values of streams, events and created contexts.
 *
 * The real driver hands a destroyed stream's handle value to the next stream
 * created, at once, while the destroyed stream's queued work still runs; the
 * same for events and contexts. So the sim's handles are not the addresses of
 * its objects (which stay alive while work drains): each kind has a table of
 * slots, and a value names a slot and a generation. A value is free again as
 * soon as it is unbound, and in recycle mode (the default) the next bind gets
 * the most recently freed value back, like the driver; in fresh mode the
 * next bind gets a value never handed out before, so that a test can tell a
 * bug that only recycling exposes from one that does not.
 *
 * Lookups are on the hot path: the library asks for a stream's id on every
 * allocation, from many threads, often of one stream. So they take no lock
 * and write nothing that another thread reads often. A value decodes to its
 * slot without a search; the slots never move (they live in chunks that are
 * never freed). A reader announces the slot in its thread's hazard pointer
 * before it loads the object, and an unbind, having emptied the slot, waits
 * until no thread announces it before it lets the caller drop the object
 * (hazard pointers, M. M. Michael, IEEE TPDS 15(6), 2004). Sequentially
 * consistent order of the announcement, the reader's load, the emptying and
 * the unbinder's scan makes either the reader see the slot empty or the
 * unbinder see the announcement. Binds and unbinds take the kind's lock.
 *
 * Values look like heap pointers (64-byte aligned, below 2^47) and never
 * collide with NULL, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD; each kind has
 * its own range, so a stream's value never names an event.
 */
#include <stdlib.h>

#include "sim-internal.h"

#define ALIGN_BITS 6
#define SLOT_BITS 20
#define GEN_BITS 16
#define SLOT_MAX (1u << SLOT_BITS)
#define GEN_MAX ((1u << GEN_BITS) - 1)
#define CHUNK_SLOTS 1024u
#define NCHUNKS (SLOT_MAX / CHUNK_SLOTS)

_Static_assert(ALIGN_BITS + SLOT_BITS + GEN_BITS <= 42, "a kind's values fit in 4 TiB");

struct slot {
	/* Written under the table's lock, read by anyone. */
	_Atomic uint64_t value;		/* the value bound here; 0 when free */
	_Atomic(void *) obj;		/* what it names; NULL when free */
	/* Under the table's lock. */
	uint64_t last;			/* the value last bound here; 0 if never */
	uint32_t next_free;		/* the free stack: index + 1 of the slot below, 0 at the bottom */
};

struct table {
	uint64_t base;			/* the kind's first value, less one slot */
	pthread_mutex_t lock;		/* binds, unbinds, the fields below */
	uint32_t nslots;		/* slots ever used */
	uint32_t free_top;		/* index + 1 of the slot freed last; 0: none */
	atomic_long bound;
	_Atomic(struct slot *) chunks[NCHUNKS];	/* set once, never freed */
};

/* Streams, events and contexts: 4 TiB apart, in what looks like a heap. */
static struct table tables[SIM_HANDLE_KINDS] = {
	{ .base = 0x7e0000000000ull, .lock = PTHREAD_MUTEX_INITIALIZER },
	{ .base = 0x7e4000000000ull, .lock = PTHREAD_MUTEX_INITIALIZER },
	{ .base = 0x7e8000000000ull, .lock = PTHREAD_MUTEX_INITIALIZER },
};

static atomic_bool fresh;

static uint64_t value_of(const struct table *t, uint32_t index, uint64_t gen)
{
	/* Slot 0 of generation 0 is base + 64: base itself stays unused. */
	return t->base + ((((gen << SLOT_BITS) | index) + 1) << ALIGN_BITS);
}

static uint64_t gen_of(const struct table *t, uint64_t value)
{
	return (((value - t->base) >> ALIGN_BITS) - 1) >> SLOT_BITS;
}

/* The slot a value would live in (bound or not), or NULL if it is none of ours. */
static struct slot *slot_of(struct table *t, uint64_t value, uint32_t *index)
{
	const uint64_t align = (1u << ALIGN_BITS) - 1;
	struct slot *chunk;
	uint64_t n;
	uint32_t i;

	if (value <= t->base || ((value - t->base) & align))
		return NULL;
	n = ((value - t->base) >> ALIGN_BITS) - 1;
	if (n >> (SLOT_BITS + GEN_BITS))
		return NULL;
	i = (uint32_t)(n & (SLOT_MAX - 1));
	chunk = atomic_load_explicit(&t->chunks[i / CHUNK_SLOTS], memory_order_acquire);
	*index = i;
	return chunk ? &chunk[i % CHUNK_SLOTS] : NULL;
}

/* A slot handed out before; caller holds the lock. */
static struct slot *slot_at(struct table *t, uint32_t index)
{
	struct slot *chunk =
		atomic_load_explicit(&t->chunks[index / CHUNK_SLOTS], memory_order_relaxed);

	return &chunk[index % CHUNK_SLOTS];
}

/* A slot never used before; caller holds the lock. NULL when none is left. */
static struct slot *slot_new(struct table *t, uint32_t *index)
{
	uint32_t i = t->nslots;
	struct slot *chunk;

	if (i == SLOT_MAX)
		return NULL;
	chunk = atomic_load_explicit(&t->chunks[i / CHUNK_SLOTS], memory_order_relaxed);
	if (!chunk) {
		chunk = calloc(CHUNK_SLOTS, sizeof(*chunk));
		if (!chunk)
			return NULL;
		/* Readers find the chunk without the lock; they see it zeroed. */
		atomic_store_explicit(&t->chunks[i / CHUNK_SLOTS], chunk, memory_order_release);
	}
	t->nslots++;
	*index = i;
	return &chunk[i % CHUNK_SLOTS];
}

uint64_t sim_handle_bind(enum sim_handle_kind kind, void *obj, uint64_t *value)
{
	struct table *t = &tables[kind];
	bool want_fresh = atomic_load_explicit(&fresh, memory_order_relaxed);
	struct slot *slot = NULL;
	uint32_t index = 0;
	uint64_t v = 0;

	pthread_mutex_lock(&t->lock);
	/*
	 * Fresh mode takes unused slots while there are any, so that a slot
	 * comes round again (with the next generation) only after 2^20 binds.
	 */
	if (want_fresh)
		slot = slot_new(t, &index);
	if (!slot && t->free_top) {
		index = t->free_top - 1;
		slot = slot_at(t, index);
		t->free_top = slot->next_free;
		v = slot->last;
		if (want_fresh) {
			if (gen_of(t, v) == GEN_MAX)
				sim_die("sim: fresh handle values are used up");
			v = value_of(t, index, gen_of(t, v) + 1);
		}
	}
	if (!slot)
		slot = slot_new(t, &index);
	if (!slot) {
		pthread_mutex_unlock(&t->lock);
		return 0;
	}
	if (!v)
		v = value_of(t, index, 0);
	slot->last = v;
	*value = v;
	/* A reader that loads obj sees the value, and *value, stored before it. */
	atomic_store_explicit(&slot->value, v, memory_order_relaxed);
	atomic_store_explicit(&slot->obj, obj, memory_order_release);
	atomic_fetch_add_explicit(&t->bound, 1, memory_order_relaxed);
	pthread_mutex_unlock(&t->lock);
	return v;
}

void *sim_handle_unbind(enum sim_handle_kind kind, uint64_t value, const void *obj)
{
	struct table *t = &tables[kind];
	uint32_t index;
	struct slot *slot = slot_of(t, value, &index);
	void *found;

	if (!slot)
		return NULL;
	pthread_mutex_lock(&t->lock);
	found = atomic_load_explicit(&slot->obj, memory_order_relaxed);
	if (found && atomic_load_explicit(&slot->value, memory_order_relaxed) == value &&
	    (!obj || found == obj)) {
		atomic_store_explicit(&slot->value, 0, memory_order_relaxed);
		atomic_store(&slot->obj, NULL);
		slot->next_free = t->free_top;
		t->free_top = index + 1;
		atomic_fetch_sub_explicit(&t->bound, 1, memory_order_relaxed);
	} else {
		found = NULL;
	}
	pthread_mutex_unlock(&t->lock);
	/* The value is free already; the object waits for readers that saw it. */
	if (found)
		sim_thread_hazard_wait(slot);
	return found;
}

bool sim_handle_visit(enum sim_handle_kind kind, uint64_t value, void (*fn)(void *obj, void *arg),
		      void *arg)
{
	struct table *t = &tables[kind];
	uint32_t index;
	struct slot *slot = slot_of(t, value, &index);
	struct sim_thread *self;
	void *obj;
	bool hit;

	if (!slot)
		return false;
	self = sim_thread(true);
	atomic_store(&self->hazard, slot);
	obj = atomic_load(&slot->obj);
	/*
	 * If the value was unbound and bound again (recycled) between the two
	 * loads, obj is the object it named before: the unbind waits for this
	 * hazard, so obj is alive, and the lookup counts as done before it.
	 */
	hit = obj && atomic_load_explicit(&slot->value, memory_order_relaxed) == value;
	if (hit)
		fn(obj, arg);
	atomic_store_explicit(&self->hazard, NULL, memory_order_release);
	return hit;
}

bool sim_handle_dead(enum sim_handle_kind kind, uint64_t value)
{
	struct table *t = &tables[kind];
	uint32_t index;
	struct slot *slot = slot_of(t, value, &index);
	bool dead;

	if (!slot)
		return false;
	pthread_mutex_lock(&t->lock);
	/* Handed out (this slot's last value, or an earlier generation of it) and not bound. */
	dead = slot->last && gen_of(t, value) <= gen_of(t, slot->last) &&
	       atomic_load_explicit(&slot->value, memory_order_relaxed) != value;
	pthread_mutex_unlock(&t->lock);
	return dead;
}

long sim_handle_count(enum sim_handle_kind kind)
{
	return atomic_load_explicit(&tables[kind].bound, memory_order_relaxed);
}

void sim_handle_set_recycle(bool on)
{
	atomic_store(&fresh, !on);
}

SIM_EXPORT void sim_handles_recycle(int on)
{
	sim_handle_set_recycle(on != 0);
}
