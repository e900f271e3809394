/* faults.c - fault injection at every driver call of pool creation, growth, trimming,
 * synchronization and destruction, the SQLite way: for n = 1, 2, ... fail the n-th call of one
 * entry point until the operation gets through without reaching it. Every failure must give a
 * clean error, leave the pool consistent (sop__pool_check) with unchanged statistics, and leak
 * nothing (the simulated driver's live-object counts). Needs the simulated driver. */
#include <string.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)
#define FAULT CUDA_ERROR_UNKNOWN

static struct sim_live base;

static void
live_same(int line)
{
	struct sim_live l = th_live();

	if (l.reservations != base.reservations || l.handles != base.handles ||
	    l.mappings != base.mappings || l.phys_bytes != base.phys_bytes ||
	    l.primary_ctx_refs != base.primary_ctx_refs) {
		fprintf(stderr, "line %d: driver objects leaked: res %ld/%ld handles %ld/%ld maps %ld/%ld"
				" ctx %ld/%ld\n",
			line, l.reservations, base.reservations, l.handles, base.handles, l.mappings,
			base.mappings, l.primary_ctx_refs, base.primary_ctx_refs);
		exit(1);
	}
}

/* Run op with the n-th call of entry failing, for n = 1, 2, ... until op no longer reaches it.
 * op returns the CUresult the application sees; before/after hooks check the rest. */
typedef CUresult (*op_fn)(void *arg);
typedef void (*check_fn)(void *arg, CUresult r);

typedef void (*prep_fn)(void *arg);

static void
sweep(const char *what, const char *const *entries, prep_fn prep, op_fn op, check_fn check,
      void *arg, bool may_succeed)
{
	size_t e;

	for (e = 0; entries[e]; e++) {
		unsigned long n;
		for (n = 1;; n++) {
			unsigned long before, made;
			CUresult r;
			if (prep)
				prep(arg);
			before = th.sim_calls(entries[e]);
			th.sim_fail(entries[e], n, FAULT);
			r = op(arg);
			made = th.sim_calls(entries[e]) - before;
			th.sim_fail_clear();
			check(arg, r);
			if (made < n) {
				TH_OK(r); /* the fault never fired: the operation must succeed */
				break;
			}
			if (r == CUDA_SUCCESS && !may_succeed) {
				fprintf(stderr, "%s: %s call %lu failed but the operation succeeded\n",
					what, entries[e], n);
				exit(1);
			}
			TH_ASSERT(n < 64);
		}
		printf("%s: %s swept\n", what, entries[e]);
	}
}

/* ---- Pool creation ---------------------------------------------------------------------- */

static sop_pool_t created;

/* A device pool; with arg, a host pool, whose creation makes and releases a granule to ask
 * the driver whether it makes host memory there. */
static CUresult
op_create(void *arg)
{
	CUmemPoolProps props;

	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = arg ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = 0;
	created = (sop_pool_t)0x1;
	return sop_pool_create(&created, &props);
}

static void
check_create(void *arg, CUresult r)
{
	(void)arg;
	if (r == CUDA_SUCCESS) {
		TH_CHECK(created);
		TH_OK(sop_pool_destroy(created));
	} else {
		TH_ASSERT(created == (sop_pool_t)0x1);
	}
	live_same(__LINE__);
}

/* ---- Growth ----------------------------------------------------------------------------- */

struct grow_arg {
	sop_pool_t pool;
	CUstream s;
	void *p;
	uint64_t used, reserved;
};

static CUresult
op_grow(void *arg)
{
	struct grow_arg *g = arg;

	g->p = (void *)0x1;
	g->used = th_attr(g->pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
	g->reserved = th_attr(g->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
	/* Larger than any free block: needs a new segment. */
	return sop_malloc_from_pool_async(&g->p, 40 * MiB, g->pool, g->s);
}

static void
check_grow(void *arg, CUresult r)
{
	struct grow_arg *g = arg;

	TH_CHECK(g->pool);
	if (r == CUDA_SUCCESS) {
		TH_EQ(th_attr(g->pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), g->used + 40 * MiB);
		TH_OK(sop_free(g->p));
		TH_OK(sop_trim_to(g->pool, g->reserved));
	} else {
		TH_ASSERT(g->p == (void *)0x1);
		TH_EQ(th_attr(g->pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), g->used);
		TH_EQ(th_attr(g->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), g->reserved);
		live_same(__LINE__);
	}
}

/* ---- Growth that moves an idle piece ------------------------------------------------------ */

/* A fresh pool each time, holding x and z in a piece of 32 MiB each, with y's piece between
 * them idle: a request of 40 MiB moves y's piece and makes 8 MiB (test/pieces.c, growth_moves).
 * A failure anywhere in it: the request fails with the driver's code, or succeeds where the
 * failure cost only the move (an unmap refused: the piece stays and more is made; a release
 * refused: the handle waits as an orphan); the idle piece may be gone, nothing else changes,
 * and once the pool is destroyed nothing is left. */
struct move_arg {
	sop_pool_t pool;
	CUstream s;
	void *x, *z, *p;
};

static void
prep_move(void *arg)
{
	struct move_arg *m = arg;
	cuuint64_t keep = UINT64_MAX;
	void *y;

	m->pool = th_pool(0, 0);
	TH_OK(sop_pool_set_attr(m->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_malloc_from_pool_async(&m->x, 32 * MiB, m->pool, m->s));
	TH_OK(sop_malloc_from_pool_async(&y, 32 * MiB, m->pool, m->s));
	TH_OK(sop_malloc_from_pool_async(&m->z, 32 * MiB, m->pool, m->s));
	TH_OK(sop_free_async(y, m->s));
	TH_OK(sop_stream_synchronize(m->s));
	TH_EQ(th_attr(m->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 96 * MiB);
}

static CUresult
op_move(void *arg)
{
	struct move_arg *m = arg;

	m->p = (void *)0x1;
	return sop_malloc_from_pool_async(&m->p, 40 * MiB, m->pool, m->s);
}

static void
check_move(void *arg, CUresult r)
{
	struct move_arg *m = arg;
	uint64_t held = th_attr(m->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);

	TH_CHECK(m->pool);
	if (r == CUDA_SUCCESS) {
		TH_EQ(th_attr(m->pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 104 * MiB);
		TH_ASSERT(held >= 104 * MiB && held <= 136 * MiB);
		th_fill(m->p, 40 * MiB, 0x5a5a5a5au, m->s);
		TH_ASSERT(th_verify(m->p, 40 * MiB, 0x5a5a5a5au, m->s));
		TH_OK(sop_free_async(m->p, m->s));
	} else {
		TH_EQ(r, FAULT);
		TH_ASSERT(m->p == (void *)0x1);
		TH_EQ(th_attr(m->pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 64 * MiB);
		TH_ASSERT(held == 64 * MiB || held == 96 * MiB);
	}
	TH_OK(sop_free_async(m->x, m->s));
	TH_OK(sop_free_async(m->z, m->s));
	TH_OK(sop_stream_synchronize(m->s));
	TH_CHECK(m->pool);
	TH_OK(sop_pool_destroy(m->pool));
	live_same(__LINE__);
}

/* ---- A stream's first use --------------------------------------------------------------- */

/* A new stream each time (which the driver may give the last one's handle): its first use asks
 * the driver who it is, then what its context, context id and device are. */
static void
prep_first(void *arg)
{
	struct grow_arg *g = arg;

	th_stream_destroy(g->s);
	g->s = th_stream();
	g->used = th_attr(g->pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
	g->reserved = th_attr(g->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
}

static CUresult
op_first(void *arg)
{
	struct grow_arg *g = arg;

	g->p = (void *)0x1;
	return sop_malloc_from_pool_async(&g->p, MiB, g->pool, g->s);
}

static void
check_first(void *arg, CUresult r)
{
	struct grow_arg *g = arg;

	TH_CHECK(g->pool);
	if (r == CUDA_SUCCESS) {
		TH_OK(sop_free_async(g->p, g->s));
		TH_OK(sop_stream_synchronize(g->s));
		TH_OK(sop_trim_to(g->pool, g->reserved));
	}
	TH_ASSERT(r == CUDA_SUCCESS || g->p == (void *)0x1);
	TH_EQ(th_attr(g->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), g->reserved);
	TH_EQ(th_attr(g->pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), g->used);
	live_same(__LINE__);
}

/* ---- Trimming --------------------------------------------------------------------------- */

static void
prep_trim(void *arg)
{
	struct grow_arg *g = arg;
	void *p;

	TH_OK(sop_malloc_from_pool_async(&p, 40 * MiB, g->pool, g->s));
	TH_OK(sop_free(p));
	g->reserved = th_attr(g->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
}

static CUresult
op_trim(void *arg)
{
	struct grow_arg *g = arg;

	return sop_trim_to(g->pool, 0);
}

static void
check_trim(void *arg, CUresult r)
{
	struct grow_arg *g = arg;

	TH_CHECK(g->pool);
	if (r == CUDA_SUCCESS)
		TH_EQ(th_attr(g->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	else
		TH_OK(sop_trim_to(g->pool, 0)); /* what failed is retried and released */
	TH_EQ(th_attr(g->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	live_same(__LINE__);
}

/* ---- With no context current -------------------------------------------------------------- */

/* sop pushes a pool's context only where the thread has another one current (or none): a
 * thread that has it current pushes nothing. The ops again, from a thread with no context
 * current, so that the pushes happen and can fail. */
static CUresult
without_ctx(op_fn op, void *arg)
{
	CUcontext c;
	CUresult r;

	/* Not popped and pushed: the sweep fails the test's pushes too. */
	TH_OK(sop__drv.cuCtxGetCurrent(&c));
	TH_OK(th.cuCtxSetCurrent(NULL));
	r = op(arg);
	TH_OK(th.cuCtxSetCurrent(c));
	return r;
}

static CUresult
op_create_bare(void *arg)
{
	return without_ctx(op_create, arg);
}

static CUresult
op_grow_bare(void *arg)
{
	return without_ctx(op_grow, arg);
}

static CUresult
op_trim_bare(void *arg)
{
	return without_ctx(op_trim, arg);
}

/* ---- Synchronization with a release threshold ------------------------------------------- */

static void
prep_sync(void *arg)
{
	struct grow_arg *g = arg;
	void *p;

	TH_OK(sop_malloc_from_pool_async(&p, 40 * MiB, g->pool, g->s));
	TH_OK(sop_free_async(p, g->s));
}

static CUresult
op_sync(void *arg)
{
	struct grow_arg *g = arg;

	return sop_stream_synchronize(g->s);
}

static void
check_sync(void *arg, CUresult r)
{
	struct grow_arg *g = arg;

	TH_CHECK(g->pool);
	/* Whatever failed, a clean synchronization and trim bring everything back. */
	(void)r;
	TH_OK(sop_stream_synchronize(g->s));
	TH_OK(sop_trim_to(g->pool, 0));
	TH_EQ(th_attr(g->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	live_same(__LINE__);
}

/* ---- The anchor ------------------------------------------------------------------------- */

/* A fresh pool each time: the anchor is tried once, at the first release that empties it. */
static void
prep_anchor(void *arg)
{
	struct grow_arg *g = arg;
	void *p;

	g->pool = th_pool(0, 0);
	TH_OK(sop_malloc_from_pool_async(&p, 3 * MiB, g->pool, g->s));
	TH_OK(sop_free(p));
}

static void
check_anchor(void *arg, CUresult r)
{
	struct grow_arg *g = arg;

	/* The anchor saves time and nothing else: failing to make it fails nothing. */
	TH_OK(r);
	TH_CHECK(g->pool);
	TH_EQ(th_attr(g->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	TH_OK(sop_pool_destroy(g->pool));
	TH_OK(sop_ctx_synchronize());
	live_same(__LINE__);
}

/* ---- Unmaps the driver refuses ---------------------------------------------------------- */

/* A growth whose piece cannot be opened, and whose unmap the driver then refuses too (refused
 * times; the growth tries twice, once after the open and once as it gives its pieces back, so
 * that one refusal leaves nothing mapped): stuck pieces stay mapped. The request fails with the driver's code and the pool stays
 * as it was; the next request grows elsewhere, where the driver succeeds (mapped over the
 * stuck range it failed: CUDA_ERROR_INVALID_VALUE, every time); a release retries the unmap,
 * and once it goes through nothing of it is left. In a compacting pool, the stuck piece is one
 * of the growth's five. */
static void
stuck_growth(CUstream s, bool compact, unsigned long refused, long stuck)
{
	sop_pool_t pool = th_pool(0, 0);
	cuuint64_t keep = UINT64_MAX;
	unsigned long n, failed = th.sim_fails("cuMemUnmap");
	struct sim_live l;
	void *p = (void *)0x1, *q;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_pool_set_compaction(pool, compact));
	th.sim_fail("cuMemSetAccess", compact ? 3 : 1, FAULT);
	for (n = 1; n <= refused; n++)
		th.sim_fail("cuMemUnmap", n, FAULT);
	TH_EQ(sop_malloc_from_pool_async(&p, 40 * MiB, pool, s), FAULT);
	TH_ASSERT(p == (void *)0x1);
	TH_CHECK(pool);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	l = th_live();
	TH_EQ(l.mappings, base.mappings + stuck); /* the pieces that stayed */
	/* The next request is served, elsewhere, and its memory works. */
	TH_OK(sop_malloc_from_pool_async(&q, 40 * MiB, pool, s));
	th_fill(q, 40 * MiB, 0x5a5a5a5a, s);
	TH_ASSERT(th_verify(q, 40 * MiB, 0x5a5a5a5a, s));
	TH_OK(sop_free_async(q, s));
	TH_OK(sop_stream_synchronize(s));
	TH_CHECK(pool);
	/* Each release tries the unmap again. A refusal of the stuck piece's fails nothing;
	 * one of the idle piece the trim itself gives back fails the trim, as any does. */
	while (th.sim_fails("cuMemUnmap") - failed < refused) {
		CUresult r = sop_trim_to(pool, 0);
		TH_ASSERT(r == CUDA_SUCCESS || r == FAULT);
		TH_CHECK(pool);
	}
	TH_OK(sop_trim_to(pool, 0));
	TH_CHECK(pool);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	th.sim_fail_clear();
	TH_OK(sop_pool_destroy(pool));
	TH_OK(sop_ctx_synchronize());
	live_same(__LINE__);
	printf("stuck: growth%s, unmap refused %lu times, %ld pieces stuck\n",
	       compact ? " (compacting)" : "", refused, stuck);
}

/* The same stuck piece in a pool destroyed before the driver unmaps it: the destroy returns,
 * the pool waits whole, and a synchronization point that finds the driver willing finishes
 * the teardown. */
static void
stuck_destroy(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0);
	void *p;

	th.sim_fail("cuMemSetAccess", 1, FAULT);
	th.sim_fail_rate("cuMemUnmap", 1.0, FAULT); /* every unmap refused until cleared */
	TH_EQ(sop_malloc_from_pool_async(&p, 40 * MiB, pool, s), FAULT);
	TH_OK(sop_pool_destroy(pool));
	TH_ASSERT(th_live().mappings > base.mappings);
	TH_OK(sop_ctx_synchronize());
	TH_ASSERT(th_live().mappings > base.mappings);
	th.sim_fail_clear();
	TH_OK(sop_ctx_synchronize());
	live_same(__LINE__);
	printf("stuck: destroyed with a piece mapped\n");
}

/* The anchor opened to nobody because its access failed, and its unmap refused: it stays as
 * the anchor (mapped with no access, a stray access faults as with read-only access), at the
 * start of the reservation where growth maps the first segment, which growth must still be
 * able to do; teardown unmaps it. */
static void
stuck_anchor(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0);
	void *p;

	TH_OK(sop_malloc_from_pool_async(&p, 3 * MiB, pool, s));
	TH_OK(sop_free(p));
	th.sim_fail("cuMemSetAccess", 1, FAULT);
	th.sim_fail("cuMemUnmap", 1, FAULT);
	TH_OK(sop_trim_to(pool, 0)); /* the anchor's set access, then unmap, refused */
	th.sim_fail_clear();
	TH_CHECK(pool);
	TH_OK(sop_malloc_from_pool_async(&p, 40 * MiB, pool, s));
	th_fill(p, 40 * MiB, 0x3c3c3c3c, s);
	TH_ASSERT(th_verify(p, 40 * MiB, 0x3c3c3c3c, s));
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_pool_destroy(pool));
	TH_OK(sop_ctx_synchronize());
	live_same(__LINE__);
	printf("stuck: anchor\n");
}

/* ---- Destruction ------------------------------------------------------------------------ */

static sop_pool_t doomed;

/* A pool that holds a piece, and an anchor from a trim that emptied it. */
static void
prep_destroy(void *arg)
{
	struct grow_arg *g = arg;
	void *p;

	doomed = th_pool(0, 0);
	TH_OK(sop_malloc_from_pool_async(&p, 3 * MiB, doomed, g->s));
	TH_OK(sop_free(p));
	TH_OK(sop_trim_to(doomed, 0));
	TH_ASSERT(TH_POOL(doomed)->anchored);
	TH_OK(sop_malloc_from_pool_async(&p, 3 * MiB, doomed, g->s));
	TH_OK(sop_free(p));
}

static CUresult
op_destroy(void *arg)
{
	(void)arg;
	return sop_pool_destroy(doomed);
}

static void
check_destroy(void *arg, CUresult r)
{
	(void)arg;
	/* Destroy itself cannot fail. If the driver refused part of the teardown, the pool waits,
	 * whole, for the next synchronization point, which finishes the job. */
	TH_OK(r);
	TH_OK(sop_ctx_synchronize());
	live_same(__LINE__);
}

/* A kept reservation (vmm.c) stays kept, anchor and all, whatever fails around it. */
static void
check_kept(void *arg, CUresult r)
{
	long n, anchors;
	size_t bytes;

	if (arg)
		check_destroy(arg, r);
	else
		check_create(arg, r);
	sop__va_kept(&n, &anchors, &bytes);
	TH_EQ(n, 1);
	TH_EQ(anchors, 1);
}

/* A range taken again gets its anchor at its pool's teardown; where the driver maps none and
 * will not release the granule it made, the pool waits, whole, with the handle, and the next
 * synchronization point finishes: the granule released, the range kept bare. */
static void
kept_anchor_refused(CUstream s)
{
	cuuint64_t max = UINT64_MAX;
	long n, anchors;
	size_t bytes;
	sop_pool_t pool;
	struct sop_pool *p;
	void *q;
	int i;

	TH_OK(sop__va_kept_free());
	for (i = 0; i < 2; i++) {
		pool = th_pool(0, 0);
		p = TH_POOL(pool);
		TH_EQ(p->va_reused, i == 1);
		TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
		TH_OK(sop_malloc_from_pool_async(&q, MiB, pool, s));
		TH_OK(sop_free_async(q, s));
		TH_OK(sop_stream_synchronize(s));
		if (i == 1) {
			/* The piece's release first, then the anchor's map, its release and
			 * the retry of it. */
			th.sim_fail("cuMemMap", 1, FAULT);
			th.sim_fail("cuMemRelease", 2, FAULT);
			th.sim_fail("cuMemRelease", 3, FAULT);
		}
		TH_OK(sop_pool_destroy(pool));
		th.sim_fail_clear();
		sop__va_kept(&n, &anchors, &bytes);
		if (i == 1) {
			struct sim_live l = th_live();

			TH_EQ(n, 0);
			TH_EQ(l.handles, base.handles + 1); /* the granule, still the pool's */
			TH_OK(sop_ctx_synchronize());
			sop__va_kept(&n, &anchors, &bytes);
		}
		TH_EQ(n, 1);
		TH_EQ(anchors, 0);
		live_same(__LINE__);
	}
	TH_OK(sop__va_kept_free());
	printf("stuck: a kept range's anchor\n");
}

int
main(void)
{
	static const char *const create_entries[] = {
		"cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain", "cuCtxPushCurrent",
		"cuMemGetAllocationGranularity", "cuDeviceTotalMem", "cuMemAddressReserve", NULL};
	static const char *const grow_entries[] = {"cuStreamGetId", "cuCtxPushCurrent", "cuMemCreate",
						   "cuMemMap", "cuMemSetAccess", NULL};
	static const char *const first_entries[] = {"cuStreamGetId", "cuStreamGetCtx", "cuCtxGetId",
						    "cuCtxPushCurrent", "cuCtxGetDevice", NULL};
	static const char *const trim_entries[] = {"cuCtxPushCurrent", "cuMemUnmap",
						   "cuMemRelease", NULL};
	static const char *const sync_entries[] = {"cuStreamGetId", "cuStreamSynchronize", NULL};
	/* A release that fails at a synchronization point does not fail the synchronization
	 * (the driver's never does); the memory stays reserved and goes at the next one. */
	static const char *const sync_release_entries[] = {"cuMemUnmap", "cuMemRelease", NULL};
	struct grow_arg g;
	cuuint64_t keep = UINT64_MAX;

	th_init();
	th_require_sim();
	/* Every pool reserves and frees its own range, so that each sweep reaches those calls;
	 * a kept reservation's paths are swept after the destroy's (check_kept). */
	sop__va_kept_max(0);
	memset(&g, 0, sizeof g);
	g.s = th_stream();
	base = th_live();

	sweep("create", create_entries, NULL, op_create, check_create, NULL, false);
	{
		/* The probe's release refused: the pool is made, and the handle goes with it. */
		static const char *const host_entries[] = {"cuMemCreate", "cuMemRelease",
							   "cuMemAddressReserve", NULL};
		sweep("create-host", host_entries, NULL, op_create, check_create, &g, true);
	}

	{
		static const char *const move_entries[] = {"cuMemUnmap", "cuMemCreate", "cuMemMap",
							   "cuMemSetAccess", "cuMemRelease", NULL};
		struct move_arg m = {.s = g.s};

		/* A first round unswept: the stream-ordered use retains the primary context once,
		 * for the process (sop's probe events live there). */
		prep_move(&m);
		TH_OK(sop_free_async(m.x, m.s));
		TH_OK(sop_free_async(m.z, m.s));
		TH_OK(sop_stream_synchronize(m.s));
		TH_OK(sop_pool_destroy(m.pool));
		base = th_live();
		sweep("grow-move", move_entries, prep_move, op_move, check_move, &m, true);
	}
	g.pool = th_pool(0, 0);
	TH_OK(sop_pool_set_attr(g.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	{
		/* The first trim that empties the pool maps its anchor, which stays. */
		void *p;

		TH_OK(sop_malloc_from_pool_async(&p, 40 * MiB, g.pool, g.s));
		TH_OK(sop_free(p));
		TH_OK(sop_trim_to(g.pool, 0));
	}
	base = th_live(); /* now with the pool's reservation, context and anchor */
	sweep("grow", grow_entries, NULL, op_grow, check_grow, &g, false);
	/* A compacting pool maps the same growth as five pieces: a failure at any of them takes
	 * back the ones made before it. */
	TH_OK(sop_pool_set_compaction(g.pool, 1));
	sweep("grow-compact", grow_entries, NULL, op_grow, check_grow, &g, false);
	TH_OK(sop_pool_set_compaction(g.pool, 0));
	sweep("first-use", first_entries, prep_first, op_first, check_first, &g, false);
	sweep("trim", trim_entries, prep_trim, op_trim, check_trim, &g, false);
	{
		static const char *const push_entries[] = {"cuCtxPushCurrent", NULL};
		static const char *const ask_entries[] = {"cuCtxGetCurrent", NULL};
		unsigned long before = th.sim_calls("cuCtxPushCurrent");

		/* The context current: growth and trimming push nothing. */
		prep_trim(&g);
		TH_OK(op_trim(&g));
		TH_OK(op_grow(&g));
		check_grow(&g, CUDA_SUCCESS);
		TH_EQ(th.sim_calls("cuCtxPushCurrent"), before);
		/* With none current, it pushes. */
		TH_OK(op_grow_bare(&g));
		check_grow(&g, CUDA_SUCCESS);
		TH_ASSERT(th.sim_calls("cuCtxPushCurrent") > before);
		/* Not asked, sop pushes as it would for another context. */
		sweep("grow-ask", ask_entries, NULL, op_grow, check_grow, &g, true);
		sweep("create-bare", push_entries, NULL, op_create_bare, check_create, NULL, false);
		sweep("grow-bare", push_entries, NULL, op_grow_bare, check_grow, &g, false);
		sweep("trim-bare", push_entries, prep_trim, op_trim_bare, check_trim, &g, false);
	}
	keep = 0;
	TH_OK(sop_pool_set_attr(g.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	{
		/* A fresh stream: its first use asks the driver for its identity. */
		CUstream s2 = th_stream();
		CUstream old = g.s;
		g.s = s2;
		sweep("sync", sync_entries, prep_sync, op_sync, check_sync, &g, false);
		sweep("sync-release", sync_release_entries, prep_sync, op_sync, check_sync, &g,
		      true);
		g.s = old;
		th_stream_destroy(s2);
	}
	TH_OK(sop_pool_destroy(g.pool));
	TH_OK(sop_ctx_synchronize());
	base = th_live();
	{
		static const char *const anchor_entries[] = {
			"cuMemGetAllocationGranularity", "cuMemCreate", "cuMemMap",
			"cuMemSetAccess", NULL};
		sop_pool_t keep_pool = g.pool;

		sweep("anchor", anchor_entries, prep_anchor, op_trim, check_anchor, &g, true);
		g.pool = keep_pool;
	}
	{
		static const char *const destroy_entries[] = {"cuMemUnmap", "cuMemRelease",
							      "cuMemAddressFree", NULL};
		sweep("destroy", destroy_entries, prep_destroy, op_destroy, check_destroy, &g, true);
		/* With room to keep reservations: a creation that fails before it needs one
		 * leaves the kept one kept, and a pool that took it, whatever the driver refuses
		 * of its pieces' teardown, leaves it kept again. */
		sop__va_kept_max(4);
		prep_destroy(&g);
		check_destroy(&g, op_destroy(&g));
		sweep("create-kept", create_entries, NULL, op_create, check_kept, NULL, false);
		sweep("destroy-kept", destroy_entries, prep_destroy, op_destroy, check_kept, &g,
		      true);
		kept_anchor_refused(g.s);
		sop__va_kept_max(0);
	}
	base = th_live();
	stuck_growth(g.s, false, 1, 0);
	stuck_growth(g.s, false, 2, 1);
	stuck_growth(g.s, false, 5, 1);
	/* The third of five pieces fails to open and its unmap is refused; as the pieces are
	 * given back, the first two are refused too, and the third goes. */
	stuck_growth(g.s, true, 3, 2);
	stuck_destroy(g.s);
	stuck_anchor(g.s);
	th_stream_destroy(g.s);
	printf("faults: ok\n");
	return 0;
}
