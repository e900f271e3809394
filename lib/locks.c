/* locks.c - lock ranks, checked: in a build with -Dchecks=true, each thread's held locks, and
 * every take checked against them (types.h, enum sop__rank, says the order). A take out of
 * order aborts with both locks named, whether or not another thread would have deadlocked
 * with it this time: an order that can deadlock shows in any run that takes it. Without the
 * option this file is empty.
 */
#include "internal.h"

#if SOP_CHECKS
#include <stdio.h>
#include <stdlib.h>

/* More than any path holds: pool, state, record or segment, leaf. */
#define HELD_MAX 16

static const char *const rank_names[] = {
	[SOP_RANK_NONE] = "a lock with no rank",
	[SOP_RANK_DEV] = "the device lock",
	[SOP_RANK_IMPORT] = "an imported pool's request lock",
	[SOP_RANK_POOL] = "a pool lock",
	[SOP_RANK_STATE] = "a stream state lock",
	[SOP_RANK_SWEEP] = "the record sweep's lock",
	[SOP_RANK_SHARD] = "a record table shard's lock",
	[SOP_RANK_RECORD] = "a stream record lock",
	[SOP_RANK_SPARES] = "the probe spares' lock",
	[SOP_RANK_EVENT] = "an event table shard's lock",
	[SOP_RANK_REG] = "the registry lock",
	[SOP_RANK_HANDLE] = "the handle lock",
	[SOP_RANK_KEPT] = "the kept reservations' lock",
	[SOP_RANK_SEGMENT] = "a segment lock",
	[SOP_RANK_LEAF] = "a leaf lock",
	[SOP_RANK_EPOCH] = "the epoch lock",
};

/* A thread's ledger: heap memory behind an initial-exec pointer, so that even this build's
 * libraries make no __tls_get_addr call (test/check-tls.sh). A thread whose ledger could not be
 * made is not checked. Freed at the thread's exit, when it holds no lock; a lock taken after
 * that, by another key's destructor, starts a new one. */
struct ledger {
	struct {
		const void *lock;
		enum sop__rank rank;
	} held[HELD_MAX];
	int n_held;
};

static __thread struct ledger *ledger __attribute__((tls_model("initial-exec")));
static __thread bool unchecked __attribute__((tls_model("initial-exec")));
static pthread_key_t ledger_key;
static pthread_once_t ledger_once = PTHREAD_ONCE_INIT;

static void
ledger_free(void *p)
{
	ledger = NULL;
	free(p);
}

static void
ledger_key_make(void)
{
	if (pthread_key_create(&ledger_key, ledger_free) != 0)
		abort();
}

/* This thread's ledger, NULL if it is not checked. */
static struct ledger *
ledger_get(void)
{
	struct ledger *l = ledger;

	if (l || unchecked)
		return l;
	pthread_once(&ledger_once, ledger_key_make);
	l = calloc(1, sizeof *l);
	if (!l || pthread_setspecific(ledger_key, l) != 0) {
		free(l);
		unchecked = true;
		return NULL;
	}
	ledger = l;
	return l;
}

static _Noreturn void
rank_fail(const char *what, const void *lock, enum sop__rank rank, int other)
{
	fprintf(stderr, "sop: lock order: %s %s (%p)", what, rank_names[rank], lock);
	if (other >= 0)
		fprintf(stderr, " while holding %s (%p)", rank_names[ledger->held[other].rank],
			ledger->held[other].lock);
	fputc('\n', stderr);
	abort();
}

/* Count lock held: taken (ordered: every held lock must rank below it) or tried. */
static void
push(const void *lock, enum sop__rank rank, bool ordered)
{
	struct ledger *l = ledger_get();
	int i;

	if (rank == SOP_RANK_NONE)
		rank_fail(ordered ? "taking" : "trying", lock, rank, -1);
	if (!l)
		return;
	for (i = 0; i < l->n_held; i++) {
		if (l->held[i].lock == lock)
			rank_fail(ordered ? "taking again" : "trying again", lock, rank, i);
		if (ordered && l->held[i].rank >= rank)
			rank_fail("taking", lock, rank, i);
	}
	if (l->n_held == HELD_MAX)
		rank_fail("too many locks held at", lock, rank, l->n_held - 1);
	l->held[l->n_held].lock = lock;
	l->held[l->n_held].rank = rank;
	l->n_held++;
}

void
sop__rank_take(const void *lock, enum sop__rank rank)
{
	push(lock, rank, true);
}

void
sop__rank_took(const void *lock, enum sop__rank rank)
{
	push(lock, rank, false);
}

void
sop__rank_drop(const void *lock)
{
	struct ledger *l = ledger_get();
	int i;

	if (!l)
		return;
	/* Locks may be dropped in any order. */
	for (i = l->n_held - 1; i >= 0; i--)
		if (l->held[i].lock == lock) {
			l->held[i] = l->held[--l->n_held];
			return;
		}
	rank_fail("dropping, not held,", lock, SOP_RANK_NONE, -1);
}

void
sop__rank_held(const void *lock, const char *what, const char *file, int line)
{
	struct ledger *l = ledger_get();
	int i;

	if (!l)
		return;
	for (i = 0; i < l->n_held; i++)
		if (l->held[i].lock == lock)
			return;
	fprintf(stderr, "sop: %s:%d: %s is not held\n", file, line, what);
	abort();
}
#endif
