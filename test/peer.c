/* peer.c - two devices: a device-0 pool's memory written and read by device 1's copy engines once
 * access is granted, memory the pool maps after the grant and a piece that growth moves
 * included; revoking; an allocation from a device-0 pool on a stream of device 1;
 * sop_malloc_async taking the stream's device's current pool; per-device default and current
 * pools; both devices' pools from many threads at once, each block's contents checked. Needs two
 * devices that can reach each other (exit 77 without): the simulated driver's two in CI, two
 * GPUs on a machine that has them.
 */
#include <string.h>

#include "helpers.h"

#define THREADS 4
#define ROUNDS 200

static CUcontext ctx[2];

static CUstream
stream_on(int dev)
{
	CUstream s;

	TH_OK(th.cuCtxSetCurrent(ctx[dev]));
	s = th_stream();
	TH_OK(th.cuCtxSetCurrent(ctx[0]));
	return s;
}

/* Fill p with v from a stream (of either device), and check every word from the host. */
static void
fill_on(void *p, size_t bytes, uint32_t v, CUstream s)
{
	TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)p, v, bytes / 4, s));
}

static bool
holds(void *p, size_t bytes, uint32_t v, CUstream s)
{
	size_t n = bytes / 4, i;
	uint32_t *h = malloc(bytes);
	bool ok = true;

	TH_ASSERT(h);
	TH_OK(th.cuMemcpyDtoHAsync(h, (CUdeviceptr)(uintptr_t)p, bytes, s));
	TH_OK(sop_stream_synchronize(s));
	for (i = 0; i < n && ok; i++)
		ok = h[i] == v;
	free(h);
	return ok;
}

static void
access_and_growth(sop_pool_t pool, CUstream s0, CUstream s1)
{
	CUmemAccessDesc grant = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemAccessDesc revoke = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_NONE};
	CUmemLocation dev1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
	CUmemAccess_flags f;
	void *a, *b, *c;

	TH_OK(sop_malloc_from_pool_async(&a, (size_t)8 << 20, pool, s0));
	TH_OK(sop_stream_synchronize(s0));
	TH_OK(sop_pool_set_access(pool, &grant, 1));
	TH_OK(sop_pool_get_access(&f, pool, &dev1));
	TH_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	/* Device 1 writes what device 0's pool holds, and device 0 reads it. */
	fill_on(a, (size_t)8 << 20, 0x11110001u, s1);
	TH_OK(sop_stream_synchronize(s1));
	TH_ASSERT(holds(a, (size_t)8 << 20, 0x11110001u, s0));
	/* Memory the pool maps after the grant is open to device 1 too. */
	TH_OK(sop_malloc_from_pool_async(&b, (size_t)256 << 20, pool, s0));
	TH_OK(sop_stream_synchronize(s0));
	fill_on(b, (size_t)256 << 20, 0x11110002u, s1);
	TH_OK(sop_stream_synchronize(s1));
	TH_ASSERT(holds(b, (size_t)256 << 20, 0x11110002u, s0));
	/* An allocation from device 0's pool on a stream of device 1, used there. */
	TH_OK(sop_malloc_from_pool_async(&c, (size_t)1 << 20, pool, s1));
	fill_on(c, (size_t)1 << 20, 0x11110003u, s1);
	TH_ASSERT(holds(c, (size_t)1 << 20, 0x11110003u, s1));
	TH_OK(sop_free_async(c, s1));
	TH_OK(sop_stream_synchronize(s1));
	/* Revoked: the pool's memory is device 0's alone again, as the driver's is. */
	TH_OK(sop_pool_set_access(pool, &revoke, 1));
	TH_OK(sop_pool_get_access(&f, pool, &dev1));
	TH_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_NONE);
	TH_ASSERT(holds(a, (size_t)8 << 20, 0x11110001u, s0));
	TH_OK(sop_free_async(a, s0));
	TH_OK(sop_free_async(b, s0));
	TH_OK(sop_stream_synchronize(s0));
	TH_CHECK(pool);
}

/* Whether the driver records flags as device 1's access at both ends of [p, p + bytes). */
static bool
access_of_1(void *p, size_t bytes, unsigned long long flags)
{
	CUmemLocation dev1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
	unsigned long long f0 = 0, f1 = 0;

	TH_OK(th.cuMemGetAccess(&f0, &dev1, (CUdeviceptr)(uintptr_t)p));
	TH_OK(th.cuMemGetAccess(&f1, &dev1, (CUdeviceptr)(uintptr_t)p + bytes - 1));
	return f0 == flags && f1 == flags;
}

/* A piece that growth moves (grow.c) keeps the pool's access: x, y and z take a piece of 32 MiB
 * each in a pool open to device 1, device 1 writes y, y is freed and known complete, and a
 * request of 40 MiB moves y's idle piece into its new range rather than hold 136 MiB for 104
 * live (test/pieces.c, growth_moves). Device 1 writes the whole of the new block, the moved
 * piece and the memory made beside it, device 0 reads it back, and x and z keep what device 1
 * wrote through their own mappings; revoked, the moved piece is closed to device 1 like the
 * rest. */
static void
moved_piece(CUstream s0, CUstream s1)
{
	CUmemAccessDesc grant = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemAccessDesc revoke = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_NONE};
	sop_pool_t pool = th_pool(0, 0);
	cuuint64_t keep_all = UINT64_MAX;
	size_t piece = (size_t)32 << 20, big = (size_t)40 << 20;
	void *x, *y, *z, *w;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
	TH_OK(sop_pool_set_access(pool, &grant, 1));
	TH_OK(sop_malloc_from_pool_async(&x, piece, pool, s0));
	TH_OK(sop_malloc_from_pool_async(&y, piece, pool, s0));
	TH_OK(sop_malloc_from_pool_async(&z, piece, pool, s0));
	TH_OK(sop_stream_synchronize(s0));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 3 * piece);
	fill_on(x, piece, 0x33330001u, s1);
	fill_on(y, piece, 0x33330002u, s1);
	fill_on(z, piece, 0x33330003u, s1);
	TH_OK(sop_stream_synchronize(s1));
	TH_OK(sop_free_async(y, s0));
	TH_OK(sop_stream_synchronize(s0));
	TH_OK(sop_malloc_from_pool_async(&w, big, pool, s0));
	/* Moved, not made whole: 104 MiB, as in test/pieces.c. */
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 3 * piece + (big - piece));
	TH_OK(sop_stream_synchronize(s0));
	TH_ASSERT(access_of_1(w, big, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
	fill_on(w, big, 0x33330004u, s1);
	TH_OK(sop_stream_synchronize(s1));
	TH_ASSERT(holds(w, big, 0x33330004u, s0));
	TH_ASSERT(holds(x, piece, 0x33330001u, s1));
	TH_ASSERT(holds(z, piece, 0x33330003u, s1));
	TH_CHECK(pool);
	TH_OK(sop_pool_set_access(pool, &revoke, 1));
	TH_ASSERT(access_of_1(w, big, CU_MEM_ACCESS_FLAGS_PROT_NONE));
	TH_ASSERT(holds(w, big, 0x33330004u, s0));
	TH_OK(sop_free_async(w, s0));
	TH_OK(sop_free_async(x, s0));
	TH_OK(sop_free_async(z, s0));
	TH_OK(sop_stream_synchronize(s0));
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
}

static void
current_pools(CUstream s0, CUstream s1)
{
	sop_pool_t def0, def1, mine1, got;
	void *p, *q;

	TH_OK(sop_device_get_default_pool(&def0, 0));
	TH_OK(sop_device_get_default_pool(&def1, 1));
	TH_ASSERT(def0 != def1);
	/* sop_malloc_async takes the pool of the stream's device. */
	TH_OK(sop_malloc_async(&p, 4096, s1));
	TH_OK(sop_pointer_get_pool(&got, p));
	TH_ASSERT(got == def1);
	TH_OK(sop_malloc_async(&q, 4096, s0));
	TH_OK(sop_pointer_get_pool(&got, q));
	TH_ASSERT(got == def0);
	TH_OK(sop_free_async(p, s1));
	TH_OK(sop_free_async(q, s0));
	/* Device 1's current pool, set, used, and forgotten when destroyed. */
	mine1 = th_pool(1, 0);
	TH_EQ(sop_device_set_pool(0, mine1), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_device_set_pool(1, mine1));
	TH_OK(sop_device_get_pool(&got, 1));
	TH_ASSERT(got == mine1);
	TH_OK(sop_device_get_pool(&got, 0));
	TH_ASSERT(got == def0);
	TH_OK(sop_malloc_async(&p, 4096, s1));
	TH_OK(sop_pointer_get_pool(&got, p));
	TH_ASSERT(got == mine1);
	TH_OK(sop_free_async(p, s1));
	TH_OK(sop_stream_synchronize(s1));
	TH_OK(sop_stream_synchronize(s0));
	TH_OK(sop_pool_destroy(mine1));
	TH_OK(sop_device_get_pool(&got, 1));
	TH_ASSERT(got == def1);
}

struct worker {
	pthread_t t;
	int id;
	sop_pool_t pools[2];
	unsigned bad;
};

static void *
work(void *arg)
{
	struct worker *w = arg;
	int dev = w->id % 2, r;
	CUstream s;
	void *p[4] = {0};
	size_t size[4] = {0};

	TH_OK(th.cuCtxSetCurrent(ctx[dev]));
	s = th_stream();
	for (r = 0; r < ROUNDS; r++) {
		int k = r % 4;
		uint32_t v = 0x22000000u + (uint32_t)(w->id << 16) + (uint32_t)r;

		if (p[k]) {
			if (!holds(p[k], size[k], 0x22000000u + (uint32_t)(w->id << 16) +
						   (uint32_t)(r - 4), s))
				w->bad++;
			TH_OK(sop_free_async(p[k], s));
		}
		size[k] = (size_t)4096 << (r % 8);
		/* Alternately from this device's pool and the other's (which grants access). */
		TH_OK(sop_malloc_from_pool_async(&p[k], size[k], w->pools[(r / 4) % 2 ? !dev : dev],
						 s));
		fill_on(p[k], size[k], v, s);
	}
	for (r = 0; r < 4; r++)
		TH_OK(sop_free_async(p[r], s));
	TH_OK(sop_stream_synchronize(s));
	th_stream_destroy(s);
	return NULL;
}

static void
threads(void)
{
	CUmemAccessDesc to1 = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemAccessDesc to0 = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	struct worker w[THREADS];
	sop_pool_t p0 = th_pool(0, 0), p1 = th_pool(1, 0);
	int i;

	TH_OK(sop_pool_set_access(p0, &to1, 1));
	TH_OK(sop_pool_set_access(p1, &to0, 1));
	for (i = 0; i < THREADS; i++) {
		w[i].id = i;
		w[i].pools[0] = p0;
		w[i].pools[1] = p1;
		w[i].bad = 0;
		TH_EQ(pthread_create(&w[i].t, NULL, work, &w[i]), 0);
	}
	for (i = 0; i < THREADS; i++) {
		TH_EQ(pthread_join(w[i].t, NULL), 0);
		TH_EQ(w[i].bad, 0);
	}
	TH_CHECK(p0);
	TH_CHECK(p1);
	TH_OK(sop_pool_destroy(p0));
	TH_OK(sop_pool_destroy(p1));
}

int
main(void)
{
	CUstream s0, s1;
	sop_pool_t pool;
	int can = 0;

	th_init();
	if (th_n_devices < 2) {
		printf("skip: needs two devices\n");
		return TH_SKIP;
	}
	TH_OK(sop__drv.cuDeviceCanAccessPeer(&can, 1, 0));
	if (!can) {
		printf("skip: device 1 cannot reach device 0's memory\n");
		return TH_SKIP;
	}
	TH_OK(sop__drv.cuDevicePrimaryCtxRetain(&ctx[0], 0));
	TH_OK(sop__drv.cuDevicePrimaryCtxRetain(&ctx[1], 1));
	s0 = stream_on(0);
	s1 = stream_on(1);
	pool = th_pool(0, 0);
	access_and_growth(pool, s0, s1);
	TH_OK(sop_pool_destroy(pool));
	moved_piece(s0, s1);
	current_pools(s0, s1);
	threads();
	TH_OK(th.cuCtxSetCurrent(ctx[1]));
	th_stream_destroy(s1);
	TH_OK(th.cuCtxSetCurrent(ctx[0]));
	th_stream_destroy(s0);
	printf("peer: two devices, access, growth after the grant, a moved piece, current pools, "
	       "%d threads: ok\n",
	       THREADS);
	return 0;
}
