/* capture.c - sop on a capturing stream, and beside one.
 *
 * On a capturing stream an allocation is the driver's graph memory, a free of it is a node of the
 * graph, and a free of sop's memory is refused, leaving it allocated; the graph then launches any
 * number of times with the right data. A capture in global mode on another thread stays valid
 * while sop grows, releases and queries its probes. Runs on the simulated driver and on a GPU
 * (memsets and device-to-device copies only, which both capture).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "helpers.h"

static struct {
	__typeof__(cuStreamBeginCapture) *begin;
	__typeof__(cuStreamEndCapture) *end;
	__typeof__(cuStreamIsCapturing) *is_capturing;
	__typeof__(cuGraphInstantiate) *instantiate;
	__typeof__(cuGraphLaunch) *launch;
	__typeof__(cuGraphExecDestroy) *exec_destroy;
	__typeof__(cuGraphDestroy) *destroy;
	__typeof__(cuStreamSynchronize) *sync;
} cap;

#define STR2(x) #x
#define STR(x) STR2(x)
#define CAP_LOAD(member, name)                                                                     \
	do {                                                                                       \
		void *s_ = dlsym(dl, STR(name));                                                   \
		memcpy(&cap.member, &s_, sizeof s_);                                               \
		if (!s_) {                                                                         \
			fprintf(stderr, "capture: the driver lacks %s\n", STR(name));              \
			exit(TH_SKIP);                                                             \
		}                                                                                  \
	} while (0)

static void
cap_load(void)
{
	void *dl = sop__driver_handle();

	CAP_LOAD(begin, cuStreamBeginCapture);
	CAP_LOAD(end, cuStreamEndCapture);
	CAP_LOAD(is_capturing, cuStreamIsCapturing);
	CAP_LOAD(instantiate, cuGraphInstantiate);
	CAP_LOAD(launch, cuGraphLaunch);
	CAP_LOAD(exec_destroy, cuGraphExecDestroy);
	CAP_LOAD(destroy, cuGraphDestroy);
	CAP_LOAD(sync, cuStreamSynchronize);
}

/* What sop has called so far of one entry point, in every thread. */
static unsigned long long
calls(const char *name)
{
	const char *names[64];
	unsigned long long counts[64];
	size_t n = 64, i;

	TH_OK(sop_driver_calls(names, counts, &n));
	for (i = 0; i < n && i < 64; i++)
		if (!strcmp(names[i], name))
			return counts[i];
	fprintf(stderr, "capture: no count for %s\n", name);
	exit(1);
}

static void
expect_words(CUdeviceptr d, unsigned want, size_t n, CUstream s)
{
	unsigned *host = calloc(n, sizeof *host);
	size_t i;

	TH_ASSERT(host);
	TH_OK(th.cuMemcpyDtoHAsync(host, d, n * sizeof *host, s));
	TH_OK(cap.sync(s));
	for (i = 0; i < n; i++)
		if (host[i] != want) {
			fprintf(stderr, "capture: word %zu is %u, expected %u\n", i, host[i], want);
			exit(1);
		}
	free(host);
}

#define WORDS 1024

/* One stream captures allocations, frees and work; the graph runs many times. */
static void
capture_and_launch(void)
{
	CUstreamCaptureStatus st;
	sop_pool_t pool, mine, owner;
	CUmemPoolProps props;
	CUgraphExec exec;
	CUgraph graph;
	CUstream s = th_stream();
	void *before, *out, *g1, *g2, *g3;
	unsigned long long allocs, records;
	CUevent ev;
	int i;

	TH_OK(sop_device_get_default_pool(&pool, 0));
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	TH_OK(sop_pool_create(&mine, &props));
	TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	/* Without the interposer: an allocation asks whether its stream captures; a free asks
	 * nothing while no capture was ever seen. */
	allocs = calls("cuStreamIsCapturing");
	TH_OK(sop_malloc_async(&before, 4096, s));
	TH_EQ(calls("cuStreamIsCapturing"), allocs + 1);
	TH_OK(sop_free_async(before, s));
	TH_EQ(calls("cuStreamIsCapturing"), allocs + 1);
	TH_OK(sop_malloc_async(&before, 4096, s));
	TH_OK(sop_malloc_async(&out, WORDS * 4, s));
	TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)out, 0, WORDS, s));

	TH_OK(cap.begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	allocs = calls("cuMemAllocAsync");
	records = calls("cuEventRecord");
	/* Graph memory: the driver's, in no sop pool. */
	TH_OK(sop_malloc_async(&g1, WORDS * 4, s));
	TH_OK(sop_malloc_from_pool_async(&g2, WORDS * 4, mine, s));
	TH_OK(sop_malloc_from_pool_async(&g3, 512, pool, s));
	TH_EQ(calls("cuMemAllocAsync"), allocs + 3);
	TH_EQ(sop_pointer_get_pool(&owner, g1), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pointer_get_pool(&owner, g2), CUDA_ERROR_INVALID_VALUE);
	TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)g1, 5, WORDS, s));
	TH_OK(th.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)g2, (CUdeviceptr)(uintptr_t)g1,
				   WORDS * 4, s));
	TH_OK(sop_free_async(g1, s));
	/* An event recorded in the capture: the driver's record alone, no probe beside it. */
	TH_OK(sop_event_record(ev, s));
	TH_EQ(calls("cuEventRecord"), records + 1);
	TH_OK(th.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)out, (CUdeviceptr)(uintptr_t)g2,
				   WORDS * 4, s));
	TH_OK(sop_free_async(g2, s));
	TH_OK(sop_free_async(g3, s));
	/* sop's own memory cannot be freed in a graph: refused, and still allocated. */
	TH_EQ(sop_free_async(before, s), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_pointer_get_pool(&owner, before));
	TH_ASSERT(owner == pool);
	TH_OK(cap.is_capturing(s, &st));
	TH_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
	TH_OK(cap.end(s, &graph));
	TH_OK(cap.instantiate(&exec, graph, 0));
	expect_words((CUdeviceptr)(uintptr_t)out, 0, WORDS, s); /* nothing ran yet */
	for (i = 0; i < 50; i++) {
		TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)out, 0, WORDS, s));
		TH_OK(cap.launch(exec, s));
		/* sop's memory, used around the launches, is sop's as ever. */
		TH_OK(sop_free_async(before, s));
		TH_OK(sop_malloc_async(&before, 4096, s));
		expect_words((CUdeviceptr)(uintptr_t)out, 5, WORDS, s);
	}
	TH_OK(sop_free_async(before, s));
	TH_OK(sop_free_async(out, s));
	TH_OK(sop_stream_synchronize(s));
	TH_OK(cap.exec_destroy(exec));
	TH_OK(cap.destroy(graph));
	TH_OK(th.cuEventDestroy(ev));
	TH_OK(sop_pool_destroy(mine));
	TH_CHECK(pool);
	th_stream_destroy(s);
}

/* A thread that holds a global capture open until told to end it. */
struct capturer {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	CUcontext ctx;
	bool begun, stop;
	CUresult ended;
};

static void *
capturer_main(void *arg)
{
	struct capturer *c = arg;
	CUgraph graph = NULL;
	CUstream s;
	void *p;

	TH_OK(th.cuCtxSetCurrent(c->ctx));
	s = th_stream();
	TH_OK(cap.begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	TH_OK(sop_malloc_async(&p, 1 << 20, s));
	TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)p, 1, 1 << 18, s));
	TH_OK(sop_free_async(p, s));
	pthread_mutex_lock(&c->lock);
	c->begun = true;
	pthread_cond_broadcast(&c->cond);
	while (!c->stop)
		pthread_cond_wait(&c->cond, &c->lock);
	pthread_mutex_unlock(&c->lock);
	c->ended = cap.end(s, &graph);
	if (graph)
		TH_OK(cap.destroy(graph));
	th_stream_destroy(s);
	return NULL;
}

/* While another thread captures in global mode, this one makes sop grow, release, record probes
 * and query them, on streams of its own: the capture must come out valid. */
static void
capture_beside(void)
{
	struct capturer c = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, false,
			     false, CUDA_ERROR_UNKNOWN};
	unsigned long long queries, relaxed;
	sop_pool_t pool, def;
	CUmemPoolProps props;
	CUstream a = th_stream(), b = th_stream();
	void *p[256];
	pthread_t t;
	int round, i;

	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	TH_OK(sop_pool_create(&pool, &props));
	TH_OK(sop_device_set_pool(0, pool));
	TH_OK(SOP_DRV(cuCtxGetCurrent)(&c.ctx));
	pthread_create(&t, NULL, capturer_main, &c);
	pthread_mutex_lock(&c.lock);
	while (!c.begun)
		pthread_cond_wait(&c.cond, &c.lock);
	pthread_mutex_unlock(&c.lock);

	queries = calls("cuEventQuery");
	relaxed = calls("cuThreadExchangeStreamCaptureMode");
	/* Frees on a: probes every 64 frees; then sizes a's frees do not fit, on b: the slow path
	 * grows the pool and asks a's probes what completed. */
	for (round = 0; round < 8; round++) {
		for (i = 0; i < 256; i++)
			TH_OK(sop_malloc_async(&p[i], 4096 + (size_t)i * 512, a));
		for (i = 0; i < 256; i++)
			TH_OK(sop_free_async(p[i], a));
		for (i = 0; i < 8; i++)
			TH_OK(sop_malloc_async(&p[i], ((size_t)4 + (size_t)(round + i)) << 20, b));
		for (i = 0; i < 8; i++)
			TH_OK(sop_free_async(p[i], b));
	}
	TH_ASSERT(calls("cuThreadExchangeStreamCaptureMode") > relaxed);
	TH_ASSERT(calls("cuEventQuery") > queries);

	pthread_mutex_lock(&c.lock);
	c.stop = true;
	pthread_cond_broadcast(&c.cond);
	pthread_mutex_unlock(&c.lock);
	pthread_join(t, NULL);
	TH_OK(c.ended);
	TH_OK(sop_stream_synchronize(a));
	TH_OK(sop_stream_synchronize(b));
	TH_CHECK(pool);
	TH_OK(sop_device_get_default_pool(&def, 0));
	TH_OK(sop_device_set_pool(0, def));
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(a);
	th_stream_destroy(b);
}

/* The capture mode is exchanged only where the slow path calls the driver: growth pays for it,
 * a request the heap serves does not (two calls in every five operations of random sizes, where
 * most slow paths carve). */
static void
relax_when_due(void)
{
	sop_pool_t pool;
	CUmemPoolProps props;
	CUstream s = th_stream();
	cuuint64_t keep = UINT64_MAX;
	unsigned long long relaxed;
	void *p;

	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	TH_OK(sop_pool_create(&pool, &props));
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	relaxed = calls("cuThreadExchangeStreamCaptureMode");
	TH_OK(sop_malloc_from_pool_async(&p, 8 << 20, pool, s)); /* grows */
	TH_EQ(calls("cuThreadExchangeStreamCaptureMode"), relaxed + 2);
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s)); /* to the heap, kept: the stream's cache is empty */
	relaxed = calls("cuThreadExchangeStreamCaptureMode");
	TH_OK(sop_malloc_from_pool_async(&p, 1 << 20, pool, s));
	TH_EQ(calls("cuThreadExchangeStreamCaptureMode"), relaxed);
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(s);
}

int
main(void)
{
	th_init();
	cap_load();
	capture_and_launch();
	capture_beside();
	relax_when_due();
	printf("capture: ok\n");
	return 0;
}
