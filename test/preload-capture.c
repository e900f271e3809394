/* preload-capture.c - stream capture, pointer attributes and cuMemFree under the interposer, as
 * an unchanged program that links libcuda.so.1 meets them.
 *
 * Captures begun and ended by every path (libcuda's symbols, dlsym on a libcuda handle,
 * cuGetProcAddress v1 and v2, with and without the per-thread flag): allocations on the capturing
 * stream are the driver's graph memory, their frees nodes of the graph, a free of sop's memory
 * there is refused, and the graph runs many times with the right data. The gate: sop asks the
 * driver whether a stream captures only while a capture is in flight (sop's call counts show
 * it). cuPointerGetAttribute(s) of sop's memory answer sop's pool and the allocation's range;
 * cuMemFree of sop's memory synchronizes and frees it; other pointers go to the driver. A thread
 * with no current context gets the driver's codes.
 *
 * Run under LD_PRELOAD (test/meson.build) on the simulated driver's libcuda.so.1, and through
 * sop-run on a GPU, where the checks of the simulated driver's counts are skipped.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#define PTDS CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

/* Declared by cuda.h only for per-thread default stream builds, or not at all. */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

typedef CUresult (*begin_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*begin_v1_fn)(CUstream);
typedef CUresult (*end_fn)(CUstream, CUgraph *);
typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);

static struct {
	__typeof__(sop_pointer_get_pool) *pointer_get_pool;
	__typeof__(sop_driver_calls) *driver_calls;
	__typeof__(sim_calls) *sim_calls;
} api;

static bool sim;
static CUcontext ctx;
static CUstream s1, s2;
static void *preload_base;
static void *libcuda;

static void *
fn_ptr(void (*f)(void))
{
	void *p;

	memcpy(&p, &f, sizeof p);
	return p;
}

#define FN_PTR(f) fn_ptr((void (*)(void))(f))
#define AS(type, p) ((type)fn_from(p))
static void (*fn_from(void *p))(void)
{
	void (*f)(void);

	memcpy(&f, &p, sizeof f);
	return f;
}

#define LOAD(member, name)                                                                         \
	do {                                                                                       \
		void *s_ = dlsym(RTLD_DEFAULT, name);                                              \
		memcpy(&api.member, &s_, sizeof s_);                                               \
	} while (0)

static unsigned long
drv_calls(const char *name)
{
	return api.sim_calls ? api.sim_calls(name) : 0;
}

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

static bool
in_preload(void *fn, const char *name)
{
	Dl_info info;

	if (!fn || !dladdr(fn, &info) || info.dli_fbase != preload_base)
		return false;
	return info.dli_sname && !strcmp(info.dli_sname, name);
}

static bool
is_sop(CUdeviceptr p)
{
	sop_pool_t sp;

	return api.pointer_get_pool(&sp, (void *)(uintptr_t)p) == CUDA_SUCCESS;
}

static void
setup(void)
{
	Dl_info info;
	int n = 0;

	setvbuf(stdout, NULL, _IONBF, 0);
	LOAD(pointer_get_pool, "sop_pointer_get_pool");
	LOAD(driver_calls, "sop_driver_calls");
	LOAD(sim_calls, "sim_calls");
	if (!api.driver_calls) {
		fprintf(stderr, "libsop-preload.so is not loaded: run it under sop-run\n");
		exit(1);
	}
	CHECK(dladdr(FN_PTR(api.driver_calls), &info));
	preload_base = info.dli_fbase;
	sim = api.sim_calls != NULL;
	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&n) != CUDA_SUCCESS || n < 1) {
		printf("skip: no usable CUDA driver\n");
		exit(SKIP);
	}
	OK(cuDevicePrimaryCtxRetain(&ctx, 0));
	OK(cuCtxSetCurrent(ctx));
	OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
	OK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
	libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	CHECK(libcuda);
}

#define WORDS 4096

/* Words of d, read on stream s, all equal to want. */
static void
expect_words(CUdeviceptr d, unsigned want, CUstream s)
{
	static unsigned host[WORDS];
	size_t i;

	memset(host, 0xff, sizeof host);
	OK(cuMemcpyDtoHAsync(host, d, sizeof host, s));
	OK(cuStreamSynchronize(s));
	for (i = 0; i < WORDS; i++)
		if (host[i] != want) {
			fprintf(stderr, "word %zu is %u, expected %u\n", i, host[i], want);
			exit(1);
		}
}

/* Allocations and frees outside any capture: sop asks no capture question. */
static void
gate_closed(CUstream s)
{
	unsigned long long q = sop_calls("cuStreamIsCapturing");
	CUdeviceptr p;
	int i;

	for (i = 0; i < 100; i++) {
		OK(cuMemAllocAsync(&p, 4096 + (size_t)i * 512, s));
		OK(cuMemFreeAsync(p, s));
	}
	EQ(sop_calls("cuStreamIsCapturing"), q);
}

/* A capture through begin and end (on stream, as the program names it; run is the stream the
 * work and allocations go to, which a _ptsz pair names NULL): graph memory, a refused free of
 * sop's memory, and the graph launched many times. */
static void
capture_with(begin_fn begin, begin_v1_fn begin_v1, end_fn end, CUstream stream, bool ptsz)
{
	unsigned long long q;
	unsigned long graph_allocs;
	CUdeviceptr out, mine, g1, g2;
	CUgraphExec exec;
	CUgraph graph;
	int i;

	OK(cuMemAllocAsync(&out, WORDS * 4, s2));
	OK(cuMemAllocAsync(&mine, 4096, s2));
	OK(cuStreamSynchronize(s2));
	CHECK(is_sop(out) && is_sop(mine));
	gate_closed(s2);
	if (begin)
		OK(begin(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
	else
		OK(begin_v1(stream));
	q = sop_calls("cuStreamIsCapturing");
	graph_allocs = drv_calls("cuMemAllocAsync");
	if (ptsz) {
		OK(cuMemAllocAsync_ptsz(&g1, WORDS * 4, stream));
		OK(cuMemAllocAsync_ptsz(&g2, WORDS * 4, stream));
	} else {
		OK(cuMemAllocAsync(&g1, WORDS * 4, stream));
		OK(cuMemAllocAsync(&g2, WORDS * 4, stream));
	}
	CHECK(!is_sop(g1) && !is_sop(g2));
	CHECK(sop_calls("cuStreamIsCapturing") > q);
	if (sim)
		EQ(drv_calls("cuMemAllocAsync"), graph_allocs + 2);
	OK(cuMemsetD32Async(g1, 9, WORDS, ptsz && !stream ? CU_STREAM_PER_THREAD : stream));
	OK(cuMemcpyDtoDAsync(g2, g1, WORDS * 4, ptsz && !stream ? CU_STREAM_PER_THREAD : stream));
	OK(cuMemcpyDtoDAsync(out, g2, WORDS * 4, ptsz && !stream ? CU_STREAM_PER_THREAD : stream));
	if (ptsz) {
		OK(cuMemFreeAsync_ptsz(g1, stream));
		OK(cuMemFreeAsync_ptsz(g2, stream));
		EQ(cuMemFreeAsync_ptsz(mine, stream), CUDA_ERROR_INVALID_VALUE);
	} else {
		OK(cuMemFreeAsync(g1, stream));
		OK(cuMemFreeAsync(g2, stream));
		EQ(cuMemFreeAsync(mine, stream), CUDA_ERROR_INVALID_VALUE);
	}
	/* Refused, and still sop's. */
	CHECK(is_sop(mine));
	OK(end(stream, &graph));
	/* The capture is over: the gate closes again. */
	gate_closed(s2);
	OK(cuGraphInstantiate(&exec, graph, 0));
	for (i = 0; i < 40; i++) {
		OK(cuMemsetD32Async(out, 0, WORDS, s1));
		OK(cuGraphLaunch(exec, s1));
		expect_words(out, 9, s1);
	}
	OK(cuGraphExecDestroy(exec));
	OK(cuGraphDestroy(graph));
	OK(cuMemFreeAsync(mine, s2));
	OK(cuMemFreeAsync(out, s2));
	OK(cuStreamSynchronize(s2));
}

/* Through libcuda's symbols. */
static void
test_symbols(void)
{
	capture_with(cuStreamBeginCapture, NULL, cuStreamEndCapture, s1, false);
	printf("capture through libcuda's symbols: ok\n");
}

/* Through dlsym on libcuda's handle: the interposer's functions, the v1 ABI among them. */
static void
test_dlsym(void)
{
	void *b2 = dlsym(libcuda, "cuStreamBeginCapture_v2");
	void *b1 = dlsym(libcuda, "cuStreamBeginCapture");
	void *b2p = dlsym(libcuda, "cuStreamBeginCapture_v2_ptsz");
	void *e = dlsym(libcuda, "cuStreamEndCapture");
	void *ep = dlsym(libcuda, "cuStreamEndCapture_ptsz");

	CHECK(in_preload(b2, "cuStreamBeginCapture_v2"));
	CHECK(in_preload(b1, "cuStreamBeginCapture"));
	CHECK(in_preload(b2p, "cuStreamBeginCapture_v2_ptsz"));
	CHECK(in_preload(e, "cuStreamEndCapture"));
	CHECK(in_preload(ep, "cuStreamEndCapture_ptsz"));
	CHECK(in_preload(dlsym(libcuda, "cuStreamBeginCaptureToGraph"),
			 "cuStreamBeginCaptureToGraph"));
	CHECK(in_preload(dlsym(libcuda, "cuPointerGetAttribute"), "cuPointerGetAttribute"));
	CHECK(in_preload(dlsym(libcuda, "cuPointerGetAttributes"), "cuPointerGetAttributes"));
	CHECK(in_preload(dlsym(libcuda, "cuMemFree_v2"), "cuMemFree_v2"));
	capture_with(AS(begin_fn, b2), NULL, AS(end_fn, e), s1, false);
	capture_with(NULL, AS(begin_v1_fn, b1), AS(end_fn, e), s1, false);
	/* The per-thread pair on the thread's default stream. */
	capture_with(AS(begin_fn, b2p), NULL, AS(end_fn, ep), NULL, true);
	printf("capture through dlsym: ok\n");
}

/* Through cuGetProcAddress, v2 and v1, by version and flags. */
static void
test_proc_address(void)
{
	CUdriverProcAddressQueryResult status;
	gpa_v1_fn v1 = NULL;
	void *b, *e, *fn;

	OK(cuGetProcAddress("cuStreamBeginCapture", &b, 12000, 0, &status));
	CHECK(in_preload(b, "cuStreamBeginCapture_v2"));
	OK(cuGetProcAddress("cuStreamEndCapture", &e, 12000, 0, &status));
	CHECK(in_preload(e, "cuStreamEndCapture"));
	capture_with(AS(begin_fn, b), NULL, AS(end_fn, e), s1, false);

	OK(cuGetProcAddress("cuStreamBeginCapture", &b, 12000, PTDS, &status));
	CHECK(in_preload(b, "cuStreamBeginCapture_v2_ptsz"));
	OK(cuGetProcAddress("cuStreamEndCapture", &e, 12000, PTDS, &status));
	CHECK(in_preload(e, "cuStreamEndCapture_ptsz"));
	capture_with(AS(begin_fn, b), NULL, AS(end_fn, e), NULL, true);

	OK(cuGetProcAddress("cuStreamBeginCapture", &b, 10000, 0, &status));
	CHECK(in_preload(b, "cuStreamBeginCapture"));
	OK(cuGetProcAddress("cuStreamBeginCapture", &b, 10000, PTDS, &status));
	CHECK(in_preload(b, "cuStreamBeginCapture_ptsz"));
	OK(cuGetProcAddress("cuStreamBeginCaptureToGraph", &b, 12030, PTDS, &status));
	CHECK(in_preload(b, "cuStreamBeginCaptureToGraph_ptsz"));
	OK(cuGetProcAddress("cuPointerGetAttributes", &fn, 12000, 0, &status));
	CHECK(in_preload(fn, "cuPointerGetAttributes"));
	OK(cuGetProcAddress("cuMemFree", &fn, 12000, 0, &status));
	CHECK(in_preload(fn, "cuMemFree_v2"));

	/* The v1 lookup, as a runtime before 12.0 asks. */
	OK(cuGetProcAddress("cuGetProcAddress", &fn, 11030, 0, &status));
	memcpy(&v1, &fn, sizeof v1);
	OK(v1("cuStreamBeginCapture", &b, 11030, 0));
	CHECK(in_preload(b, "cuStreamBeginCapture_v2"));
	OK(v1("cuStreamEndCapture", &e, 11030, PTDS));
	CHECK(in_preload(e, "cuStreamEndCapture_ptsz"));
	OK(v1("cuStreamBeginCapture", &b, 11030, PTDS));
	capture_with(AS(begin_fn, b), NULL, AS(end_fn, e), NULL, true);
	printf("capture through cuGetProcAddress v1 and v2: ok\n");
}

/* The count of captures in flight follows what the driver did, not what was asked. */
static void
test_count(void)
{
	CUgraph graph, into;
	CUdeviceptr p;
	unsigned long long q;

	/* A begin the driver refuses leaves no capture counted. */
	EQ(cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL),
	   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	gate_closed(s2);
	if (sim) { /* a graph the driver is not given */
		EQ(cuStreamBeginCaptureToGraph(s1, NULL, NULL, NULL, 0,
					       CU_STREAM_CAPTURE_MODE_GLOBAL),
		   CUDA_ERROR_INVALID_VALUE);
		gate_closed(s2);
	}
	/* A capture into a graph the program made counts as any other: its stream's allocations
	 * are the driver's graph memory, the other streams' sop's, and its end ends it. */
	OK(cuGraphCreate(&into, 0));
	OK(cuStreamBeginCaptureToGraph(s1, into, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_RELAXED));
	OK(cuMemAllocAsync(&p, 4096, s1));
	CHECK(!is_sop(p));
	OK(cuMemFreeAsync(p, s1));
	OK(cuMemAllocAsync(&p, 4096, s2));
	CHECK(is_sop(p));
	OK(cuMemFreeAsync(p, s2));
	OK(cuStreamEndCapture(s1, &graph));
	CHECK(graph != NULL);
	if (graph != into)
		OK(cuGraphDestroy(graph));
	OK(cuGraphDestroy(into));
	gate_closed(s2);
	/* An end of a stream that does not capture ends nothing: the capture of s1 still counts. */
	OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
	CHECK(cuStreamEndCapture(s2, &graph) != CUDA_SUCCESS);
	q = sop_calls("cuStreamIsCapturing");
	OK(cuMemAllocAsync(&p, 4096, s1));
	CHECK(sop_calls("cuStreamIsCapturing") > q);
	CHECK(!is_sop(p));
	OK(cuMemFreeAsync(p, s1));
	/* While one is in flight, other streams ask, and are served by sop. */
	OK(cuMemAllocAsync(&p, 4096, s2));
	CHECK(is_sop(p));
	OK(cuMemFreeAsync(p, s2));
	OK(cuStreamEndCapture(s1, &graph));
	OK(cuGraphDestroy(graph));
	gate_closed(s2);
	/* An invalidated capture ends too: synchronizing the capturing stream invalidates it. */
	OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
	CHECK(cuStreamSynchronize(s1) != CUDA_SUCCESS);
	EQ(cuStreamEndCapture(s1, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	gate_closed(s2);
	printf("captures in flight counted: ok\n");
}

/* A free on a capturing stream of memory that is neither sop's nor the graph's reaches the driver
 * once, untouched: the driver refuses it (and may end the capture), as without sop. */
static void
test_foreign_free_in_capture(void)
{
	unsigned long d;
	CUgraph graph = NULL;
	CUresult r;
	int word;

	if (!sim) /* a real driver may take the refusal as the capture's end: nothing to count */
		return;
	OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
	d = drv_calls("cuMemFreeAsync");
	r = cuMemFreeAsync((CUdeviceptr)(uintptr_t)&word, s1);
	CHECK(r != CUDA_SUCCESS);
	EQ(drv_calls("cuMemFreeAsync"), d + 1);
	(void)cuStreamEndCapture(s1, &graph);
	if (graph)
		OK(cuGraphDestroy(graph));
	printf("a foreign free in a capture: ok\n");
}

/* cuPointerGetAttribute(s): sop's pool and the allocation's range for sop's memory; the driver's
 * answer for other memory. */
static void
test_pointer_attributes(void)
{
	CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
					CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
					CU_POINTER_ATTRIBUTE_RANGE_SIZE};
	CUmemoryPool pool, got = NULL;
	CUdeviceptr p, start = 0, classic;
	size_t size = 0;
	void *data[3] = {&got, &start, &size};
	unsigned long d;

	OK(cuDeviceGetDefaultMemPool(&pool, 0));
	OK(cuMemAllocAsync(&p, 10000, s1));
	OK(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p + 100));
	CHECK(got == pool);
	OK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 9999));
	EQ(start, p);
	OK(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p));
	EQ(size, 10000);
	EQ(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 10000),
	   CUDA_ERROR_INVALID_VALUE);
	/* Past the allocation, for the plural call: no error, and the defaults, as the driver
	 * answers for a pointer that is not valid. */
	got = pool, start = 1, size = 1;
	OK(cuPointerGetAttributes(3, attrs, data, p + 10000));
	CHECK(got == NULL);
	EQ(start, 0);
	EQ(size, 0);
	got = NULL, start = 0, size = 0;
	OK(cuPointerGetAttributes(3, attrs, data, p + 5));
	CHECK(got == pool);
	EQ(start, p);
	EQ(size, 10000);
	OK(cuMemFreeAsync(p, s1));
	OK(cuStreamSynchronize(s1));
	EQ(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p),
	   CUDA_ERROR_INVALID_VALUE);
	got = pool, start = 1, size = 1;
	OK(cuPointerGetAttributes(3, attrs, data, p)); /* freed */
	CHECK(got == NULL);
	EQ(start, 0);
	EQ(size, 0);
	/* The driver's memory: the driver answers. */
	OK(cuMemAlloc(&classic, 4096));
	d = drv_calls("cuPointerGetAttribute");
	got = pool;
	OK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, classic + 8));
	EQ(start, classic);
	if (sim) {
		EQ(drv_calls("cuPointerGetAttribute"), d + 1);
		OK(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, classic));
		CHECK(got == NULL);
	}
	OK(cuMemFree(classic));
	printf("pointer attributes: ok\n");
}

/* cuMemFree of sop's memory: after a synchronization, at once; a second free is refused. */
static void
test_mem_free(void)
{
	CUdeviceptr p, classic;
	cuuint64_t used = 0, before = 0;
	CUmemoryPool pool;
	unsigned long d;

	OK(cuDeviceGetDefaultMemPool(&pool, 0));
	OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &before));
	OK(cuMemAllocAsync(&p, 1 << 20, s1));
	OK(cuMemsetD32Async(p, 3, (1 << 20) / 4, s1));
	d = drv_calls("cuMemFree");
	OK(cuMemFree(p));
	EQ(drv_calls("cuMemFree"), d);
	OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
	EQ(used, before);
	CHECK(!is_sop(p));
	EQ(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
	/* The memory is reusable at once, by any stream: the synchronization covered its work. */
	OK(cuMemAllocAsync(&p, 1 << 20, s2));
	OK(cuMemFreeAsync(p, s2));
	OK(cuMemAlloc(&classic, 4096));
	OK(cuMemFree(classic));
	if (sim)
		EQ(drv_calls("cuMemFree"), d + 1);
	OK(cuStreamSynchronize(s2));
	printf("cuMemFree of sop's memory: ok\n");
}

/* A thread with no current context: the driver's codes, and sop's memory stays as it was. */
static void *
no_context_main(void *arg)
{
	CUdeviceptr p = *(CUdeviceptr *)arg;
	CUmemoryPool got = NULL;
	CUgraph graph;

	CHECK(cuStreamBeginCapture(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_GLOBAL) !=
	      CUDA_SUCCESS);
	CHECK(cuStreamEndCapture(CU_STREAM_PER_THREAD, &graph) != CUDA_SUCCESS);
	/* An address needs no context. */
	OK(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p));
	CHECK(got != NULL);
	/* cuMemFree synchronizes the current context: there is none. */
	EQ(cuMemFree(p), CUDA_ERROR_INVALID_CONTEXT);
	return NULL;
}

static void
test_no_context(void)
{
	pthread_t t;
	CUdeviceptr p;

	OK(cuMemAllocAsync(&p, 4096, s1));
	pthread_create(&t, NULL, no_context_main, &p);
	pthread_join(t, NULL);
	CHECK(is_sop(p));
	gate_closed(s2);
	OK(cuMemFreeAsync(p, s1));
	OK(cuStreamSynchronize(s1));
	printf("a thread without a context: ok\n");
}

int
main(void)
{
	setup();
	gate_closed(s1);
	test_symbols();
	test_dlsym();
	test_proc_address();
	test_count();
	test_pointer_attributes();
	test_foreign_free_in_capture();
	test_mem_free();
	test_no_context();
	printf("all ok\n");
	return 0;
}
