// What a device reset does to a program under sop-run, against the driver alone.
// mode 0: no reset; 1: reset at the end only; 2: reset between rounds, all freed;
// 3: reset between rounds with a block left allocated and a pool of its own made current;
// 4: reset between rounds after frees taken across streams through an event; 5: an event made
// before a reset, queried after it (not valid use: what the driver answers); 6: mode 4 with a
// device synchronization before each reset; 7: frees cached on a stream with probes, left to the
// reset, then a new stream's large requests; 8: memory made with cuMemCreate, across a reset.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <cuda.h>
#include <dlfcn.h>
#include <cstring>

/* sop's count of its own driver calls, where sop is loaded. */
static void report(void)
{
	typedef CUresult (*calls_fn)(const char **, unsigned long long *, size_t *);
	calls_fn f = (calls_fn)dlsym(RTLD_DEFAULT, "sop_driver_calls");
	const char *names[64];
	unsigned long long counts[64];
	size_t n = 64;

	if (!f || f(names, counts, &n) != CUDA_SUCCESS) {
		printf("sop: not loaded\n");
		return;
	}
	printf("sop's calls:");
	for (size_t i = 0; i < n && i < 64; i++)
		if (counts[i] && (strstr(names[i], "Event") || strstr(names[i], "MemCreate") ||
				  strstr(names[i], "MemMap") || strstr(names[i], "Release")))
			printf(" %s=%llu", names[i], counts[i]);
	printf("\n");
}

__global__ void spin(long long cycles)
{
	long long t0 = clock64();
	while (clock64() - t0 < cycles)
		;
}

__global__ void fill(int *p, int n, int v)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		p[i] = v + i;
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	printf("line %d: %s -> %s\n", __LINE__, #x, cudaGetErrorString(e_)); fflush(stdout); return 1; } } while (0)

int main(int argc, char **argv)
{
	int mode = argc > 1 ? atoi(argv[1]) : 0;
	const int n = 1 << 18;
	int *h = (int *)malloc(n * sizeof(int));
	if (mode == 7) {
		/* Frees cached on a stream that has probes, the stream left alive, a reset, and
		 * then a new stream whose large requests ask what other streams' probes show. */
		for (int round = 0; round < 3; round++) {
			cudaStream_t a, t;
			int *blk[64];
			CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
			for (int k = 0; k < 64; k++)
				CK(cudaMallocAsync(&blk[k], 1 << 20, a));
			spin<<<1, 1, 0, a>>>(4000000);
			CK(cudaStreamSynchronize(a));
			for (int rep = 0; rep < 4; rep++) {
				spin<<<1, 1, 0, a>>>(200000);
				for (int k = 0; k < 64; k++)
					CK(cudaFreeAsync(blk[k], a));
				for (int k = 0; k < 64; k++)
					CK(cudaMallocAsync(&blk[k], 1 << 20, a));
			}
			for (int k = 0; k < 64; k++)
				CK(cudaFreeAsync(blk[k], a));
			report();
			CK(cudaDeviceReset());
			CK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
			for (int k = 0; k < 32; k++) {
				CK(cudaMallocAsync(&blk[k], 3 << 20, t));
				fill<<<256, 256, 0, t>>>(blk[k], 1 << 16, k);
			}
			for (int k = 0; k < 32; k++)
				CK(cudaFreeAsync(blk[k], t));
			CK(cudaStreamSynchronize(t));
			CK(cudaStreamDestroy(t));
			printf("round %d ok\n", round);
			fflush(stdout);
		}
		report();
		printf("done\n");
		return 0;
	}
	if (mode == 8) {
		/* Does a reset take memory made with cuMemCreate and mapped? */
		CUdevice d0;
		CUcontext pc;
		CUmemGenericAllocationHandle hdl;
		CUdeviceptr va;
		CUmemAllocationProp prop = {};
		CUmemAccessDesc acc = {};
		size_t sz = 2 << 20;
		unsigned word = 0;
		cudaFree(0);
		CK((cudaError_t)cuDeviceGet(&d0, 0));
		CK((cudaError_t)cuDevicePrimaryCtxRetain(&pc, d0));
		CK((cudaError_t)cuCtxSetCurrent(pc));
		prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop.location.id = 0;
		CK((cudaError_t)cuMemCreate(&hdl, sz, &prop, 0));
		CK((cudaError_t)cuMemAddressReserve(&va, sz, 0, 0, 0));
		CK((cudaError_t)cuMemMap(va, sz, 0, hdl, 0));
		acc.location = prop.location;
		acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		CK((cudaError_t)cuMemSetAccess(va, sz, &acc, 1));
		CK((cudaError_t)cuMemsetD32(va, 0x5a5a1234u, sz / 4));
		CK(cudaDeviceReset());
		CK((cudaError_t)cuCtxSetCurrent(pc));
		cudaFree(0);
		CUresult r = cuMemcpyDtoH(&word, va, 4);
		printf("after the reset: read %d, word %x\n", (int)r, word);
		r = cuMemsetD32(va, 7, sz / 4);
		printf("after the reset: write %d\n", (int)r);
		r = cuMemUnmap(va, sz);
		printf("unmap %d\n", (int)r);
		r = cuMemRelease(hdl);
		printf("release %d\n", (int)r);
		r = cuMemAddressFree(va, sz);
		printf("address free %d\n", (int)r);
		return 0;
	}
	if (mode == 5) {
		/* Does a reset destroy an event of the primary context that another retain holds? */
		CUdevice d0;
		CUcontext pc;
		CUevent e;
		cudaFree(0);
		CK((cudaError_t)cuDeviceGet(&d0, 0));
		CK((cudaError_t)cuDevicePrimaryCtxRetain(&pc, d0));
		CK((cudaError_t)cuCtxPushCurrent(pc));
		CK((cudaError_t)cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
		CK((cudaError_t)cuEventRecord(e, 0));
		CK((cudaError_t)cuEventSynchronize(e));
		printf("event made and recorded; primary ctx %p\n", (void *)pc);
		fflush(stdout);
		CK(cudaDeviceReset());
		CUcontext pc2;
		CK((cudaError_t)cuDevicePrimaryCtxRetain(&pc2, d0));
		printf("after the reset: primary ctx %p\n", (void *)pc2);
		fflush(stdout);
		CK((cudaError_t)cuCtxSetCurrent(pc2));
		CUresult r = cuEventQuery(e);
		printf("cuEventQuery of the old event: %d\n", (int)r);
		fflush(stdout);
		r = cuEventRecord(e, 0);
		printf("cuEventRecord of the old event: %d\n", (int)r);
		return 0;
	}
	for (int round = 0; round < 3; round++) {
		cudaStream_t s;
		int *p, *q = nullptr;
		cudaMemPool_t mine = nullptr;
		CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
		if (mode == 3) {
			cudaMemPoolProps props = {};
			props.allocType = cudaMemAllocationTypePinned;
			props.location.type = cudaMemLocationTypeDevice;
			props.location.id = 0;
			CK(cudaMemPoolCreate(&mine, &props));
			CK(cudaDeviceSetMemPool(0, mine));
		}
		for (int k = 0; k < 50; k++) {
			CK(cudaMallocAsync(&p, n * sizeof(int), s));
			fill<<<n / 256, 256, 0, s>>>(p, n, round * 1000 + k);
			CK(cudaMemcpyAsync(h, p, n * sizeof(int), cudaMemcpyDeviceToHost, s));
			CK(cudaStreamSynchronize(s));
			for (int i = 0; i < n; i += 4099)
				if (h[i] != round * 1000 + k + i) {
					printf("round %d k %d: bad data at %d: %d\n", round, k, i, h[i]);
					return 1;
				}
			CK(cudaFreeAsync(p, s));
		}
		if (mode == 3)
			CK(cudaMallocAsync(&q, 4096, s)); /* left allocated */
		if (mode == 4 || mode == 6) {
			/* Frees on a busy stream, taken by another after an event, and by a third
			 * opportunistically once complete: probes and events of sop in use. */
			cudaStream_t b, c;
			cudaEvent_t ev;
			int *blk[64];
			CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
			CK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
			CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
			for (int k = 0; k < 64; k++) {
				CK(cudaMallocAsync(&blk[k], 1 << 20, s));
				fill<<<256, 256, 0, s>>>(blk[k], 1 << 16, k);
			}
			spin<<<1, 1, 0, s>>>(2000000);
			for (int k = 0; k < 64; k++)
				CK(cudaFreeAsync(blk[k], s));
			CK(cudaEventRecord(ev, s));
			CK(cudaStreamWaitEvent(b, ev, 0));
			for (int k = 0; k < 32; k++) {
				CK(cudaMallocAsync(&blk[k], 1 << 20, b));
				fill<<<256, 256, 0, b>>>(blk[k], 1 << 16, 100 + k);
				CK(cudaFreeAsync(blk[k], b));
			}
			CK(cudaStreamSynchronize(s));
			for (int k = 0; k < 32; k++) {
				CK(cudaMallocAsync(&blk[k], 1 << 20, c));
				fill<<<256, 256, 0, c>>>(blk[k], 1 << 16, 200 + k);
			}
			for (int k = 0; k < 32; k++)
				CK(cudaFreeAsync(blk[k], c));
			CK(cudaStreamSynchronize(b));
			CK(cudaStreamSynchronize(c));
			CK(cudaEventDestroy(ev));
			CK(cudaStreamDestroy(b));
			CK(cudaStreamDestroy(c));
		}
		CK(cudaStreamSynchronize(s));
		CK(cudaStreamDestroy(s));
		printf("round %d ok\n", round);
		fflush(stdout);
		if (mode == 1 && round == 2)
			CK(cudaDeviceReset());
		if (mode >= 2) {
			if (mode == 6)
				CK(cudaDeviceSynchronize());
			report();
			CK(cudaDeviceReset());
		}
	}
	report();
	printf("done\n");
	return 0;
}
