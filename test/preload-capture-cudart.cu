// preload-capture-cudart.cu - a runtime program that captures cudaMallocAsync, cudaFreeAsync and
// kernels into a CUDA graph and launches it many times, checking the data each time; run with and
// without sop-run on a GPU (test/meson.build builds it with static cudart, nvcc's default, and
// with per-thread default streams). Under sop-run, memory made outside the capture is sop's and
// what the capture allocates is the driver's graph memory; while the graph is captured in global
// mode, another thread allocates and frees through sop on a stream of its own (growing the pool,
// recording and querying probes), and the capture must stay valid: sop's own driver calls run in
// the relaxed capture mode. Without sop that thread is left out: the driver refuses a free on
// another stream during a global capture. Exit 77 without a GPU.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define OK(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
				cudaGetErrorString(e_));                                           \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

typedef int (*pointer_get_pool_fn)(void **pool, const void *ptr);
static pointer_get_pool_fn get_pool; // NULL without sop

static bool sop_owns(const void *p)
{
	void *pool = NULL;

	return get_pool && get_pool(&pool, p) == 0;
}

__global__ void fill(int *p, int v, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		p[i] = v + i;
}

__global__ void combine(int *out, const int *a, const int *b, const int *in, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		out[i] = 2 * a[i] - b[i] + in[i];
}

static const int N = 1 << 20;
static const int LAUNCHES = 200;

// Churn through sop on a stream of this thread's own while the main thread captures.
struct peer {
	cudaStream_t s;
	volatile bool stop;
	volatile long rounds;
	cudaError_t err;
};

static void *peer_main(void *arg)
{
	struct peer *p = (struct peer *)arg;
	cudaStream_t s = p->s;
	void *v[64];

	while (!p->stop && p->err == cudaSuccess) {
		for (int i = 0; i < 64 && p->err == cudaSuccess; i++)
			p->err = cudaMallocAsync(&v[i], (size_t)(4096 + 512 * i) << (p->rounds % 12), s);
		for (int i = 0; i < 64 && p->err == cudaSuccess; i++)
			p->err = cudaFreeAsync(v[i], s);
		p->rounds++;
	}
	return NULL;
}

int main()
{
	int devices = 0, *in, *out, *a, *b, *host;
	cudaStream_t s;
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	struct peer peer = {NULL, false, 0, cudaSuccess};
	pthread_t t;
	const int threads = 256, blocks = (N + threads - 1) / threads;

	if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
		printf("skip: no GPU\n");
		return 77;
	}
	void *sym = dlsym(RTLD_DEFAULT, "sop_pointer_get_pool");
	*(void **)&get_pool = sym;
	OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	host = (int *)malloc(N * sizeof *host);
	CHECK(host);
	OK(cudaMallocAsync((void **)&in, N * sizeof(int), s));
	OK(cudaMallocAsync((void **)&out, N * sizeof(int), s));
	CHECK(!get_pool || (sop_owns(in) && sop_owns(out)));
	OK(cudaStreamSynchronize(s));

	if (get_pool) {
		// Running before the capture begins, so that nothing it starts lazily falls in it.
		OK(cudaStreamCreateWithFlags(&peer.s, cudaStreamNonBlocking));
		pthread_create(&t, NULL, peer_main, &peer);
		while (peer.rounds < 2 && peer.err == cudaSuccess)
			;
	}
	OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	OK(cudaMallocAsync((void **)&a, N * sizeof(int), s));
	OK(cudaMallocAsync((void **)&b, N * sizeof(int), s));
	CHECK(!sop_owns(a) && !sop_owns(b)); // graph memory, the driver's
	fill<<<blocks, threads, 0, s>>>(a, 7, N);
	fill<<<blocks, threads, 0, s>>>(b, 3, N);
	combine<<<blocks, threads, 0, s>>>(out, a, b, in, N);
	OK(cudaFreeAsync(a, s));
	OK(cudaFreeAsync(b, s));
	// sop's memory cannot be freed in a graph: refused, as the driver refuses a free of memory
	// that is not the graph's (whether the driver also invalidates the capture then is not
	// known here: only under sop, which does not).
	if (get_pool) {
		CHECK(cudaFreeAsync(in, s) == cudaErrorInvalidValue);
		cudaGetLastError();
	}
	OK(cudaStreamEndCapture(s, &graph));
	if (get_pool) {
		long during = peer.rounds;

		peer.stop = true;
		pthread_join(t, NULL);
		if (peer.err != cudaSuccess) {
			fprintf(stderr, "peer: %s\n", cudaGetErrorString(peer.err));
			return 1;
		}
		CHECK(during > 2);
		OK(cudaStreamSynchronize(peer.s));
		OK(cudaStreamDestroy(peer.s));
	}
	OK(cudaGraphInstantiate(&exec, graph, 0));
	for (int l = 0; l < LAUNCHES; l++) {
		// a = 7 + i, b = 3 + i: out = 2a - b + in = 11 + i + in.
		fill<<<blocks, threads, 0, s>>>(in, l * 1000, N);
		OK(cudaMemsetAsync(out, 0, N * sizeof(int), s));
		OK(cudaGraphLaunch(exec, s));
		OK(cudaMemcpyAsync(host, out, N * sizeof(int), cudaMemcpyDeviceToHost, s));
		OK(cudaStreamSynchronize(s));
		for (int i = 0; i < N; i++)
			if (host[i] != 11 + i + (l * 1000 + i)) {
				fprintf(stderr, "launch %d: out[%d] = %d, expected %d\n", l, i, host[i],
					11 + i + l * 1000 + i);
				return 1;
			}
	}
	OK(cudaGraphExecDestroy(exec));
	OK(cudaGraphDestroy(graph));
	OK(cudaFreeAsync(in, s));
	OK(cudaFreeAsync(out, s));
	OK(cudaStreamSynchronize(s));
	OK(cudaStreamDestroy(s));
	free(host);
	printf("capture-cudart: %d launches ok, %s, peer rounds during the capture: %ld\n", LAUNCHES,
	       get_pool ? "under sop" : "without sop", peer.rounds);
	return 0;
}
