/* Per repetition: 100k same-stream pairs through sop, then 100k of its two queries alone
 * (cuStreamGetId, cuStreamIsCapturing), then a synchronization, as the harness's pair workload
 * runs them. Prints each repetition's ns per pair and per query pair, and the block's address. */
#define _GNU_SOURCE
#include <cuda.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "sop.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(int argc, char **argv){
	CUdevice d; CUcontext c; CUstream s; sop_pool_t pool; void *p = 0;
	int pin = argc > 1 && atoi(argv[1]); /* as run: any CPU given pins to CPU 1 */
	size_t sizes[] = {256, 4096, 65536, 1 << 20, 64 << 20};
	if (pin) { cpu_set_t m; CPU_ZERO(&m); CPU_SET(pin, &m); sched_setaffinity(0, sizeof m, &m); }
	cuInit(0); cuDeviceGet(&d,0); cuDevicePrimaryCtxRetain(&c,d); cuCtxSetCurrent(c);
	cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	CUmemPoolProps pp={0}; pp.allocType=CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type=CU_MEM_LOCATION_TYPE_DEVICE;
	sop_pool_create(&pool,&pp);
	for (int z = 0; z < 5; z++) {
		size_t size = sizes[z];
		for (int i = 0; i < 10001; i++) { sop_malloc_from_pool_async(&p,size,pool,s); sop_free_async(p,s); }
		sop_stream_synchronize(s);
		for (int rep = 0; rep < 12; rep++) {
			double t0 = now();
			for (int i = 0; i < 100000; i++) { sop_malloc_from_pool_async(&p,size,pool,s); sop_free_async(p,s); }
			double t1 = now();
			unsigned long long id; CUstreamCaptureStatus st;
			for (int i = 0; i < 100000; i++) { cuStreamGetId(s, &id); cuStreamIsCapturing(s, &st); }
			double t2 = now();
			sop_stream_synchronize(s);
			printf("pin %d size %8zu rep %2d pair %6.1f ns queries %6.1f ns p %p cpu %d\n", pin, size, rep,
			       (t1 - t0) / 1e5, (t2 - t1) / 1e5, p, sched_getcpu());
		}
	}
	return 0;
}
