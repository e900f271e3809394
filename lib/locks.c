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

static __thread struct {
	const void *lock;
	enum sop__rank rank;
} held[HELD_MAX];
static __thread int n_held;

static _Noreturn void
rank_fail(const char *what, const void *lock, enum sop__rank rank, int other)
{
	fprintf(stderr, "sop: lock order: %s %s (%p)", what, rank_names[rank], lock);
	if (other >= 0)
		fprintf(stderr, " while holding %s (%p)", rank_names[held[other].rank],
			held[other].lock);
	fputc('\n', stderr);
	abort();
}

/* Count lock held: taken (ordered: every held lock must rank below it) or tried. */
static void
push(const void *lock, enum sop__rank rank, bool ordered)
{
	int i;

	if (rank == SOP_RANK_NONE)
		rank_fail(ordered ? "taking" : "trying", lock, rank, -1);
	for (i = 0; i < n_held; i++) {
		if (held[i].lock == lock)
			rank_fail(ordered ? "taking again" : "trying again", lock, rank, i);
		if (ordered && held[i].rank >= rank)
			rank_fail("taking", lock, rank, i);
	}
	if (n_held == HELD_MAX)
		rank_fail("too many locks held at", lock, rank, n_held - 1);
	held[n_held].lock = lock;
	held[n_held].rank = rank;
	n_held++;
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
	int i;

	/* Locks may be dropped in any order. */
	for (i = n_held - 1; i >= 0; i--)
		if (held[i].lock == lock) {
			held[i] = held[--n_held];
			return;
		}
	rank_fail("dropping, not held,", lock, SOP_RANK_NONE, -1);
}

void
sop__rank_held(const void *lock, const char *what, const char *file, int line)
{
	int i;

	for (i = 0; i < n_held; i++)
		if (held[i].lock == lock)
			return;
	fprintf(stderr, "sop: %s:%d: %s is not held\n", file, line, what);
	abort();
}
#endif
