/* host.c - host pools: pinned host memory (CU_MEM_LOCATION_TYPE_HOST, HOST_NUMA) through the same
 * calls as device pools.
 *
 * Creation with the driver's rules (no handle types for HOST, no HOST_NUMA_CURRENT, a node the
 * driver knows) and, where the driver cannot make host memory through cuMemCreate (the simulated
 * one told to answer so), a refusal with its code that leaves everything else working. Then
 * allocation and free in stream order with reuse on the stream and across an event, statistics,
 * the release threshold, trimming, free extents and compaction; the CPU loading and storing the
 * memory once the stream work before it has completed, and stream copies and memsets on it after
 * the CPU's stores; access (the CPU always, devices once granted); no device's memory limit
 * counts it; the default and current pools of host locations; the device's closest node; memory
 * of a HOST_NUMA pool on its node, where the kernel says (get_mempolicy); driver failures while
 * a host pool grows. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)

static bool sim;

static CUmemPoolProps
host_props(CUmemLocationType type, int id)
{
	CUmemPoolProps props;

	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = type;
	props.location.id = id;
	return props;
}

static sop_pool_t
host_pool(CUmemLocationType type, int id)
{
	CUmemPoolProps props = host_props(type, id);
	sop_pool_t pool;

	TH_OK(sop_pool_create(&pool, &props));
	return pool;
}

/* Device 0 may use the pool's memory: stream copies and memsets on its streams. */
static void
grant(sop_pool_t pool, int device, CUmemAccess_flags flags)
{
	CUmemAccessDesc d;

	memset(&d, 0, sizeof d);
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = device;
	d.flags = flags;
	TH_OK(sop_pool_set_access(pool, &d, 1));
}

static CUmemAccess_flags
access_of(sop_pool_t pool, CUmemLocationType type, int id)
{
	CUmemLocation loc = {type, id};
	CUmemAccess_flags f = (CUmemAccess_flags)-1;

	TH_OK(sop_pool_get_access(&f, pool, &loc));
	return f;
}

static bool
live_same(struct sim_live a, struct sim_live b)
{
	return a.reservations == b.reservations && a.handles == b.handles &&
	       a.mappings == b.mappings && a.phys_bytes == b.phys_bytes;
}

/* The driver's rules on a host pool's properties; bad input changes nothing. */
static void
bad_input(void)
{
	struct sim_live before = th_live();
	CUmemPoolProps props;
	sop_pool_t pool = (sop_pool_t)0x1, hp;
	CUmemLocation loc;

	props = host_props(CU_MEM_LOCATION_TYPE_HOST, 0);
	props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	TH_EQ(sop_pool_create(&pool, &props), CUDA_ERROR_INVALID_VALUE);
	props = host_props(CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0);
	TH_EQ(sop_pool_create(&pool, &props), CUDA_ERROR_INVALID_VALUE);
	props = host_props(CU_MEM_LOCATION_TYPE_HOST_NUMA, -1);
	TH_EQ(sop_pool_create(&pool, &props), CUDA_ERROR_INVALID_VALUE);
	/* A node the machine does not have: the driver's refusal. */
	props = host_props(CU_MEM_LOCATION_TYPE_HOST_NUMA, 4000);
	TH_ASSERT(sop_pool_create(&pool, &props) != CUDA_SUCCESS);
	if (sim)
		TH_EQ(sop_pool_create(&pool, &props), CUDA_ERROR_INVALID_VALUE);
	props = host_props(CU_MEM_LOCATION_TYPE_HOST, 0);
	props.allocType = CU_MEM_ALLOCATION_TYPE_MANAGED;
	TH_EQ(sop_pool_create(&pool, &props), CUDA_ERROR_NOT_SUPPORTED);
	props = host_props(CU_MEM_LOCATION_TYPE_HOST, 0);
	props.usage = 1;
	TH_EQ(sop_pool_create(&pool, &props), CUDA_ERROR_NOT_SUPPORTED);
	TH_ASSERT(pool == (sop_pool_t)0x1);

	/* Locations by name. */
	loc.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
	loc.id = 0;
	TH_EQ(sop_mem_get_default_pool(&hp, &loc, CU_MEM_ALLOCATION_TYPE_PINNED),
	      CUDA_ERROR_INVALID_VALUE);
	loc.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
	loc.id = SOP_NUMA_NODES;
	TH_EQ(sop_mem_get_default_pool(&hp, &loc, CU_MEM_ALLOCATION_TYPE_PINNED),
	      CUDA_ERROR_INVALID_VALUE);
	loc.type = CU_MEM_LOCATION_TYPE_HOST;
	TH_EQ(sop_mem_get_default_pool(&hp, &loc, CU_MEM_ALLOCATION_TYPE_MANAGED),
	      CUDA_ERROR_NOT_SUPPORTED);
	TH_EQ(sop_mem_get_default_pool(NULL, &loc, CU_MEM_ALLOCATION_TYPE_PINNED),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_mem_get_pool(&hp, NULL, CU_MEM_ALLOCATION_TYPE_PINNED), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_device_get_host_location(&loc, th_n_devices), CUDA_ERROR_INVALID_DEVICE);
	TH_EQ(sop_device_get_host_location(NULL, 0), CUDA_ERROR_INVALID_VALUE);
	TH_ASSERT(live_same(before, th_live()));
	printf("bad input: ok\n");
}

/* A driver that cannot make host memory through cuMemCreate: the pool is refused with its code,
 * nothing is left behind, and device pools work as before. */
static void
no_host_vmm(CUstream s)
{
	struct sim_live before;
	CUmemPoolProps props = host_props(CU_MEM_LOCATION_TYPE_HOST, 0);
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_HOST_NUMA, 0};
	sop_pool_t pool = (sop_pool_t)0x1, dp;
	void *p;

	if (!sim)
		return;
	TH_OK(sop_device_get_default_pool(&dp, 0));
	before = th_live();
	th.sim_host_vmm(0);
	TH_EQ(sop_pool_create(&pool, &props), CUDA_ERROR_NOT_SUPPORTED);
	props = host_props(CU_MEM_LOCATION_TYPE_HOST_NUMA, 0);
	TH_EQ(sop_pool_create(&pool, &props), CUDA_ERROR_NOT_SUPPORTED);
	TH_EQ(sop_mem_get_default_pool(&pool, &loc, CU_MEM_ALLOCATION_TYPE_PINNED),
	      CUDA_ERROR_NOT_SUPPORTED);
	TH_ASSERT(pool == (sop_pool_t)0x1);
	TH_ASSERT(live_same(before, th_live()));
	TH_OK(sop_malloc_async(&p, 3 * MiB, s));
	th_fill(p, 3 * MiB, 0x01020304, s);
	TH_ASSERT(th_verify(p, 3 * MiB, 0x01020304, s));
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
	TH_CHECK(dp);
	th.sim_host_vmm(1);
	/* The refusal was not remembered: the driver is asked again. */
	TH_OK(sop_mem_get_default_pool(&pool, &loc, CU_MEM_ALLOCATION_TYPE_PINNED));
	printf("driver without host memory through cuMemCreate: ok\n");
}

/* Stream order, statistics, threshold, trimming, extents, compaction. */
static void
stream_order(CUmemLocationType type, int id, CUstream s1, CUstream s2)
{
	sop_pool_t pool = host_pool(type, id);
	cuuint64_t keep = 64 * MiB;
	size_t largest, total, limit, held_before, held;
	CUevent ev;
	void *a, *b, *c;
	int on = 1;

	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	TH_OK(sop_device_get_memory_limit(&limit, &held_before, 0));
	/* Same stream: a free is reusable at once, at the same address. */
	TH_OK(sop_malloc_from_pool_async(&a, 1 * MiB, pool, s1));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 1 * MiB);
	TH_ASSERT(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 2 * MiB);
	{
		sop_pool_t got;
		TH_OK(sop_pointer_get_pool(&got, (char *)a + 4096));
		TH_ASSERT(got == pool);
	}
	TH_OK(sop_free_async(a, s1));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	TH_OK(sop_malloc_from_pool_async(&b, 1 * MiB, pool, s1));
	TH_ASSERT(b == a);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 1 * MiB);
	/* Host memory counts against no device. */
	TH_OK(sop_device_get_memory_limit(&limit, &held, 0));
	TH_EQ(held, held_before);

	/* Across streams, through an event. */
	TH_OK(sop_free_async(b, s1));
	TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	TH_OK(sop_event_record(ev, s1));
	TH_OK(sop_stream_wait_event(s2, ev, 0));
	TH_OK(sop_malloc_from_pool_async(&c, 1 * MiB, pool, s2));
	TH_ASSERT(c == a);
	TH_OK(sop_free_async(c, s2));
	TH_OK(sop_event_destroy(ev));

	/* Threshold 0: a synchronization gives the idle memory back. */
	TH_OK(sop_stream_synchronize(s1));
	TH_OK(sop_stream_synchronize(s2));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	/* A threshold keeps it (pinning is what a host pool saves), until a trim. */
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_pool_set_compaction(pool, 1));
	TH_OK(sop_malloc_from_pool_async(&a, 20 * MiB, pool, s1));
	TH_OK(sop_malloc_from_pool_async(&b, 3 * MiB, pool, s1));
	TH_OK(sop_malloc_from_pool_async(&c, 5 * MiB, pool, s1));
	TH_OK(sop_free_async(b, s1));
	TH_OK(sop_pool_get_free_extents(pool, &largest, &total));
	TH_ASSERT(total >= 3 * MiB && largest >= 3 * MiB && largest <= total);
	TH_EQ(total, th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) - 25 * MiB);
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_free_async(c, s1));
	TH_OK(sop_stream_synchronize(s1));
	TH_ASSERT(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 28 * MiB);
	TH_CHECK(pool);
	TH_OK(sop_trim_to(pool, 8 * MiB));
	TH_ASSERT(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 8 * MiB);
	TH_ASSERT(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) < 28 * MiB);
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) >= 28 * MiB, 1);
	/* The reuse policies read and write as on a device pool. */
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &on));
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	printf("stream order, statistics, threshold, trim (location %d): ok\n", (int)type);
}

/* A staging pipeline: per batch the CPU fills a buffer allocated on a stream of its own, which
 * runs no work, and a copy on s1 reads it before it is freed there. With internal dependencies
 * off, a block comes back to the CPU's stream only once sop knows its copy complete, and the CPU
 * finds it in its caches only if that is the block freed last: the pool must hand out that one,
 * not cycle through the free memory of its growth step (it did, 32 blocks of 1 MiB in turn).
 * sop learns of the copies from its own probes alone: the test waits for them through the
 * driver, behind sop's back. */
static void
staging(CUstream s1, CUstream hs)
{
	enum { BATCHES = 256, WARM = 16, KEEP = 4 };
	sop_pool_t pool = host_pool(CU_MEM_LOCATION_TYPE_HOST, 0);
	cuuint64_t keep = UINT64_MAX;
	void *seen[KEEP], *dev, *p;
	int off = 0, n_seen = 0, b, k;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off));
	grant(pool, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	TH_OK(sop_malloc_async(&dev, MiB, s1));
	TH_OK(sop_stream_synchronize(s1));
	for (b = 0; b < BATCHES; b++) {
		TH_OK(sop_malloc_from_pool_async(&p, MiB, pool, hs));
		TH_OK(sop_stream_synchronize(hs));
		memset(p, b & 0xff, MiB);
		TH_OK(th.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dev, (CUdeviceptr)(uintptr_t)p, MiB,
				       s1));
		TH_OK(sop_free_async(p, s1));
		while (th.cuStreamQuery(s1) == CUDA_ERROR_NOT_READY)
			sched_yield();
		if (b < WARM)
			continue;
		for (k = 0; k < n_seen && seen[k] != p; k++)
			;
		if (k == n_seen) {
			TH_ASSERT(n_seen < KEEP);
			seen[n_seen++] = p;
		}
	}
	TH_ASSERT(th_verify(dev, MiB, (uint32_t)((BATCHES - 1) & 0xff) * 0x01010101u, s1));
	TH_ASSERT(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) <= 2 * TH_POOL(pool)->granularity);
	TH_OK(sop_free_async(dev, s1));
	TH_OK(sop_stream_synchronize(s1));
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	printf("staging: %d buffers in turn after %d batches: ok\n", n_seen, WARM);
}

/* Pieces of the pool's segments. */
static size_t
pieces(sop_pool_t pool)
{
	struct sop_pool *p = TH_POOL(pool);
	struct sop__segment *seg;
	size_t n = 0;

	sop__mutex_take(&p->lock, SOP_RANK_POOL);
	for (seg = p->segments; seg; seg = seg->next)
		n += seg->n_pieces;
	sop__mutex_drop(&p->lock);
	return n;
}

/* A host pool pins what it needs, not a device pool's 32 MiB step: its first small allocation
 * pins one granule, and as it grows its steps ramp up by half of what it holds, so that it
 * reserves at most half again its live memory plus a granule while its pieces stay few. */
static void
growth_ramp(CUstream s)
{
	enum { LIVE = 96 };
	sop_pool_t pool = host_pool(CU_MEM_LOCATION_TYPE_HOST, 0);
	size_t g = TH_POOL(pool)->granularity, reserved, n;
	void *p[LIVE];
	int i;

	TH_OK(sop_malloc_from_pool_async(&p[0], MiB, pool, s));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), g);
	for (i = 1; i < LIVE; i++) {
		TH_OK(sop_malloc_from_pool_async(&p[i], MiB, pool, s));
		reserved = th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
		TH_ASSERT(reserved <= (size_t)(i + 1) * MiB * 3 / 2 + g);
	}
	n = pieces(pool);
	TH_ASSERT(n <= 12);
	for (i = 0; i < LIVE; i++)
		TH_OK(sop_free_async(p[i], s));
	TH_OK(sop_stream_synchronize(s));
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	printf("growth ramp: %zu pieces for %d MiB: ok\n", n, LIVE);
}

/* The CPU's loads and stores, ordered with stream work by synchronization; device access. */
static void
cpu_access(CUmemLocationType type, int id, CUstream s1, CUstream s2)
{
	sop_pool_t pool = host_pool(type, id);
	const size_t n = 4 * MiB;
	unsigned char *a, *b;
	CUmemAccessDesc d;
	unsigned long long f = 0;
	size_t i;

	/* The CPU is the owner; devices have no access until granted. */
	TH_EQ(access_of(pool, CU_MEM_LOCATION_TYPE_HOST, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	TH_EQ(access_of(pool, CU_MEM_LOCATION_TYPE_DEVICE, 0), CU_MEM_ACCESS_FLAGS_PROT_NONE);
	TH_OK(sop_malloc_from_pool_async((void **)&a, n, pool, s1));
	TH_OK(sop_malloc_from_pool_async((void **)&b, n, pool, s1));
	if (sim) {
		/* Mapped for the CPU, not for the device. */
		CUmemLocation loc = {type, 0};
		TH_OK(th.cuMemGetAccess(&f, &loc, (CUdeviceptr)(uintptr_t)a));
		TH_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
		loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
		TH_OK(th.cuMemGetAccess(&f, &loc, (CUdeviceptr)(uintptr_t)a));
		TH_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_NONE);
	}
	/* The owner's rules. */
	memset(&d, 0, sizeof d);
	d.location.type = CU_MEM_LOCATION_TYPE_HOST;
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	TH_OK(sop_pool_set_access(pool, &d, 1));
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
	TH_EQ(sop_pool_set_access(pool, &d, 1), CUDA_ERROR_INVALID_DEVICE);
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
	TH_EQ(sop_pool_set_access(pool, &d, 1), CUDA_ERROR_NOT_SUPPORTED);
	d.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	TH_EQ(sop_pool_set_access(pool, &d, 1),
	      type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = th_n_devices;
	TH_EQ(sop_pool_set_access(pool, &d, 1), CUDA_ERROR_INVALID_DEVICE);
	TH_EQ(access_of(pool, CU_MEM_LOCATION_TYPE_DEVICE, 0), CU_MEM_ACCESS_FLAGS_PROT_NONE);

	/* Granted to every device: memory mapped before and after. */
	for (i = 0; i < (size_t)th_n_devices; i++)
		grant(pool, (int)i, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	TH_EQ(access_of(pool, CU_MEM_LOCATION_TYPE_DEVICE, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	if (sim) {
		CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
		TH_OK(th.cuMemGetAccess(&f, &loc, (CUdeviceptr)(uintptr_t)a));
		TH_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	}

	/* Device work first (a memset on s1), then the CPU after a synchronization. */
	th_fill(a, n, 0xa5a5a5a5u, s1);
	TH_OK(sop_stream_synchronize(s1));
	for (i = 0; i < n; i += 4093)
		TH_EQ(a[i], 0xa5);
	/* The CPU's stores, then a copy on another stream and the CPU's check. */
	for (i = 0; i < n; i++)
		a[i] = (unsigned char)(i * 7 + 1);
	TH_OK(th.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)b, (CUdeviceptr)(uintptr_t)a, n, s2));
	TH_OK(sop_stream_synchronize(s2));
	for (i = 0; i < n; i++)
		if (b[i] != (unsigned char)(i * 7 + 1))
			TH_EQ(b[i], (unsigned char)(i * 7 + 1));
	/* Done on the CPU: the frees go in stream order. */
	TH_OK(sop_free_async(a, s1));
	TH_OK(sop_free_async(b, s2));
	/* A block reused after growth is mapped for the devices granted. */
	TH_OK(sop_malloc_from_pool_async((void **)&a, 40 * MiB, pool, s1));
	th_fill(a, 40 * MiB, 0x5a5a5a5au, s1);
	TH_ASSERT(th_verify(a, 40 * MiB, 0x5a5a5a5au, s1));
	TH_EQ(a[40 * MiB - 1], 0x5a);
	TH_OK(sop_free_async(a, s1));
	/* Revoked. */
	grant(pool, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE);
	TH_EQ(access_of(pool, CU_MEM_LOCATION_TYPE_DEVICE, 0), CU_MEM_ACCESS_FLAGS_PROT_NONE);
	TH_OK(sop_ctx_synchronize());
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	printf("CPU access and device access (location %d): ok\n", (int)type);
}

/* Default and current pools of host locations; a host pool is no device's pool. */
static void
locations(CUstream s)
{
	CUmemLocation host = {CU_MEM_LOCATION_TYPE_HOST, 0}, dev0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	CUmemLocation near;
	CUmemPoolProps props;
	sop_pool_t def, def2, cur, mine, numa_def, dp;
	void *p;
	int node = -1;

	TH_OK(sop_mem_get_default_pool(&def, &host, CU_MEM_ALLOCATION_TYPE_PINNED));
	TH_OK(sop_mem_get_default_pool(&def2, &host, CU_MEM_ALLOCATION_TYPE_PINNED));
	TH_ASSERT(def == def2);
	TH_EQ(sop_pool_destroy(def), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_mem_get_pool(&cur, &host, CU_MEM_ALLOCATION_TYPE_PINNED));
	TH_ASSERT(cur == def);
	/* Its location as CUDA 13.2's read-only attributes give it (LOCATION_ID 11, LOCATION_TYPE
	 * 12, EXPORT_HANDLE_TYPES 10): a host pool exports nothing. */
	TH_EQ(th_attr_int(def, 12), CU_MEM_LOCATION_TYPE_HOST);
	TH_EQ(th_attr_int(def, 11), 0);
	TH_EQ(th_attr_int(def, 10), CU_MEM_HANDLE_TYPE_NONE);
	TH_OK(sop_malloc_from_pool_async(&p, 4096, def, s));
	TH_OK(sop_stream_synchronize(s));
	memset(p, 1, 4096);
	TH_OK(sop_free_async(p, s));

	mine = host_pool(CU_MEM_LOCATION_TYPE_HOST, 0);
	TH_OK(sop_mem_set_pool(&host, CU_MEM_ALLOCATION_TYPE_PINNED, mine));
	TH_OK(sop_mem_get_pool(&cur, &host, CU_MEM_ALLOCATION_TYPE_PINNED));
	TH_ASSERT(cur == mine);
	/* Not a device's pool, nor another location's. */
	TH_EQ(sop_device_set_pool(0, mine), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_mem_set_pool(&dev0, CU_MEM_ALLOCATION_TYPE_PINNED, mine), CUDA_ERROR_INVALID_VALUE);
	near.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
	near.id = 0;
	TH_EQ(sop_mem_set_pool(&near, CU_MEM_ALLOCATION_TYPE_PINNED, mine), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_device_get_default_pool(&dp, 0));
	TH_EQ(sop_mem_set_pool(&host, CU_MEM_ALLOCATION_TYPE_PINNED, dp), CUDA_ERROR_INVALID_VALUE);
	/* By location, a device's are the device's. */
	TH_OK(sop_mem_get_default_pool(&cur, &dev0, CU_MEM_ALLOCATION_TYPE_PINNED));
	TH_ASSERT(cur == dp);
	/* Destroying the current pool makes the default current again. */
	TH_OK(sop_pool_destroy(mine));
	TH_OK(sop_mem_get_pool(&cur, &host, CU_MEM_ALLOCATION_TYPE_PINNED));
	TH_ASSERT(cur == def);

	/* The device's closest node, as the driver names it. */
	TH_OK(sop_device_get_host_location(&near, 0));
	TH_OK(sop__drv.cuDeviceGetAttribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0));
	if (node >= 0) {
		TH_EQ(near.type, CU_MEM_LOCATION_TYPE_HOST_NUMA);
		TH_EQ(near.id, node);
	} else {
		TH_EQ(near.type, CU_MEM_LOCATION_TYPE_HOST);
	}
	props = host_props(near.type, near.id);
	TH_OK(sop_pool_create(&mine, &props));
	TH_OK(sop_pool_destroy(mine));
	if (near.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
		TH_OK(sop_mem_get_default_pool(&numa_def, &near, CU_MEM_ALLOCATION_TYPE_PINNED));
		TH_ASSERT(numa_def != def);
		TH_OK(sop_mem_set_pool(&near, CU_MEM_ALLOCATION_TYPE_PINNED, numa_def));
	}
	TH_OK(sop_stream_synchronize(s));
	printf("host locations' default and current pools: ok\n");
}

/* The NUMA node of the page at p (get_mempolicy with MPOL_F_NODE | MPOL_F_ADDR), or -1 where the
 * kernel does not say. */
static int
page_node(const void *p)
{
	int node = -1;

	if (syscall(SYS_get_mempolicy, &node, NULL, 0ul, p, 3ul) != 0)
		return -1;
	return node;
}

/* A HOST_NUMA pool's memory is on its node: every node of the machine, where the kernel tells. */
static void
numa_placement(CUstream s)
{
	char path[64];
	int n, checked = 0;

	for (n = 0; n < SOP_NUMA_NODES; n++) {
		CUmemPoolProps props = host_props(CU_MEM_LOCATION_TYPE_HOST_NUMA, n);
		sop_pool_t pool;
		unsigned char *p;
		size_t off;

		snprintf(path, sizeof path, "/sys/devices/system/node/node%d", n);
		if (access(path, F_OK) != 0)
			continue;
		if (sop_pool_create(&pool, &props) != CUDA_SUCCESS) /* a node without memory */
			continue;
		TH_OK(sop_malloc_from_pool_async((void **)&p, 6 * MiB, pool, s));
		TH_OK(sop_stream_synchronize(s));
		memset(p, 0x77, 6 * MiB);
		for (off = 0; off < 6 * MiB; off += 1 * MiB) {
			int got = page_node(p + off);
			if (got < 0) {
				printf("skip: the kernel does not tell where pages are\n");
				TH_OK(sop_free_async(p, s));
				TH_OK(sop_pool_destroy(pool));
				return;
			}
			TH_EQ(got, n);
		}
		TH_OK(sop_free_async(p, s));
		TH_OK(sop_stream_synchronize(s));
		TH_OK(sop_pool_destroy(pool));
		checked++;
	}
	if (checked < 2)
		printf("NUMA placement: %d node(s) here, placement across nodes not proven\n",
		       checked);
	else
		printf("NUMA placement on %d nodes: ok\n", checked);
}

/* The n-th driver call of a host pool's growth fails: a clean error, the pool as it was. */
static void
faults(CUstream s)
{
	static const char *const entries[] = {"cuMemCreate", "cuMemMap", "cuMemSetAccess"};
	CUmemPoolProps props = host_props(CU_MEM_LOCATION_TYPE_HOST, 0);
	struct sim_live before;
	sop_pool_t pool = (sop_pool_t)0x1;
	size_t i;
	void *p;

	if (!sim)
		return;
	before = th_live();
	th.sim_fail("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
	TH_EQ(sop_pool_create(&pool, &props), CUDA_ERROR_OUT_OF_MEMORY);
	TH_ASSERT(pool == (sop_pool_t)0x1);
	TH_ASSERT(live_same(before, th_live()));
	pool = host_pool(CU_MEM_LOCATION_TYPE_HOST, 0);
	grant(pool, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	/* The n-th call of each entry fails, n = 1, 2, ... until growth no longer reaches it: the
	 * driver's code, nothing held, or success where growth worked around it. */
	for (i = 0; i < sizeof entries / sizeof entries[0]; i++) {
		unsigned long n, calls, made;
		CUresult r;

		for (n = 1;; n++) {
			calls = th.sim_calls(entries[i]);
			th.sim_fail(entries[i], n, CUDA_ERROR_UNKNOWN);
			r = sop_malloc_from_pool_async(&p, 3 * MiB, pool, s);
			made = th.sim_calls(entries[i]) - calls;
			th.sim_fail_clear();
			TH_CHECK(pool);
			if (r == CUDA_SUCCESS) {
				TH_OK(sop_free_async(p, s));
				TH_OK(sop_stream_synchronize(s));
			} else {
				TH_EQ(r, CUDA_ERROR_UNKNOWN);
			}
			TH_OK(sop_trim_to(pool, 0));
			TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
			if (made < n)
				break;
		}
	}
	TH_OK(sop_malloc_from_pool_async(&p, 3 * MiB, pool, s));
	TH_OK(sop_stream_synchronize(s));
	memset(p, 2, 3 * MiB);
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_pool_destroy(pool));
	TH_ASSERT(live_same(before, th_live()));
	printf("driver failures: ok\n");
}

int
main(void)
{
	CUmemLocation near;
	CUstream s1, s2;
	int node;

	sim = th_init();
	s1 = th_stream();
	s2 = th_stream();
	no_host_vmm(s1);
	{
		CUmemPoolProps props = host_props(CU_MEM_LOCATION_TYPE_HOST, 0);
		sop_pool_t probe;
		CUresult r = sop_pool_create(&probe, &props);

		if (r != CUDA_SUCCESS && !sim) {
			printf("skip: the driver makes no host memory through cuMemCreate (%d)\n",
			       (int)r);
			return TH_SKIP;
		}
		TH_OK(r);
		TH_OK(sop_pool_destroy(probe));
	}
	bad_input();
	faults(s1);
	TH_OK(sop_device_get_host_location(&near, 0));
	stream_order(CU_MEM_LOCATION_TYPE_HOST, 0, s1, s2);
	node = near.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? near.id : 0;
	stream_order(CU_MEM_LOCATION_TYPE_HOST_NUMA, node, s1, s2);
	cpu_access(CU_MEM_LOCATION_TYPE_HOST, 0, s1, s2);
	staging(s1, s2);
	growth_ramp(s1);
	cpu_access(CU_MEM_LOCATION_TYPE_HOST_NUMA, node, s1, s2);
	locations(s1);
	numa_placement(s1);
	th_stream_destroy(s1);
	th_stream_destroy(s2);
	printf("all ok\n");
	return 0;
}
