/*
 * Virtual memory management of the simulated driver.
 *
 * Device memory is host memory, so that a CUdeviceptr is a real address and a
 * bug faults like it would on a GPU:
 *   reservation  an anonymous PROT_NONE mmap, aligned as asked
 *   physical     a memfd of the allocation's size (cuMemCreate)
 *   mapping      the memfd mmap'ed MAP_SHARED|MAP_FIXED over the reservation,
 *                still PROT_NONE until cuMemSetAccess mprotects it
 *   unmapping    the range turned back into an anonymous PROT_NONE mapping
 * Every piece of state lives under one lock; these calls are not hot.
 *
 * Host memory (CU_MEM_LOCATION_TYPE_HOST and HOST_NUMA) is made the same way, counted against no
 * device, with the driver's rules: no handle types for HOST, a NUMA node that exists for
 * HOST_NUMA (whose pages the kernel is told to take from that node, mbind), HOST_NUMA_CURRENT
 * refused. The CPU may touch it once it is granted host access (a HOST or HOST_NUMA descriptor);
 * as the sim's devices are the CPU too, a device's access opens it as well. SOP_SIM_HOST_VMM=0,
 * or sim_host_vmm(0), makes the sim a driver that cannot make host memory this way (CUDA 12
 * drivers for HOST, older ones for both): those calls fail with CUDA_ERROR_NOT_SUPPORTED and
 * the device attributes that announce it read 0.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sim-internal.h"

/* Physical memory: one memfd, shared by every handle that refers to it. */
struct phys {
	struct phys *next;	/* all live physical allocations, for import */
	int fd;
	size_t size;
	int device;		/* -1: host memory */
	int numa;		/* host memory: its NUMA node (HOST_NUMA), else -1 */
	unsigned handle_types;	/* CUmemAllocationHandleType bits */
	bool accounted;		/* counted against its device (created here) */
	dev_t st_dev;		/* identity of the memfd, to recognise imports */
	ino_t st_ino;
	long handles;		/* handle records that refer to it */
};

/*
 * An allocation handle. It stays registered while mappings made through it
 * exist, even once released, so that cuMemRetainAllocationHandle gives back
 * the very value that was mapped (as the real driver does).
 */
struct handle {
	struct sim_node node;	/* key: the CUmemGenericAllocationHandle value */
	struct phys *phys;
	long refs;		/* create/import/retain minus release */
	long maps;		/* live mappings made through this handle */
};

struct reservation {
	uintptr_t base;
	size_t size;
};

struct mapping {
	uintptr_t base;
	size_t size;
	struct handle *handle;
	unsigned char access[SIM_MAX_DEVICES];	/* CUmemAccess_flags per device */
	unsigned char host_access;		/* the CPU's (host memory only) */
};

static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sim_table handles;
static uint64_t next_handle = 1;
static struct phys *phys_list;
static size_t device_used[SIM_MAX_DEVICES];

/* Both arrays are sorted by base and never overlap. */
static struct reservation *resv;
static size_t nresv, resv_cap;
static struct mapping *maps;
static size_t nmaps, maps_cap;

static long live_handle_refs;
static size_t live_phys_bytes;

/* Whether host memory can be made through these calls (sim_host_vmm). */
static atomic_bool host_vmm = true;

/* ---- host NUMA nodes ---- */

/* The machine's NUMA nodes (below 64) as a mask, 0 where it has no NUMA. */
static uint64_t numa_mask;
static pthread_once_t numa_once = PTHREAD_ONCE_INIT;

static void numa_scan(void)
{
	char path[64];

	for (int n = 0; n < 64; n++) {
		snprintf(path, sizeof(path), "/sys/devices/system/node/node%d", n);
		if (access(path, F_OK) == 0)
			numa_mask |= (uint64_t)1 << n;
	}
}

static uint64_t numa_nodes(void)
{
	pthread_once(&numa_once, numa_scan);
	return numa_mask;
}

/* A HOST_NUMA id the driver accepts: a node of the machine, or 0 where it has no NUMA. */
static bool numa_valid(int id)
{
	uint64_t mask = numa_nodes();

	if (!mask)
		return id == 0;
	return id >= 0 && id < 64 && (mask >> id & 1);
}

int sim_host_numa_id(int dev)
{
	uint64_t mask = numa_nodes();
	int k, n;

	if (!mask)
		return -1;
	/* The devices spread over the nodes in turn. */
	k = dev % __builtin_popcountll(mask);
	for (n = 0; n < 64; n++)
		if ((mask >> n & 1) && k-- == 0)
			break;
	return n;
}

bool sim_host_vmm_supported(void)
{
	return atomic_load(&host_vmm);
}

SIM_EXPORT void sim_host_vmm(int on)
{
	atomic_store(&host_vmm, on != 0);
}

/* ---- sorted arrays ---- */

/* Makes room for one element at `at`; false if out of memory. */
static bool array_open(void **array, size_t *n, size_t *cap, size_t elem, size_t at)
{
	char *a = *array;

	if (*n == *cap) {
		size_t ncap = *cap ? *cap * 2 : 16;

		a = realloc(a, ncap * elem);
		if (!a)
			return false;
		*array = a;
		*cap = ncap;
	}
	memmove(a + (at + 1) * elem, a + at * elem, (*n - at) * elem);
	(*n)++;
	return true;
}

static void array_close(void *array, size_t *n, size_t elem, size_t at, size_t count)
{
	char *a = array;

	memmove(a + at * elem, a + (at + count) * elem, (*n - at - count) * elem);
	*n -= count;
}

/* Index of the first mapping that ends after p (nmaps if none). */
static size_t map_index_after(uintptr_t p)
{
	size_t lo = 0, hi = nmaps;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (maps[mid].base + maps[mid].size > p)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

static struct mapping *map_containing(uintptr_t p)
{
	size_t i = map_index_after(p);

	return i < nmaps && maps[i].base <= p ? &maps[i] : NULL;
}

static bool range_has_mapping(uintptr_t p, size_t size)
{
	size_t i = map_index_after(p);

	return i < nmaps && maps[i].base < p + size;
}

/*
 * The mappings that exactly tile [p, p + size): the first starts at p, each
 * next one starts where the last ended, the last ends at p + size. Gives the
 * index of the first and their count, or false.
 */
static bool whole_mappings(uintptr_t p, size_t size, size_t *first, size_t *count)
{
	size_t i = map_index_after(p);
	uintptr_t cursor = p;

	*first = i;
	while (cursor < p + size) {
		if (i == nmaps || maps[i].base != cursor)
			return false;
		cursor += maps[i].size;
		i++;
	}
	*count = i - *first;
	return cursor == p + size;
}

/* Index of the last reservation that starts at or below p, or nresv. */
static size_t resv_index_at_or_below(uintptr_t p)
{
	size_t lo = 0, hi = nresv;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (resv[mid].base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo ? lo - 1 : nresv;
}

static bool inside_one_reservation(uintptr_t p, size_t size)
{
	size_t i = resv_index_at_or_below(p);

	return i < nresv && p + size >= p && p + size <= resv[i].base + resv[i].size;
}

/* ---- handles and physical memory ---- */

static bool prop_location_ok(const CUmemLocation *loc, CUresult *rc)
{
	if (loc->type != CU_MEM_LOCATION_TYPE_DEVICE) {
		*rc = CUDA_ERROR_INVALID_VALUE;
		return false;
	}
	if (!sim_device_valid(loc->id)) {
		*rc = CUDA_ERROR_INVALID_DEVICE;
		return false;
	}
	return true;
}

static CUresult check_prop(const CUmemAllocationProp *prop)
{
	CUresult rc = CUDA_SUCCESS;

	if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE;
	switch (prop->location.type) {
	case CU_MEM_LOCATION_TYPE_DEVICE:
		if (!prop_location_ok(&prop->location, &rc))
			return rc;
		break;
	case CU_MEM_LOCATION_TYPE_HOST:
		/* Counted against no device; id ignored; "not IPC capable". */
		if (!atomic_load(&host_vmm))
			return CUDA_ERROR_NOT_SUPPORTED;
		if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE)
			return CUDA_ERROR_INVALID_VALUE;
		break;
	case CU_MEM_LOCATION_TYPE_HOST_NUMA:
		if (!atomic_load(&host_vmm))
			return CUDA_ERROR_NOT_SUPPORTED;
		if (!numa_valid(prop->location.id))
			return CUDA_ERROR_INVALID_VALUE;
		break;
	default:
		/* HOST_NUMA_CURRENT among them, as the driver documents. */
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
	    prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	return CUDA_SUCCESS;
}

/* A handle the caller still holds a reference to, or NULL. */
static struct handle *handle_lookup(CUmemGenericAllocationHandle value)
{
	struct sim_node *n = sim_table_find(&handles, value);
	struct handle *h = n ? sim_container_of(n, struct handle, node) : NULL;

	return h && h->refs > 0 ? h : NULL;
}

static struct handle *handle_new(struct phys *p)
{
	struct handle *h = calloc(1, sizeof(*h));

	if (!h)
		return NULL;
	h->node.key = next_handle++;
	h->phys = p;
	h->refs = 1;
	p->handles++;
	sim_table_insert(&handles, &h->node);
	live_handle_refs++;
	return h;
}

static void phys_put(struct phys *p)
{
	struct phys **link;

	if (--p->handles > 0)
		return;
	for (link = &phys_list; *link != p; link = &(*link)->next)
		;
	*link = p->next;
	close(p->fd);
	if (p->accounted)
		device_used[p->device] -= p->size;
	live_phys_bytes -= p->size;
	free(p);
}

/* Frees the handle once neither the caller nor a mapping refers to it. */
static void handle_maybe_free(struct handle *h)
{
	if (h->refs > 0 || h->maps > 0)
		return;
	sim_table_remove(&handles, h->node.key);
	phys_put(h->phys);
	free(h);
}

static struct phys *phys_new(int fd, size_t size, int device, unsigned types, bool accounted)
{
	struct phys *p = calloc(1, sizeof(*p));
	struct stat st;

	if (!p || fstat(fd, &st) != 0) {
		free(p);
		return NULL;
	}
	p->fd = fd;
	p->size = size;
	p->device = device;
	p->numa = -1;
	p->handle_types = types;
	p->accounted = accounted;
	p->st_dev = st.st_dev;
	p->st_ino = st.st_ino;
	p->next = phys_list;
	phys_list = p;
	if (accounted)
		device_used[device] += size;
	live_phys_bytes += size;
	return p;
}

/* Ask the kernel to take the memfd's pages from one node (MPOL_BIND): a policy set through a
 * mapping of shared memory stays with the memory. Where the kernel refuses (a container without
 * the right), the pages go where the kernel puts them. */
static void numa_bind(int fd, size_t size, int node)
{
	unsigned long mask = 1ul << node;
	void *m;

	if (!numa_nodes())
		return;
	m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return;
	(void)syscall(SYS_mbind, m, size, 2 /* MPOL_BIND */, &mask, 64ul, 0u);
	munmap(m, size);
}

/* Physical memory on `device` (-1: the host, on NUMA node numa if that is not -1); the memfd's
 * name records the device for importers. */
static CUresult phys_create(size_t size, int device, int numa, unsigned types, struct phys **out)
{
	char name[32];
	int fd;

	if (device >= 0 &&
	    (device_used[device] + size > sim_cfg.memory || device_used[device] + size < size))
		return CUDA_ERROR_OUT_OF_MEMORY;
	/* The name says where the memory is, for a process that imports it (memfd_origin). */
	if (device >= 0)
		snprintf(name, sizeof(name), "sop-sim-dev%d", device);
	else if (numa >= 0)
		snprintf(name, sizeof(name), "sop-sim-numa%d", numa);
	else
		snprintf(name, sizeof(name), "sop-sim-host");
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (ftruncate(fd, (off_t)size) != 0) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (numa >= 0)
		numa_bind(fd, size, numa);
	*out = phys_new(fd, size, device, types, device >= 0);
	if (!*out) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	(*out)->numa = numa;
	return CUDA_SUCCESS;
}

/* ---- entry points ---- */

SIM_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity,
							  const CUmemAllocationProp *prop,
							  CUmemAllocationGranularity_flags option)
{
	CUresult rc;

	SIM_ENTER(cuMemGetAllocationGranularity);
	if (!granularity || !prop)
		return CUDA_ERROR_INVALID_VALUE;
	if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
	    option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
		return CUDA_ERROR_INVALID_VALUE;
	rc = check_prop(prop);
	if (rc != CUDA_SUCCESS)
		return rc;
	*granularity = sim_cfg.granularity;
	return CUDA_SUCCESS;
}

/* Maps `size` bytes of PROT_NONE address space aligned to `align`, or NULL. */
static void *reserve_aligned(size_t size, size_t align, uintptr_t hint)
{
	const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
	uintptr_t base, aligned;
	char *p;

	if (hint && hint % align == 0) {
		/* The driver takes addr as a hint: use it when it is free. */
		p = mmap((void *)hint, size, PROT_NONE, flags | MAP_FIXED_NOREPLACE, -1, 0);
		if (p != MAP_FAILED && (uintptr_t)p == hint)
			return p;
		if (p != MAP_FAILED)
			munmap(p, size);
	}
	if (size + align < size)
		return NULL;
	p = mmap(NULL, size + align, PROT_NONE, flags, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	base = (uintptr_t)p;
	aligned = (base + align - 1) & ~(uintptr_t)(align - 1);
	if (aligned > base)
		munmap(p, aligned - base);
	if (base + size + align > aligned + size)
		munmap((void *)(aligned + size), base + size + align - (aligned + size));
	return (void *)aligned;
}

SIM_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
						CUdeviceptr addr, unsigned long long flags)
{
	size_t gran = sim_cfg.granularity;
	size_t at;
	void *p;

	SIM_ENTER(cuMemAddressReserve);
	if (!ptr || flags != 0 || size == 0 || size % gran != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (alignment & (alignment - 1))
		return CUDA_ERROR_INVALID_VALUE;
	if (alignment < gran)
		alignment = gran;
	p = reserve_aligned(size, alignment, (uintptr_t)addr);
	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&vmm_lock);
	at = resv_index_at_or_below((uintptr_t)p);
	at = at == nresv ? 0 : at + 1;
	if (!array_open((void **)&resv, &nresv, &resv_cap, sizeof(*resv), at)) {
		pthread_mutex_unlock(&vmm_lock);
		munmap(p, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	resv[at].base = (uintptr_t)p;
	resv[at].size = size;
	pthread_mutex_unlock(&vmm_lock);
	*ptr = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	uintptr_t p = (uintptr_t)ptr;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	size_t i;

	SIM_ENTER(cuMemAddressFree);
	pthread_mutex_lock(&vmm_lock);
	i = resv_index_at_or_below(p);
	/* Only a whole reservation, and only once nothing is mapped in it. */
	if (i < nresv && resv[i].base == p && resv[i].size == size &&
	    !range_has_mapping(p, size)) {
		munmap((void *)p, size);
		array_close(resv, &nresv, sizeof(*resv), i, 1);
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&vmm_lock);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
					const CUmemAllocationProp *prop, unsigned long long flags)
{
	struct phys *p;
	struct handle *h;
	CUresult rc;

	SIM_ENTER(cuMemCreate);
	if (!handle || !prop || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	rc = check_prop(prop);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (size == 0 || size % sim_cfg.granularity != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&vmm_lock);
	rc = phys_create(size,
			 prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1,
			 prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? prop->location.id
									       : -1,
			 (unsigned)prop->requestedHandleTypes, &p);
	if (rc == CUDA_SUCCESS) {
		h = handle_new(p);
		if (h) {
			*handle = h->node.key;
		} else {
			p->handles = 1;
			phys_put(p);
			rc = CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	pthread_mutex_unlock(&vmm_lock);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
	struct handle *h;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	SIM_ENTER(cuMemRelease);
	pthread_mutex_lock(&vmm_lock);
	h = handle_lookup(handle);
	if (h) {
		/* Mapped memory lives on until its last mapping goes. */
		h->refs--;
		live_handle_refs--;
		handle_maybe_free(h);
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&vmm_lock);
	return rc;
}

static CUresult map_locked(uintptr_t p, size_t size, struct handle *h)
{
	size_t at;
	void *m;

	if (size > h->phys->size)
		return CUDA_ERROR_INVALID_VALUE;
	if (!inside_one_reservation(p, size) || range_has_mapping(p, size))
		return CUDA_ERROR_INVALID_VALUE;
	at = map_index_after(p);
	if (!array_open((void **)&maps, &nmaps, &maps_cap, sizeof(*maps), at))
		return CUDA_ERROR_OUT_OF_MEMORY;
	/* PROT_NONE: a fresh mapping is inaccessible until cuMemSetAccess. */
	m = mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->phys->fd, 0);
	if (m == MAP_FAILED) {
		array_close(maps, &nmaps, sizeof(*maps), at, 1);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	memset(&maps[at], 0, sizeof(maps[at]));
	maps[at].base = p;
	maps[at].size = size;
	maps[at].handle = h;
	h->maps++;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
				     CUmemGenericAllocationHandle handle,
				     unsigned long long flags)
{
	size_t gran = sim_cfg.granularity;
	struct handle *h;
	CUresult rc;

	SIM_ENTER(cuMemMap);
	if (flags != 0 || size == 0 || ptr % gran != 0 || size % gran != 0)
		return CUDA_ERROR_INVALID_VALUE;
	/* As observed on an H100: a non-zero offset is refused outright. */
	if (offset != 0)
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&vmm_lock);
	h = handle_lookup(handle);
	rc = h ? map_locked((uintptr_t)ptr, size, h) : CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&vmm_lock);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED;
	uintptr_t p = (uintptr_t)ptr;
	size_t first, count;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	SIM_ENTER(cuMemUnmap);
	if (size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&vmm_lock);
	if (!whole_mappings(p, size, &first, &count))
		goto out;
	/* Back to reserved, inaccessible address space: later touches fault. */
	if (mmap((void *)p, size, PROT_NONE, flags, -1, 0) == MAP_FAILED) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	for (size_t i = first; i < first + count; i++) {
		maps[i].handle->maps--;
		handle_maybe_free(maps[i].handle);
	}
	array_close(maps, &nmaps, sizeof(*maps), first, count);
	rc = CUDA_SUCCESS;
out:
	pthread_mutex_unlock(&vmm_lock);
	return rc;
}

static bool host_type(CUmemLocationType t)
{
	return t == CU_MEM_LOCATION_TYPE_HOST || t == CU_MEM_LOCATION_TYPE_HOST_NUMA;
}

static CUresult check_access_desc(const CUmemAccessDesc *desc, size_t count)
{
	CUresult rc = CUDA_SUCCESS;

	for (size_t i = 0; i < count; i++) {
		if (!host_type(desc[i].location.type) && !prop_location_ok(&desc[i].location, &rc))
			return rc;
		if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
		    desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
		    desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

/* Whether a host descriptor may name the mapping's memory: the driver refuses host access to
 * device memory (CUDA_ERROR_NOT_SUPPORTED, as an H100 answers it for pools), and HOST_NUMA access
 * to memory of any other location type ("Users cannot specify CU_MEM_LOCATION_TYPE_HOST_NUMA
 * accessibility for allocations created on with other location types"). */
static CUresult host_desc_ok(const struct mapping *m, const CUmemAccessDesc *d)
{
	const struct phys *p = m->handle->phys;

	if (!host_type(d->location.type))
		return CUDA_SUCCESS;
	if (d->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA && (p->device >= 0 || p->numa < 0))
		return CUDA_ERROR_INVALID_VALUE;
	return p->device >= 0 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS;
}

/* The host stands in for every device: it gets the widest access any device has, and the
 * access the CPU was granted to host memory. */
static int host_prot(const struct mapping *m)
{
	int prot = PROT_NONE;

	if (m->host_access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
		return PROT_READ | PROT_WRITE;
	if (m->host_access == CU_MEM_ACCESS_FLAGS_PROT_READ)
		prot = PROT_READ;
	for (int d = 0; d < sim_cfg.ndevices; d++) {
		if (m->access[d] == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			return PROT_READ | PROT_WRITE;
		if (m->access[d] == CU_MEM_ACCESS_FLAGS_PROT_READ)
			prot = PROT_READ;
	}
	return prot;
}

SIM_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size,
					   const CUmemAccessDesc *desc, size_t count)
{
	size_t first, nm;
	CUresult rc;

	SIM_ENTER(cuMemSetAccess);
	if (!desc || count == 0 || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	rc = check_access_desc(desc, count);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&vmm_lock);
	if (!whole_mappings((uintptr_t)ptr, size, &first, &nm)) {
		rc = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	/* All or nothing: every descriptor must suit every mapping before any changes. */
	for (size_t i = first; i < first + nm; i++)
		for (size_t k = 0; k < count; k++)
			if ((rc = host_desc_ok(&maps[i], &desc[k])) != CUDA_SUCCESS)
				goto out;
	for (size_t i = first; i < first + nm; i++) {
		struct mapping *m = &maps[i];

		for (size_t k = 0; k < count; k++) {
			if (host_type(desc[k].location.type))
				m->host_access = (unsigned char)desc[k].flags;
			else
				m->access[desc[k].location.id] = (unsigned char)desc[k].flags;
		}
		if (mprotect((void *)m->base, m->size, host_prot(m)) != 0)
			sim_die("sim: mprotect of a mapping failed: %s", strerror(errno));
	}
out:
	pthread_mutex_unlock(&vmm_lock);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
					   CUdeviceptr ptr)
{
	struct mapping *m;
	CUresult rc = CUDA_SUCCESS;

	SIM_ENTER(cuMemGetAccess);
	if (!flags || !location)
		return CUDA_ERROR_INVALID_VALUE;
	if (!host_type(location->type) && !prop_location_ok(location, &rc))
		return rc;
	pthread_mutex_lock(&vmm_lock);
	m = map_containing((uintptr_t)ptr);
	if (m)
		*flags = host_type(location->type) ? m->host_access : m->access[location->id];
	else
		rc = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&vmm_lock);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuMemExportToShareableHandle(void *shareable,
							 CUmemGenericAllocationHandle handle,
							 CUmemAllocationHandleType type,
							 unsigned long long flags)
{
	struct handle *h;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	int fd;

	SIM_ENTER(cuMemExportToShareableHandle);
	if (!shareable || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&vmm_lock);
	h = handle_lookup(handle);
	if (h && (h->phys->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
		/* The caller owns the new descriptor and closes it. */
		fd = fcntl(h->phys->fd, F_DUPFD_CLOEXEC, 0);
		if (fd >= 0) {
			*(int *)shareable = fd;
			rc = CUDA_SUCCESS;
		} else {
			rc = CUDA_ERROR_OPERATING_SYSTEM;
		}
	}
	pthread_mutex_unlock(&vmm_lock);
	return rc;
}

/* Where a sim memfd's memory is, from its name: a device, or the host (-1) and its NUMA node
 * (-1: HOST). Device 0 if the name is not ours. */
static void memfd_origin(int fd, int *device, int *numa)
{
	char path[64], target[128];
	ssize_t n;
	int v;

	*device = 0;
	*numa = -1;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, target, sizeof(target) - 1);
	if (n < 0)
		return;
	target[n] = '\0';
	if (sscanf(target, "/memfd:sop-sim-dev%d", &v) == 1 && sim_device_valid(v)) {
		*device = v;
	} else if (sscanf(target, "/memfd:sop-sim-numa%d", &v) == 1) {
		*device = -1;
		*numa = v;
	} else if (!strncmp(target, "/memfd:sop-sim-host", 19)) {
		*device = -1;
	}
}

/* Physical memory behind an FD: ours if this process created it, else adopted. */
static struct phys *phys_for_fd(int fd, const struct stat *st)
{
	struct phys *p;
	int dup_fd, device, numa;

	for (p = phys_list; p; p = p->next)
		if (p->st_dev == st->st_dev && p->st_ino == st->st_ino)
			return p;
	/* From another process: keep our own descriptor, do not count it here. */
	dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (dup_fd < 0)
		return NULL;
	memfd_origin(fd, &device, &numa);
	p = phys_new(dup_fd, (size_t)st->st_size, device, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		     false);
	if (!p)
		close(dup_fd);
	else
		p->numa = numa;
	return p;
}

SIM_EXPORT CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
							   void *os_handle,
							   CUmemAllocationHandleType type)
{
	int fd = (int)(intptr_t)os_handle;
	struct phys *p;
	struct handle *h;
	struct stat st;
	CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;

	SIM_ENTER(cuMemImportFromShareableHandle);
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
	    (size_t)st.st_size % sim_cfg.granularity != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&vmm_lock);
	p = phys_for_fd(fd, &st);
	if (p) {
		h = handle_new(p);
		if (h) {
			*handle = h->node.key;
			rc = CUDA_SUCCESS;
		} else if (p->handles == 0) {
			p->handles = 1;
			phys_put(p);
		}
	}
	pthread_mutex_unlock(&vmm_lock);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
							void *addr)
{
	struct mapping *m;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	SIM_ENTER(cuMemRetainAllocationHandle);
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&vmm_lock);
	m = map_containing((uintptr_t)addr);
	if (m) {
		m->handle->refs++;
		live_handle_refs++;
		*handle = m->handle->node.key;
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&vmm_lock);
	return rc;
}

SIM_EXPORT CUresult CUDAAPI
cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
				       CUmemGenericAllocationHandle handle)
{
	struct handle *h;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	SIM_ENTER(cuMemGetAllocationPropertiesFromHandle);
	if (!prop)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&vmm_lock);
	h = handle_lookup(handle);
	if (h) {
		memset(prop, 0, sizeof(*prop));
		prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
		prop->requestedHandleTypes = (CUmemAllocationHandleType)h->phys->handle_types;
		prop->location.type = h->phys->device >= 0 ? CU_MEM_LOCATION_TYPE_DEVICE
				      : h->phys->numa >= 0 ? CU_MEM_LOCATION_TYPE_HOST_NUMA
							   : CU_MEM_LOCATION_TYPE_HOST;
		prop->location.id = h->phys->device >= 0 ? h->phys->device
				    : h->phys->numa >= 0 ? h->phys->numa : 0;
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&vmm_lock);
	return rc;
}

/* ---- page-locked host memory (cuMemHostAlloc) ---- */

/* Host memory the CPU and the sim's devices share anyway: an anonymous mapping, remembered so that
 * cuMemFreeHost refuses anything else. */
struct host_alloc {
	struct host_alloc *next;
	void *p;
	size_t size;
};

static struct host_alloc *host_allocs;

SIM_EXPORT CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	const unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
			       CU_MEMHOSTALLOC_WRITECOMBINED;
	struct host_alloc *a;
	size_t size;
	void *p;

	SIM_ENTER(cuMemHostAlloc);
	if (!pp || (Flags & ~known))
		return CUDA_ERROR_INVALID_VALUE;
	if (bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	size = (bytesize + 4095) & ~(size_t)4095;
	a = calloc(1, sizeof(*a));
	p = a ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
	      : MAP_FAILED;
	if (p == MAP_FAILED) {
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->p = p;
	a->size = size;
	pthread_mutex_lock(&vmm_lock);
	a->next = host_allocs;
	host_allocs = a;
	pthread_mutex_unlock(&vmm_lock);
	*pp = p;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuMemFreeHost(void *p)
{
	struct host_alloc **link, *a = NULL;

	SIM_ENTER(cuMemFreeHost);
	pthread_mutex_lock(&vmm_lock);
	for (link = &host_allocs; *link; link = &(*link)->next) {
		if ((*link)->p == p) {
			a = *link;
			*link = a->next;
			break;
		}
	}
	pthread_mutex_unlock(&vmm_lock);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE;
	munmap(a->p, a->size);
	free(a);
	return CUDA_SUCCESS;
}

/* ---- accounting ---- */

bool sim_vmm_reaches(uintptr_t p, size_t n, int dev)
{
	uintptr_t end = p + n;
	bool ok = true;

	/* Mappings are apart: walk those the range touches. */
	pthread_mutex_lock(&vmm_lock);
	while (ok && p < end) {
		struct mapping *m = map_containing(p);
		if (!m)
			break; /* not memory of the virtual memory calls: not checked */
		ok = dev < 0 || dev >= SIM_MAX_DEVICES ||
		     m->access[dev] == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		p = m->base + m->size;
	}
	pthread_mutex_unlock(&vmm_lock);
	return ok;
}

size_t sim_vmm_device_used(int dev)
{
	size_t used;

	pthread_mutex_lock(&vmm_lock);
	used = device_used[dev];
	pthread_mutex_unlock(&vmm_lock);
	return used;
}

void sim_vmm_live(struct sim_live *out)
{
	pthread_mutex_lock(&vmm_lock);
	out->reservations = (long)nresv;
	out->mappings = (long)nmaps;
	out->handles = live_handle_refs;
	out->phys_bytes = live_phys_bytes;
	pthread_mutex_unlock(&vmm_lock);
}
