/* trim.c - maxSize, the release threshold and sop_trim_to.
 *
 * maxSize caps the physical memory a pool holds: a request beyond it fails at once with
 * CUDA_ERROR_OUT_OF_MEMORY while others still succeed. The release threshold is applied only at
 * synchronization points that cover the frees (never at a sync of an unrelated stream); trimming
 * releases memory no allocation and no pending free uses and keeps at least what was asked. */
#include "helpers.h"

#define MiB ((size_t)1 << 20)

static uint64_t
reserved(sop_pool_t pool)
{
	return th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
}

static void
max_size(CUstream s)
{
	sop_pool_t pool = th_pool(0, 64 * MiB);
	void *a, *b, *c = (void *)0x1;
	struct th_gate gate;

	TH_OK(sop_malloc_from_pool_async(&a, 60 * MiB, pool, s));
	TH_EQ(sop_malloc_from_pool_async(&c, 8 * MiB, pool, s), CUDA_ERROR_OUT_OF_MEMORY);
	TH_ASSERT(c == (void *)0x1);
	TH_OK(sop_malloc_from_pool_async(&b, 4 * MiB, pool, s));
	TH_ASSERT(reserved(pool) <= 64 * MiB);
	TH_CHECK(pool);
	TH_OK(sop_free_async(b, s));
	TH_OK(sop_free_async(a, s));

	TH_OK(sop_stream_synchronize(s));
	TH_EQ(reserved(pool), 0);

	/* A free pending behind a busy stream, internal dependencies off: a request from another
	 * stream cannot grow past the cap and does not wait; it fails at once. */
	{
		CUstream s2 = th_stream();
		int off = 0;

		TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
					&off));
		th_gate_init(&gate);
		th_gate_block(&gate, s);
		TH_OK(sop_malloc_from_pool_async(&a, 64 * MiB, pool, s));
		TH_OK(sop_free_async(a, s));
		TH_EQ(sop_malloc_from_pool_async(&c, 64 * MiB, pool, s2), CUDA_ERROR_OUT_OF_MEMORY);
		/* The same stream reuses it at once. */
		TH_OK(sop_malloc_from_pool_async(&b, 64 * MiB, pool, s));
		TH_ASSERT(b == a);
		TH_OK(sop_free_async(b, s));
		th_gate_open(&gate);
		TH_OK(sop_stream_synchronize(s));
		/* Now it can, and the sync released the memory (threshold 0). */
		TH_EQ(reserved(pool), 0);
		TH_OK(sop_malloc_from_pool_async(&c, 64 * MiB, pool, s2));
		TH_OK(sop_free_async(c, s2));
		TH_OK(sop_stream_synchronize(s2));
		th_stream_destroy(s2);
	}
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

static void
threshold(CUstream s1, CUstream s2)
{
	sop_pool_t pool = th_pool(0, 0);
	cuuint64_t thr = 16 * MiB;
	void *p[8];
	struct th_gate gate;
	int i;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
	th_gate_init(&gate);
	th_gate_block(&gate, s1);
	for (i = 0; i < 8; i++)
		TH_OK(sop_malloc_from_pool_async(&p[i], 32 * MiB, pool, s1));
	for (i = 0; i < 8; i++)
		TH_OK(sop_free_async(p[i], s1));
	TH_EQ(reserved(pool), 256 * MiB);
	/* Unrelated stream: nothing released. */
	TH_OK(sop_stream_synchronize(s2));
	TH_EQ(reserved(pool), 256 * MiB);
	th_gate_open(&gate);
	/* Finished, but not yet seen at a synchronization point: still held. */
	while (th.cuStreamQuery(s1) == CUDA_ERROR_NOT_READY)
		;
	TH_EQ(reserved(pool), 256 * MiB);
	TH_OK(sop_stream_synchronize(s1));
	TH_ASSERT(reserved(pool) <= 16 * MiB);
	TH_CHECK(pool);

	/* Threshold 32 MiB: keeps one 32 MiB segment of three. */
	thr = 32 * MiB;
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
	for (i = 0; i < 3; i++)
		TH_OK(sop_malloc_from_pool_async(&p[i], 30 * MiB, pool, s1));
	TH_EQ(reserved(pool), 96 * MiB);
	for (i = 0; i < 3; i++)
		TH_OK(sop_free_async(p[i], s1));
	TH_OK(sop_ctx_synchronize());
	TH_EQ(reserved(pool), 32 * MiB);
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

/* A piece the broker of an exported pool is exporting, with the pool lock dropped (share.c,
 * broker_ahead), is not released meanwhile, whatever a trim asks; once exported it is. */
static void
exporting(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0);
	struct sop_pool *p = TH_POOL(pool);
	struct sop__piece *pc;
	cuuint64_t keep = UINT64_MAX;
	void *a;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_malloc_from_pool_async(&a, 32 * MiB, pool, s));
	TH_OK(sop_free_async(a, s));
	TH_OK(sop_stream_synchronize(s));
	sop__mutex_take(&p->lock, SOP_RANK_POOL);
	TH_ASSERT(p->segments && p->segments->n_pieces >= 1);
	pc = p->segments->pieces[0];
	pc->exporting = true;
	sop__mutex_drop(&p->lock);
	TH_OK(sop_trim_to(pool, 0));
	TH_ASSERT(reserved(pool) >= pc->size);
	TH_CHECK(pool);
	sop__mutex_take(&p->lock, SOP_RANK_POOL);
	pc->exporting = false;
	sop__mutex_drop(&p->lock);
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(reserved(pool), 0);
	TH_OK(sop_pool_destroy(pool));
}

static void
trim(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0);
	cuuint64_t keep = UINT64_MAX;
	struct th_gate gate;
	void *p[4];
	int i;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	for (i = 0; i < 4; i++)
		TH_OK(sop_malloc_from_pool_async(&p[i], 32 * MiB, pool, s));
	TH_EQ(reserved(pool), 128 * MiB);
	/* Pending frees are in use: trimming releases nothing. */
	th_gate_init(&gate);
	th_gate_block(&gate, s);
	for (i = 0; i < 4; i++)
		TH_OK(sop_free_async(p[i], s));
	TH_OK(sop_malloc_from_pool_async(&p[0], MiB, pool, s)); /* reuses a pending block */
	TH_OK(sop_free_async(p[0], s));
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(reserved(pool), 128 * MiB);
	th_gate_open(&gate);
	TH_OK(sop_stream_synchronize(s));
	/* Threshold max: the sync kept everything. */
	TH_EQ(reserved(pool), 128 * MiB);
	/* Trim to 50 MiB keeps 64 MiB: never below what was asked. */
	TH_OK(sop_trim_to(pool, 50 * MiB));
	TH_EQ(reserved(pool), 64 * MiB);
	/* Trim to more than is held: a no-op. */
	TH_OK(sop_trim_to(pool, 100 * MiB));
	TH_EQ(reserved(pool), 64 * MiB);
	/* A live allocation holds its segment. */
	TH_OK(sop_malloc_from_pool_async(&p[0], 10 * MiB, pool, s));
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(reserved(pool), 32 * MiB);
	TH_OK(sop_free(p[0]));
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(reserved(pool), 0);
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

/* A pool that empties keeps a granule of host memory mapped, read-only, at the start of its
 * reservation (the driver then keeps its page tables there), and grows next to it again; a pool
 * that never empties makes none, and the anchor goes with the pool. */
static void
anchor(CUstream s)
{
	CUmemAllocationProp host = {0}, prop = {0};
	CUmemLocation dev = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	struct sim_live before = th_live(), now;
	cuuint64_t max = UINT64_MAX;
	CUmemGenericAllocationHandle h;
	unsigned long long flags = 0;
	sop_pool_t pool, kept;
	bool can = false;
	size_t gran = 0;
	void *p;
	int i;

	TH_ASSERT(th.cuMemRetainAllocationHandle && th.cuMemGetAllocationPropertiesFromHandle &&
		  th.cuMemGetAccess);
	/* Drivers before CUDA 12.2 make no host memory: then no anchor either. */
	host.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	host.location.type = CU_MEM_LOCATION_TYPE_HOST;
	can = sop__drv.cuMemGetAllocationGranularity(&gran, &host,
						     CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
	      CUDA_SUCCESS;
	/* Fresh reservations, with no anchor from a pool before (kept_reservation). */
	TH_OK(sop__va_kept_free());
	pool = th_pool(0, 0);
	kept = th_pool(0, 0);

	/* Threshold max: the pool never empties by itself. */
	TH_OK(sop_pool_set_attr(kept, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
	TH_OK(sop_malloc_from_pool_async(&p, 32 * MiB, kept, s));
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
	TH_ASSERT(!TH_POOL(kept)->anchored);

	/* Threshold 0: the first synchronization that empties it makes the anchor. */
	TH_OK(sop_malloc_from_pool_async(&p, 32 * MiB, pool, s));
	TH_ASSERT(!TH_POOL(pool)->anchored);
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
	TH_EQ(reserved(pool), 0);
	TH_EQ(TH_POOL(pool)->anchored, can);
	if (TH_POOL(pool)->anchored) {
		TH_OK(th.cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)TH_POOL(pool)->va_base));
		TH_OK(th.cuMemGetAllocationPropertiesFromHandle(&prop, h));
		TH_ASSERT(prop.location.type == CU_MEM_LOCATION_TYPE_HOST ||
			  prop.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA);
		TH_OK(sop__drv.cuMemRelease(h));
		TH_OK(th.cuMemGetAccess(&flags, &dev, TH_POOL(pool)->va_base));
		TH_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READ);
	}
	/* Growth maps next to it, in the same 512 MiB, and makes no other. */
	for (i = 0; i < 3; i++) {
		TH_OK(sop_malloc_from_pool_async(&p, 32 * MiB, pool, s));
		TH_ASSERT((CUdeviceptr)(uintptr_t)p >=
			  TH_POOL(pool)->va_base + TH_POOL(pool)->granularity);
		TH_ASSERT((CUdeviceptr)(uintptr_t)p + 32 * MiB <= TH_POOL(pool)->va_base + 512 * MiB);
		TH_OK(sop_free_async(p, s));
		TH_OK(sop_stream_synchronize(s));
		TH_EQ(reserved(pool), 0);
	}
	TH_CHECK(pool);
	if (th.sim_live_get) {
		/* The anchor and the piece kept holds. */
		now = th_live();
		TH_EQ(now.mappings, before.mappings + 2);
		TH_EQ(now.handles, before.handles + 2);
	}
	TH_OK(sop_pool_destroy(pool));
	TH_OK(sop_pool_destroy(kept));
	TH_OK(sop_ctx_synchronize());
	now = th_live();
	TH_EQ(now.reservations, before.reservations);
	TH_EQ(now.handles, before.handles);
	TH_EQ(now.mappings, before.mappings);
	TH_EQ(now.phys_bytes, before.phys_bytes);
}

/* A pool torn down leaves its reservation, and its anchor, to the next pool of the same
 * location and size: that pool asks the driver for no range, starts anchored, and serves
 * memory that works; pools of another size reserve their own; at most a few are kept, the rest
 * go back to the driver; and sop__va_kept_free gives them all back. */
static void
kept_reservation(CUstream s)
{
	struct sim_live base, all;
	unsigned long reserves = 0;
	cuuint64_t max = UINT64_MAX;
	sop_pool_t a, b, c, many[6];
	CUdeviceptr va;
	long n_kept, anchors;
	size_t bytes;
	bool anchored;
	void *p;
	int i;

	TH_OK(sop__va_kept_free());
	base = th_live_all();
	/* Threshold 0: a's synchronization empties it and makes its anchor. */
	a = th_pool(0, 0);
	TH_OK(sop_malloc_from_pool_async(&p, 32 * MiB, a, s));
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
	va = TH_POOL(a)->va_base;
	anchored = TH_POOL(a)->anchored;
	TH_OK(sop_pool_destroy(a));
	sop__va_kept(&n_kept, &anchors, &bytes);
	TH_EQ(n_kept, 1);
	TH_EQ(anchors, anchored);
	if (th.sim_live_get) {
		all = th_live_all();
		TH_EQ(all.reservations, base.reservations + 1);
		TH_EQ(all.mappings, base.mappings + anchored);
		TH_EQ(th_live().reservations, base.reservations);
		reserves = th.sim_calls("cuMemAddressReserve");
	}

	/* The next pool of the same shape takes it, anchor and all, and its memory works. */
	b = th_pool(0, 0);
	TH_EQ(TH_POOL(b)->va_base, va);
	TH_EQ(TH_POOL(b)->anchored, anchored);
	sop__va_kept(&n_kept, &anchors, &bytes);
	TH_EQ(n_kept, 0);
	TH_OK(sop_pool_set_attr(b, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
	TH_OK(sop_malloc_from_pool_async(&p, 32 * MiB, b, s));
	TH_ASSERT((CUdeviceptr)(uintptr_t)p >= va + TH_POOL(b)->granularity);
	th_fill(p, 32 * MiB, 0x6b6b6b6b, s);
	TH_ASSERT(th_verify(p, 32 * MiB, 0x6b6b6b6b, s));
	TH_CHECK(b);
	/* A pool capped above four times the device's memory needs a larger range: its own. */
	{
		size_t total = 0;

		TH_OK(sop__drv.cuDeviceTotalMem(&total, 0));
		c = th_pool(0, total * 2);
		TH_ASSERT(TH_POOL(c)->va_size != TH_POOL(b)->va_size);
	}
	if (th.sim_live_get)
		TH_EQ(th.sim_calls("cuMemAddressReserve"), reserves + 1);
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_pool_destroy(b));
	TH_OK(sop_pool_destroy(c));
	TH_OK(sop_ctx_synchronize());
	sop__va_kept(&n_kept, &anchors, &bytes);
	TH_EQ(n_kept, 2);
	TH_EQ(anchors, anchored);

	/* A pool that never empties makes no anchor, and leaves its range bare; the pool that
	 * takes it again anchors it at its teardown, for the pools after it. */
	TH_OK(sop__va_kept_free());
	for (i = 0; i < 3; i++) {
		a = th_pool(0, 0);
		TH_EQ(TH_POOL(a)->va_reused, i > 0);
		TH_EQ(TH_POOL(a)->anchored, i > 1 && anchored);
		TH_OK(sop_pool_set_attr(a, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
		TH_OK(sop_malloc_from_pool_async(&p, MiB, a, s));
		TH_OK(sop_free_async(p, s));
		TH_OK(sop_stream_synchronize(s));
		TH_OK(sop_pool_destroy(a));
		sop__va_kept(&n_kept, &anchors, &bytes);
		TH_EQ(n_kept, 1);
		TH_EQ(anchors, i > 0 && anchored);
	}

	/* Six destroyed at once: four kept, two given back. */
	for (i = 0; i < 6; i++)
		many[i] = th_pool(0, 0);
	for (i = 0; i < 6; i++)
		TH_OK(sop_pool_destroy(many[i]));
	sop__va_kept(&n_kept, &anchors, &bytes);
	TH_EQ(n_kept, 4);
	if (th.sim_live_get) {
		all = th_live_all();
		TH_EQ(all.reservations, base.reservations + 4);
		TH_EQ(th_live().reservations, base.reservations);
	}
	TH_OK(sop__va_kept_free());
	sop__va_kept(&n_kept, &anchors, &bytes);
	TH_EQ(n_kept, 0);
	if (th.sim_live_get) {
		all = th_live_all();
		TH_EQ(all.reservations, base.reservations);
		TH_EQ(all.handles, base.handles);
		TH_EQ(all.mappings, base.mappings);
		TH_EQ(all.phys_bytes, base.phys_bytes);
	}
}

/* The device cannot back a request: out of memory, the pool as it was, and the pool still
 * serves what the device can back. Then fill the device and find its end. */
static void
device_full(CUstream s)
{
	sop_pool_t pool = th_pool(0, 0);
	size_t total = 0, n = 0, i;
	void *p = (void *)0x1, **v;
	CUresult r;

	TH_OK(sop__drv.cuDeviceTotalMem(&total, 0));
	TH_EQ(sop_malloc_from_pool_async(&p, total + 64 * MiB, pool, s), CUDA_ERROR_OUT_OF_MEMORY);
	TH_ASSERT(p == (void *)0x1);
	TH_EQ(reserved(pool), 0);
	TH_CHECK(pool);

	v = calloc(total / (256 * MiB) + 2, sizeof *v);
	TH_ASSERT(v);
	for (;;) {
		r = sop_malloc_from_pool_async(&v[n], 256 * MiB, pool, s);
		if (r != CUDA_SUCCESS)
			break;
		n++;
		TH_ASSERT(n <= total / (256 * MiB));
	}
	TH_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
	TH_ASSERT(n > 0);
	TH_CHECK(pool);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), n * 256 * MiB);
	for (i = 0; i < n; i++)
		TH_OK(sop_free_async(v[i], s));
	TH_OK(sop_stream_synchronize(s));
	TH_EQ(reserved(pool), 0);
	/* Full again, and usable. */
	TH_OK(sop_malloc_from_pool_async(&p, 256 * MiB, pool, s));
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
	TH_CHECK(pool);
	free(v);
	printf("trim: the device held %zu x 256 MiB\n", n);
	TH_OK(sop_pool_destroy(pool));
}

int
main(void)
{
	CUstream s1, s2;

	th_init();
	s1 = th_stream();
	s2 = th_stream();
	max_size(s1);
	threshold(s1, s2);
	trim(s1);
	exporting(s1);
	anchor(s1);
	kept_reservation(s1);
	device_full(s1);
	th_stream_destroy(s1);
	th_stream_destroy(s2);
	printf("trim: ok\n");
	return 0;
}
