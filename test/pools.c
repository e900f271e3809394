/* pools.c - default and current pools, pools on several devices, and destroying a pool that
 * still has live allocations (they stay valid until freed; the pool's memory goes back once the
 * last free has completed; the device's default pool becomes current again). */
#include <string.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)

static void
default_and_current(CUstream s)
{
	sop_pool_t def, def2, cur, pool;
	void *p;

	TH_OK(sop_device_get_default_pool(&def, 0));
	TH_OK(sop_device_get_default_pool(&def2, 0));
	TH_ASSERT(def == def2);
	TH_OK(sop_device_get_pool(&cur, 0));
	TH_ASSERT(cur == def);

	/* sop_malloc_async takes the current pool of the stream's device. */
	pool = th_pool(0, 0);
	TH_OK(sop_device_set_pool(0, pool));
	TH_OK(sop_device_get_pool(&cur, 0));
	TH_ASSERT(cur == pool);
	TH_OK(sop_malloc_async(&p, 1234, s));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 1234);
	TH_OK(sop_pointer_get_pool(&cur, p));
	TH_ASSERT(cur == pool);
	TH_OK(sop_free_async(p, s));

	/* Setting the default back works too. */
	TH_OK(sop_device_set_pool(0, def));
	TH_OK(sop_device_get_pool(&cur, 0));
	TH_ASSERT(cur == def);
	TH_OK(sop_device_set_pool(0, pool));

	/* Destroying the current pool reverts the device to its default. */
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_pool_destroy(pool));
	TH_OK(sop_device_get_pool(&cur, 0));
	TH_ASSERT(cur == def);
	TH_OK(sop_malloc_async(&p, 1234, s));
	TH_OK(sop_pointer_get_pool(&cur, p));
	TH_ASSERT(cur == def);
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
}

static void
destroy_live(CUstream s)
{
	struct sim_live before = th_live(), after;
	sop_pool_t pool = th_pool(0, 0);
	void *a, *b;

	TH_OK(sop_malloc_from_pool_async(&a, 3 * MiB, pool, s));
	TH_OK(sop_malloc_from_pool_async(&b, 5 * MiB, pool, s));
	TH_OK(sop_pool_destroy(pool));
	/* The allocations stay usable. */
	th_fill(a, 3 * MiB, 0x0badcafe, s);
	th_fill(b, 5 * MiB, 0x600df00d, s);
	TH_ASSERT(th_verify(a, 3 * MiB, 0x0badcafe, s));
	TH_ASSERT(th_verify(b, 5 * MiB, 0x600df00d, s));
	/* No new allocations from a destroyed pool. */
	{
		void *c = NULL;
		TH_EQ(sop_malloc_from_pool_async(&c, 16, pool, s), CUDA_ERROR_INVALID_VALUE);
	}
	TH_OK(sop_free_async(a, s));
	TH_OK(sop_free(b));
	/* The last free is still pending on s: the memory is still there. */
	after = th_live();
	if (th.sim_live_get)
		TH_ASSERT(after.mappings > before.mappings);
	TH_OK(sop_stream_synchronize(s));
	after = th_live();
	TH_EQ(after.mappings, before.mappings);
	TH_EQ(after.reservations, before.reservations);
	TH_EQ(after.handles, before.handles);
	TH_EQ(after.phys_bytes, before.phys_bytes);
	TH_EQ(after.primary_ctx_refs, before.primary_ctx_refs);
}

static void
several_devices(void)
{
	sop_pool_t pools[8], def;
	void *p[8];
	CUstream s;
	int d, n = th_n_devices < 8 ? th_n_devices : 8;

	if (n < 2) {
		printf("pools: one device, skipping the multi-device part\n");
		return;
	}
	s = th_stream();
	for (d = 0; d < n; d++) {
		CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, d};
		CUmemAccess_flags f;
		pools[d] = th_pool(d, 0);
		TH_OK(sop_malloc_from_pool_async(&p[d], 3 * MiB, pools[d], s));
		TH_OK(sop_pool_get_access(&f, pools[d], &loc));
		TH_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
		TH_OK(sop_device_get_default_pool(&def, d));
		TH_ASSERT(def != pools[d]);
		TH_EQ(sop_device_set_pool(d == 0 ? 1 : 0, pools[d]), CUDA_ERROR_INVALID_VALUE);
	}
	for (d = 0; d < n; d++) {
		sop_pool_t owner;
		TH_OK(sop_pointer_get_pool(&owner, p[d]));
		TH_ASSERT(owner == pools[d]);
		TH_OK(sop_free_async(p[d], s));
		TH_OK(sop_stream_synchronize(s));
		TH_CHECK(pools[d]);
		TH_OK(sop_pool_destroy(pools[d]));
	}
	/* Peer access on device 0's pool for device 1. */
	{
		CUmemAccessDesc d1 = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
		CUmemLocation l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
		CUmemAccess_flags f;
		sop_pool_t pool = th_pool(0, 0);
		void *q;
		int can = 0;

		TH_OK(sop__drv.cuDeviceCanAccessPeer(&can, 1, 0));
		TH_OK(sop_malloc_from_pool_async(&q, MiB, pool, s));
		TH_OK(sop_pool_get_access(&f, pool, &l1));
		TH_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_NONE);
		if (can) {
			TH_OK(sop_pool_set_access(pool, &d1, 1));
			TH_OK(sop_pool_get_access(&f, pool, &l1));
			TH_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
			d1.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
			TH_OK(sop_pool_set_access(pool, &d1, 1));
			TH_OK(sop_pool_get_access(&f, pool, &l1));
			TH_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_NONE);
		} else {
			TH_EQ(sop_pool_set_access(pool, &d1, 1), CUDA_ERROR_INVALID_DEVICE);
		}
		TH_OK(sop_free_async(q, s));
		TH_OK(sop_stream_synchronize(s));
		TH_CHECK(pool);
		TH_OK(sop_pool_destroy(pool));
	}
	th_stream_destroy(s);
}

/* CUDA 13.2's read-only properties (attribute ids 9-14, which the 13.0 headers lack): what the
 * pool was made with, the cap as the pool rounds it. */
enum { ALLOC_TYPE = 9, EXPORT_TYPES, LOCATION_ID, LOCATION_TYPE, MAX_SIZE, HW_DECOMPRESS };

static void
properties(void)
{
	const size_t cap = (size_t)100 << 20, cap_pad = cap + 12345;
	CUmemPoolProps props;
	sop_pool_t pool, def;
	cuuint64_t max;
	int d, a;

	for (d = 0; d < th_n_devices; d++) {
		TH_OK(sop_device_get_default_pool(&def, d));
		TH_EQ(th_attr_int(def, ALLOC_TYPE), CU_MEM_ALLOCATION_TYPE_PINNED);
		TH_EQ(th_attr_int(def, EXPORT_TYPES), CU_MEM_HANDLE_TYPE_NONE);
		TH_EQ(th_attr_int(def, LOCATION_ID), d);
		TH_EQ(th_attr_int(def, LOCATION_TYPE), CU_MEM_LOCATION_TYPE_DEVICE);
		TH_EQ(th_attr_int(def, HW_DECOMPRESS), 0);
		TH_EQ(th_attr(def, (CUmemPool_attribute)MAX_SIZE), 0); /* no cap */

		memset(&props, 0, sizeof props);
		props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		props.location.id = d;
		props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
		props.maxSize = cap_pad;
		TH_OK(sop_pool_create(&pool, &props));
		TH_EQ(th_attr_int(pool, EXPORT_TYPES), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		TH_EQ(th_attr_int(pool, LOCATION_ID), d);
		/* Rounded up to the granularity (2 MiB on the simulated driver and the GPUs sop
		 * has run on), as the driver says its figure may be. */
		max = th_attr(pool, (CUmemPool_attribute)MAX_SIZE);
		TH_ASSERT(max >= cap_pad && max <= cap + ((size_t)2 << 20) && max % 4096 == 0);
		/* Read-only: a write is refused and changes nothing. */
		for (a = ALLOC_TYPE; a <= HW_DECOMPRESS; a++) {
			cuuint64_t v = 0;
			TH_EQ(sop_pool_set_attr(pool, (CUmemPool_attribute)a, &v),
			      CUDA_ERROR_INVALID_VALUE);
		}
		TH_EQ(th_attr(pool, (CUmemPool_attribute)MAX_SIZE), max);
		TH_EQ(th_attr_int(pool, ALLOC_TYPE), CU_MEM_ALLOCATION_TYPE_PINNED);
		TH_OK(sop_pool_destroy(pool));
	}
}

int
main(void)
{
	CUstream s;

	th_init();
	s = th_stream();
	default_and_current(s);
	destroy_live(s);
	several_devices();
	properties();
	th_stream_destroy(s);
	printf("pools: ok\n");
	return 0;
}
