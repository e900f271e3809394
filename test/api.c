/* api.c - every bad input gets a clear CUresult and leaves the pool exactly as it was.
 *
 * After each rejected call the pool's invariants hold and its statistics are unchanged; the
 * out-parameters are untouched.
 */
#include <string.h>

#include "helpers.h"

struct snapshot {
	uint64_t used, used_high, reserved, reserved_high;
};

static struct snapshot
snap(sop_pool_t pool)
{
	struct snapshot s = {
		th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
		th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH),
		th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
		th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
	};
	return s;
}

static void
same(sop_pool_t pool, struct snapshot a)
{
	struct snapshot b = snap(pool);

	TH_CHECK(pool);
	TH_EQ(b.used, a.used);
	TH_EQ(b.used_high, a.used_high);
	TH_EQ(b.reserved, a.reserved);
	TH_EQ(b.reserved_high, a.reserved_high);
}

static void
props_errors(void)
{
	CUmemPoolProps good, p;
	sop_pool_t pool = (sop_pool_t)0x1234;

	memset(&good, 0, sizeof good);
	good.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	good.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	good.location.id = 0;

	TH_EQ(sop_pool_create(NULL, &good), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_create(&pool, NULL), CUDA_ERROR_INVALID_VALUE);
	p = good;
	p.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
	TH_EQ(sop_pool_create(&pool, &p), CUDA_ERROR_INVALID_VALUE);
	p = good;
	p.location.id = th_n_devices;
	TH_EQ(sop_pool_create(&pool, &p), CUDA_ERROR_INVALID_VALUE);
	p = good;
	p.location.id = -1;
	TH_EQ(sop_pool_create(&pool, &p), CUDA_ERROR_INVALID_VALUE);
	p = good;
	p.location.type = CU_MEM_LOCATION_TYPE_INVALID;
	TH_EQ(sop_pool_create(&pool, &p), CUDA_ERROR_INVALID_VALUE);
	p = good;
	p.reserved[7] = 1;
	TH_EQ(sop_pool_create(&pool, &p), CUDA_ERROR_INVALID_VALUE);
	p = good;
	p.win32SecurityAttributes = &p;
	TH_EQ(sop_pool_create(&pool, &p), CUDA_ERROR_INVALID_VALUE);
	p = good;
	p.handleTypes = (CUmemAllocationHandleType)0x100;
	TH_EQ(sop_pool_create(&pool, &p), CUDA_ERROR_INVALID_VALUE);
	p = good;
	p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT; /* host pools: test/host.c */
	TH_EQ(sop_pool_create(&pool, &p), CUDA_ERROR_INVALID_VALUE);
	TH_ASSERT(pool == (sop_pool_t)0x1234); /* untouched on failure */
}

static void
attr_errors(sop_pool_t pool)
{
	struct snapshot s = snap(pool);
	cuuint64_t v = 5;
	int i = 1;

	TH_EQ(sop_pool_get_attr(NULL, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, NULL),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_attr(pool, (CUmemPool_attribute)999, &v), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(v, 5);
	TH_EQ(sop_pool_set_attr(pool, (CUmemPool_attribute)999, &v), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_set_attr(pool, (CUmemPool_attribute)0, &i), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &v),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, NULL),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_set_attr(NULL, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v),
	      CUDA_ERROR_INVALID_VALUE);
	same(pool, s);

	/* The reuse policies default on and are stored as written. */
	for (CUmemPool_attribute a = CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES;
	     a <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES; a++) {
		TH_OK(sop_pool_get_attr(pool, a, &i));
		TH_EQ(i, 1);
		i = 0;
		TH_OK(sop_pool_set_attr(pool, a, &i));
		i = 7;
		TH_OK(sop_pool_get_attr(pool, a, &i));
		TH_EQ(i, 0);
		i = 1;
		TH_OK(sop_pool_set_attr(pool, a, &i));
	}
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0);
	v = 12345;
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 12345);
	v = 0;
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
}

static void
alloc_errors(sop_pool_t pool, CUstream s)
{
	struct snapshot st;
	void *p = (void *)0x77, *q;
	char host[64];

	/* Size 0: success and NULL; freeing NULL succeeds. */
	TH_OK(sop_malloc_from_pool_async(&p, 0, pool, s));
	TH_ASSERT(p == NULL);
	TH_OK(sop_malloc_async(&p, 0, s));
	TH_ASSERT(p == NULL);
	TH_OK(sop_free_async(NULL, s));
	TH_OK(sop_free(NULL));

	TH_EQ(sop_malloc_from_pool_async(NULL, 16, pool, s), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_malloc_async(NULL, 16, s), CUDA_ERROR_INVALID_VALUE);
	p = (void *)0x77;
	TH_EQ(sop_malloc_from_pool_async(&p, 16, NULL, s), CUDA_ERROR_INVALID_VALUE);
	TH_ASSERT(p == (void *)0x77);

	TH_OK(sop_malloc_from_pool_async(&q, 1000, pool, s));
	st = snap(pool);
	/* Impossible sizes: out of memory at once, nothing changes. */
	TH_EQ(sop_malloc_from_pool_async(&p, (size_t)1 << 50, pool, s), CUDA_ERROR_OUT_OF_MEMORY);
	TH_EQ(sop_malloc_from_pool_async(&p, SIZE_MAX, pool, s), CUDA_ERROR_OUT_OF_MEMORY);
	TH_EQ(sop_malloc_from_pool_async(&p, SIZE_MAX - 100, pool, s), CUDA_ERROR_OUT_OF_MEMORY);
	TH_ASSERT(p == (void *)0x77);
	same(pool, st);

	/* Interior, foreign and host pointers. */
	TH_EQ(sop_free_async((char *)q + 512, s), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_free_async((char *)q + 1, s), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_free_async(host, s), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_free_async((void *)(uintptr_t)0x1000, s), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_free((char *)q + 512), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_free(host), CUDA_ERROR_INVALID_VALUE);
	same(pool, st);

	/* The pointer's pool, for any address inside the allocation. */
	{
		sop_pool_t owner = NULL;
		TH_OK(sop_pointer_get_pool(&owner, q));
		TH_ASSERT(owner == pool);
		owner = NULL;
		TH_OK(sop_pointer_get_pool(&owner, (char *)q + 999));
		TH_ASSERT(owner == pool);
		TH_EQ(sop_pointer_get_pool(&owner, (char *)q + 1000), CUDA_ERROR_INVALID_VALUE);
		TH_EQ(sop_pointer_get_pool(&owner, host), CUDA_ERROR_INVALID_VALUE);
		TH_EQ(sop_pointer_get_pool(NULL, q), CUDA_ERROR_INVALID_VALUE);
	}

	/* Double free, async then async, async then sync. */
	TH_OK(sop_free_async(q, s));
	st = snap(pool);
	TH_EQ(sop_free_async(q, s), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_free(q), CUDA_ERROR_INVALID_VALUE);
	{
		sop_pool_t owner = NULL;
		TH_EQ(sop_pointer_get_pool(&owner, q), CUDA_ERROR_INVALID_VALUE);
	}
	same(pool, st);

	/* sop_free: free at once, and only once. */
	TH_OK(sop_malloc_from_pool_async(&q, 4096, pool, s));
	st = snap(pool);
	TH_OK(sop_free(q));
	TH_EQ(sop_free(q), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), st.used - 4096);
	TH_CHECK(pool);
}

static void
pool_errors(sop_pool_t pool)
{
	sop_pool_t def, cur;
	CUmemAccess_flags f;
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	CUmemAccessDesc d;

	TH_OK(sop_device_get_default_pool(&def, 0));
	TH_EQ(sop_pool_destroy(def), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_destroy(NULL), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_device_get_default_pool(NULL, 0), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_device_get_default_pool(&cur, th_n_devices), CUDA_ERROR_INVALID_DEVICE);
	TH_EQ(sop_device_get_default_pool(&cur, -1), CUDA_ERROR_INVALID_DEVICE);
	TH_EQ(sop_device_get_pool(&cur, th_n_devices), CUDA_ERROR_INVALID_DEVICE);
	TH_EQ(sop_device_get_pool(NULL, 0), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_device_set_pool(th_n_devices, pool), CUDA_ERROR_INVALID_DEVICE);
	TH_EQ(sop_device_set_pool(0, NULL), CUDA_ERROR_INVALID_VALUE);
	if (th_n_devices > 1)
		TH_EQ(sop_device_set_pool(1, pool), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_device_get_pool(&cur, 0));
	TH_ASSERT(cur == def);

	TH_EQ(sop_trim_to(NULL, 0), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_access(NULL, pool, &loc), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_access(&f, NULL, &loc), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_get_access(&f, pool, NULL), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_pool_get_access(&f, pool, &loc));
	TH_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	loc.type = CU_MEM_LOCATION_TYPE_HOST;
	TH_OK(sop_pool_get_access(&f, pool, &loc));
	TH_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_NONE);

	TH_EQ(sop_pool_set_access(pool, NULL, 1), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_pool_set_access(pool, NULL, 0));
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = 0;
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	TH_OK(sop_pool_set_access(pool, &d, 1)); /* the owner: a no-op */
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
	TH_EQ(sop_pool_set_access(pool, &d, 1), CUDA_ERROR_INVALID_DEVICE);
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
	TH_EQ(sop_pool_set_access(pool, &d, 1), CUDA_ERROR_NOT_SUPPORTED);
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	d.location.id = th_n_devices + 3;
	TH_EQ(sop_pool_set_access(pool, &d, 1), CUDA_ERROR_INVALID_DEVICE);
	d.location.type = CU_MEM_LOCATION_TYPE_HOST;
	d.location.id = 0;
	TH_EQ(sop_pool_set_access(pool, &d, 1), CUDA_ERROR_NOT_SUPPORTED);
	TH_CHECK(pool);
}

int
main(void)
{
	sop_pool_t pool;
	CUstream s;

	th_init();
	s = th_stream();
	props_errors();
	pool = th_pool(0, 0);
	attr_errors(pool);
	alloc_errors(pool, s);
	pool_errors(pool);
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_pool_destroy(pool));
	TH_EQ(sop_pool_destroy(pool), CUDA_ERROR_INVALID_VALUE); /* twice */
	th_stream_destroy(s);
	printf("api: ok\n");
	return 0;
}
