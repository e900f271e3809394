/* passthrough.c - what the interposer does to the driver calls a program makes: what it adds to
 * a call it does not serve, or serves by learning from it and passing it on, and what the pair
 * of calls it serves costs.
 *
 * Run it plainly and under sop-run; the difference per call is the interposer's cost. The entry
 * points are found as static cudart and most libraries find them, through dlsym on libcuda (the
 * interposer answers dlsym with its own function where it takes a name over). Each call is timed
 * over a loop of N calls, REPS times; the JSON line gives the median ns per call:
 *   ctx_get_device     not taken over: the control, equal on both sides
 *   mem_get_info       taken over for memory limits; passed on when no limit is set
 *   pointer_attribute  a device ordinal asked of cuMemAlloc memory (not sop's): looked up, passed on
 *   event_record       an event recorded on an idle stream (sop learns the stream's order)
 *   stream_wait_event  a wait on that event
 *   stream_synchronize an idle stream synchronized
 *   event_synchronize  a completed event synchronized
 *   pair_4k, pair_1m   cuMemAllocAsync then cuMemFreeAsync of 4 KiB or 1 MiB on one idle
 *                      stream, per pair: the driver's default pool plainly, sop's under
 *                      sop-run (what cudaMallocAsync and cudaFreeAsync reach)
 * Exits 77 where there is no driver or no device.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#define N 20000
#define REPS 9

static void *lib;
static CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
static CUresult (*free_async)(CUdeviceptr, CUstream);

static void *
sym(const char *name)
{
	void *p = dlsym(lib, name);

	if (!p) {
		fprintf(stderr, "passthrough: %s not found\n", name);
		exit(1);
	}
	return p;
}

static double
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int
cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

#define CHECK(call)                                                                    \
	do {                                                                           \
		CUresult r_ = (call);                                                  \
		if (r_ != CUDA_SUCCESS) {                                              \
			fprintf(stderr, "passthrough: %s failed (%d)\n", #call, (int)r_); \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

/* The median over REPS of the ns per call of a loop of N calls of `body`. */
#define TIME(out, body)                                                                \
	do {                                                                           \
		double v_[REPS];                                                       \
		for (int k_ = 0; k_ < REPS; k_++) {                                    \
			double t0_ = now_ns();                                         \
			for (int i_ = 0; i_ < N; i_++)                                 \
				CHECK(body);                                           \
			v_[k_] = (now_ns() - t0_) / N;                                 \
		}                                                                      \
		qsort(v_, REPS, sizeof v_[0], cmp);                                    \
		(out) = v_[REPS / 2];                                                  \
	} while (0)

/* One allocation and its free, on one stream, through whichever pool serves the device's
 * cuMemAllocAsync. */
static CUresult
pair(size_t size, CUstream s)
{
	CUdeviceptr q;
	CUresult r = alloc_async(&q, size, s);

	return r != CUDA_SUCCESS ? r : free_async(q, s);
}

int
main(void)
{
	CUresult (*init)(unsigned int);
	CUresult (*dev_get)(CUdevice *, int);
	CUresult (*primary_retain)(CUcontext *, CUdevice);
	CUresult (*ctx_set)(CUcontext);
	CUresult (*ctx_get_device)(CUdevice *);
	CUresult (*mem_get_info)(size_t *, size_t *);
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*ptr_attr)(void *, CUpointer_attribute, CUdeviceptr);
	CUresult (*stream_create)(CUstream *, unsigned int);
	CUresult (*stream_destroy)(CUstream);
	CUresult (*stream_sync)(CUstream);
	CUresult (*event_create)(CUevent *, unsigned int);
	CUresult (*event_destroy)(CUevent);
	CUresult (*event_record)(CUevent, CUstream);
	CUresult (*event_sync)(CUevent);
	CUresult (*wait_event)(CUstream, CUevent, unsigned int);
	double ctx_ns, info_ns, attr_ns, rec_ns, wait_ns, ssync_ns, esync_ns, pair4k_ns, pair1m_ns;
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr p;
	CUstream s;
	CUevent e;
	size_t free_b, total_b;
	int ordinal;

	lib = dlopen("libcuda.so.1", RTLD_NOW);
	if (!lib)
		return 77;
	*(void **)&init = sym("cuInit");
	if (init(0) != CUDA_SUCCESS)
		return 77;
	*(void **)&dev_get = sym("cuDeviceGet");
	if (dev_get(&dev, 0) != CUDA_SUCCESS)
		return 77;
	*(void **)&primary_retain = sym("cuDevicePrimaryCtxRetain");
	*(void **)&ctx_set = sym("cuCtxSetCurrent");
	*(void **)&ctx_get_device = sym("cuCtxGetDevice");
	*(void **)&mem_get_info = sym("cuMemGetInfo_v2");
	*(void **)&mem_alloc = sym("cuMemAlloc_v2");
	*(void **)&mem_free = sym("cuMemFree_v2");
	*(void **)&ptr_attr = sym("cuPointerGetAttribute");
	*(void **)&stream_create = sym("cuStreamCreate");
	*(void **)&stream_destroy = sym("cuStreamDestroy_v2");
	*(void **)&stream_sync = sym("cuStreamSynchronize");
	*(void **)&event_create = sym("cuEventCreate");
	*(void **)&event_destroy = sym("cuEventDestroy_v2");
	*(void **)&event_record = sym("cuEventRecord");
	*(void **)&event_sync = sym("cuEventSynchronize");
	*(void **)&wait_event = sym("cuStreamWaitEvent");
	*(void **)&alloc_async = sym("cuMemAllocAsync");
	*(void **)&free_async = sym("cuMemFreeAsync");

	CHECK(primary_retain(&ctx, dev));
	CHECK(ctx_set(ctx));
	CHECK(mem_alloc(&p, 1 << 20));
	CHECK(stream_create(&s, CU_STREAM_NON_BLOCKING));
	CHECK(event_create(&e, CU_EVENT_DISABLE_TIMING));

	TIME(ctx_ns, ctx_get_device(&dev));
	TIME(info_ns, mem_get_info(&free_b, &total_b));
	TIME(attr_ns, ptr_attr(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p + 4096));
	TIME(rec_ns, event_record(e, s));
	TIME(wait_ns, wait_event(s, e, 0));
	CHECK(stream_sync(s));
	TIME(ssync_ns, stream_sync(s));
	TIME(esync_ns, event_sync(e));
	TIME(pair4k_ns, pair(4096, s));
	TIME(pair1m_ns, pair(1 << 20, s));
	CHECK(stream_sync(s));

	CHECK(event_destroy(e));
	CHECK(stream_destroy(s));
	CHECK(mem_free(p));
	printf("{\"calls\": %d, \"ctx_get_device\": %.1f, \"mem_get_info\": %.1f, "
	       "\"pointer_attribute\": %.1f, \"event_record\": %.1f, \"stream_wait_event\": %.1f, "
	       "\"stream_synchronize\": %.1f, \"event_synchronize\": %.1f, \"pair_4k\": %.1f, "
	       "\"pair_1m\": %.1f}\n",
	       N, ctx_ns, info_ns, attr_ns, rec_ns, wait_ns, ssync_ns, esync_ns, pair4k_ns, pair1m_ns);
	return 0;
}
