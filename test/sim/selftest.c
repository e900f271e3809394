/*
 * Self-test of the simulated CUDA driver (libsopsim.so).
 *
 * It loads the library exactly as sop loads a driver: dlopen() of a path
 * (argv[1], else $SOP_DRIVER_LIBRARY), then dlsym() of the names that cuda.h's
 * macros produce (cuStreamDestroy_v2, ...). Faults are checked in child
 * processes, which must die of SIGSEGV. Prints "N passed, N failed" last.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "sim.h"

/* A sanitizer may report a SEGV itself and exit with an error instead of the signal. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#define STR_(x) #x
#define STR(x) STR_(x)

/* Every function the test resolves; cuda.h's macros give the exported names. */
#define DRV_FUNCS(X) \
	X(cuInit) X(cuDriverGetVersion) X(cuGetErrorString) X(cuGetErrorName) \
	X(cuGetProcAddress) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) \
	X(cuDeviceTotalMem) X(cuDeviceGetAttribute) X(cuDeviceCanAccessPeer) \
	X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxReset) \
	X(cuCtxGetCurrent) \
	X(cuCtxSetCurrent) X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxGetDevice) \
	X(cuCtxCreate) X(cuCtxDestroy) \
	X(cuCtxSynchronize) X(cuCtxGetId) X(cuMemGetInfo) \
	X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree) \
	X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) \
	X(cuMemGetAccess) X(cuMemExportToShareableHandle) \
	X(cuMemImportFromShareableHandle) X(cuMemRetainAllocationHandle) \
	X(cuMemGetAllocationPropertiesFromHandle) \
	X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamQuery) X(cuStreamSynchronize) \
	X(cuStreamWaitEvent) X(cuStreamGetCtx) X(cuStreamGetFlags) X(cuStreamGetId) \
	X(cuStreamGetDevice) \
	X(cuLaunchHostFunc) X(cuStreamAddCallback) \
	X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery) \
	X(cuEventSynchronize) X(cuEventElapsedTime) X(cuIpcGetEventHandle) \
	X(cuIpcOpenEventHandle) \
	X(cuMemsetD8Async) X(cuMemsetD32Async) X(cuMemsetD8) X(cuMemcpyHtoDAsync) \
	X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemcpyHtoD) X(cuMemcpyDtoH) \
	X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing) \
	X(cuStreamGetCaptureInfo) X(cuThreadExchangeStreamCaptureMode) X(cuGraphInstantiate) \
	X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuMemAllocAsync) \
	X(cuMemFreeAsync) \
	X(sim_fail) X(sim_fail_clear) X(sim_calls) X(sim_counts_reset) X(sim_live_get) \
	X(sim_handles_recycle) X(sim_fail_rate) X(sim_fail_seed) X(sim_fails) X(sim_host_vmm)

#define DRV_MEMBER(name) __typeof__(&name) name;
static struct {
	DRV_FUNCS(DRV_MEMBER)
} drv;
#undef DRV_MEMBER

static void *lib;
static const char *lib_path;

/* Atomic: the threads test checks from several threads. */
static atomic_int failures;

#define CHECK(cond) \
	do { \
		if (!(cond)) { \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			failures++; \
		} \
	} while (0)

#define CHECK_RC(call, want) \
	do { \
		CUresult rc_ = (call); \
		if (rc_ != (want)) { \
			fprintf(stderr, "%s:%d: %s gave %d, expected %d\n", __FILE__, __LINE__, \
				#call, (int)rc_, (int)(want)); \
			failures++; \
		} \
	} while (0)

#define OK(call) CHECK_RC(call, CUDA_SUCCESS)

static void load_symbol(void *slot, size_t size, const char *name)
{
	void *sym = dlsym(lib, name);

	if (!sym || size != sizeof(sym)) {
		fprintf(stderr, "selftest: %s: symbol %s missing\n", lib_path, name);
		exit(2);
	}
	memcpy(slot, &sym, sizeof(sym));
}

static void load_library(void)
{
	lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "selftest: dlopen: %s\n", dlerror());
		exit(2);
	}
#define DRV_LOAD(name) load_symbol(&drv.name, sizeof(drv.name), STR(name));
	DRV_FUNCS(DRV_LOAD)
#undef DRV_LOAD
}

static void msleep(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

#define PTR(d) ((unsigned char *)(uintptr_t)(d))

static size_t gran;
static CUcontext ctx0, ctx1;
/* The handle mode SOP_SIM_HANDLES chose; tests that pick one put this one back. */
static bool recycling = true;

static CUmemAllocationProp device_prop(int dev, bool shareable)
{
	CUmemAllocationProp prop;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	prop.requestedHandleTypes = shareable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
					      : CU_MEM_HANDLE_TYPE_NONE;
	return prop;
}

static CUresult set_access(CUdeviceptr p, size_t size, int dev, CUmemAccess_flags flags)
{
	CUmemAccessDesc d;

	memset(&d, 0, sizeof(d));
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = dev;
	d.flags = flags;
	return drv.cuMemSetAccess(p, size, &d, 1);
}

/* Reserved, created, mapped and read-write for device 0. */
struct buffer {
	CUdeviceptr va;
	size_t size;
	CUmemGenericAllocationHandle handle;
};

static void buffer_new(struct buffer *b, size_t size)
{
	CUmemAllocationProp prop = device_prop(0, false);

	b->size = size;
	OK(drv.cuMemAddressReserve(&b->va, size, 0, 0, 0));
	OK(drv.cuMemCreate(&b->handle, size, &prop, 0));
	OK(drv.cuMemMap(b->va, size, 0, b->handle, 0));
	OK(set_access(b->va, size, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
}

static void buffer_free(struct buffer *b)
{
	OK(drv.cuMemUnmap(b->va, b->size));
	OK(drv.cuMemRelease(b->handle));
	OK(drv.cuMemAddressFree(b->va, b->size));
}

static void check_no_leaks(void)
{
	struct sim_live live;

	drv.sim_live_get(&live);
	CHECK(live.reservations == 0);
	CHECK(live.handles == 0);
	CHECK(live.mappings == 0);
	CHECK(live.streams == 0);
	CHECK(live.events == 0);
	CHECK(live.phys_bytes == 0);
	CHECK(live.contexts == 0);
}

/* ---- host functions that block and log ---- */

struct gate {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	bool open;
};

#define GATE_INIT { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false }

static void CUDA_CB gate_wait(void *arg)
{
	struct gate *g = arg;

	pthread_mutex_lock(&g->lock);
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->lock);
	pthread_mutex_unlock(&g->lock);
}

static void gate_open(struct gate *g)
{
	pthread_mutex_lock(&g->lock);
	g->open = true;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->lock);
}

static void CUDA_CB gate_open_fn(void *arg)
{
	gate_open(arg);
}

/* Host functions append their letter; the test reads the order. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[64];
static size_t log_len;
static const char letters[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";

static void CUDA_CB log_letter(void *arg)
{
	pthread_mutex_lock(&log_lock);
	if (log_len < sizeof(log_buf) - 1)
		log_buf[log_len++] = *(const char *)arg;
	log_buf[log_len] = '\0';
	pthread_mutex_unlock(&log_lock);
}

static CUresult log_on(CUstream s, char c)
{
	return drv.cuLaunchHostFunc(s, log_letter, (void *)&letters[c - 'A']);
}

static void log_reset(void)
{
	pthread_mutex_lock(&log_lock);
	log_len = 0;
	log_buf[0] = '\0';
	pthread_mutex_unlock(&log_lock);
}

static bool log_is(const char *want)
{
	bool same;

	pthread_mutex_lock(&log_lock);
	same = strcmp(log_buf, want) == 0;
	if (!same)
		fprintf(stderr, "log is \"%s\", expected \"%s\"\n", log_buf, want);
	pthread_mutex_unlock(&log_lock);
	return same;
}

static bool log_is_either(const char *a, const char *b)
{
	bool same;

	pthread_mutex_lock(&log_lock);
	same = strcmp(log_buf, a) == 0 || strcmp(log_buf, b) == 0;
	if (!same)
		fprintf(stderr, "log is \"%s\", expected \"%s\" or \"%s\"\n", log_buf, a, b);
	pthread_mutex_unlock(&log_lock);
	return same;
}

/* ---- children that must fault ---- */

static void child_setup(void)
{
	struct rlimit none = { 0, 0 };

	setrlimit(RLIMIT_CORE, &none);
	signal(SIGSEGV, SIG_DFL);
	signal(SIGBUS, SIG_DFL);
}

/* True if the child died of SIGSEGV (or of a sanitizer's report of one). */
static bool child_faulted(int status)
{
	if (WIFSIGNALED(status))
		return WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS ||
		       (SANITIZED && WTERMSIG(status) == SIGABRT);
	return SANITIZED && WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
	       WEXITSTATUS(status) != 42;
}

enum touch { TOUCH_READ, TOUCH_WRITE };

/* Touches *p in a forked child; true if that faulted. Exit 42: it did not. */
static bool touch_faults(volatile unsigned char *p, enum touch how)
{
	int status = 0;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		child_setup();
		if (how == TOUCH_READ)
			(void)*p;
		else
			*p = 1;
		_exit(42);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return false;
	return child_faulted(status);
}

/* ---- tests ---- */

static void test_devices(void)
{
	int n, v;
	size_t total;
	char name[64];
	const char *s;
	void *fn;
	CUdriverProcAddressQueryResult status;
	CUdevice d;

	OK(drv.cuDeviceGetCount(&n));
	CHECK(n == 2);
	OK(drv.cuDeviceGet(&d, 1));
	CHECK(d == 1);
	CHECK_RC(drv.cuDeviceGet(&d, 2), CUDA_ERROR_INVALID_DEVICE);
	OK(drv.cuDeviceGetName(name, sizeof(name), 0));
	CHECK(strlen(name) > 0);
	OK(drv.cuDeviceTotalMem(&total, 0));
	CHECK(total == 64u << 20);
	OK(drv.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
				    0));
	CHECK(v == 1);
	OK(drv.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 1));
	CHECK(v == 9);
	CHECK_RC(drv.cuDeviceGetAttribute(&v, (CUdevice_attribute)9999, 0),
		 CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 5),
		 CUDA_ERROR_INVALID_DEVICE);
	OK(drv.cuDeviceCanAccessPeer(&v, 0, 1));
	CHECK(v == 1);
	OK(drv.cuDeviceCanAccessPeer(&v, 1, 1));
	CHECK(v == 0);

	OK(drv.cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
	CHECK(s && strcmp(s, "out of memory") == 0);
	OK(drv.cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &s));
	CHECK(s && strcmp(s, "CUDA_ERROR_INVALID_VALUE") == 0);
	OK(drv.cuGetErrorString(CUDA_ERROR_LAUNCH_TIMEOUT, &s));
	CHECK(s != NULL);
	CHECK_RC(drv.cuGetErrorString((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
	CHECK(s == NULL);

	/* cuGetProcAddress hands out the same (versioned) functions as dlsym. */
	OK(drv.cuGetProcAddress("cuStreamDestroy", &fn, 13000, 0, &status));
	CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS);
	CHECK(fn == dlsym(lib, "cuStreamDestroy_v2"));
	CHECK_RC(drv.cuGetProcAddress("cuNoSuchThing", &fn, 13000, 0, &status),
		 CUDA_ERROR_NOT_FOUND);
	CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

	/* Only the cu* entry points and the control API are exported. */
	CHECK(dlsym(lib, "cuMemPoolCreate") == NULL);
	CHECK(dlsym(lib, "cuMemAllocFromPoolAsync") == NULL);
	CHECK(dlsym(lib, "sim_enter") == NULL);
	CHECK(dlsym(lib, "cuStreamDestroy") == NULL);
}

static void test_contexts(void)
{
	CUcontext c, popped;
	CUdevice d;
	unsigned long long id0, id1;
	struct sim_live live;

	OK(drv.cuCtxSetCurrent(NULL));
	OK(drv.cuCtxGetCurrent(&c));
	CHECK(c == NULL);
	CHECK_RC(drv.cuCtxGetDevice(&d), CUDA_ERROR_INVALID_CONTEXT);
	CHECK_RC(drv.cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);

	OK(drv.cuDevicePrimaryCtxRetain(&c, 1));
	CHECK(c == ctx1);
	drv.sim_live_get(&live);
	CHECK(live.primary_ctx_refs == 3);
	OK(drv.cuDevicePrimaryCtxRelease(1));

	OK(drv.cuCtxPushCurrent(ctx0));
	OK(drv.cuCtxGetDevice(&d));
	CHECK(d == 0);
	OK(drv.cuCtxPushCurrent(ctx1));
	OK(drv.cuCtxGetDevice(&d));
	CHECK(d == 1);
	OK(drv.cuCtxGetId(NULL, &id1));
	OK(drv.cuCtxGetId(ctx0, &id0));
	CHECK(id0 != id1);
	OK(drv.cuCtxPopCurrent(&popped));
	CHECK(popped == ctx1);
	OK(drv.cuCtxGetCurrent(&c));
	CHECK(c == ctx0);
	OK(drv.cuCtxPopCurrent(NULL));
	CHECK_RC(drv.cuCtxPopCurrent(NULL), CUDA_ERROR_INVALID_CONTEXT);
	CHECK_RC(drv.cuCtxSetCurrent((CUcontext)&c), CUDA_ERROR_INVALID_CONTEXT);
	OK(drv.cuCtxSetCurrent(ctx0));
}

static void test_vmm_basics(void)
{
	CUmemAllocationProp prop = device_prop(0, false);
	CUmemGenericAllocationHandle h1, h2;
	CUmemLocation loc = { CU_MEM_LOCATION_TYPE_DEVICE, 0 };
	unsigned long long flags;
	size_t g, free_before, free_now, total;
	CUdeviceptr va;
	struct sim_live live;

	OK(drv.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CHECK(g == gran);
	prop.location.id = 7;
	CHECK_RC(drv.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
		 CUDA_ERROR_INVALID_DEVICE);
	prop.location.id = 0;

	CHECK_RC(drv.cuMemAddressReserve(&va, gran + 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
	OK(drv.cuMemAddressReserve(&va, 4 * gran, 8 * gran, 0, 0));
	CHECK(va % (8 * gran) == 0);
	CHECK_RC(drv.cuMemCreate(&h1, gran + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	OK(drv.cuMemGetInfo(&free_before, &total));
	OK(drv.cuMemCreate(&h1, 2 * gran, &prop, 0));
	OK(drv.cuMemCreate(&h2, 2 * gran, &prop, 0));
	OK(drv.cuMemGetInfo(&free_now, &total));
	CHECK(free_before - free_now == 4 * gran);

	CHECK_RC(drv.cuMemMap(va, 2 * gran, gran, h1, 0), CUDA_ERROR_NOT_SUPPORTED);
	CHECK_RC(drv.cuMemMap(va + 3 * gran, 2 * gran, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuMemMap(va, 2 * gran, 0, 0xdeadbeef, 0), CUDA_ERROR_INVALID_VALUE);
	OK(drv.cuMemMap(va, 2 * gran, 0, h1, 0));
	CHECK_RC(drv.cuMemMap(va + gran, 2 * gran, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
	OK(drv.cuMemMap(va + 2 * gran, gran, 0, h2, 0));	/* a prefix of h2 */

	/* Mapped but not yet accessible, as on a GPU. */
	OK(drv.cuMemGetAccess(&flags, &loc, va));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
	CHECK(touch_faults(PTR(va), TOUCH_READ));
	CHECK_RC(set_access(va, gran, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
		 CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(set_access(va, 4 * gran, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
		 CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(set_access(va, 3 * gran, 9, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
		 CUDA_ERROR_INVALID_DEVICE);
	OK(set_access(va, 3 * gran, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
	OK(drv.cuMemGetAccess(&flags, &loc, va + 2 * gran + 5));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	loc.id = 1;
	OK(drv.cuMemGetAccess(&flags, &loc, va));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);

	memset(PTR(va), 0xab, 3 * gran);
	CHECK(PTR(va)[3 * gran - 1] == 0xab);
	CHECK(!touch_faults(PTR(va), TOUCH_WRITE));
	CHECK(touch_faults(PTR(va + 3 * gran), TOUCH_READ));	/* reserved, not mapped */

	CHECK_RC(drv.cuMemAddressFree(va, 4 * gran), CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuMemUnmap(va, gran), CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuMemUnmap(va + gran, 2 * gran), CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuMemUnmap(va, 4 * gran), CUDA_ERROR_INVALID_VALUE);
	drv.sim_live_get(&live);
	CHECK(live.mappings == 2 && live.handles == 2 && live.reservations == 1);
	/* Two whole adjacent mappings at once. */
	OK(drv.cuMemUnmap(va, 3 * gran));
	CHECK(touch_faults(PTR(va), TOUCH_READ));
	CHECK_RC(drv.cuMemGetAccess(&flags, &loc, va), CUDA_ERROR_INVALID_VALUE);
	OK(drv.cuMemRelease(h1));
	OK(drv.cuMemRelease(h2));
	CHECK_RC(drv.cuMemRelease(h2), CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuMemAddressFree(va, 2 * gran), CUDA_ERROR_INVALID_VALUE);
	OK(drv.cuMemAddressFree(va, 4 * gran));
	OK(drv.cuMemGetInfo(&free_now, &total));
	CHECK(free_now == free_before);
	check_no_leaks();
}

/* The NUMA node of the page at p (get_mempolicy, MPOL_F_NODE | MPOL_F_ADDR), or -1 where the
 * kernel does not say. */
static int page_node(const void *p)
{
	int node = -1;

	if (syscall(SYS_get_mempolicy, &node, NULL, 0ul, p, 3ul) != 0)
		return -1;
	return node;
}

static CUmemAllocationProp host_prop(CUmemLocationType type, int id)
{
	CUmemAllocationProp prop;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = type;
	prop.location.id = id;
	return prop;
}

static CUresult host_access(CUdeviceptr p, size_t size, CUmemLocationType type,
			    CUmemAccess_flags flags)
{
	CUmemAccessDesc d;

	memset(&d, 0, sizeof(d));
	d.location.type = type;
	d.flags = flags;
	return drv.cuMemSetAccess(p, size, &d, 1);
}

static void test_host_memory(void)
{
	CUmemAllocationProp prop = host_prop(CU_MEM_LOCATION_TYPE_HOST, 5), got;
	CUmemLocation host = { CU_MEM_LOCATION_TYPE_HOST, 0 };
	CUmemGenericAllocationHandle h, hn, hd;
	unsigned long long flags;
	size_t g, free_before, free_now, total;
	CUdeviceptr va;
	int v, numa;

	/* The device says so. */
	OK(drv.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED, 0));
	CHECK(v == 1);
	OK(drv.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
				    1));
	CHECK(v == 1);
	OK(drv.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED, 0));
	CHECK(v == 1);
	OK(drv.cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0));
	CHECK(numa >= -1);

	/* Granularity, and the driver's rules on the properties. */
	OK(drv.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CHECK(g == gran);
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CHECK_RC(drv.cuMemCreate(&h, gran, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
	prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
	CHECK_RC(drv.cuMemCreate(&h, gran, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
		 CUDA_ERROR_INVALID_VALUE);
	prop = host_prop(CU_MEM_LOCATION_TYPE_HOST_NUMA, 4096);
	CHECK_RC(drv.cuMemCreate(&h, gran, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	prop.location.id = -1;
	CHECK_RC(drv.cuMemCreate(&h, gran, &prop, 0), CUDA_ERROR_INVALID_VALUE);

	/* Host memory counts against no device. */
	OK(drv.cuMemGetInfo(&free_before, &total));
	prop = host_prop(CU_MEM_LOCATION_TYPE_HOST, 5);
	OK(drv.cuMemCreate(&h, gran, &prop, 0));
	OK(drv.cuMemGetAllocationPropertiesFromHandle(&got, h));
	CHECK(got.location.type == CU_MEM_LOCATION_TYPE_HOST && got.location.id == 0);
	prop = host_prop(CU_MEM_LOCATION_TYPE_HOST_NUMA, numa < 0 ? 0 : numa);
	OK(drv.cuMemCreate(&hn, gran, &prop, 0));
	OK(drv.cuMemGetAllocationPropertiesFromHandle(&got, hn));
	CHECK(got.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA &&
	      got.location.id == prop.location.id);
	OK(drv.cuMemGetInfo(&free_now, &total));
	CHECK(free_now == free_before);

	/* Mapped, it is out of the CPU's reach until the CPU is granted access. */
	OK(drv.cuMemAddressReserve(&va, 4 * gran, 0, 0, 0));
	OK(drv.cuMemMap(va, gran, 0, h, 0));
	OK(drv.cuMemMap(va + gran, gran, 0, hn, 0));
	CHECK(touch_faults(PTR(va), TOUCH_READ));
	CHECK(touch_faults(PTR(va + gran), TOUCH_WRITE));
	OK(drv.cuMemGetAccess(&flags, &host, va));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
	/* HOST_NUMA access only for HOST_NUMA memory; HOST_NUMA_CURRENT never. */
	CHECK_RC(host_access(va, 2 * gran, CU_MEM_LOCATION_TYPE_HOST_NUMA,
			     CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
		 CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(host_access(va + gran, gran, CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT,
			     CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
		 CUDA_ERROR_INVALID_VALUE);
	CHECK(touch_faults(PTR(va), TOUCH_READ)); /* the refusals changed nothing */
	OK(host_access(va, gran, CU_MEM_LOCATION_TYPE_HOST, CU_MEM_ACCESS_FLAGS_PROT_READ));
	CHECK(!touch_faults(PTR(va), TOUCH_READ));
	CHECK(touch_faults(PTR(va), TOUCH_WRITE));
	OK(host_access(va, gran, CU_MEM_LOCATION_TYPE_HOST, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
	OK(host_access(va + gran, gran, CU_MEM_LOCATION_TYPE_HOST_NUMA,
		       CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
	OK(drv.cuMemGetAccess(&flags, &host, va + gran));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	memset(PTR(va), 0x5a, 2 * gran);
	CHECK(PTR(va)[2 * gran - 1] == 0x5a);
	/* Where the machine says, the HOST_NUMA memory's pages are on its node. */
	if (numa >= 0) {
		int node = page_node(PTR(va + gran));
		CHECK(node == -1 || node == numa);
	}
	/* A device granted access too: a copy engine reaches it (the sim's streams are the CPU). */
	OK(set_access(va, 2 * gran, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
	OK(drv.cuMemsetD8(va, 0x11, gran));
	CHECK(PTR(va)[gran - 1] == 0x11);
	/* Revoked from both, the CPU faults again. */
	OK(set_access(va, gran, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE));
	OK(host_access(va, gran, CU_MEM_LOCATION_TYPE_HOST, CU_MEM_ACCESS_FLAGS_PROT_NONE));
	CHECK(touch_faults(PTR(va), TOUCH_READ));
	OK(drv.cuMemUnmap(va, 2 * gran));
	OK(drv.cuMemRelease(h));
	OK(drv.cuMemRelease(hn));

	/* Host access to device memory is refused, and leaves it as it was. */
	prop = device_prop(0, false);
	OK(drv.cuMemCreate(&hd, gran, &prop, 0));
	OK(drv.cuMemMap(va, gran, 0, hd, 0));
	OK(set_access(va, gran, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
	CHECK_RC(host_access(va, gran, CU_MEM_LOCATION_TYPE_HOST, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
		 CUDA_ERROR_NOT_SUPPORTED);
	CHECK_RC(host_access(va, gran, CU_MEM_LOCATION_TYPE_HOST_NUMA,
			     CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
		 CUDA_ERROR_INVALID_VALUE);
	OK(drv.cuMemGetAccess(&flags, &host, va));
	CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
	OK(drv.cuMemUnmap(va, gran));
	OK(drv.cuMemRelease(hd));

	/* A driver without host memory through these calls: it says so, and device memory
	 * works as before. */
	drv.sim_host_vmm(0);
	OK(drv.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED, 0));
	CHECK(v == 0);
	OK(drv.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
				    0));
	CHECK(v == 0);
	prop = host_prop(CU_MEM_LOCATION_TYPE_HOST, 0);
	CHECK_RC(drv.cuMemCreate(&h, gran, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
	CHECK_RC(drv.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
		 CUDA_ERROR_NOT_SUPPORTED);
	prop = host_prop(CU_MEM_LOCATION_TYPE_HOST_NUMA, 0);
	CHECK_RC(drv.cuMemCreate(&h, gran, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
	prop = device_prop(0, false);
	OK(drv.cuMemCreate(&hd, gran, &prop, 0));
	OK(drv.cuMemRelease(hd));
	drv.sim_host_vmm(1);
	OK(drv.cuMemAddressFree(va, 4 * gran));
	check_no_leaks();
}

static void test_vmm_handles(void)
{
	CUmemAllocationProp prop = device_prop(1, true), got;
	CUmemGenericAllocationHandle h, retained, imported;
	CUdeviceptr va, va2;
	struct sim_live live;
	int fd;

	OK(drv.cuMemAddressReserve(&va, 2 * gran, 0, 0, 0));
	OK(drv.cuMemAddressReserve(&va2, 2 * gran, 0, 0, 0));
	OK(drv.cuMemCreate(&h, 2 * gran, &prop, 0));
	OK(drv.cuMemGetAllocationPropertiesFromHandle(&got, h));
	CHECK(got.location.id == 1 &&
	      got.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	OK(drv.cuMemMap(va, 2 * gran, 0, h, 0));
	OK(set_access(va, 2 * gran, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));

	/* Released while mapped: the memory lives until the unmap. */
	OK(drv.cuMemRelease(h));
	PTR(va)[100] = 7;
	drv.sim_live_get(&live);
	CHECK(live.handles == 0 && live.phys_bytes == 2 * gran);
	OK(drv.cuMemRetainAllocationHandle(&retained, PTR(va) + gran + 3));
	CHECK(retained == h);

	/* Export and import: the same memory through a second handle and address. */
	OK(drv.cuMemExportToShareableHandle(&fd, retained,
					    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	OK(drv.cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd,
					      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	close(fd);
	CHECK(imported != retained);
	OK(drv.cuMemMap(va2, 2 * gran, 0, imported, 0));
	OK(set_access(va2, 2 * gran, 0, CU_MEM_ACCESS_FLAGS_PROT_READ));
	CHECK(PTR(va2)[100] == 7);
	PTR(va)[101] = 9;
	CHECK(PTR(va2)[101] == 9);
	CHECK(touch_faults(PTR(va2), TOUCH_WRITE));	/* read-only */
	drv.sim_live_get(&live);
	CHECK(live.phys_bytes == 2 * gran);

	OK(drv.cuMemUnmap(va, 2 * gran));
	OK(drv.cuMemRelease(retained));
	OK(drv.cuMemUnmap(va2, 2 * gran));
	OK(drv.cuMemRelease(imported));
	OK(drv.cuMemAddressFree(va, 2 * gran));
	OK(drv.cuMemAddressFree(va2, 2 * gran));

	/* Exporting needs the handle type at creation. */
	prop = device_prop(0, false);
	OK(drv.cuMemCreate(&h, gran, &prop, 0));
	CHECK_RC(drv.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
						  0),
		 CUDA_ERROR_INVALID_VALUE);
	OK(drv.cuMemRelease(h));
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
	CHECK_RC(drv.cuMemCreate(&h, gran, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
	check_no_leaks();
}

static void test_out_of_memory(void)
{
	CUmemAllocationProp prop = device_prop(0, false);
	CUmemGenericAllocationHandle h[40], extra;
	size_t n = (64u << 20) / gran, free_bytes, total;

	for (size_t i = 0; i < n; i++)
		OK(drv.cuMemCreate(&h[i], gran, &prop, 0));
	OK(drv.cuMemGetInfo(&free_bytes, &total));
	CHECK(free_bytes == 0);
	CHECK_RC(drv.cuMemCreate(&extra, gran, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
	/* Device 1 has its own memory. */
	prop.location.id = 1;
	OK(drv.cuMemCreate(&extra, gran, &prop, 0));
	OK(drv.cuMemRelease(extra));
	prop.location.id = 0;
	OK(drv.cuMemRelease(h[0]));
	OK(drv.cuMemCreate(&h[0], gran, &prop, 0));
	for (size_t i = 0; i < n; i++)
		OK(drv.cuMemRelease(h[i]));
	check_no_leaks();
}

static void test_fault_injection(void)
{
	CUmemAllocationProp prop = device_prop(0, false);
	CUmemGenericAllocationHandle h1, h2, h3;
	CUdeviceptr va;
	struct sim_live live;

	drv.sim_counts_reset();
	drv.sim_fail("cuMemCreate", 2, CUDA_ERROR_OUT_OF_MEMORY);
	drv.sim_fail("cuMemMap", 1, CUDA_ERROR_UNKNOWN);
	drv.sim_fail("cuMemAddressFree", 1, CUDA_ERROR_UNKNOWN);
	drv.sim_fail("cuMemAddressFree", 0, CUDA_SUCCESS);	/* removed again */
	OK(drv.cuMemCreate(&h1, gran, &prop, 0));
	CHECK_RC(drv.cuMemCreate(&h2, gran, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
	drv.sim_live_get(&live);
	CHECK(live.handles == 1);	/* the failed call did nothing */
	OK(drv.cuMemCreate(&h2, gran, &prop, 0));
	OK(drv.cuMemAddressReserve(&va, gran, 0, 0, 0));
	CHECK_RC(drv.cuMemMap(va, gran, 0, h1, 0), CUDA_ERROR_UNKNOWN);
	drv.sim_live_get(&live);
	CHECK(live.mappings == 0);
	OK(drv.cuMemMap(va, gran, 0, h1, 0));
	OK(drv.cuMemUnmap(va, gran));
	CHECK(drv.sim_calls("cuMemCreate") == 3);
	CHECK(drv.sim_calls("cuMemMap") == 2);
	CHECK(drv.sim_calls("cuMemAddressFree") == 0);

	/* Two rules on one entry point count independently. */
	drv.sim_fail("cuMemCreate", 1, CUDA_ERROR_INVALID_VALUE);
	drv.sim_fail("cuMemCreate", 3, CUDA_ERROR_NOT_PERMITTED);
	CHECK_RC(drv.cuMemCreate(&h3, gran, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	OK(drv.cuMemCreate(&h3, gran, &prop, 0));
	OK(drv.cuMemRelease(h3));
	CHECK_RC(drv.cuMemCreate(&h3, gran, &prop, 0), CUDA_ERROR_NOT_PERMITTED);
	drv.sim_fail("cuMemRelease", 1, CUDA_ERROR_UNKNOWN);
	drv.sim_fail_clear();
	OK(drv.cuMemRelease(h1));
	OK(drv.cuMemRelease(h2));
	OK(drv.cuMemAddressFree(va, gran));
	CHECK(drv.sim_calls("cuMemRelease") == 3);
	CHECK(drv.sim_calls("cuNoSuchEntryPoint") == 0);
	drv.sim_counts_reset();
	CHECK(drv.sim_calls("cuMemRelease") == 0);

	/* Faults at a rate: all, none, about the share asked, the same again for a seed. */
	{
		unsigned long before = drv.sim_fails("cuMemCreate"), hits[2] = {0, 0};

		drv.sim_fail_rate("cuMemCreate", 1.0, CUDA_ERROR_OUT_OF_MEMORY);
		for (int i = 0; i < 10; i++)
			CHECK_RC(drv.cuMemCreate(&h3, gran, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
		CHECK(drv.sim_fails("cuMemCreate") == before + 10);
		drv.sim_live_get(&live);
		CHECK(live.handles == 0);
		for (int round = 0; round < 2; round++) {
			drv.sim_fail_seed(7);
			drv.sim_fail_rate("cuMemGetAllocationGranularity", 0.25, CUDA_ERROR_UNKNOWN);
			for (int i = 0; i < 4000; i++) {
				size_t g;
				CUresult rc = drv.cuMemGetAllocationGranularity(
					&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
				CHECK(rc == CUDA_SUCCESS || rc == CUDA_ERROR_UNKNOWN);
				hits[round] += rc != CUDA_SUCCESS;
			}
		}
		CHECK(hits[0] == hits[1] && hits[0] > 800 && hits[0] < 1200);
		drv.sim_fail_rate("cuMemCreate", 0.0, CUDA_SUCCESS);
		OK(drv.cuMemCreate(&h3, gran, &prop, 0));
		OK(drv.cuMemRelease(h3));
		drv.sim_fail_clear();
		for (int i = 0; i < 100; i++) {
			size_t g;
			OK(drv.cuMemGetAllocationGranularity(&g, &prop,
							     CU_MEM_ALLOC_GRANULARITY_MINIMUM));
		}
	}
	check_no_leaks();
}

static void test_stream_order(void)
{
	struct gate g = GATE_INIT;
	struct buffer b;
	unsigned char host[64];
	CUstream s, s2;
	unsigned long long id, id2;
	CUcontext c;

	buffer_new(&b, gran);
	memset(host, 0x11, sizeof(host));
	OK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(drv.cuStreamGetCtx(s, &c));
	CHECK(c == ctx0);
	log_reset();
	OK(drv.cuLaunchHostFunc(s, gate_wait, &g));
	OK(log_on(s, 'A'));
	OK(drv.cuMemsetD8Async(b.va, 0x5a, 4096, s));
	OK(drv.cuMemcpyDtoHAsync(host, b.va + 10, 16, s));
	OK(log_on(s, 'B'));
	CHECK_RC(drv.cuStreamQuery(s), CUDA_ERROR_NOT_READY);
	msleep(30);
	CHECK(log_is(""));
	CHECK(PTR(b.va)[0] == 0 && host[0] == 0x11);
	gate_open(&g);
	OK(drv.cuStreamSynchronize(s));
	OK(drv.cuStreamQuery(s));
	CHECK(log_is("AB"));
	CHECK(PTR(b.va)[4095] == 0x5a && PTR(b.va)[4096] == 0);
	CHECK(host[0] == 0x5a && host[15] == 0x5a && host[16] == 0x11);

	/* Synchronous copies and a D32 memset. */
	memset(host, 0x33, sizeof(host));
	OK(drv.cuMemcpyHtoD(b.va + 64, host, sizeof(host)));
	CHECK(PTR(b.va)[64] == 0x33);
	OK(drv.cuMemsetD32Async(b.va + 128, 0x01020304u, 4, s));
	OK(drv.cuMemcpyDtoDAsync(b.va + 256, b.va + 128, 16, s));
	OK(drv.cuStreamSynchronize(s));
	CHECK(*(uint32_t *)(void *)PTR(b.va + 268) == 0x01020304u);
	CHECK_RC(drv.cuMemsetD32Async(b.va + 2, 0, 1, s), CUDA_ERROR_INVALID_VALUE);

	OK(drv.cuStreamGetId(s, &id));
	OK(drv.cuStreamDestroy(s));
	OK(drv.cuStreamCreate(&s2, 0));
	OK(drv.cuStreamGetId(s2, &id2));
	CHECK(id != id2);
	OK(drv.cuStreamDestroy(s2));
	CHECK_RC(drv.cuStreamDestroy(s2), CUDA_ERROR_INVALID_HANDLE);
	CHECK_RC(drv.cuStreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
	buffer_free(&b);
	check_no_leaks();
}

static CUresult host_call_result = CUDA_SUCCESS;

static void CUDA_CB call_driver(void *arg)
{
	unsigned long long id;

	host_call_result = drv.cuStreamGetId((CUstream)arg, &id);
}

static int callbacks_seen;

static void CUDA_CB count_callback(CUstream s, CUresult status, void *arg)
{
	(void)s;
	if (status == CUDA_SUCCESS && arg == &callbacks_seen)
		callbacks_seen++;
}

static void test_host_functions(void)
{
	CUstream s;

	OK(drv.cuStreamCreate(&s, 0));
	OK(drv.cuLaunchHostFunc(s, call_driver, s));
	OK(drv.cuStreamAddCallback(s, count_callback, &callbacks_seen, 0));
	OK(drv.cuStreamSynchronize(s));
	CHECK(host_call_result == CUDA_ERROR_NOT_PERMITTED);
	CHECK(callbacks_seen == 1);
	OK(drv.cuStreamDestroy(s));
	check_no_leaks();
}

static void test_events(void)
{
	struct gate g = GATE_INIT, g2 = GATE_INIT;
	CUstream a, b, c;
	CUevent e, never, t0, t1, untimed;
	float ms;

	OK(drv.cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
	OK(drv.cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
	OK(drv.cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
	OK(drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
	OK(drv.cuEventCreate(&never, CU_EVENT_DEFAULT));
	OK(drv.cuEventQuery(never));
	OK(drv.cuEventSynchronize(never));
	log_reset();

	OK(drv.cuLaunchHostFunc(a, gate_wait, &g));
	OK(log_on(a, 'A'));
	OK(drv.cuEventRecord(e, a));
	CHECK_RC(drv.cuEventQuery(e), CUDA_ERROR_NOT_READY);
	OK(drv.cuStreamWaitEvent(b, e, 0));
	OK(drv.cuStreamWaitEvent(b, never, 0));	/* no-op */
	OK(log_on(b, 'B'));
	/* Re-recording on an idle stream does not move the wait enqueued above. */
	OK(drv.cuEventRecord(e, c));
	OK(drv.cuEventSynchronize(e));
	OK(drv.cuStreamWaitEvent(c, never, 0));
	OK(log_on(c, 'C'));
	OK(drv.cuStreamSynchronize(c));
	msleep(30);
	CHECK(log_is("C"));
	CHECK_RC(drv.cuStreamQuery(b), CUDA_ERROR_NOT_READY);
	gate_open(&g);
	OK(drv.cuStreamSynchronize(b));
	CHECK(log_is("CAB"));

	/* Timing. */
	OK(drv.cuEventCreate(&t0, 0));
	OK(drv.cuEventCreate(&t1, CU_EVENT_BLOCKING_SYNC));
	CHECK_RC(drv.cuEventElapsedTime(&ms, t0, t1), CUDA_ERROR_INVALID_HANDLE);
	OK(drv.cuEventRecord(t0, a));
	OK(drv.cuLaunchHostFunc(a, log_letter, (void *)"D"));
	OK(drv.cuEventRecord(t1, a));
	OK(drv.cuEventSynchronize(t1));
	OK(drv.cuEventElapsedTime(&ms, t0, t1));
	CHECK(ms >= 0.0f);
	untimed = e;
	CHECK_RC(drv.cuEventElapsedTime(&ms, t0, untimed), CUDA_ERROR_INVALID_HANDLE);

	/* Destroying an event with a record pending is fine. */
	OK(drv.cuLaunchHostFunc(a, gate_wait, &g2));
	OK(drv.cuEventRecord(t0, a));
	OK(drv.cuEventDestroy(t0));
	CHECK_RC(drv.cuEventQuery(t0), CUDA_ERROR_INVALID_HANDLE);
	gate_open(&g2);
	OK(drv.cuStreamSynchronize(a));

	OK(drv.cuEventDestroy(t1));
	OK(drv.cuEventDestroy(e));
	OK(drv.cuEventDestroy(never));
	OK(drv.cuStreamDestroy(a));
	OK(drv.cuStreamDestroy(b));
	OK(drv.cuStreamDestroy(c));
	check_no_leaks();
}

/*
 * Interprocess events in one process: the driver's argument rules, and
 * order through the shared page. Across processes: test/ipc-events.c.
 */
static void test_ipc_events(void)
{
	struct gate g = GATE_INIT;
	CUipcEventHandle h, junk;
	CUstream a, b;
	CUevent e, plain, opened;

	CHECK_RC(drv.cuEventCreate(&e, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
	OK(drv.cuEventCreate(&e, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
	OK(drv.cuEventCreate(&plain, CU_EVENT_DISABLE_TIMING));
	CHECK_RC(drv.cuIpcGetEventHandle(&h, plain), CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuIpcGetEventHandle(NULL, e), CUDA_ERROR_INVALID_VALUE);
	OK(drv.cuIpcGetEventHandle(&h, e));
	/* Opened by other processes only; a handle sim did not write is refused. */
	CHECK_RC(drv.cuIpcOpenEventHandle(&opened, h), CUDA_ERROR_INVALID_CONTEXT);
	memset(&junk, 0x5a, sizeof(junk));
	CHECK_RC(drv.cuIpcOpenEventHandle(&opened, junk), CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuIpcOpenEventHandle(NULL, h), CUDA_ERROR_INVALID_VALUE);

	OK(drv.cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
	OK(drv.cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
	OK(drv.cuEventQuery(e));	/* never recorded */
	OK(drv.cuStreamWaitEvent(b, e, 0));	/* no-op */
	log_reset();
	OK(drv.cuLaunchHostFunc(a, gate_wait, &g));
	OK(log_on(a, 'A'));
	OK(drv.cuEventRecord(e, a));
	CHECK_RC(drv.cuEventQuery(e), CUDA_ERROR_NOT_READY);
	OK(drv.cuStreamWaitEvent(b, e, 0));
	OK(log_on(b, 'B'));
	msleep(30);
	CHECK(log_is(""));
	gate_open(&g);
	OK(drv.cuEventSynchronize(e));
	OK(drv.cuStreamSynchronize(b));
	CHECK(log_is("AB"));
	OK(drv.cuEventQuery(e));

	OK(drv.cuEventDestroy(e));
	OK(drv.cuEventDestroy(plain));
	OK(drv.cuStreamDestroy(a));
	OK(drv.cuStreamDestroy(b));
	check_no_leaks();
}

struct opener {
	struct gate *gate;
	int delay_ms;
};

static void *open_later(void *arg)
{
	struct opener *o = arg;

	msleep(o->delay_ms);
	gate_open(o->gate);
	return NULL;
}

static void test_legacy_stream(void)
{
	struct gate g1 = GATE_INIT, g2 = GATE_INIT, g3 = GATE_INIT, g4 = GATE_INIT;
	struct opener o = { &g4, 50 };
	CUstream blocking, nonblocking;
	pthread_t t;

	OK(drv.cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
	OK(drv.cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));

	/* Legacy work waits for earlier work on blocking streams only. */
	log_reset();
	OK(drv.cuLaunchHostFunc(blocking, gate_wait, &g1));
	OK(log_on(blocking, 'A'));
	OK(log_on(NULL, 'L'));
	OK(log_on(nonblocking, 'N'));
	OK(drv.cuStreamSynchronize(nonblocking));
	msleep(30);
	CHECK(log_is("N"));
	CHECK_RC(drv.cuStreamQuery(NULL), CUDA_ERROR_NOT_READY);
	gate_open(&g1);
	OK(drv.cuStreamSynchronize(CU_STREAM_LEGACY));
	CHECK(log_is("NAL"));

	/* Blocking streams (and the per-thread stream) wait for earlier legacy work. */
	log_reset();
	OK(drv.cuLaunchHostFunc(CU_STREAM_LEGACY, gate_wait, &g2));
	OK(log_on(blocking, 'B'));
	OK(log_on(CU_STREAM_PER_THREAD, 'P'));
	OK(log_on(nonblocking, 'N'));
	OK(drv.cuStreamSynchronize(nonblocking));
	msleep(30);
	CHECK(log_is("N"));
	CHECK_RC(drv.cuStreamQuery(blocking), CUDA_ERROR_NOT_READY);
	gate_open(&g2);
	OK(drv.cuStreamSynchronize(blocking));
	OK(drv.cuStreamSynchronize(CU_STREAM_PER_THREAD));
	CHECK(log_is_either("NBP", "NPB"));

	/* Synchronising the legacy stream covers blocking streams, not the others. */
	OK(drv.cuLaunchHostFunc(nonblocking, gate_wait, &g3));
	OK(drv.cuStreamQuery(NULL));
	OK(drv.cuStreamSynchronize(NULL));
	gate_open(&g3);

	/* cuCtxSynchronize waits for everything in the context. */
	log_reset();
	OK(drv.cuLaunchHostFunc(nonblocking, gate_wait, &g4));
	OK(log_on(nonblocking, 'Z'));
	CHECK(pthread_create(&t, NULL, open_later, &o) == 0);
	OK(drv.cuCtxSynchronize());
	CHECK(log_is("Z"));
	pthread_join(t, NULL);

	OK(drv.cuStreamDestroy(blocking));
	OK(drv.cuStreamDestroy(nonblocking));
	check_no_leaks();
}

static void test_stream_destroy_pending(void)
{
	struct gate g = GATE_INIT, done = GATE_INIT;
	struct buffer b;
	struct sim_live live;
	CUstream s, s2;

	buffer_new(&b, gran);
	OK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(drv.cuLaunchHostFunc(s, gate_wait, &g));
	OK(drv.cuMemsetD8Async(b.va, 0x77, gran, s));
	OK(drv.cuLaunchHostFunc(s, gate_open_fn, &done));
	OK(drv.cuStreamDestroy(s));	/* returns at once */
	drv.sim_live_get(&live);
	CHECK(live.streams == 0);
	CHECK_RC(drv.cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
	OK(drv.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
	/* As on the driver, the value comes back at once, while the old stream still drains. */
	CHECK(recycling ? s2 == s : s2 != s);
	msleep(20);
	CHECK(PTR(b.va)[0] == 0);
	gate_open(&g);
	gate_wait(&done);
	OK(drv.cuStreamSynchronize(s2));
	CHECK(PTR(b.va)[gran - 1] == 0x77);
	OK(drv.cuStreamDestroy(s2));
	buffer_free(&b);
	check_no_leaks();
}

/*
 * Once 32 streams of a context exist, a destroyed one with work pending among them, creating
 * another waits for that work (the driver's did from 35 or 36 on, on H100s); with no such
 * work it does not.
 */
static void test_stream_create_waits(void)
{
	struct gate g = GATE_INIT;
	struct opener o = { &g, 100 };
	struct timespec t0, t1;
	CUstream s, many[40];
	pthread_t t;
	int i;

	OK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(drv.cuLaunchHostFunc(s, gate_wait, &g));
	OK(drv.cuStreamDestroy(s));
	for (i = 0; i < 31; i++)
		OK(drv.cuStreamCreate(&many[i], CU_STREAM_NON_BLOCKING));
	CHECK(pthread_create(&t, NULL, open_later, &o) == 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	OK(drv.cuStreamCreate(&many[31], CU_STREAM_NON_BLOCKING));
	clock_gettime(CLOCK_MONOTONIC, &t1);
	CHECK((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 >= 50);
	pthread_join(t, NULL);
	for (i = 32; i < 40; i++)
		OK(drv.cuStreamCreate(&many[i], CU_STREAM_NON_BLOCKING));
	for (i = 0; i < 40; i++)
		OK(drv.cuStreamDestroy(many[i]));
	check_no_leaks();
}

/* ---- handle values: recycled at once (the driver's way) or fresh ---- */

static CUstream callback_stream;

static void CUDA_CB note_stream(CUstream s, CUresult status, void *arg)
{
	(void)status;
	(void)arg;
	callback_stream = s;
}

/*
 * A destroyed stream's value names the next stream at once, while the old
 * stream's work still runs; the old stream is reachable only through what
 * was enqueued or recorded before.
 */
static void test_stream_handle_reuse(void)
{
	struct gate g = GATE_INIT;
	struct buffer b;
	struct sim_live live;
	CUstream s, s2, w, x, y, x2, y2;
	CUevent e, e2;
	unsigned long long id, id2;
	CUcontext c;

	drv.sim_handles_recycle(1);
	buffer_new(&b, gran);
	log_reset();
	OK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(drv.cuStreamCreate(&w, CU_STREAM_NON_BLOCKING));
	OK(drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
	OK(drv.cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING));
	OK(drv.cuStreamGetId(s, &id));
	OK(drv.cuLaunchHostFunc(s, gate_wait, &g));
	OK(log_on(s, 'A'));
	OK(drv.cuMemsetD8Async(b.va, 0x42, gran, s));
	OK(drv.cuStreamAddCallback(s, note_stream, NULL, 0));
	OK(log_on(s, 'B'));
	OK(drv.cuEventRecord(e, s));
	OK(drv.cuStreamWaitEvent(w, e, 0));
	OK(log_on(w, 'W'));

	OK(drv.cuStreamDestroy(s));	/* returns at once, with A, B and the record queued */
	OK(drv.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
	CHECK(s2 == s);
	OK(drv.cuStreamGetId(s2, &id2));
	CHECK(id2 != id);
	OK(drv.cuStreamGetCtx(s2, &c));
	CHECK(c == ctx0);
	drv.sim_live_get(&live);
	CHECK(live.streams == 2);

	/* The value names the new, idle stream; the old one's work is still held up. */
	OK(drv.cuStreamQuery(s2));
	OK(log_on(s2, 'C'));
	OK(drv.cuEventRecord(e2, s2));
	OK(drv.cuStreamSynchronize(s2));
	OK(drv.cuEventSynchronize(e2));
	CHECK(log_is("C"));
	CHECK_RC(drv.cuEventQuery(e), CUDA_ERROR_NOT_READY);
	CHECK_RC(drv.cuStreamQuery(w), CUDA_ERROR_NOT_READY);
	CHECK(PTR(b.va)[0] == 0);

	/* The old stream finishes in order; the wait enqueued before holds. */
	gate_open(&g);
	OK(drv.cuEventSynchronize(e));
	OK(drv.cuStreamSynchronize(w));
	CHECK(log_is("CABW"));
	CHECK(PTR(b.va)[gran - 1] == 0x42);
	/* The callback hands back the value as it was named, which names s2 by now. */
	CHECK(callback_stream == s);

	OK(drv.cuStreamDestroy(s2));
	CHECK_RC(drv.cuStreamDestroy(s2), CUDA_ERROR_INVALID_HANDLE);
	CHECK_RC(drv.cuStreamGetId(s2, &id2), CUDA_ERROR_INVALID_HANDLE);

	/* Most recently destroyed first. */
	OK(drv.cuStreamCreate(&x, 0));
	OK(drv.cuStreamCreate(&y, 0));
	OK(drv.cuStreamDestroy(x));
	OK(drv.cuStreamDestroy(y));
	OK(drv.cuStreamCreate(&y2, 0));
	OK(drv.cuStreamCreate(&x2, 0));
	CHECK(y2 == y && x2 == x);
	CHECK(x != CU_STREAM_LEGACY && x != CU_STREAM_PER_THREAD && x != NULL);
	CHECK((uintptr_t)x % 16 == 0);
	/* Streams and events never share a value. */
	CHECK((uintptr_t)x != (uintptr_t)e && (uintptr_t)y != (uintptr_t)e2);
	OK(drv.cuStreamDestroy(x2));
	OK(drv.cuStreamDestroy(y2));

	OK(drv.cuEventDestroy(e));
	OK(drv.cuEventDestroy(e2));
	OK(drv.cuStreamDestroy(w));
	buffer_free(&b);
	drv.sim_handles_recycle(recycling);
	check_no_leaks();
}

/* Events likewise: the value comes back at once, the pending record is the old event's. */
static void test_event_handle_reuse(void)
{
	struct gate g = GATE_INIT;
	CUstream s, w;
	CUevent e, e2;

	drv.sim_handles_recycle(1);
	log_reset();
	OK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(drv.cuStreamCreate(&w, CU_STREAM_NON_BLOCKING));
	OK(drv.cuEventCreate(&e, CU_EVENT_DEFAULT));
	OK(drv.cuLaunchHostFunc(s, gate_wait, &g));
	OK(log_on(s, 'A'));
	OK(drv.cuEventRecord(e, s));
	OK(drv.cuStreamWaitEvent(w, e, 0));
	OK(log_on(w, 'W'));
	OK(drv.cuEventDestroy(e));	/* with its record pending */
	OK(drv.cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING));
	CHECK(e2 == e);
	/* Never recorded: complete, and waiting on it waits for nothing. */
	OK(drv.cuEventQuery(e2));
	OK(drv.cuStreamWaitEvent(s, e2, 0));
	msleep(20);
	CHECK(log_is(""));
	CHECK_RC(drv.cuStreamQuery(w), CUDA_ERROR_NOT_READY);
	gate_open(&g);
	OK(drv.cuStreamSynchronize(w));
	CHECK(log_is("AW"));
	OK(drv.cuEventDestroy(e2));
	CHECK_RC(drv.cuEventQuery(e2), CUDA_ERROR_INVALID_HANDLE);
	CHECK_RC(drv.cuEventDestroy(e2), CUDA_ERROR_INVALID_HANDLE);
	OK(drv.cuStreamDestroy(s));
	OK(drv.cuStreamDestroy(w));
	drv.sim_handles_recycle(recycling);
	check_no_leaks();
}

/* Fresh mode: a value is never handed out twice; destroyed ones stay stale. */
static void test_fresh_handles(void)
{
	CUstream s, s2;
	CUevent e, e2;
	CUcontext c, c2, cur;

	drv.sim_handles_recycle(0);
	OK(drv.cuStreamCreate(&s, 0));
	OK(drv.cuEventCreate(&e, 0));
	OK(drv.cuStreamDestroy(s));
	OK(drv.cuEventDestroy(e));
	OK(drv.cuStreamCreate(&s2, 0));
	OK(drv.cuEventCreate(&e2, 0));
	CHECK(s2 != s && e2 != e);
	CHECK_RC(drv.cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
	CHECK_RC(drv.cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
	OK(drv.cuStreamDestroy(s2));
	OK(drv.cuEventDestroy(e2));
	OK(drv.cuCtxCreate(&c, NULL, 0, 0));
	OK(drv.cuCtxDestroy(c));
	OK(drv.cuCtxCreate(&c2, NULL, 0, 0));
	CHECK(c2 != c);
	CHECK_RC(drv.cuCtxPushCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
	OK(drv.cuCtxDestroy(c2));
	OK(drv.cuCtxGetCurrent(&cur));
	CHECK(cur == ctx0);

	/* Recycling again: the value destroyed last comes back. */
	drv.sim_handles_recycle(1);
	OK(drv.cuStreamCreate(&s, 0));
	CHECK(s == s2);
	OK(drv.cuStreamDestroy(s));
	drv.sim_handles_recycle(recycling);
	check_no_leaks();
}

/* ---- created contexts ---- */

/*
 * A reset ends the primary context's life: its streams and events die, calls in it fail until
 * it is retained again, and the handle it comes back with is the same, with a new id. Its
 * legacy and per-thread streams are new ones too, with new ids, as on an H200 (driver 580: the
 * legacy stream's id went from 7 to 16 over a reset, the per-thread stream's from 13 to 22): a
 * record that names a stream by its id meets them as streams it never saw.
 */
static void test_primary_reset(void)
{
	unsigned long long cid, cid2, leg, leg2, pt, pt2, sid, sid2, again;
	CUcontext c, c2, got;
	CUstream s, t;
	CUevent e;

	OK(drv.cuDevicePrimaryCtxRetain(&c, 1));
	OK(drv.cuCtxPushCurrent(c));
	OK(drv.cuCtxGetId(c, &cid));
	OK(drv.cuStreamGetId(CU_STREAM_LEGACY, &leg));
	OK(drv.cuStreamGetId(CU_STREAM_PER_THREAD, &pt));
	OK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(drv.cuStreamGetId(s, &sid));
	OK(drv.cuEventCreate(&e, 0));
	log_reset();
	OK(log_on(CU_STREAM_LEGACY, 'L'));
	OK(log_on(CU_STREAM_PER_THREAD, 'P'));
	OK(drv.cuEventRecord(e, s));

	/* The work queued runs first. */
	OK(drv.cuDevicePrimaryCtxReset(1));
	CHECK(log_is("LP"));
	CHECK_RC(drv.cuStreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_ERROR_CONTEXT_IS_DESTROYED);
	CHECK_RC(drv.cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
	CHECK_RC(drv.cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);

	OK(drv.cuDevicePrimaryCtxRetain(&c2, 1));
	CHECK(c2 == c);
	OK(drv.cuCtxGetId(c2, &cid2));
	CHECK(cid2 != cid);
	OK(drv.cuStreamGetId(CU_STREAM_LEGACY, &leg2));
	OK(drv.cuStreamGetId(CU_STREAM_PER_THREAD, &pt2));
	CHECK(leg2 != leg && leg2 != pt && leg2 != sid);
	CHECK(pt2 != pt && pt2 != leg && pt2 != sid && pt2 != leg2);
	/* The same streams from then on. */
	OK(drv.cuStreamGetId(NULL, &again));
	CHECK(again == leg2);
	OK(drv.cuStreamGetId(CU_STREAM_PER_THREAD, &again));
	CHECK(again == pt2);
	OK(drv.cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
	OK(drv.cuStreamGetId(t, &sid2));
	CHECK(sid2 != sid && sid2 != leg2 && sid2 != pt2);
	/* And they run work. */
	log_reset();
	OK(log_on(NULL, 'M'));
	OK(drv.cuStreamSynchronize(NULL));
	OK(log_on(CU_STREAM_PER_THREAD, 'N'));
	OK(drv.cuStreamSynchronize(CU_STREAM_PER_THREAD));
	OK(log_on(t, 'T'));
	OK(drv.cuStreamSynchronize(t));
	CHECK(log_is("MNT"));
	OK(drv.cuStreamDestroy(t));
	OK(drv.cuCtxPopCurrent(&got));
	CHECK(got == c2);
}

static void test_created_contexts(void)
{
	CUctxCreateParams params;
	CUcontext c, c2, cur, got;
	CUstream s, t, legacy_c;
	CUevent e;
	CUdevice d;
	unsigned long long id, id0, idc2, sid, sid0;
	struct sim_live live;
	struct gate g = GATE_INIT, g2 = GATE_INIT;
	struct opener o = { &g, 50 }, o2 = { &g2, 50 };
	struct buffer b;
	pthread_t th;

	CHECK_RC(drv.cuCtxCreate(&c, NULL, 3, 0), CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuCtxCreate(NULL, NULL, 0, 0), CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuCtxCreate(&c, NULL, 0, 7), CUDA_ERROR_INVALID_DEVICE);
	memset(&params, 0, sizeof(params));
	CHECK_RC(drv.cuCtxCreate(&c, &params, 0, 0), CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuCtxDestroy(NULL), CUDA_ERROR_INVALID_VALUE);
	CHECK_RC(drv.cuCtxDestroy(ctx0), CUDA_ERROR_INVALID_CONTEXT);

	drv.sim_handles_recycle(1);
	OK(drv.cuCtxGetId(ctx0, &id0));
	OK(drv.cuStreamGetId(NULL, &sid0));
	OK(drv.cuCtxCreate(&c, NULL, CU_CTX_SCHED_BLOCKING_SYNC, 1));
	CHECK(c != NULL && c != ctx0 && c != ctx1);
	OK(drv.cuCtxGetCurrent(&cur));
	CHECK(cur == c);		/* pushed, above ctx0 */
	OK(drv.cuCtxGetDevice(&d));
	CHECK(d == 1);
	OK(drv.cuCtxGetId(c, &id));
	CHECK(id != id0);
	drv.sim_live_get(&live);
	CHECK(live.contexts == 1);

	/* Its own legacy stream, per-thread stream, streams and events. */
	OK(drv.cuStreamGetId(NULL, &sid));
	CHECK(sid != sid0);
	OK(drv.cuStreamGetCtx(CU_STREAM_PER_THREAD, &got));
	CHECK(got == c);
	OK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(drv.cuStreamCreate(&t, 0));
	OK(drv.cuStreamGetCtx(s, &got));
	CHECK(got == c);
	OK(drv.cuStreamGetDevice(s, &d));
	CHECK(d == 1);
	OK(drv.cuEventCreate(&e, 0));
	legacy_c = CU_STREAM_LEGACY;
	OK(log_on(legacy_c, 'L'));
	OK(drv.cuStreamSynchronize(legacy_c));
	drv.sim_live_get(&live);
	CHECK(live.streams == 2 && live.events == 1);

	/* cuCtxSynchronize covers its streams. */
	log_reset();
	OK(drv.cuLaunchHostFunc(s, gate_wait, &g));
	OK(log_on(s, 'A'));
	CHECK(pthread_create(&th, NULL, open_later, &o) == 0);
	OK(drv.cuCtxSynchronize());
	CHECK(log_is("A"));
	pthread_join(th, NULL);

	/* cuCtxDestroy waits for queued work, a destroyed stream's included. The buffer is
	 * device 0's: device 1's streams reach it once granted access. */
	buffer_new(&b, gran);
	OK(set_access(b.va, gran, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
	log_reset();
	OK(drv.cuLaunchHostFunc(s, gate_wait, &g2));
	OK(drv.cuMemsetD8Async(b.va, 0x24, gran, s));
	OK(log_on(s, 'B'));
	OK(drv.cuEventRecord(e, s));
	OK(log_on(t, 'T'));
	OK(drv.cuStreamDestroy(s));
	CHECK(pthread_create(&th, NULL, open_later, &o2) == 0);
	OK(drv.cuCtxDestroy(c));
	CHECK(log_is_either("BT", "TB"));
	CHECK(PTR(b.va)[gran - 1] == 0x24);
	pthread_join(th, NULL);

	/* Popped, and everything it held is gone; the memory is not its own. */
	OK(drv.cuCtxGetCurrent(&cur));
	CHECK(cur == ctx0);
	drv.sim_live_get(&live);
	CHECK(live.contexts == 0 && live.streams == 0 && live.events == 0);
	CHECK(live.handles == 1 && live.mappings == 1);
	CHECK_RC(drv.cuStreamQuery(t), CUDA_ERROR_INVALID_HANDLE);
	CHECK_RC(drv.cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
	CHECK_RC(drv.cuCtxGetId(c, &id), CUDA_ERROR_INVALID_CONTEXT);
	CHECK_RC(drv.cuCtxPushCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
	CHECK_RC(drv.cuCtxSetCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
	CHECK_RC(drv.cuCtxDestroy(c), CUDA_ERROR_INVALID_CONTEXT);
	PTR(b.va)[0] = 1;
	buffer_free(&b);

	/* The value comes back with the next context, whose id is new. */
	OK(drv.cuCtxCreate(&c2, NULL, 0, 0));
	CHECK(c2 == c);
	OK(drv.cuCtxGetId(c2, &idc2));
	CHECK(idc2 != id && idc2 != id0);
	OK(drv.cuStreamGetId(NULL, &sid0));
	CHECK(sid0 != sid);		/* a new legacy stream */
	OK(drv.cuStreamCreate(&s, 0));
	OK(drv.cuLaunchHostFunc(s, log_letter, (void *)"Z"));
	/* Pushed twice; destroying pops only the top entry. */
	OK(drv.cuCtxPushCurrent(c2));
	OK(drv.cuCtxDestroy(c2));
	OK(drv.cuCtxGetCurrent(&cur));
	CHECK(cur == c2);
	CHECK_RC(drv.cuCtxGetDevice(&d), CUDA_ERROR_CONTEXT_IS_DESTROYED);
	CHECK_RC(drv.cuStreamCreate(&t, 0), CUDA_ERROR_CONTEXT_IS_DESTROYED);
	CHECK_RC(drv.cuCtxGetId(c2, &id), CUDA_ERROR_CONTEXT_IS_DESTROYED);
	OK(drv.cuCtxPopCurrent(&got));
	CHECK(got == c2);
	CHECK_RC(drv.cuCtxGetId(c2, &id), CUDA_ERROR_INVALID_CONTEXT);
	OK(drv.cuCtxGetCurrent(&cur));
	CHECK(cur == ctx0);
	CHECK_RC(drv.cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
	drv.sim_handles_recycle(recycling);
	check_no_leaks();
}

/* A destroyed context still current on another thread reads as destroyed there. */
struct ctx_user {
	CUcontext ctx;
	struct gate ready, destroyed, popped;
	CUresult device_rc, stream_rc;
	CUcontext popped_ctx;
};

static void *use_ctx(void *arg)
{
	struct ctx_user *u = arg;
	CUdevice d;
	CUstream s;

	OK(drv.cuCtxSetCurrent(u->ctx));
	OK(drv.cuStreamCreate(&s, 0));
	OK(drv.cuStreamDestroy(s));
	gate_open(&u->ready);
	gate_wait(&u->destroyed);
	u->device_rc = drv.cuCtxGetDevice(&d);
	u->stream_rc = drv.cuStreamCreate(&s, 0);
	OK(drv.cuCtxPopCurrent(&u->popped_ctx));
	gate_open(&u->popped);
	return NULL;
}

static void test_context_destroyed_elsewhere(void)
{
	struct ctx_user u = { NULL, GATE_INIT, GATE_INIT, GATE_INIT, 0, 0, NULL };
	unsigned long long id;
	pthread_t th;

	OK(drv.cuCtxCreate(&u.ctx, NULL, 0, 0));
	CHECK(pthread_create(&th, NULL, use_ctx, &u) == 0);
	gate_wait(&u.ready);
	OK(drv.cuCtxDestroy(u.ctx));
	CHECK_RC(drv.cuCtxGetId(u.ctx, &id), CUDA_ERROR_CONTEXT_IS_DESTROYED);
	gate_open(&u.destroyed);
	gate_wait(&u.popped);
	pthread_join(th, NULL);
	CHECK(u.device_rc == CUDA_ERROR_CONTEXT_IS_DESTROYED);
	CHECK(u.stream_rc == CUDA_ERROR_CONTEXT_IS_DESTROYED);
	CHECK(u.popped_ctx == u.ctx);
	CHECK_RC(drv.cuCtxGetId(u.ctx, &id), CUDA_ERROR_INVALID_CONTEXT);
	check_no_leaks();
}

/* ---- several threads at once (mostly for ThreadSanitizer) ---- */

static void *hammer(void *arg)
{
	CUstream s;
	CUevent e;
	struct buffer b;
	unsigned char out[8];

	(void)arg;
	OK(drv.cuCtxSetCurrent(ctx0));
	for (int i = 0; i < 20; i++) {
		buffer_new(&b, gran);
		OK(drv.cuStreamCreate(&s, i % 2 ? CU_STREAM_NON_BLOCKING : 0));
		OK(drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
		OK(drv.cuMemsetD8Async(b.va, (unsigned char)i, 4096, s));
		OK(drv.cuEventRecord(e, s));
		OK(drv.cuStreamWaitEvent(CU_STREAM_PER_THREAD, e, 0));
		OK(drv.cuMemcpyDtoHAsync(out, b.va, sizeof(out), CU_STREAM_PER_THREAD));
		OK(drv.cuStreamSynchronize(CU_STREAM_PER_THREAD));
		CHECK(out[7] == (unsigned char)i);
		OK(drv.cuEventDestroy(e));
		OK(drv.cuStreamDestroy(s));
		OK(drv.cuStreamSynchronize(NULL));
		buffer_free(&b);
	}
	return NULL;
}

/*
 * Handle values bound, looked up and freed from many threads at once, with
 * the mode flipping under them, and contexts created and destroyed.
 */
static CUstream shared_stream;
static unsigned long long shared_id;

static void *hammer_handles(void *arg)
{
	int n = (int)(intptr_t)arg;
	unsigned long long id, sid;
	CUcontext c, cur;
	CUstream s;
	CUevent e;

	OK(drv.cuCtxSetCurrent(ctx0));
	for (int i = 0; i < 100; i++) {
		if (n == 0)
			drv.sim_handles_recycle(i % 2);
		OK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
		OK(drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
		OK(drv.cuStreamGetId(s, &id));
		OK(drv.cuStreamGetCtx(s, &cur));
		CHECK(cur == ctx0 && id != shared_id);
		OK(drv.cuStreamGetId(shared_stream, &sid));
		CHECK(sid == shared_id);
		OK(drv.cuEventRecord(e, s));
		OK(drv.cuStreamWaitEvent(CU_STREAM_PER_THREAD, e, 0));
		OK(drv.cuEventDestroy(e));
		OK(drv.cuStreamDestroy(s));
		if (i % 25 == n % 25) {
			OK(drv.cuCtxCreate(&c, NULL, 0, n % 2));
			OK(drv.cuStreamCreate(&s, 0));
			OK(drv.cuLaunchHostFunc(s, log_letter, (void *)"X"));
			OK(drv.cuStreamGetId(CU_STREAM_PER_THREAD, &id));
			OK(drv.cuCtxDestroy(c));
			OK(drv.cuCtxGetCurrent(&cur));
			CHECK(cur == ctx0);
		}
	}
	OK(drv.cuStreamSynchronize(CU_STREAM_PER_THREAD));
	return NULL;
}

static void test_threads_handles(void)
{
	pthread_t t[8];

	OK(drv.cuStreamCreate(&shared_stream, 0));
	OK(drv.cuStreamGetId(shared_stream, &shared_id));
	for (int i = 0; i < 8; i++)
		CHECK(pthread_create(&t[i], NULL, hammer_handles, (void *)(intptr_t)i) == 0);
	for (int i = 0; i < 8; i++)
		pthread_join(t[i], NULL);
	drv.sim_handles_recycle(recycling);
	OK(drv.cuStreamDestroy(shared_stream));
	OK(drv.cuCtxSynchronize());
	check_no_leaks();
}

/*
 * Lookups of values that another thread destroys and creates again meanwhile:
 * each lookup finds the old object, the new one, or nothing, and never a
 * freed one (AddressSanitizer and ThreadSanitizer watch the objects).
 */
static _Atomic(CUstream) churned_stream;
static _Atomic(CUevent) churned_event;
static atomic_bool churn_done;

static void *churn_reader(void *arg)
{
	unsigned long long id;
	CUcontext c;
	CUresult rc;

	(void)arg;
	OK(drv.cuCtxSetCurrent(ctx0));
	while (!atomic_load(&churn_done)) {
		rc = drv.cuStreamGetId(atomic_load(&churned_stream), &id);
		CHECK(rc == CUDA_SUCCESS || rc == CUDA_ERROR_INVALID_HANDLE);
		rc = drv.cuStreamGetCtx(atomic_load(&churned_stream), &c);
		CHECK(rc == CUDA_SUCCESS || rc == CUDA_ERROR_INVALID_HANDLE);
		CHECK(rc != CUDA_SUCCESS || c == ctx0);
		/* A record was just enqueued: not ready is an answer too. */
		rc = drv.cuStreamQuery(atomic_load(&churned_stream));
		CHECK(rc == CUDA_SUCCESS || rc == CUDA_ERROR_NOT_READY ||
		      rc == CUDA_ERROR_INVALID_HANDLE);
		rc = drv.cuEventQuery(atomic_load(&churned_event));
		CHECK(rc == CUDA_SUCCESS || rc == CUDA_ERROR_NOT_READY ||
		      rc == CUDA_ERROR_INVALID_HANDLE);
	}
	return NULL;
}

static void test_handle_churn(void)
{
	pthread_t t[4];
	CUstream s;
	CUevent e;

	OK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
	atomic_store(&churned_stream, s);
	atomic_store(&churned_event, e);
	atomic_store(&churn_done, false);
	for (int i = 0; i < 4; i++)
		CHECK(pthread_create(&t[i], NULL, churn_reader, NULL) == 0);
	for (int i = 0; i < 300; i++) {
		/* Fresh values every 64th round, so that stale ones are looked up too. */
		drv.sim_handles_recycle(i % 64 != 0);
		OK(drv.cuStreamDestroy(s));
		OK(drv.cuEventDestroy(e));
		OK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
		OK(drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
		OK(drv.cuEventRecord(e, s));
		atomic_store(&churned_stream, s);
		atomic_store(&churned_event, e);
	}
	atomic_store(&churn_done, true);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	drv.sim_handles_recycle(recycling);
	OK(drv.cuStreamDestroy(s));
	OK(drv.cuEventDestroy(e));
	check_no_leaks();
}

static void test_threads(void)
{
	pthread_t t[4];

	for (int i = 0; i < 4; i++)
		CHECK(pthread_create(&t[i], NULL, hammer, NULL) == 0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	OK(drv.cuCtxSynchronize());
	check_no_leaks();
}

/* ---- a fault on a stream worker, in a fresh process ---- */

/* Child mode: an async memset into unmapped memory must kill the process. */
static int async_fault_child(void)
{
	CUcontext c;
	CUstream s;
	CUdeviceptr va;

	child_setup();
	load_library();
	if (drv.cuInit(0) != CUDA_SUCCESS || drv.cuDevicePrimaryCtxRetain(&c, 0) ||
	    drv.cuCtxSetCurrent(c) || drv.cuMemAddressReserve(&va, 2u << 20, 0, 0, 0) ||
	    drv.cuStreamCreate(&s, 0))
		return 3;
	drv.cuMemsetD8Async(va, 1, 16, s);
	drv.cuStreamSynchronize(s);
	return 42;	/* survived: no fault */
}

static void test_async_fault(char *self)
{
	int status = 0;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		/* exec, so that the child starts threads in a clean process */
		execl("/proc/self/exe", self, "--async-fault-child", lib_path, (char *)NULL);
		_exit(4);
	}
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
	CHECK(child_faulted(status));
}

/* ---- before cuInit ---- */

static void test_no_devices(void)
{
	int status = 0;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		setenv("SOP_SIM_DEVICES", "0", 1);
		_exit(drv.cuInit(0) == CUDA_ERROR_NO_DEVICE ? 0 : 1);
	}
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A malformed SOP_SIM_HANDLES aborts the first cuInit. */
static void test_bad_handles_env(void)
{
	int status = 0;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		child_setup();
		setenv("SOP_SIM_HANDLES", "sometimes", 1);
		if (!freopen("/dev/null", "w", stderr))
			_exit(3);
		drv.cuInit(0);
		_exit(0);
	}
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

/* A call naming a destroyed stream's or event's handle that no stream or event has taken since
 * faults, as in the driver, unless SOP_SIM_DEAD_HANDLES=error (which the rest of this test sets,
 * to check the codes such calls get then). */
static void test_dead_handles_fault(bool event)
{
	int status = 0;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		unsigned long long id;
		CUcontext c;
		CUstream s, t;
		CUevent e, g;

		child_setup();
		setenv("SOP_SIM_DEAD_HANDLES", "fault", 1);
		if (!freopen("/dev/null", "w", stderr))
			_exit(3);
		if (drv.cuInit(0) || drv.cuDevicePrimaryCtxRetain(&c, 0) || drv.cuCtxSetCurrent(c) ||
		    drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) || drv.cuStreamDestroy(s) ||
		    drv.cuStreamCreate(&t, CU_STREAM_NON_BLOCKING) || drv.cuStreamDestroy(t) ||
		    drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) || drv.cuEventDestroy(e) ||
		    drv.cuEventCreate(&g, CU_EVENT_DISABLE_TIMING) || drv.cuEventDestroy(g))
			_exit(4);
		/* Recycled, t took s's value and g e's; fresh, they name nothing either way. */
		if (event)
			drv.cuEventQuery(e);
		else
			drv.cuStreamGetId(s, &id);
		_exit(0);
	}
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

static void test_before_init(void)
{
	int n;

	CHECK_RC(drv.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
	OK(drv.cuDriverGetVersion(&n));
	CHECK(n == 13000);
	CHECK_RC(drv.cuInit(1), CUDA_ERROR_INVALID_VALUE);
	test_no_devices();
	test_bad_handles_env();
	test_dead_handles_fault(false);
	test_dead_handles_fault(true);
}

/* SOP_SIM_FAIL, set in main: the second cuDeviceGetName fails. */
static void test_env_fault(void)
{
	char name[32];

	OK(drv.cuDeviceGetName(name, sizeof(name), 0));
	CHECK_RC(drv.cuDeviceGetName(name, sizeof(name), 0), CUDA_ERROR_UNKNOWN);
	OK(drv.cuDeviceGetName(name, sizeof(name), 0));
	CHECK(drv.sim_calls("cuDeviceGetName") == 3);
}

static int passed, failed;

static void run(const char *name, void (*fn)(void))
{
	int before = failures;

	fn();
	if (failures == before) {
		passed++;
		printf("ok %s\n", name);
	} else {
		failed++;
		printf("FAIL %s\n", name);
	}
	fflush(stdout);
}

/* Capture: work on a capturing stream is recorded, not run; a graph runs it at every launch;
 * graph memory lives from a launch to its free. */
static void test_capture_graphs(void)
{
	CUstreamCaptureStatus st;
	CUstream s, t;
	CUgraph g;
	CUgraphExec x;
	CUdeviceptr d, other;
	CUevent ev;
	cuuint64_t id = 0;
	unsigned host[4];
	unsigned seen[4];
	int i;

	OK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(drv.cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
	OK(drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	OK(drv.cuStreamIsCapturing(s, &st));
	CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);
	/* Outside a capture, libsopsim has no pools. */
	CHECK_RC(drv.cuMemAllocAsync(&d, 4096, s), CUDA_ERROR_NOT_SUPPORTED);
	CHECK_RC(drv.cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL),
		 CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	OK(drv.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	CHECK_RC(drv.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
	OK(drv.cuStreamIsCapturing(s, &st));
	CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
	OK(drv.cuStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL, NULL));
	CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0);
	OK(drv.cuMemAllocAsync(&d, sizeof host, s));
	OK(drv.cuMemAllocAsync(&other, 4096, s));
	OK(drv.cuMemsetD32Async(d, 7, 4, s));
	OK(drv.cuMemcpyDtoHAsync(host, d, sizeof host, s));
	/* Recorded in the capture: not queryable; a wait on it joins t to the capture. */
	OK(drv.cuEventRecord(ev, s));
	CHECK_RC(drv.cuEventQuery(ev), CUDA_ERROR_CAPTURED_EVENT);
	OK(drv.cuStreamWaitEvent(t, ev, 0));
	OK(drv.cuStreamIsCapturing(t, &st));
	CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
	CHECK_RC(drv.cuStreamEndCapture(t, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
	OK(drv.cuMemFreeAsync(d, s));
	/* A free of memory that is not the graph's, or twice. */
	CHECK_RC(drv.cuMemFreeAsync(d, s), CUDA_ERROR_INVALID_VALUE);
	memset(host, 0, sizeof host);
	OK(drv.cuStreamEndCapture(s, &g));
	OK(drv.cuStreamIsCapturing(t, &st));
	CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);
	/* Nothing ran. */
	OK(drv.cuStreamSynchronize(s));
	CHECK(host[0] == 0);
	OK(drv.cuGraphInstantiate(&x, g, 0));
	OK(drv.cuGraphLaunch(x, s));
	OK(drv.cuStreamSynchronize(s));
	CHECK(host[0] == 7 && host[3] == 7);
	/* other was not freed in the graph: live until freed outside it, and a launch meanwhile
	 * fails. */
	CHECK_RC(drv.cuGraphLaunch(x, s), CUDA_ERROR_INVALID_VALUE);
	OK(drv.cuMemFreeAsync(other, s));
	CHECK_RC(drv.cuMemFreeAsync(other, s), CUDA_ERROR_INVALID_VALUE);
	for (i = 0; i < 3; i++) {
		memset(host, 0, sizeof host);
		OK(drv.cuGraphLaunch(x, s));
		OK(drv.cuStreamSynchronize(s));
		memcpy(seen, host, sizeof seen);
		CHECK(seen[1] == 7);
		OK(drv.cuMemFreeAsync(other, s));
	}
	OK(drv.cuGraphExecDestroy(x));
	OK(drv.cuGraphDestroy(g));
	OK(drv.cuEventDestroy(ev));
	OK(drv.cuStreamDestroy(t));
	OK(drv.cuStreamDestroy(s));
}

struct capture_peer {
	CUstream s;
	CUstreamCaptureMode mode;
	CUresult query;
};

static void *capture_peer_main_mode(void *arg)
{
	struct capture_peer *p = arg;
	CUstreamCaptureMode m = p->mode;

	OK(drv.cuCtxSetCurrent(ctx0));
	OK(drv.cuThreadExchangeStreamCaptureMode(&m));
	p->query = drv.cuStreamQuery(p->s);
	return NULL;
}

/* A potentially unsafe call from another thread: forbidden, and the capture invalidated, by a
 * GLOBAL capture unless the caller is RELAXED; never by a THREAD_LOCAL or RELAXED one. The
 * capturing stream itself may never be queried or synchronized. */
static void test_capture_modes(void)
{
	static const struct {
		CUstreamCaptureMode capture, caller;
		bool forbidden;
	} cases[] = {
		{CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL, true},
		{CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, false},
		{CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED, false},
		{CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_GLOBAL, false},
		{CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_GLOBAL, false},
	};
	CUstreamCaptureMode m;
	struct capture_peer peer;
	pthread_t th;
	CUstream s, other;
	CUgraph g;
	size_t i;

	OK(drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(drv.cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
	m = (CUstreamCaptureMode)7;
	CHECK_RC(drv.cuThreadExchangeStreamCaptureMode(&m), CUDA_ERROR_INVALID_VALUE);
	for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		OK(drv.cuStreamBeginCapture(s, cases[i].capture));
		peer.s = other;
		peer.query = CUDA_ERROR_UNKNOWN;
		peer.mode = cases[i].caller; /* modes are per thread: the peer sets its own */
		pthread_create(&th, NULL, capture_peer_main_mode, &peer);
		pthread_join(th, NULL);
		CHECK_RC(peer.query, cases[i].forbidden ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
							: CUDA_SUCCESS);
		CHECK_RC(drv.cuStreamEndCapture(s, &g), cases[i].forbidden
							    ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
							    : CUDA_SUCCESS);
		if (!cases[i].forbidden)
			OK(drv.cuGraphDestroy(g));
	}
	/* The capturing thread itself, in its own GLOBAL capture: forbidden unless it relaxes. */
	OK(drv.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	m = CU_STREAM_CAPTURE_MODE_RELAXED;
	OK(drv.cuThreadExchangeStreamCaptureMode(&m));
	CHECK(m == CU_STREAM_CAPTURE_MODE_GLOBAL);
	OK(drv.cuStreamQuery(other));
	OK(drv.cuThreadExchangeStreamCaptureMode(&m));
	CHECK(m == CU_STREAM_CAPTURE_MODE_RELAXED);
	OK(drv.cuStreamEndCapture(s, &g));
	OK(drv.cuGraphDestroy(g));
	/* Synchronizing the capturing stream: illegal in any mode. */
	OK(drv.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
	CHECK_RC(drv.cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	CHECK_RC(drv.cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	CHECK(g == NULL);
	/* Its id too, from a relaxed thread in a relaxed capture (the driver of 580); another
	 * stream's id is fine. */
	OK(drv.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
	m = CU_STREAM_CAPTURE_MODE_RELAXED;
	OK(drv.cuThreadExchangeStreamCaptureMode(&m));
	{
		unsigned long long id;
		OK(drv.cuStreamGetId(other, &id));
		CHECK_RC(drv.cuStreamGetId(s, &id), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	}
	OK(drv.cuThreadExchangeStreamCaptureMode(&m));
	CHECK_RC(drv.cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	CHECK(g == NULL);
	OK(drv.cuStreamDestroy(other));
	OK(drv.cuStreamDestroy(s));
}

int main(int argc, char **argv)
{
	lib_path = argc > 1 && argv[1][0] != '-' ? argv[1] : getenv("SOP_DRIVER_LIBRARY");
	if (argc > 2 && strcmp(argv[1], "--async-fault-child") == 0) {
		lib_path = argv[2];
		return async_fault_child();
	}
	if (!lib_path) {
		fprintf(stderr, "usage: %s path/to/libsopsim.so\n", argv[0]);
		return 2;
	}
	/* A deadlock is a failure too. */
	alarm(90);
	/* Left as the test runner set it: the selftest passes in both modes. */
	recycling = !getenv("SOP_SIM_HANDLES") || strcmp(getenv("SOP_SIM_HANDLES"), "fresh") != 0;
	setenv("SOP_SIM_DEVICES", "2", 1);
	setenv("SOP_SIM_MEMORY", "64M", 1);
	setenv("SOP_SIM_GRANULARITY", "2097152", 1);
	setenv("SOP_SIM_FAIL", "cuDeviceGetName:2:CUDA_ERROR_UNKNOWN", 1);
	/* The codes calls on dead streams get; test_dead_handles_fault checks the default. */
	setenv("SOP_SIM_DEAD_HANDLES", "error", 1);
	load_library();

	run("before-init", test_before_init);
	if (drv.cuInit(0) != CUDA_SUCCESS || drv.cuDevicePrimaryCtxRetain(&ctx0, 0) ||
	    drv.cuDevicePrimaryCtxRetain(&ctx1, 1) || drv.cuCtxSetCurrent(ctx0)) {
		fprintf(stderr, "selftest: cannot initialise the simulated driver\n");
		return 1;
	}
	gran = 2u << 20;
	run("env-fault-rules", test_env_fault);
	run("devices", test_devices);
	run("contexts", test_contexts);
	run("vmm-basics", test_vmm_basics);
	run("vmm-handles", test_vmm_handles);
	run("host-memory", test_host_memory);
	run("out-of-memory", test_out_of_memory);
	run("fault-injection", test_fault_injection);
	run("stream-order", test_stream_order);
	run("host-functions", test_host_functions);
	run("events", test_events);
	run("ipc-events", test_ipc_events);
	run("legacy-stream", test_legacy_stream);
	run("stream-destroy-pending", test_stream_destroy_pending);
	run("stream-create-waits", test_stream_create_waits);
	run("stream-handle-reuse", test_stream_handle_reuse);
	run("event-handle-reuse", test_event_handle_reuse);
	run("fresh-handles", test_fresh_handles);
	run("created-contexts", test_created_contexts);
	run("context-destroyed-elsewhere", test_context_destroyed_elsewhere);
	run("primary-reset", test_primary_reset);
	run("threads", test_threads);
	run("threads-handles", test_threads_handles);
	run("handle-churn", test_handle_churn);
	run("capture-graphs", test_capture_graphs);
	run("capture-modes", test_capture_modes);
	if (failures == 0) {
		int before = failures;

		test_async_fault(argv[0]);
		if (failures == before) {
			passed++;
			printf("ok async-fault\n");
		} else {
			failed++;
			printf("FAIL async-fault\n");
		}
	}

	OK(drv.cuDevicePrimaryCtxRelease(0));
	OK(drv.cuDevicePrimaryCtxRelease(1));
	{
		struct sim_live live;

		drv.sim_live_get(&live);
		if (live.primary_ctx_refs != 0)
			failed++;
	}
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
