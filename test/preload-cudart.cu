// preload-cudart.cu - a program of the CUDA runtime as nvcc builds it, run under sop-run on a GPU:
// its cudaMallocAsync, cudaFreeAsync, cudaMemPool* and synchronizations, which the runtime finds
// through cuGetProcAddress (static cudart, nvcc's default) or dlsym, land in sop's pools, and
// stream 0 keeps its meaning. test/meson.build builds it three ways: static cudart with the
// legacy default stream, with --default-stream per-thread, and with the shared cudart. It checks
// with sop's own calls, which the interposer exports; exit 77 without a GPU.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define OK(call) CHECK((call) == cudaSuccess)

typedef int (*pointer_get_pool_fn)(void **pool, const void *ptr);

static pointer_get_pool_fn get_pool;

// The sop pool p lies in, or NULL for memory sop did not allocate.
static void *pool_of(const void *p)
{
	void *pool = NULL;

	return get_pool(&pool, p) == 0 ? pool : NULL;
}

static uint64_t attr(cudaMemPool_t pool, cudaMemPoolAttr a)
{
	uint64_t v = 0;

	OK(cudaMemPoolGetAttribute(pool, a, &v));
	return v;
}

int main()
{
	const size_t n = (size_t)1 << 20;
	cudaMemPool_t def, mp;
	cudaStream_t s;
	void *p, *q, *r;
	int devices = 0, off = 0, on = 1;
	unsigned char *host;

	if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
		printf("skip: no GPU\n");
		return 77;
	}
	void *sym = dlsym(RTLD_DEFAULT, "sop_pointer_get_pool");
	if (!sym) {
		fprintf(stderr, "libsop-preload.so is not loaded: run it under sop-run\n");
		return 1;
	}
	memcpy(&get_pool, &sym, sizeof sym);

	// The default pool is sop's, and so is what it gives, on a stream and on stream 0.
	OK(cudaDeviceGetDefaultMemPool(&def, 0));
	OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	OK(cudaMallocAsync(&p, n, s));
	CHECK(pool_of(p) == (void *)def);
	OK(cudaMallocAsync(&q, n, 0));
	CHECK(pool_of(q) == (void *)def);
	// The memory works on the GPU.
	host = (unsigned char *)malloc(n);
	CHECK(host);
	OK(cudaMemsetAsync(p, 0x5a, n, s));
	OK(cudaMemcpyAsync(host, p, n, cudaMemcpyDeviceToHost, s));
	OK(cudaStreamSynchronize(s));
	CHECK(host[0] == 0x5a && host[n - 1] == 0x5a);
	OK(cudaFreeAsync(p, s));
	OK(cudaFreeAsync(q, 0));
	CHECK(attr(def, cudaMemPoolAttrUsedMemCurrent) == 0);
	// sop sees the runtime's synchronizations: with release threshold 0 it gives its memory back.
	OK(cudaDeviceSynchronize());
	CHECK(attr(def, cudaMemPoolAttrReservedMemCurrent) == 0);

	// Stream 0 is the per-thread stream in a per-thread build, the legacy stream otherwise.
	OK(cudaMemPoolSetAttribute(def, cudaMemPoolReuseFollowEventDependencies, &off));
	OK(cudaMemPoolSetAttribute(def, cudaMemPoolReuseAllowOpportunistic, &off));
	OK(cudaMemPoolSetAttribute(def, cudaMemPoolReuseAllowInternalDependencies, &off));
	OK(cudaMallocAsync(&p, n, 0));
	OK(cudaFreeAsync(p, 0));
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
	OK(cudaMallocAsync(&q, n, cudaStreamLegacy));
	OK(cudaMallocAsync(&r, n, cudaStreamPerThread));
	const char *mode = "per-thread default stream";
#else
	OK(cudaMallocAsync(&q, n, cudaStreamPerThread));
	OK(cudaMallocAsync(&r, n, cudaStreamLegacy));
	const char *mode = "legacy default stream";
#endif
	CHECK(q != p); // the other default stream cannot take it yet
	CHECK(r == p); // stream 0's own can
	OK(cudaFreeAsync(q, cudaStreamLegacy));
	OK(cudaFreeAsync(r, 0));
	OK(cudaDeviceSynchronize());
	OK(cudaMemPoolSetAttribute(def, cudaMemPoolReuseFollowEventDependencies, &on));
	OK(cudaMemPoolSetAttribute(def, cudaMemPoolReuseAllowOpportunistic, &on));
	OK(cudaMemPoolSetAttribute(def, cudaMemPoolReuseAllowInternalDependencies, &on));

	// A pool of the program's own is sop's too; its statistics are sop's figures.
	cudaMemPoolProps props;
	memset(&props, 0, sizeof props);
	props.allocType = cudaMemAllocationTypePinned;
	props.location.type = cudaMemLocationTypeDevice;
	props.location.id = 0;
	OK(cudaMemPoolCreate(&mp, &props));
	OK(cudaMallocFromPoolAsync(&p, 3 * n, mp, s));
	CHECK(pool_of(p) == (void *)mp);
	CHECK(attr(mp, cudaMemPoolAttrUsedMemCurrent) == 3 * n);
	OK(cudaFreeAsync(p, s));
	OK(cudaStreamSynchronize(s));
	OK(cudaMemPoolTrimTo(mp, 0));
	CHECK(attr(mp, cudaMemPoolAttrReservedMemCurrent) == 0);
	OK(cudaMemPoolDestroy(mp));

	// Memory from cudaMalloc is the driver's, freed by it.
	OK(cudaMalloc(&p, n));
	CHECK(pool_of(p) == NULL);
	OK(cudaFreeAsync(p, s));
	OK(cudaStreamSynchronize(s));
	OK(cudaStreamDestroy(s));
	free(host);
	printf("ok: %s\n", mode);
	return 0;
}
