/* preload.c - the interposer (libsop-preload.so) as an unchanged program meets it: this program
 * links libcuda.so.1 and knows nothing of sop. It calls the driver's stream-ordered allocator by
 * every path programs use (libcuda's symbols, dlsym on a libcuda handle, cuGetProcAddress v1 and
 * v2 with and without the per-thread flag) and checks with sop's own calls, found with
 * dlsym(RTLD_DEFAULT), where each call went.
 *
 *   test-preload             sop serves: allocations land in sop's pools, per-thread and legacy
 *                            streams stay apart, pool handles and attributes are sop's, the
 *                            synchronization calls reach sop, foreign pointers and pools the
 *                            driver made go to the driver, cuMemGetInfo reports sop's memory
 *                            limit, a thread without a context gets the
 *                            driver's codes, a forked child (with or without exec) works
 *   test-preload --fallback  sop cannot start (SOP_DRIVER_LIBRARY names nothing): every call
 *                            reaches the driver untouched
 *   test-preload --quick     one allocation lands in sop (the sop-run test)
 *   test-preload --meminfo-first
 *                            cuMemGetInfo is the first call the interposer takes over, as in a
 *                            framework that sizes itself at start: it answers
 *   test-preload --before-init
 *                            calls it takes over, made before cuInit, get the driver's
 *                            CUDA_ERROR_NOT_INITIALIZED, and the driver stays uninitialised
 *   test-preload --child     what the exec'd child of the fork test runs
 *
 * test/meson.build runs it under LD_PRELOAD, in the plain build only. On the simulated driver's
 * libcuda.so.1 (test/sim/sim-libcuda.c), whose pool entry points fail with
 * CUDA_ERROR_NOT_SUPPORTED, sim_calls() also says which calls reached the driver; on a GPU (the
 * gpu suite) those checks are skipped and the rest hold.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "sim/sim.h"
#include "sop.h"

#define SKIP 77

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define EQ(got, want)                                                                              \
	do {                                                                                       \
		long long g_ = (long long)(got), w_ = (long long)(want);                           \
		if (g_ != w_) {                                                                    \
			fprintf(stderr, "%s:%d: %s is %lld, expected %lld\n", __FILE__, __LINE__, \
				#got, g_, w_);                                                     \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define OK(call) EQ((call), CUDA_SUCCESS)

/* The _ptsz variants and the v1 lookup, which cuda.h declares only for programs built for
 * per-thread default streams, or not at all. */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
					      CUmemoryPool pool, CUstream hStream);
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream);
CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags);
CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult CUDAAPI get_proc_address_v1(const char *symbol, void **pfn, int cudaVersion,
				     cuuint64_t flags) __asm__("cuGetProcAddress");

typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t,
			      CUdriverProcAddressQueryResult *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*alloc_from_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*free_fn)(CUdeviceptr, CUstream);

#define PTDS CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

/* sop's calls, from the interposer, and the simulated driver's control API (NULL on a GPU). */
static struct {
	__typeof__(sop_pointer_get_pool) *pointer_get_pool;
	__typeof__(sop_device_get_default_pool) *device_get_default_pool;
	__typeof__(sop_pool_get_attr) *pool_get_attr;
	__typeof__(sop_pool_get_compaction) *pool_get_compaction;
	__typeof__(sop_driver_calls) *driver_calls;
	__typeof__(sop_device_set_memory_limit) *device_set_memory_limit;
	__typeof__(sop_device_get_memory_limit) *device_get_memory_limit;
	__typeof__(sim_calls) *sim_calls;
	__typeof__(sim_host_vmm) *sim_host_vmm;
} api;

static bool sim;
static CUcontext ctx;
static CUstream s1, s2;
static CUmemoryPool pool; /* device 0's default pool */
static int n_devices;
static void *preload_base; /* where the interposer is loaded */

static void *
sym_of(void *handle, const char *name)
{
	return dlsym(handle, name);
}

#define LOAD(member, name)                                                                         \
	do {                                                                                       \
		void *s_ = sym_of(RTLD_DEFAULT, name);                                             \
		memcpy(&api.member, &s_, sizeof s_);                                               \
	} while (0)

/* A function's address as data, and back: ISO C has no cast between the two. */
#define FN_PTR(f) fn_ptr((void (*)(void))(f))
static void *
fn_ptr(void (*f)(void))
{
	void *p;

	memcpy(&p, &f, sizeof p);
	return p;
}

#define AS_FN(type, p) ((type)fn_from(p))
static void (*fn_from(void *p))(void)
{
	void (*f)(void);

	memcpy(&f, &p, sizeof f);
	return f;
}

/* Calls of an entry point that reached the simulated driver; 0 on a GPU, and for NULL. */
static unsigned long
drv_calls(const char *name)
{
	return api.sim_calls && name ? api.sim_calls(name) : 0;
}

/* Calls sop made to a driver entry point. */
static unsigned long long
sop_calls(const char *name)
{
	const char *names[64];
	unsigned long long counts[64];
	size_t n = 64, i;

	OK(api.driver_calls(names, counts, &n));
	for (i = 0; i < n && i < 64; i++)
		if (!strcmp(names[i], name))
			return counts[i];
	fprintf(stderr, "sop makes no calls of %s\n", name);
	exit(1);
}

static unsigned long long
sop_calls_all(void)
{
	const char *names[64];
	unsigned long long counts[64], sum = 0;
	size_t n = 64, i;

	OK(api.driver_calls(names, counts, &n));
	for (i = 0; i < n && i < 64; i++)
		sum += counts[i];
	return sum;
}

/* The sop pool that p lies in, as a CUmemoryPool; NULL for memory sop did not allocate. */
static CUmemoryPool
pool_of(CUdeviceptr p)
{
	sop_pool_t sp;

	return api.pointer_get_pool(&sp, (void *)(uintptr_t)p) == CUDA_SUCCESS
		       ? (CUmemoryPool)(void *)sp
		       : NULL;
}

/* Whether fn is a function of the interposer, exported as name (NULL: any name). */
static bool
in_preload(void *fn, const char *name)
{
	Dl_info info;

	if (!fn || !dladdr(fn, &info) || info.dli_fbase != preload_base)
		return false;
	return !name || (info.dli_sname && !strcmp(info.dli_sname, name));
}

static cuuint64_t
attr(CUmemoryPool p, CUmemPool_attribute a)
{
	cuuint64_t v = 0;

	OK(cuMemPoolGetAttribute(p, a, &v));
	return v;
}

static void
setup(void)
{
	Dl_info info;
	void *probe;

	setvbuf(stdout, NULL, _IONBF, 0);
	LOAD(pointer_get_pool, "sop_pointer_get_pool");
	LOAD(device_get_default_pool, "sop_device_get_default_pool");
	LOAD(pool_get_attr, "sop_pool_get_attr");
	LOAD(pool_get_compaction, "sop_pool_get_compaction");
	LOAD(driver_calls, "sop_driver_calls");
	LOAD(device_set_memory_limit, "sop_device_set_memory_limit");
	LOAD(device_get_memory_limit, "sop_device_get_memory_limit");
	LOAD(sim_calls, "sim_calls");
	LOAD(sim_host_vmm, "sim_host_vmm");
	if (!api.driver_calls) {
		fprintf(stderr, "libsop-preload.so is not loaded: run it under sop-run\n");
		exit(1);
	}
	probe = sym_of(RTLD_DEFAULT, "sop_driver_calls");
	CHECK(dladdr(probe, &info));
	preload_base = info.dli_fbase;
	sim = api.sim_calls != NULL;
	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&n_devices) != CUDA_SUCCESS ||
	    n_devices < 1) {
		printf("skip: no usable CUDA driver\n");
		exit(SKIP);
	}
	OK(cuDevicePrimaryCtxRetain(&ctx, 0));
	OK(cuCtxSetCurrent(ctx));
	OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
	OK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
}

/* The driver's pool calls that may reach it where sop serves, and how many did on purpose: those
 * on pools the driver made (test_pools). */
static const char *const driver_pool_names[] = {
	"cuMemAllocAsync",    "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync_ptsz",
	"cuDeviceGetMemPool", "cuDeviceSetMemPool",   "cuDeviceGetDefaultMemPool",
	"cuMemPoolSetAccess", "cuMemPoolGetAccess",   "cuMemPoolExportToShareableHandle",
	"cuMemPoolExportPointer", "cuMemPoolImportPointer", "cuMemAllocFromPoolAsync",
};
#define N_DRIVER_POOL_NAMES (sizeof driver_pool_names / sizeof driver_pool_names[0])
static unsigned long driver_pool_meant[N_DRIVER_POOL_NAMES];

/* A call of name that reaches the driver on purpose, n times more. */
static void
driver_pool_expect(const char *name, unsigned long n)
{
	size_t i;

	for (i = 0; i < N_DRIVER_POOL_NAMES; i++)
		if (!strcmp(driver_pool_names[i], name))
			driver_pool_meant[i] += n;
}

/* The driver's device pools were never called where sop serves. A real driver's calls are not
 * counted. */
static void
driver_pools_untouched(void)
{
	size_t i;

	for (i = 0; sim && i < N_DRIVER_POOL_NAMES; i++)
		EQ(drv_calls(driver_pool_names[i]), driver_pool_meant[i]);
}

/* ---- (a) libcuda's symbols ----------------------------------------------------------------- */

static void
test_direct(void)
{
	sop_pool_t sp;
	CUdeviceptr p;

	OK(cuDeviceGetDefaultMemPool(&pool, 0));
	OK(api.device_get_default_pool(&sp, 0));
	CHECK(pool == (CUmemoryPool)(void *)sp);

	OK(cuMemAllocAsync(&p, 1 << 20, s1));
	CHECK(pool_of(p) == pool);
	OK(cuMemFreeAsync(p, s1));
	CHECK(pool_of(p) == NULL);

	OK(cuMemAllocFromPoolAsync(&p, 4096, pool, s1));
	CHECK(pool_of(p) == pool);
	OK(cuMemFreeAsync(p, s1));

	OK(cuMemAllocAsync_ptsz(&p, 4096, s1));
	CHECK(pool_of(p) == pool);
	OK(cuMemFreeAsync_ptsz(p, s1));

	OK(cuMemAllocFromPoolAsync_ptsz(&p, 4096, pool, s1));
	CHECK(pool_of(p) == pool);
	OK(cuMemFreeAsync_ptsz(p, s1));

	/* Size 0 and a NULL out-pointer are answered, not crashed on. */
	OK(cuMemAllocAsync(&p, 0, s1));
	EQ(p, 0);
	EQ(cuMemAllocAsync(NULL, 16, s1), CUDA_ERROR_INVALID_VALUE);
	OK(cuStreamSynchronize(s1));
	driver_pools_untouched();
	printf("direct calls: ok\n");
}

/* ---- (b) dlsym ----------------------------------------------------------------------------- */

static const char *const taken_over[] = {
	"cuGetProcAddress",
	"cuGetProcAddress_v2",
	"cuMemAllocAsync",
	"cuMemAllocAsync_ptsz",
	"cuMemFreeAsync",
	"cuMemFreeAsync_ptsz",
	"cuMemAllocFromPoolAsync",
	"cuMemAllocFromPoolAsync_ptsz",
	"cuMemPoolCreate",
	"cuMemPoolDestroy",
	"cuMemPoolTrimTo",
	"cuMemPoolSetAttribute",
	"cuMemPoolGetAttribute",
	"cuMemPoolSetAccess",
	"cuMemPoolGetAccess",
	"cuMemPoolExportToShareableHandle",
	"cuMemPoolImportFromShareableHandle",
	"cuMemPoolExportPointer",
	"cuMemPoolImportPointer",
	"cuDeviceGetDefaultMemPool",
	"cuDeviceGetMemPool",
	"cuDeviceSetMemPool",
	"cuMemGetDefaultMemPool",
	"cuMemGetMemPool",
	"cuMemSetMemPool",
	"cuStreamSynchronize",
	"cuStreamSynchronize_ptsz",
	"cuEventSynchronize",
	"cuCtxSynchronize",
	"cuCtxSynchronize_v2",
	"cuEventRecord",
	"cuEventRecord_ptsz",
	"cuEventRecordWithFlags",
	"cuEventRecordWithFlags_ptsz",
	"cuStreamWaitEvent",
	"cuStreamWaitEvent_ptsz",
	"cuStreamDestroy_v2",
	"cuEventDestroy_v2",
	"cuMemGetInfo_v2",
};

static void
test_dlsym(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	CUdeviceptr p, q;
	size_t i;

	CHECK(h);
	for (i = 0; i < sizeof taken_over / sizeof taken_over[0]; i++) {
		if (!in_preload(sym_of(h, taken_over[i]), taken_over[i])) {
			fprintf(stderr, "dlsym(libcuda, \"%s\") is not the interposer's\n",
				taken_over[i]);
			exit(1);
		}
	}
	/* Other names are the driver's own, and a name the driver lacks stays missing. */
	CHECK(sym_of(h, "cuStreamCreate") == FN_PTR(cuStreamCreate));
	CHECK(!in_preload(sym_of(h, "cuStreamCreate"), NULL));
	CHECK(sym_of(h, "cuNoSuchEntryPoint") == NULL);

	/* The special handles keep their meaning: glibc sees the program as the caller. */
	CHECK(in_preload(sym_of(RTLD_DEFAULT, "cuMemAllocAsync"), "cuMemAllocAsync"));
	CHECK(sym_of(RTLD_NEXT, "dlsym") == FN_PTR(dlsym));
	CHECK(sym_of(RTLD_DEFAULT, "dlsym") == FN_PTR(dlsym));

	OK(AS_FN(alloc_fn, sym_of(h, "cuMemAllocAsync"))(&p, 8192, s1));
	CHECK(pool_of(p) == pool);
	OK(AS_FN(alloc_fn, sym_of(h, "cuMemAllocAsync_ptsz"))(&q, 8192, s1));
	CHECK(pool_of(q) == pool);
	OK(AS_FN(free_fn, sym_of(h, "cuMemFreeAsync"))(p, s1));
	OK(AS_FN(free_fn, sym_of(h, "cuMemFreeAsync_ptsz"))(q, s1));
	OK(AS_FN(alloc_from_fn, sym_of(h, "cuMemAllocFromPoolAsync"))(&p, 8192, pool, s1));
	CHECK(pool_of(p) == pool);
	OK(cuMemFreeAsync(p, s1));
	OK(cuStreamSynchronize(s1));
	driver_pools_untouched();
	dlclose(h);
	printf("dlsym: ok\n");
}

/* ---- (c) cuGetProcAddress ------------------------------------------------------------------- */

struct lookup {
	const char *name;
	int version;
	cuuint64_t flags;
	const char *want; /* the interposer's function expected, by its exported name */
};

static const struct lookup hooked_lookups[] = {
	{"cuMemAllocAsync", 11020, 0, "cuMemAllocAsync"},
	{"cuMemAllocAsync", 11020, PTDS, "cuMemAllocAsync_ptsz"},
	{"cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemAllocAsync"},
	{"cuMemFreeAsync", 11020, 0, "cuMemFreeAsync"},
	{"cuMemFreeAsync", 11020, PTDS, "cuMemFreeAsync_ptsz"},
	{"cuMemAllocFromPoolAsync", 11020, 0, "cuMemAllocFromPoolAsync"},
	{"cuMemAllocFromPoolAsync", 11020, PTDS, "cuMemAllocFromPoolAsync_ptsz"},
	{"cuMemPoolCreate", 11020, PTDS, "cuMemPoolCreate"},
	{"cuMemPoolDestroy", 11020, 0, "cuMemPoolDestroy"},
	{"cuMemPoolTrimTo", 11020, 0, "cuMemPoolTrimTo"},
	{"cuMemPoolSetAttribute", 11020, 0, "cuMemPoolSetAttribute"},
	{"cuMemPoolGetAttribute", 12000, PTDS, "cuMemPoolGetAttribute"},
	{"cuMemPoolSetAccess", 11020, 0, "cuMemPoolSetAccess"},
	{"cuMemPoolGetAccess", 11020, 0, "cuMemPoolGetAccess"},
	{"cuMemPoolExportToShareableHandle", 11020, 0, "cuMemPoolExportToShareableHandle"},
	{"cuMemPoolImportFromShareableHandle", 11020, 0, "cuMemPoolImportFromShareableHandle"},
	{"cuMemPoolExportPointer", 11020, 0, "cuMemPoolExportPointer"},
	{"cuMemPoolImportPointer", 11020, PTDS, "cuMemPoolImportPointer"},
	{"cuDeviceGetDefaultMemPool", 11020, 0, "cuDeviceGetDefaultMemPool"},
	{"cuDeviceGetMemPool", 11020, 0, "cuDeviceGetMemPool"},
	{"cuDeviceSetMemPool", 11020, 0, "cuDeviceSetMemPool"},
	{"cuMemGetDefaultMemPool", 13000, 0, "cuMemGetDefaultMemPool"},
	{"cuMemGetMemPool", 13000, 0, "cuMemGetMemPool"},
	{"cuMemSetMemPool", 13000, 0, "cuMemSetMemPool"},
	{"cuStreamSynchronize", 2000, 0, "cuStreamSynchronize"},
	/* The per-thread variants of the oldest entry points exist from CUDA 7.0: asked at an
	 * older version, the driver (580) answers VERSION_NOT_SUFFICIENT. */
	{"cuStreamSynchronize", 7000, PTDS, "cuStreamSynchronize_ptsz"},
	{"cuEventSynchronize", 2000, PTDS, "cuEventSynchronize"},
	{"cuCtxSynchronize", 2000, 0, "cuCtxSynchronize"},
	{"cuCtxSynchronize", 12080, 0, "cuCtxSynchronize"},
	{"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"},
	{"cuEventRecord", 2000, 0, "cuEventRecord"},
	{"cuEventRecord", 7000, PTDS, "cuEventRecord_ptsz"},
	{"cuEventRecordWithFlags", 11010, 0, "cuEventRecordWithFlags"},
	{"cuEventRecordWithFlags", 11010, PTDS, "cuEventRecordWithFlags_ptsz"},
	{"cuStreamWaitEvent", 3020, 0, "cuStreamWaitEvent"},
	{"cuStreamWaitEvent", 7000, PTDS, "cuStreamWaitEvent_ptsz"},
	{"cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2"},
	{"cuStreamDestroy", 2000, 0, "cuStreamDestroy"},
	{"cuCtxDestroy", 2000, 0, "cuCtxDestroy"},
	{"cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2"},
	{"cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease"},
	{"cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"},
	{"cuDevicePrimaryCtxReset", 7000, 0, "cuDevicePrimaryCtxReset"},
	{"cuDevicePrimaryCtxReset", 11000, 0, "cuDevicePrimaryCtxReset_v2"},
	{"cuGreenCtxDestroy", 12040, 0, "cuGreenCtxDestroy"},
	{"cuEventDestroy", 4000, 0, "cuEventDestroy_v2"},
	{"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
	{"cuGetProcAddress", 11030, PTDS, "cuGetProcAddress"},
	{"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
	{"cuGetProcAddress", 13000, 0, "cuGetProcAddress_v2"},
	{"cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2"},
	{"cuMemGetInfo", 13000, PTDS, "cuMemGetInfo_v2"},
};

/* The four ways a program asks: v2 and v1 as libcuda exports them, and the v1 and v2 functions
 * that a request for "cuGetProcAddress" itself returned. */
enum { BY_V2, BY_V1, BY_GOT_V1, BY_GOT_V2, N_WAYS };
static gpa_v1_fn got_v1;
static gpa_v2_fn got_v2;

static CUresult
lookup(int way, const char *name, void **fn, int version, cuuint64_t flags,
       CUdriverProcAddressQueryResult *status)
{
	*status = CU_GET_PROC_ADDRESS_SUCCESS;
	switch (way) {
	case BY_V2:
		return cuGetProcAddress(name, fn, version, flags, status);
	case BY_V1:
		return get_proc_address_v1(name, fn, version, flags);
	case BY_GOT_V1:
		return got_v1(name, fn, version, flags);
	default:
		return got_v2(name, fn, version, flags, status);
	}
}

static void
test_proc_address(void)
{
	CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
	int bad_status = 0;
	CUdeviceptr p;
	size_t i;
	void *fn;
	int way;

	/* The lookup itself, by the ABI each version has. */
	fn = NULL;
	OK(cuGetProcAddress("cuGetProcAddress", &fn, 11030, 0, &status));
	CHECK(in_preload(fn, "cuGetProcAddress"));
	got_v1 = AS_FN(gpa_v1_fn, fn);
	fn = NULL;
	OK(got_v1("cuGetProcAddress", &fn, 12000, 0));
	CHECK(in_preload(fn, "cuGetProcAddress_v2"));
	got_v2 = AS_FN(gpa_v2_fn, fn);
	CHECK(in_preload(FN_PTR(get_proc_address_v1), "cuGetProcAddress"));

	for (way = 0; way < N_WAYS; way++) {
		for (i = 0; i < sizeof hooked_lookups / sizeof hooked_lookups[0]; i++) {
			const struct lookup *l = &hooked_lookups[i];

			fn = NULL;
			status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
			OK(lookup(way, l->name, &fn, l->version, l->flags, &status));
			if ((way == BY_V2 || way == BY_GOT_V2) &&
			    status != CU_GET_PROC_ADDRESS_SUCCESS) {
				fprintf(stderr, "way %d: %s (%d, %d): status %d\n", way, l->name,
					l->version, (int)l->flags, (int)status);
				bad_status++;
				continue;
			}
			if (!in_preload(fn, l->want)) {
				fprintf(stderr, "way %d: %s (%d, %d) is not the preload's %s\n",
					way, l->name, l->version, (int)l->flags, l->want);
				exit(1);
			}
		}
		CHECK(!bad_status);
		/* Names the interposer leaves alone, and versions the driver does not have. */
		fn = NULL;
		OK(lookup(way, "cuStreamCreate", &fn, 2000, 0, &status));
		CHECK(fn && !in_preload(fn, NULL));
		/* A version too old for the entry point: no function through v2, whatever the code
		 * (the simulated driver fails the call; the driver of 580 returns CUDA_SUCCESS, the
		 * status saying why there is none). Its v1 lookup answers with another function of
		 * its own there, not the one it gives at 11020: an ABI sop cannot know, left as
		 * the driver gave it. */
		fn = FN_PTR(cuStreamCreate);
		(void)lookup(way, "cuMemAllocAsync", &fn, 11000, 0, &status);
		CHECK(!fn || !in_preload(fn, NULL));
		if (way == BY_V2 || way == BY_GOT_V2) {
			CHECK(fn == NULL);
			EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
		}
		fn = NULL;
		(void)lookup(way, "cuMemGetMemPool", &fn, 12080, 0, &status);
		CHECK(fn == NULL);
		(void)lookup(way, "cuNoSuchEntryPoint", &fn, 13000, 0, &status);
		CHECK(fn == NULL);
		/* Versions newer than the interposer's headers (on the simulated driver, which
		 * answers them as described in its README): the interposer's function where the
		 * driver gives the same as at the headers' version; the driver's where it gives
		 * another ABI (one made up for cuStreamWaitEvent at 99000). */
		if (sim) {
			OK(lookup(way, "cuMemAllocAsync", &fn, 99000, PTDS, &status));
			CHECK(in_preload(fn, "cuMemAllocAsync_ptsz"));
			OK(lookup(way, "cuStreamWaitEvent", &fn, 99000, PTDS, &status));
			CHECK(fn && !in_preload(fn, NULL));
		}
	}

	/* What the lookups return works: allocations land in sop. */
	fn = NULL;
	OK(got_v1("cuMemAllocAsync", &fn, 11020, 0));
	OK(AS_FN(alloc_fn, fn)(&p, 4096, s1));
	CHECK(pool_of(p) == pool);
	fn = NULL;
	OK(got_v2("cuMemFreeAsync", &fn, 11020, 0, &status));
	OK(AS_FN(free_fn, fn)(p, s1));
	fn = NULL;
	OK(cuGetProcAddress("cuMemAllocFromPoolAsync", &fn, 11020, PTDS, &status));
	OK(AS_FN(alloc_from_fn, fn)(&p, 4096, pool, s1));
	CHECK(pool_of(p) == pool);
	OK(cuMemFreeAsync(p, s1));
	OK(cuStreamSynchronize(s1));
	driver_pools_untouched();
	printf("cuGetProcAddress: ok\n");
}

/* ---- Who a stream is, without asking ---------------------------------------------------------- */

typedef CUresult (*stream_destroy_fn)(CUstream);
typedef CUresult (*ctx_destroy_fn)(CUcontext);
typedef CUresult (*primary_fn)(CUdevice);
typedef CUresult (*green_destroy_fn)(CUgreenCtx);

static atomic_int gate_open;

static void CUDA_CB
gate_fn(void *arg)
{
	(void)arg;
	while (!atomic_load(&gate_open))
		usleep(100);
}

/* An allocation and a free on s, and how many times sop asked the driver who s is for them. */
static unsigned long long
asked_for_pair(CUstream s)
{
	unsigned long long before = sop_calls("cuStreamGetId");
	CUdeviceptr p;

	OK(cuMemAllocAsync(&p, 4096, s));
	OK(cuMemFreeAsync(p, s));
	return sop_calls("cuStreamGetId") - before;
}

/* Whether the destroys of two handles are counted in one slot (order.c, destroys_slot: the top 9
 * bits of the handle's value times 2^64 over the golden ratio), where a destroy of either makes
 * a thread ask about the other again. */
static unsigned long long
same_destroy_slot(CUstream a, CUstream b)
{
	return ((uint64_t)(uintptr_t)a * 0x9E3779B97F4A7C15u) >> 55 ==
	       ((uint64_t)(uintptr_t)b * 0x9E3779B97F4A7C15u) >> 55;
}

/* *s, which sop knows without asking, destroyed by destroy and made again, most likely with the
 * same handle: the next pair on the new *s asks who it is, once. The simulated driver has no v1
 * entry points, which the interposer's then cannot reach: there *s goes the usual way. */
static void
destroyed_by(stream_destroy_fn destroy, CUstream *s)
{
	EQ(asked_for_pair(*s), 0);
	if (destroy(*s) != CUDA_SUCCESS) {
		CHECK(sim);
		OK(cuStreamDestroy(*s));
	}
	OK(cuStreamCreate(s, CU_STREAM_NON_BLOCKING));
	EQ(asked_for_pair(*s), 1);
	EQ(asked_for_pair(*s), 0);
}

/* Under the interposer every call that destroys streams goes through sop, so a thread's last
 * streams are known without asking the driver while none is destroyed: a same-stream pair makes
 * no driver call at all, nor do pairs that alternate between two streams. Each way a program can destroy a stream or a context makes the next
 * call ask again (here with arguments the driver refuses, or a stream of no use: the report
 * comes whatever the driver answers), and a destroyed stream's handle, which the driver gives to
 * the next stream at once, names a new stream for sop: it never hands that stream the memory the
 * destroyed one freed while its work still ran. */
static void
test_stream_memo(void)
{
	const char *stream_syms[] = {"cuStreamDestroy", "cuStreamDestroy_v2"};
	const char *ctx_syms[] = {"cuCtxDestroy", "cuCtxDestroy_v2"};
	const char *primary_syms[] = {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2",
				      "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2"};
	static const struct {
		const char *name;
		int version, kind; /* 0 stream, 1 context, 2 primary context */
	} procs[] = {{"cuStreamDestroy", 2000, 0},         {"cuStreamDestroy", 4000, 0},
		     {"cuCtxDestroy", 2000, 1},            {"cuCtxDestroy", 4000, 1},
		     {"cuDevicePrimaryCtxRelease", 7000, 2}, {"cuDevicePrimaryCtxRelease", 11000, 2},
		     {"cuDevicePrimaryCtxReset", 7000, 2},   {"cuDevicePrimaryCtxReset", 11000, 2}};
	CUdriverProcAddressQueryResult status;
	CUstream s, again, others[8];
	CUdeviceptr p, q;
	size_t i;
	void *fn;
	int k;

	OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	(void)asked_for_pair(s);
	for (k = 0; k < 100; k++)
		EQ(asked_for_pair(s), 0);
	/* A thread that goes back and forth between streams (compute and copy). */
	OK(cuStreamCreate(&again, CU_STREAM_NON_BLOCKING));
	EQ(asked_for_pair(again), 1);
	for (k = 0; k < 100; k++) {
		EQ(asked_for_pair(s), 0);
		EQ(asked_for_pair(again), 0);
	}
	/* A thread pool's other streams, made and destroyed: s is not asked about again, except
	 * after a destroy in its slot (order.c). Under churn every call used to ask. */
	OK(cuStreamDestroy(again));
	EQ(asked_for_pair(s), same_destroy_slot(s, again));
	EQ(asked_for_pair(s), 0);
	for (k = 0; k < 8; k++)
		OK(cuStreamCreate(&others[k], CU_STREAM_NON_BLOCKING));
	for (k = 0; k < 8; k++) {
		(void)asked_for_pair(others[k]);
		OK(cuStreamDestroy(others[k]));
		EQ(asked_for_pair(s), same_destroy_slot(s, others[k]));
	}

	/* Each way, by symbol (the program's own calls resolve to the interposer's) and by
	 * cuGetProcAddress. */
	for (i = 0; i < sizeof stream_syms / sizeof stream_syms[0]; i++) {
		fn = dlsym(RTLD_DEFAULT, stream_syms[i]);
		CHECK(in_preload(fn, stream_syms[i]));
		destroyed_by(AS_FN(stream_destroy_fn, fn), &s);
	}
	for (i = 0; i < sizeof ctx_syms / sizeof ctx_syms[0]; i++) {
		fn = dlsym(RTLD_DEFAULT, ctx_syms[i]);
		CHECK(in_preload(fn, ctx_syms[i]));
		CHECK(AS_FN(ctx_destroy_fn, fn)(NULL) != CUDA_SUCCESS);
		EQ(asked_for_pair(s), 1);
	}
	for (i = 0; i < sizeof primary_syms / sizeof primary_syms[0]; i++) {
		fn = dlsym(RTLD_DEFAULT, primary_syms[i]);
		CHECK(in_preload(fn, primary_syms[i]));
		CHECK(AS_FN(primary_fn, fn)(9999) != CUDA_SUCCESS);
		EQ(asked_for_pair(s), 1);
	}
	fn = dlsym(RTLD_DEFAULT, "cuGreenCtxDestroy");
	CHECK(in_preload(fn, "cuGreenCtxDestroy"));
	CHECK(AS_FN(green_destroy_fn, fn)(NULL) != CUDA_SUCCESS);
	EQ(asked_for_pair(s), 1);
	for (i = 0; i < sizeof procs / sizeof procs[0]; i++) {
		fn = NULL;
		OK(cuGetProcAddress(procs[i].name, &fn, procs[i].version, 0, &status));
		CHECK(in_preload(fn, NULL));
		if (procs[i].kind == 0) {
			destroyed_by(AS_FN(stream_destroy_fn, fn), &s);
			continue;
		}
		if (procs[i].kind == 1)
			CHECK(AS_FN(ctx_destroy_fn, fn)(NULL) != CUDA_SUCCESS);
		else
			CHECK(AS_FN(primary_fn, fn)(9999) != CUDA_SUCCESS);
		EQ(asked_for_pair(s), 1);
	}

	/* A busy stream destroyed, its handle at once a new stream's. */
	atomic_store(&gate_open, 0);
	OK(cuLaunchHostFunc(s, gate_fn, NULL));
	OK(cuMemAllocAsync(&p, 1 << 20, s));
	OK(cuMemFreeAsync(p, s)); /* behind the gate */
	OK(cuStreamDestroy(s));
	OK(cuStreamCreate(&again, CU_STREAM_NON_BLOCKING));
	if (sim)
		CHECK(again == s); /* as the driver does */
	OK(cuMemAllocAsync(&q, 1 << 20, again));
	CHECK(q != p);
	atomic_store(&gate_open, 1);
	OK(cuStreamSynchronize(again));
	OK(cuMemFreeAsync(q, again));
	OK(cuStreamSynchronize(again));
	OK(cuStreamDestroy(again));
	OK(cuCtxSynchronize());
	printf("stream identity: ok\n");
}

/* ---- cuMemGetInfo under a memory limit ------------------------------------------------------ */

typedef CUresult (*meminfo_fn)(size_t *, size_t *);

#define MiB ((size_t)1 << 20)

/* Every path to cuMemGetInfo answers the same: the limit as total, what sop leaves of it as free,
 * no more than the device and the driver's free; the driver's answer without a limit. free is
 * checked where it is known exactly: on the simulated driver, or where the limit decides it. */
static void
meminfo_expect(meminfo_fn by[3], size_t total, size_t free_bytes, bool exact_free)
{
	unsigned long d;
	size_t f, t;
	int i;

	for (i = 0; i < 3; i++) {
		d = drv_calls("cuMemGetInfo");
		f = t = 0;
		OK(by[i](&f, &t));
		if (sim)
			EQ(drv_calls("cuMemGetInfo"), d + 1);
		EQ(t, total);
		/* The driver's own free moves on a GPU (other processes, the context's own use). */
		if (exact_free)
			EQ(f, free_bytes);
	}
}

static void
test_meminfo(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	CUdriverProcAddressQueryResult status;
	size_t free0, total0, limit = 1, held = 0;
	meminfo_fn by[3];
	CUdeviceptr p, q = 0;
	void *fn = NULL;
	CUresult r;

	CHECK(h);
	by[0] = cuMemGetInfo;
	by[1] = AS_FN(meminfo_fn, sym_of(h, "cuMemGetInfo_v2"));
	OK(cuGetProcAddress("cuMemGetInfo", &fn, 12000, 0, &status));
	by[2] = AS_FN(meminfo_fn, fn);
	CHECK(in_preload(FN_PTR(by[0]), "cuMemGetInfo_v2"));
	CHECK(in_preload(FN_PTR(by[1]), "cuMemGetInfo_v2"));
	CHECK(in_preload(FN_PTR(by[2]), "cuMemGetInfo_v2"));
	/* Before 3020 it is the v1 of 32-bit sizes: the driver's. */
	fn = NULL;
	r = cuGetProcAddress("cuMemGetInfo", &fn, 2000, 0, &status);
	CHECK(!in_preload(fn, NULL));
	if (sim)
		CHECK(r == CUDA_SUCCESS && fn);

	/* sop holds memory on device 0; no limit: the driver's answer, untouched. */
	OK(cuMemAllocAsync(&p, 40 * MiB, s1));
	OK(api.device_get_memory_limit(&limit, &held, 0));
	EQ(limit, 0);
	CHECK(held >= 40 * MiB);
	OK(cuMemGetInfo(&free0, &total0));
	CHECK(free0 <= total0 && total0 > 512 * MiB);
	meminfo_expect(by, total0, free0, sim);

	/* A limit: itself as total, what sop's pools leave of it as free. */
	OK(api.device_set_memory_limit(0, 256 * MiB));
	meminfo_expect(by, 256 * MiB, 256 * MiB - held, true);
	/* A limit past the device: the device's total and the driver's free. */
	OK(api.device_set_memory_limit(0, 2 * total0));
	meminfo_expect(by, total0, free0, sim);
	/* A limit below what sop holds: nothing free, and growth is refused. */
	OK(api.device_set_memory_limit(0, 16 * MiB));
	meminfo_expect(by, 16 * MiB, 0, true);
	EQ(cuMemAllocAsync(&q, 64 * MiB, s1), CUDA_ERROR_OUT_OF_MEMORY);
	EQ(q, 0);

	OK(api.device_set_memory_limit(0, 0));
	meminfo_expect(by, total0, free0, sim);
	OK(cuMemFreeAsync(p, s1));
	OK(cuStreamSynchronize(s1));
	driver_pools_untouched();
	dlclose(h);
	printf("cuMemGetInfo: ok\n");
}

/* ---- Per-thread and legacy default streams ------------------------------------------------ */

static void
policies(CUmemoryPool p, int on)
{
	OK(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &on));
	OK(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &on));
	OK(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &on));
}

#define PT_SIZE ((size_t)64 << 10)

/* On another thread, with the same context: its own per-thread stream. */
static void *
other_thread(void *arg)
{
	CUdeviceptr held = *(CUdeviceptr *)arg, x, y;

	OK(cuCtxSetCurrent(ctx));
	OK(cuMemAllocAsync_ptsz(&x, PT_SIZE, NULL));
	CHECK(x != held); /* freed on the main thread's per-thread stream, not this one's */
	OK(cuMemFreeAsync_ptsz(x, NULL));
	OK(cuMemAllocAsync(&y, PT_SIZE, CU_STREAM_PER_THREAD));
	CHECK(y == x);
	OK(cuMemFreeAsync(y, CU_STREAM_PER_THREAD));
	OK(cuStreamSynchronize_ptsz(NULL));
	return NULL;
}

static void
test_per_thread(void)
{
	CUdriverProcAddressQueryResult status;
	CUdeviceptr a, b, c, d, e;
	void *fn_alloc = NULL, *fn_free = NULL;
	pthread_t t;
	int on;

	/* Memory freed on one stream is then reusable on that stream only. */
	policies(pool, 0);
	OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &on));
	EQ(on, 0);

	/* A _ptsz call on stream 0 is on the per-thread stream ... */
	OK(cuMemAllocAsync_ptsz(&a, PT_SIZE, NULL));
	OK(cuMemFreeAsync_ptsz(a, NULL));
	OK(cuMemAllocAsync(&b, PT_SIZE, NULL));
	CHECK(b != a); /* the legacy stream cannot take it yet */
	OK(cuMemAllocAsync(&c, PT_SIZE, CU_STREAM_PER_THREAD));
	CHECK(c == a);
	/* ... and a legacy call on stream 0 is on the legacy stream. */
	OK(cuMemFreeAsync(b, NULL));
	OK(cuMemAllocAsync(&d, PT_SIZE, CU_STREAM_LEGACY));
	CHECK(d == b);

	/* The same through cuGetProcAddress with the per-thread flag. */
	OK(cuGetProcAddress("cuMemAllocAsync", &fn_alloc, 11020, PTDS, &status));
	OK(cuGetProcAddress("cuMemFreeAsync", &fn_free, 11020, PTDS, &status));
	OK(AS_FN(free_fn, fn_free)(c, NULL));
	OK(cuMemAllocAsync(&e, PT_SIZE, NULL));
	CHECK(e != c);
	OK(cuMemFreeAsync(e, NULL));
	OK(AS_FN(alloc_fn, fn_alloc)(&e, PT_SIZE, NULL));
	CHECK(e == c);

	/* Another thread's per-thread stream is another stream. */
	OK(cuMemFreeAsync_ptsz(e, NULL));
	OK(pthread_create(&t, NULL, other_thread, &e));
	OK(pthread_join(t, NULL));

	OK(cuMemFreeAsync(d, CU_STREAM_LEGACY));
	OK(cuStreamSynchronize_ptsz(NULL));
	OK(cuCtxSynchronize());
	policies(pool, 1);
	driver_pools_untouched();
	printf("per-thread streams: ok\n");
}

/* ---- Synchronization points --------------------------------------------------------------- */

/* Each call reaches sop (sop makes the driver call), and not the driver's own variant of it
 * (NULL: sop's call is to that very entry point). */
#define VIA_SOP(call, entry, ptsz_entry)                                                           \
	do {                                                                                       \
		unsigned long long n_ = sop_calls(entry);                                          \
		unsigned long d_ = drv_calls(ptsz_entry);                                          \
		OK(call);                                                                          \
		CHECK(sop_calls(entry) > n_); /* more for the probes sop records with it */       \
		EQ(drv_calls(ptsz_entry), d_);                                                     \
	} while (0)

static void
test_sync(void)
{
	CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
				.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
	unsigned long long n;
	unsigned long d;
	CUmemoryPool mp;
	CUcontext ctx1;
	CUstream s3;
	CUdeviceptr p;
	CUevent ev;

	OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	VIA_SOP(cuStreamSynchronize(s1), "cuStreamSynchronize", NULL);
	VIA_SOP(cuStreamSynchronize_ptsz(NULL), "cuStreamSynchronize", "cuStreamSynchronize_ptsz");
	VIA_SOP(cuEventRecord(ev, s1), "cuEventRecord", NULL);
	VIA_SOP(cuEventRecord_ptsz(ev, NULL), "cuEventRecord", "cuEventRecord_ptsz");
	VIA_SOP(cuEventRecordWithFlags(ev, s1, 0), "cuEventRecord", "cuEventRecordWithFlags");
	VIA_SOP(cuEventRecordWithFlags_ptsz(ev, NULL, 0), "cuEventRecord",
		"cuEventRecordWithFlags_ptsz");
	VIA_SOP(cuStreamWaitEvent(s2, ev, 0), "cuStreamWaitEvent", NULL);
	VIA_SOP(cuStreamWaitEvent_ptsz(NULL, ev, 0), "cuStreamWaitEvent", "cuStreamWaitEvent_ptsz");
	VIA_SOP(cuEventSynchronize(ev), "cuEventSynchronize", NULL);
	VIA_SOP(cuCtxSynchronize(), "cuCtxSynchronize", NULL);
	VIA_SOP(cuCtxSynchronize_v2(NULL), "cuCtxSynchronize", "cuCtxSynchronize_v2");
	VIA_SOP(cuCtxSynchronize_v2(ctx), "cuCtxSynchronize", "cuCtxSynchronize_v2");
	OK(cuStreamCreate(&s3, CU_STREAM_NON_BLOCKING));
	VIA_SOP(cuStreamDestroy(s3), "cuStreamDestroy", NULL);

	/* A record with flags is the driver's alone (sop_event_record has none), whatever it
	 * answers: the driver of 580 refuses an external record outside a capture
	 * (CUDA_ERROR_ILLEGAL_STATE), the simulated one takes it. */
	n = sop_calls("cuEventRecord");
	d = drv_calls("cuEventRecordWithFlags");
	{
		CUresult r = cuEventRecordWithFlags(ev, s1, CU_EVENT_RECORD_EXTERNAL);
		CHECK(r == CUDA_SUCCESS || (!sim && r == CUDA_ERROR_ILLEGAL_STATE));
	}
	EQ(sop_calls("cuEventRecord"), n);
	if (sim)
		EQ(drv_calls("cuEventRecordWithFlags"), d + 1);
	/* So is a synchronization of a context that is not current. */
	if (n_devices > 1) {
		OK(cuDevicePrimaryCtxRetain(&ctx1, 1));
		n = sop_calls("cuCtxSynchronize");
		d = drv_calls("cuCtxSynchronize_v2");
		OK(cuCtxSynchronize_v2(ctx1));
		EQ(sop_calls("cuCtxSynchronize"), n);
		if (sim)
			EQ(drv_calls("cuCtxSynchronize_v2"), d + 1);
		OK(cuDevicePrimaryCtxRelease(1));
	}

	/* sop learns from them: with release threshold 0, a pool gives its memory back at each
	 * synchronization that covers its frees. */
	OK(cuMemPoolCreate(&mp, &props));
	OK(cuMemAllocFromPoolAsync(&p, 8 << 20, mp, s1));
	OK(cuMemFreeAsync(p, s1));
	CHECK(attr(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) > 0);
	OK(cuStreamSynchronize(s1));
	EQ(attr(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);

	OK(cuMemAllocFromPoolAsync(&p, 8 << 20, mp, s1));
	OK(cuMemFreeAsync(p, s1));
	OK(cuEventRecord(ev, s1));
	CHECK(attr(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) > 0);
	OK(cuEventSynchronize(ev));
	EQ(attr(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);

	OK(cuMemAllocFromPoolAsync(&p, 8 << 20, mp, s2));
	OK(cuMemFreeAsync(p, s2));
	CHECK(attr(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) > 0);
	OK(cuCtxSynchronize());
	EQ(attr(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);

	OK(cuMemAllocFromPoolAsync_ptsz(&p, 8 << 20, mp, NULL));
	OK(cuMemFreeAsync_ptsz(p, NULL));
	CHECK(attr(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) > 0);
	OK(cuStreamSynchronize_ptsz(NULL));
	EQ(attr(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	OK(cuMemPoolDestroy(mp));

	VIA_SOP(cuEventDestroy(ev), "cuEventDestroy", NULL);
	printf("synchronization points: ok\n");
}

/* ---- Memory and pools that are not sop's ------------------------------------------------- */

static void
test_foreign(void)
{
	unsigned long d;
	CUdeviceptr f, p;

	/* Freeing memory sop did not allocate goes to the driver, untouched. */
	OK(cuMemAlloc(&f, 4096));
	CHECK(pool_of(f) == NULL);
	d = drv_calls("cuMemFreeAsync");
	OK(cuMemFreeAsync(f, s1));
	if (sim)
		EQ(drv_calls("cuMemFreeAsync"), d + 1);
	OK(cuMemAlloc(&f, 4096));
	d = drv_calls("cuMemFreeAsync_ptsz");
	OK(cuMemFreeAsync_ptsz(f, NULL));
	if (sim)
		EQ(drv_calls("cuMemFreeAsync_ptsz"), d + 1);
	OK(cuStreamSynchronize_ptsz(NULL));
	OK(cuStreamSynchronize(s1));

	/* A double free of sop's memory is sop's to refuse; the driver never sees it. */
	OK(cuMemAllocAsync(&p, 4096, s1));
	OK(cuMemFreeAsync(p, s1));
	d = drv_calls("cuMemFreeAsync");
	EQ(cuMemFreeAsync(p, s1), CUDA_ERROR_INVALID_VALUE);
	EQ(drv_calls("cuMemFreeAsync"), d);
	OK(cuStreamSynchronize(s1));
	printf("foreign pointers: ok\n");
}

/* up, a device pool of device 0 that the driver made, becomes the device's current pool: the
 * device's allocations then come from it, through the driver, until a pool of sop's is current
 * again or up is destroyed, as the driver's own current pool would. */
static void
driver_current(CUmemoryPool up)
{
	CUmemLocation dev0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	CUmemoryPool def, cur;
	CUdeviceptr p;
	unsigned long d;

	OK(cuDeviceGetMemPool(&def, 0));
	CHECK(def != up);
	OK(cuDeviceSetMemPool(0, up));
	driver_pool_expect("cuDeviceSetMemPool", 1);
	OK(cuDeviceGetMemPool(&cur, 0));
	OK(cuMemGetMemPool(&cur, &dev0, CU_MEM_ALLOCATION_TYPE_PINNED));
	driver_pool_expect("cuDeviceGetMemPool", 1);
	CHECK(cur == up);
	d = drv_calls("cuMemAllocAsync");
	OK(cuMemAllocAsync(&p, 4096, s1));
	driver_pool_expect("cuMemAllocAsync", 1);
	if (sim)
		EQ(drv_calls("cuMemAllocAsync"), d + 1);
	CHECK(pool_of(p) == NULL);
	OK(cuMemsetD32Async(p, 7, 1024, s1));
	OK(cuMemFreeAsync(p, s1));
	OK(cuStreamSynchronize(s1));
	/* The per-thread default stream's requests alike. */
	OK(cuMemAllocAsync_ptsz(&p, 4096, NULL));
	driver_pool_expect("cuMemAllocAsync_ptsz", 1);
	CHECK(pool_of(p) == NULL);
	OK(cuMemFreeAsync_ptsz(p, NULL));
	OK(cuStreamSynchronize_ptsz(NULL));

	/* sop's default current again: sop serves, and the driver hears nothing. */
	OK(cuDeviceSetMemPool(0, def));
	OK(cuDeviceGetMemPool(&cur, 0));
	CHECK(cur == def);
	OK(cuMemAllocAsync(&p, 4096, s1));
	CHECK(pool_of(p) == def);
	OK(cuMemFreeAsync(p, s1));
	driver_pools_untouched();

	/* By location, then destroyed while current: the default is current again. */
	OK(cuMemSetMemPool(&dev0, CU_MEM_ALLOCATION_TYPE_PINNED, up));
	OK(cuDeviceGetMemPool(&cur, 0));
	driver_pool_expect("cuDeviceGetMemPool", 1);
	CHECK(cur == up);
	OK(cuMemAllocAsync(&p, 4096, s1));
	driver_pool_expect("cuMemAllocAsync", 1);
	CHECK(pool_of(p) == NULL);
	OK(cuMemFreeAsync(p, s1));
	OK(cuStreamSynchronize(s1));
	OK(cuMemPoolDestroy(up));
	OK(cuDeviceGetMemPool(&cur, 0));
	CHECK(cur == def);
	OK(cuMemAllocAsync(&p, 4096, s1));
	CHECK(pool_of(p) == def);
	OK(cuMemFreeAsync(p, s1));
	OK(cuStreamSynchronize(s1));
	driver_pools_untouched();
	printf("a pool the driver made, current: ok\n");
}

static void
test_pools(void)
{
	CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
				.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
	CUmemPoolProps host_props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = {CU_MEM_LOCATION_TYPE_HOST, 0}};
	CUmemLocation dev0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	CUmemLocation host = {CU_MEM_LOCATION_TYPE_HOST, 0};
	CUmemoryPool mp, cur, def, hp, hpool, up;
	cuuint64_t v, threshold = (cuuint64_t)1 << 30;
	unsigned long d;
	CUdeviceptr p, x;
	sop_pool_t sp;
	CUresult r;
	int compact;

	/* Pools made through the driver's calls are sop's, and read sop's figures. */
	OK(cuMemPoolCreate(&mp, &props));
	OK(api.pool_get_compaction((sop_pool_t)(void *)mp, &compact));
	OK(cuMemPoolSetAttribute(mp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
	OK(api.pool_get_attr((sop_pool_t)(void *)mp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
	EQ(v, threshold);
	OK(cuMemAllocFromPoolAsync(&p, 3 << 20, mp, s1));
	CHECK(pool_of(p) == mp);
	EQ(attr(mp, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 3 << 20);
	EQ(attr(mp, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 3 << 20);
	OK(api.pool_get_attr((sop_pool_t)(void *)mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v));
	CHECK(v >= (3 << 20));
	EQ(attr(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), v);
	if (n_devices > 1) {
		CUmemAccessDesc grant = {{CU_MEM_LOCATION_TYPE_DEVICE, 1},
					 CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
		CUmemLocation dev1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
		CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;

		OK(cuMemPoolSetAccess(mp, &grant, 1));
		OK(cuMemPoolGetAccess(&flags, mp, &dev1));
		EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	}
	OK(cuMemFreeAsync(p, s1));
	OK(cuStreamSynchronize(s1));
	CHECK(attr(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) > 0); /* under the threshold */
	OK(cuMemPoolTrimTo(mp, 0));
	EQ(attr(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);

	/* Current and default pools, by device and by location. */
	OK(cuDeviceSetMemPool(0, mp));
	OK(cuDeviceGetMemPool(&cur, 0));
	CHECK(cur == mp);
	OK(cuMemAllocAsync(&p, 4096, s1));
	CHECK(pool_of(p) == mp);
	OK(cuMemFreeAsync(p, s1));
	OK(cuMemGetMemPool(&cur, &dev0, CU_MEM_ALLOCATION_TYPE_PINNED));
	CHECK(cur == mp);
	OK(cuMemGetDefaultMemPool(&def, &dev0, CU_MEM_ALLOCATION_TYPE_PINNED));
	CHECK(def == pool);
	OK(cuMemSetMemPool(&dev0, CU_MEM_ALLOCATION_TYPE_PINNED, def));
	OK(cuDeviceGetMemPool(&cur, 0));
	CHECK(cur == pool);
	OK(cuStreamSynchronize(s1));

	/* A destroyed handle is refused by sop, not handed to the driver. */
	OK(cuMemPoolDestroy(mp));
	d = drv_calls("cuMemPoolGetAttribute");
	EQ(cuMemPoolGetAttribute(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v),
	   CUDA_ERROR_INVALID_VALUE);
	EQ(cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE); /* a default pool */
	EQ(drv_calls("cuMemPoolGetAttribute"), d);
	OK(api.device_get_default_pool(&sp, 0));

	/* Pools on the host are sop's where the driver makes host memory through the virtual
	 * memory calls (the simulated one does): the driver's pool calls are not reached. */
	d = drv_calls("cuMemGetDefaultMemPool") + drv_calls("cuMemPoolCreate");
	r = cuMemGetDefaultMemPool(&hp, &host, CU_MEM_ALLOCATION_TYPE_PINNED);
	if (sim) {
		OK(r);
		OK(api.pool_get_compaction((sop_pool_t)(void *)hp, &compact));
		/* A host pool is no device's current pool. */
		EQ(cuDeviceSetMemPool(0, hp), CUDA_ERROR_INVALID_VALUE);
		OK(cuMemGetMemPool(&cur, &host, CU_MEM_ALLOCATION_TYPE_PINNED));
		CHECK(cur == hp);
	}
	r = cuMemPoolCreate(&hpool, &host_props);
	if (sim) {
		OK(r);
		EQ(drv_calls("cuMemGetDefaultMemPool") + drv_calls("cuMemPoolCreate"), d);
	}
	if (r == CUDA_SUCCESS && api.pool_get_compaction((sop_pool_t)(void *)hpool, &compact) ==
				     CUDA_SUCCESS) {
		OK(cuMemSetMemPool(&host, CU_MEM_ALLOCATION_TYPE_PINNED, hpool));
		OK(cuMemGetMemPool(&cur, &host, CU_MEM_ALLOCATION_TYPE_PINNED));
		CHECK(cur == hpool);
		OK(cuMemAllocFromPoolAsync(&x, 4096, hpool, s1));
		CHECK(pool_of(x) == hpool);
		OK(cuStreamSynchronize(s1));
		memset((void *)(uintptr_t)x, 0x3c, 4096); /* the CPU's, after the allocation */
		OK(cuMemFreeAsync(x, s1));
		OK(cuMemPoolSetAttribute(hpool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
		OK(cuMemPoolGetAttribute(hpool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
		EQ(v, threshold);
		OK(cuStreamSynchronize(s1));
		OK(cuMemPoolTrimTo(hpool, 0));
		EQ(attr(hpool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
		OK(cuMemPoolDestroy(hpool));
		/* Destroying the current pool makes the default current again. */
		OK(cuMemGetMemPool(&cur, &host, CU_MEM_ALLOCATION_TYPE_PINNED));
		CHECK(cur == hp);
	} else if (r == CUDA_SUCCESS) {
		OK(cuMemPoolDestroy(hpool));
	}

	/* Where the driver cannot make host memory so (the simulated one told to answer as such a
	 * driver), host pools are the driver's, and calls on their handles go there. */
	if (api.sim_host_vmm) {
		api.sim_host_vmm(0);
		d = drv_calls("cuMemPoolCreate");
		OK(cuMemPoolCreate(&hpool, &host_props));
		EQ(drv_calls("cuMemPoolCreate"), d + 1);
		d = drv_calls("cuMemAllocFromPoolAsync");
		OK(cuMemAllocFromPoolAsync(&x, 4096, hpool, s1));
		driver_pool_expect("cuMemAllocFromPoolAsync", 1);
		EQ(drv_calls("cuMemAllocFromPoolAsync"), d + 1);
		CHECK(pool_of(x) == NULL);
		OK(cuMemFreeAsync(x, s1));
		OK(cuMemPoolSetAttribute(hpool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
		OK(cuMemPoolGetAttribute(hpool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
		EQ(v, threshold);
		OK(cuMemPoolTrimTo(hpool, 0));
		OK(cuStreamSynchronize(s1));
		d = drv_calls("cuMemPoolDestroy");
		OK(cuMemPoolDestroy(hpool));
		EQ(drv_calls("cuMemPoolDestroy"), d + 1);
		/* Once destroyed, the handle is nobody's: sop refuses it. */
		d = drv_calls("cuMemPoolGetAttribute");
		EQ(cuMemPoolGetAttribute(hpool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v),
		   CUDA_ERROR_INVALID_VALUE);
		EQ(drv_calls("cuMemPoolGetAttribute"), d);
		api.sim_host_vmm(1);
	}

	/* IPC: sop's exportable pools export through sop (a socket), in this process as in
	 * another; the driver never sees them. A descriptor that is not a socket is the driver's. */
	{
		CUmemPoolProps ipc_props = props;
		CUmemPoolPtrExportData data;
		CUmemoryPool ipc, imp;
		CUdeviceptr imported;
		unsigned int word = 0;
		int fd = -1, pipefd[2];

		EQ(cuMemPoolExportToShareableHandle(&fd, pool,
						    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		   CUDA_ERROR_INVALID_VALUE); /* a default pool */
		ipc_props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
		d = drv_calls("cuMemPoolCreate") + drv_calls("cuMemPoolExportToShareableHandle") +
		    drv_calls("cuMemPoolImportFromShareableHandle") +
		    drv_calls("cuMemPoolExportPointer") + drv_calls("cuMemPoolImportPointer");
		OK(cuMemPoolCreate(&ipc, &ipc_props));
		OK(cuMemPoolExportToShareableHandle(&fd, ipc,
						    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		OK(cuMemAllocFromPoolAsync(&p, 4096, ipc, s1));
		OK(cuMemsetD32Async(p, 0x5a5a1234u, 1024, s1));
		OK(cuStreamSynchronize(s1));
		OK(cuMemPoolExportPointer(&data, p));
		OK(cuMemPoolImportFromShareableHandle(&imp, (void *)(uintptr_t)fd,
						      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		close(fd);
		OK(cuMemPoolImportPointer(&imported, imp, &data));
		CHECK(imported != p); /* a second mapping, as the driver gives in one process */
		OK(cuMemcpyDtoH(&word, imported + 4092, sizeof word));
		EQ(word, 0x5a5a1234u);
		CHECK(pool_of(imported) == imp);
		EQ(cuMemAllocFromPoolAsync(&x, 4096, imp, s1), CUDA_ERROR_INVALID_VALUE);
		OK(cuMemFreeAsync(imported, s1));
		OK(cuStreamSynchronize(s1));
		OK(cuMemPoolDestroy(imp));
		OK(cuMemFreeAsync(p, s1));
		OK(cuStreamSynchronize(s1));
		OK(cuMemPoolDestroy(ipc));
		EQ(drv_calls("cuMemPoolCreate") + drv_calls("cuMemPoolExportToShareableHandle") +
			   drv_calls("cuMemPoolImportFromShareableHandle") +
			   drv_calls("cuMemPoolExportPointer") + drv_calls("cuMemPoolImportPointer"),
		   d);
		/* A socket of the program's own, not of sop's kind: the driver's to refuse, and
		 * nothing is written into it. */
		{
			int sv[2], n = 0;
			char c;

			CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
			d = drv_calls("cuMemPoolImportFromShareableHandle");
			r = cuMemPoolImportFromShareableHandle(&up, (void *)(uintptr_t)sv[0],
							       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
			CHECK(r != CUDA_SUCCESS);
			if (sim)
				EQ(drv_calls("cuMemPoolImportFromShareableHandle"), d + 1);
			while (recv(sv[1], &c, 1, MSG_DONTWAIT) == 1)
				n++;
			EQ(n, 0);
			close(sv[0]);
			close(sv[1]);
		}
		/* Not a socket: another process's driver pool, the driver's to import or refuse. */
		CHECK(pipe(pipefd) == 0);
		d = drv_calls("cuMemPoolImportFromShareableHandle");
		r = cuMemPoolImportFromShareableHandle(&up, (void *)(uintptr_t)pipefd[0],
						       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
		CHECK(r != CUDA_SUCCESS);
		if (sim)
			EQ(drv_calls("cuMemPoolImportFromShareableHandle"), d + 1);
		close(pipefd[0]);
		close(pipefd[1]);
	}

	/* A device pool sop cannot make (a usage it lacks, or fabric handles) is the driver's to make
	 * or refuse (the simulated driver makes those with a usage; an H200 with driver 580 makes one
	 * of the two). */
	props.usage = 1;
	d = drv_calls("cuMemPoolCreate");
	r = cuMemPoolCreate(&up, &props);
	if (sim) {
		OK(r);
		EQ(drv_calls("cuMemPoolCreate"), d + 1);
	}
	props.usage = 0;
	props.handleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
	if (r != CUDA_SUCCESS)
		r = cuMemPoolCreate(&up, &props);
	if (r == CUDA_SUCCESS)
		driver_current(up); /* and destroys it */
	driver_pools_untouched();
	printf("pool handles and attributes: ok\n");
}

/* ---- Pools the driver makes, made and destroyed on two threads at once --------------------- */

/* The simulated driver hands a destroyed pool's handle to the next pool made, at once (sim-libcuda.c):
 * a pool made on one thread while another destroys one may get the value the destroy just freed.
 * The interposer must still know it for the driver's, else calls on it go to sop and fail. */
#define CHURN_ROUNDS 20000

static atomic_int churn_bad;

static void *
driver_pool_churn(void *arg)
{
	const CUmemPoolProps *props = arg;
	cuuint64_t v;
	int i;

	OK(cuCtxSetCurrent(ctx));
	for (i = 0; i < CHURN_ROUNDS && !atomic_load(&churn_bad); i++) {
		CUmemoryPool p;
		CUresult a, b;

		OK(cuMemPoolCreate(&p, props));
		a = cuMemPoolGetAttribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v);
		b = cuMemPoolDestroy(p);
		if (a != CUDA_SUCCESS || b != CUDA_SUCCESS) {
			printf("round %d: a pool the driver made: attribute %d, destroy %d\n", i, a, b);
			atomic_store(&churn_bad, 1);
		}
	}
	return NULL;
}

static void
test_driver_pool_churn(void)
{
	CUmemPoolProps host_props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = {.type = CU_MEM_LOCATION_TYPE_HOST}};
	pthread_t t[2];
	int i;

	if (!api.sim_host_vmm) /* only the simulated driver is told to make host pools itself */
		return;
	api.sim_host_vmm(0);
	for (i = 0; i < 2; i++)
		CHECK(pthread_create(&t[i], NULL, driver_pool_churn, &host_props) == 0);
	for (i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	api.sim_host_vmm(1);
	EQ(atomic_load(&churn_bad), 0);
	printf("driver pools made and destroyed on two threads: ok\n");
}

/* ---- A context the program makes and destroys ---------------------------------------------- */

/* Round after round, a context made, a stream of it, an allocation freed on that stream, and the
 * context destroyed: the driver's destroy waits for the context's work, so the free has
 * completed, and the next round's allocation takes the same memory. Nothing else could make it
 * reusable: the stream is gone with its context. */
static void
test_ctx_destroy(void)
{
	cuuint64_t reserved = 0, first = 0;
	CUmemoryPool dpool;
	int i;

	OK(cuDeviceGetDefaultMemPool(&dpool, 0));
	for (i = 0; i < 8; i++) {
		CUcontext c, popped;
		CUdeviceptr p;
		CUstream s;

		OK(cuCtxCreate(&c, NULL, 0, 0));
		OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
		OK(cuMemAllocAsync(&p, 64 << 20, s));
		CHECK(pool_of(p) == dpool);
		OK(cuMemFreeAsync(p, s));
		OK(cuCtxPopCurrent(&popped));
		CHECK(popped == c);
		OK(cuCtxDestroy(c));
		OK(cuCtxSetCurrent(ctx));
		OK(cuMemPoolGetAttribute(dpool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
		if (!i)
			first = reserved;
		EQ(reserved, first);
	}
	OK(cuMemPoolTrimTo(dpool, 0));
	printf("contexts made and destroyed: ok\n");
}

/* ---- A thread with no current context ------------------------------------------------------ */

static void *
no_context(void *arg)
{
	CUdeviceptr p;
	CUcontext none = ctx;

	(void)arg;
	OK(cuCtxGetCurrent(&none));
	CHECK(none == NULL);
	/* The default streams need a context: the driver's code, as without sop. */
	EQ(cuMemAllocAsync(&p, 4096, NULL), CUDA_ERROR_INVALID_CONTEXT);
	EQ(cuMemAllocAsync_ptsz(&p, 4096, NULL), CUDA_ERROR_INVALID_CONTEXT);
	EQ(cuStreamSynchronize(NULL), CUDA_ERROR_INVALID_CONTEXT);
	EQ(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
	/* A stream names its context. */
	OK(cuMemAllocAsync(&p, 4096, s1));
	CHECK(pool_of(p) == pool);
	OK(cuMemFreeAsync(p, s1));
	OK(cuMemAllocFromPoolAsync(&p, 4096, pool, s2));
	OK(cuMemFreeAsync(p, s2));
	OK(cuStreamSynchronize(s1));
	OK(cuStreamSynchronize(s2));
	(void)attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
	return NULL;
}

static void
test_no_context(void)
{
	pthread_t t;

	OK(pthread_create(&t, NULL, no_context, NULL));
	OK(pthread_join(t, NULL));
	printf("thread without a context: ok\n");
}

/* ---- fork ---------------------------------------------------------------------------------- */

static int
wait_child(pid_t pid)
{
	int status;

	CHECK(pid > 0);
	CHECK(waitpid(pid, &status, 0) == pid);
	if (WIFSIGNALED(status)) {
		fprintf(stderr, "child killed by signal %d\n", WTERMSIG(status));
		return -1;
	}
	return WEXITSTATUS(status);
}

static void
test_fork(const char *self)
{
	unsigned long before;
	CUdeviceptr p;
	pid_t pid;

	/* A child that stays: its hooked calls go to the driver, which answers as it does in any
	 * forked child; nothing waits for the parent's threads. */
	before = drv_calls("cuMemAllocAsync");
	pid = fork();
	if (pid == 0) {
		CUresult r;

		alarm(30);
		r = cuMemAllocAsync(&p, 4096, s1);
		if (sim && r != CUDA_ERROR_NOT_SUPPORTED)
			_exit(1);
		if (sim && drv_calls("cuMemAllocAsync") != before + 1)
			_exit(1);
		_exit(sym_of(RTLD_DEFAULT, "cuMemAllocAsync") ? 0 : 1);
	}
	EQ(wait_child(pid), 0);

	/* A child that execs starts afresh, with sop. */
	pid = fork();
	if (pid == 0) {
		alarm(60);
		execl("/proc/self/exe", self, "--child", (char *)NULL);
		_exit(127);
	}
	EQ(wait_child(pid), 0);

	/* And the parent goes on. */
	OK(cuMemAllocAsync(&p, 4096, s1));
	CHECK(pool_of(p) == pool);
	OK(cuMemFreeAsync(p, s1));
	OK(cuStreamSynchronize(s1));
	printf("fork: ok\n");
}

static void
quick(void)
{
	CUdeviceptr p;

	OK(cuDeviceGetDefaultMemPool(&pool, 0));
	OK(cuMemAllocAsync(&p, 1 << 20, s1));
	CHECK(pool_of(p) == pool);
	OK(cuMemFreeAsync(p, s1));
	OK(cuStreamSynchronize(s1));
	driver_pools_untouched();
}

/* ---- sop cannot start ---------------------------------------------------------------------- */

#define VIA_DRIVER(call, entry)                                                                    \
	do {                                                                                       \
		unsigned long d_ = drv_calls(entry);                                               \
		OK(call);                                                                          \
		if (sim)                                                                           \
			EQ(drv_calls(entry), d_ + 1);                                              \
	} while (0)

static void
test_fallback(void)
{
	CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
				.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
	CUdriverProcAddressQueryResult status;
	CUdeviceptr p, f;
	CUmemoryPool mp;
	unsigned long d;
	sop_pool_t sp;
	CUevent ev;
	CUstream s3;
	CUresult r;
	void *fn;

	CHECK(api.device_get_default_pool(&sp, 0) != CUDA_SUCCESS);

	/* The driver's own pools answer (on the simulated driver: its stubs, which fail). */
	d = drv_calls("cuMemAllocAsync");
	r = cuMemAllocAsync(&p, 4096, s1);
	if (sim) {
		EQ(r, CUDA_ERROR_NOT_SUPPORTED);
		EQ(drv_calls("cuMemAllocAsync"), d + 1);
	} else {
		OK(r);
		CHECK(pool_of(p) == NULL);
		OK(cuMemFreeAsync(p, s1));
	}
	d = drv_calls("cuMemAllocAsync_ptsz");
	r = cuMemAllocAsync_ptsz(&p, 4096, NULL);
	if (sim) {
		EQ(r, CUDA_ERROR_NOT_SUPPORTED);
		EQ(drv_calls("cuMemAllocAsync_ptsz"), d + 1);
	} else {
		OK(r);
		OK(cuMemFreeAsync_ptsz(p, NULL));
	}
	d = drv_calls("cuDeviceGetDefaultMemPool");
	r = cuDeviceGetDefaultMemPool(&mp, 0);
	if (sim) {
		EQ(r, CUDA_ERROR_NOT_SUPPORTED);
		EQ(drv_calls("cuDeviceGetDefaultMemPool"), d + 1);
	} else {
		OK(r);
		(void)attr(mp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
	}
	d = drv_calls("cuMemPoolCreate");
	r = cuMemPoolCreate(&mp, &props);
	if (sim) {
		EQ(r, CUDA_ERROR_NOT_SUPPORTED);
		EQ(drv_calls("cuMemPoolCreate"), d + 1);
	} else {
		OK(r);
		OK(cuMemPoolDestroy(mp));
	}

	/* Synchronization points, records and waits go to the driver as they are. */
	OK(cuEventCreate(&ev, 0));
	VIA_DRIVER(cuStreamSynchronize(s1), "cuStreamSynchronize");
	VIA_DRIVER(cuStreamSynchronize_ptsz(NULL), "cuStreamSynchronize_ptsz");
	VIA_DRIVER(cuEventRecord(ev, s1), "cuEventRecord");
	VIA_DRIVER(cuEventRecord_ptsz(ev, NULL), "cuEventRecord_ptsz");
	VIA_DRIVER(cuEventRecordWithFlags(ev, s1, 0), "cuEventRecordWithFlags");
	VIA_DRIVER(cuEventRecordWithFlags_ptsz(ev, NULL, 0), "cuEventRecordWithFlags_ptsz");
	VIA_DRIVER(cuStreamWaitEvent(s2, ev, 0), "cuStreamWaitEvent");
	VIA_DRIVER(cuStreamWaitEvent_ptsz(NULL, ev, 0), "cuStreamWaitEvent_ptsz");
	VIA_DRIVER(cuEventSynchronize(ev), "cuEventSynchronize");
	VIA_DRIVER(cuCtxSynchronize(), "cuCtxSynchronize");
	VIA_DRIVER(cuCtxSynchronize_v2(NULL), "cuCtxSynchronize_v2");
	VIA_DRIVER(cuEventDestroy(ev), "cuEventDestroy");
	OK(cuStreamCreate(&s3, 0));
	VIA_DRIVER(cuStreamDestroy(s3), "cuStreamDestroy");
	{
		size_t mem_free, mem_total;

		VIA_DRIVER(cuMemGetInfo(&mem_free, &mem_total), "cuMemGetInfo");
	}

	/* Foreign memory is freed by the driver, as always. */
	OK(cuMemAlloc(&f, 4096));
	VIA_DRIVER(cuMemFreeAsync(f, s1), "cuMemFreeAsync");

	/* The lookups still hand out the interposer's functions, which forward. */
	fn = NULL;
	OK(cuGetProcAddress("cuMemAllocAsync", &fn, 11020, PTDS, &status));
	CHECK(in_preload(fn, "cuMemAllocAsync_ptsz"));
	d = drv_calls("cuMemAllocAsync_ptsz");
	r = AS_FN(alloc_fn, fn)(&p, 4096, NULL);
	if (sim) {
		EQ(r, CUDA_ERROR_NOT_SUPPORTED);
		EQ(drv_calls("cuMemAllocAsync_ptsz"), d + 1);
	} else {
		OK(r);
		OK(cuMemFreeAsync_ptsz(p, NULL));
	}
	OK(cuCtxSynchronize());

	/* sop never called the driver. */
	EQ(sop_calls_all(), 0);
	printf("sop not started, everything to the driver: ok\n");
}

/* ---- A device reset ------------------------------------------------------------------------ */

/* cuDevicePrimaryCtxReset destroys every stream and event of the primary context, which is gone
 * until retained again (an H200 keeps memory made with cuMemCreate, and its mappings, whole). A program that resets between rounds
 * and uses only what it makes afterwards must run as it does without sop: sop may touch none of
 * the dead streams and events (its own probe events among them; the driver faults on them), and
 * the frees the reset completed are reusable, not held for good. Each round leaves a stream with
 * frees cached and probes recorded, undestroyed, and another with events followed, destroyed;
 * after the reset, new streams ask for memory the way that queries other streams' probes. */
#define RESET_ROUNDS 4
#define RESET_BLOCKS 64

static void
reset_round(int round, cuuint64_t *reserved_after)
{
	CUstream a, b, t;
	CUevent ev;
	CUdeviceptr blk[RESET_BLOCKS], p;
	CUmemoryPool def;
	unsigned word;
	int k, rep;

	OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
	OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
	OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	for (k = 0; k < RESET_BLOCKS; k++)
		OK(cuMemAllocAsync(&blk[k], (size_t)1 << 20, a));
	usleep(2000); /* old enough for probes by count */
	for (rep = 0; rep < 4; rep++) {
		for (k = 0; k < RESET_BLOCKS; k++)
			OK(cuMemFreeAsync(blk[k], a));
		for (k = 0; k < RESET_BLOCKS; k++)
			OK(cuMemAllocAsync(&blk[k], (size_t)1 << 20, a));
	}
	for (k = 0; k < RESET_BLOCKS / 2; k++)
		OK(cuMemFreeAsync(blk[k], a));
	/* b follows a's frees through an event, then goes. */
	OK(cuEventRecord(ev, a));
	OK(cuStreamWaitEvent(b, ev, 0));
	for (k = 0; k < 8; k++) {
		OK(cuMemAllocAsync(&p, (size_t)1 << 20, b));
		OK(cuMemFreeAsync(p, b));
	}
	OK(cuStreamDestroy(b));
	OK(cuEventDestroy(ev));
	for (k = RESET_BLOCKS / 2; k < RESET_BLOCKS; k++)
		OK(cuMemFreeAsync(blk[k], a));
	/* a is left to the reset, its frees cached on it. The context is gone until retained again
	 * (as the runtime does after cudaDeviceReset). */
	OK(cuDevicePrimaryCtxReset(0));
	OK(cuCtxSetCurrent(ctx));
	EQ(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_ERROR_CONTEXT_IS_DESTROYED);
	OK(cuDevicePrimaryCtxRetain(&ctx, 0));
	OK(cuCtxSetCurrent(ctx));

	OK(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
	for (k = 0; k < RESET_BLOCKS / 2; k++) {
		OK(cuMemAllocAsync(&blk[k], (size_t)3 << 20, t));
		OK(cuMemsetD32Async(blk[k], 0x7e570000u + (unsigned)k, ((size_t)3 << 20) / 4, t));
	}
	for (k = 0; k < RESET_BLOCKS / 2; k++) {
		OK(cuMemcpyDtoHAsync(&word, blk[k] + ((size_t)3 << 20) - 4, sizeof word, t));
		OK(cuStreamSynchronize(t));
		EQ(word, 0x7e570000u + (unsigned)k);
		OK(cuMemFreeAsync(blk[k], t));
	}
	/* The legacy stream, after the reset too. */
	OK(cuMemAllocAsync(&p, 4096, NULL));
	OK(cuMemFreeAsync(p, NULL));
	OK(cuStreamSynchronize(t));
	OK(cuStreamDestroy(t));
	OK(cuDeviceGetMemPool(&def, 0));
	OK(cuMemPoolGetAttribute(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, reserved_after));
	printf("reset, round %d: %llu MiB reserved after\n", round,
	       (unsigned long long)(*reserved_after >> 20));
}

static void
test_reset(void)
{
	cuuint64_t keep = UINT64_MAX, reserved[RESET_ROUNDS];
	CUmemoryPool def;
	int round;

	OK(cuDeviceGetMemPool(&def, 0));
	OK(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	for (round = 0; round < RESET_ROUNDS; round++)
		reset_round(round, &reserved[round]);
	/* What the reset completed is reused: the pool does not grow by a round's frees left on the
	 * stream the reset destroyed (64 MiB), round after round. */
	CHECK(reserved[RESET_ROUNDS - 1] < reserved[1] + ((cuuint64_t)RESET_BLOCKS << 20));
	printf("a device reset between rounds: ok\n");
}

int
main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";

	if (!strcmp(mode, "--before-init")) {
		/* Calls sop takes over, made before cuInit: the driver's answer, and the driver is not
		 * initialised behind the program's back. Then, once it is, sop serves. */
		CUmemoryPool p0 = NULL;
		CUdeviceptr x = 0;
		CUdevice dev;
		int n = -1;

		EQ(cuStreamSynchronize(NULL), CUDA_ERROR_NOT_INITIALIZED);
		EQ(cuCtxSynchronize(), CUDA_ERROR_NOT_INITIALIZED);
		EQ(cuDeviceGetDefaultMemPool(&p0, 0), CUDA_ERROR_NOT_INITIALIZED);
		EQ(cuMemAllocAsync(&x, 16, NULL), CUDA_ERROR_NOT_INITIALIZED);
		EQ(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
		if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS) {
			printf("skip: no usable CUDA driver\n");
			return SKIP;
		}
		OK(cuDevicePrimaryCtxRetain(&ctx, dev));
		OK(cuCtxSetCurrent(ctx));
		OK(cuDeviceGetDefaultMemPool(&p0, dev));
		OK(cuMemAllocAsync(&x, 16, NULL));
		OK(cuMemFreeAsync(x, NULL));
		OK(cuStreamSynchronize(NULL));
		printf("before-init: ok\n");
		return 0;
	}
	if (!strcmp(mode, "--meminfo-first")) {
		CUdevice dev;
		size_t free_bytes = 0, total = 0;

		if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS) {
			printf("skip: no usable CUDA driver\n");
			return SKIP;
		}
		OK(cuDevicePrimaryCtxRetain(&ctx, dev));
		OK(cuCtxSetCurrent(ctx));
		OK(cuMemGetInfo(&free_bytes, &total));
		CHECK(total > 0 && free_bytes <= total);
		printf("meminfo-first: ok\n");
		return 0;
	}
	setup();
	if (!strcmp(mode, "--fallback")) {
		test_fallback();
		return 0;
	}
	if (!strcmp(mode, "--reset")) {
		test_reset();
		return 0;
	}
	if (!strcmp(mode, "--quick") || !strcmp(mode, "--child")) {
		quick();
		printf("%s: ok\n", mode + 2);
		return 0;
	}
	test_direct();
	test_dlsym();
	test_proc_address();
	test_per_thread();
	test_sync();
	test_foreign();
	test_pools();
	test_driver_pool_churn();
	test_ctx_destroy();
	test_meminfo();
	test_no_context();
	test_stream_memo();
	test_fork(argv[0]);
	/* sop's own calls to the driver never came back through the interposer: it resolved its
	 * table from the driver (the count is of its calls, every one of which reached it). */
	CHECK(sop_calls("cuStreamGetId") > 0);
	driver_pools_untouched();
	printf("all ok\n");
	return 0;
}
