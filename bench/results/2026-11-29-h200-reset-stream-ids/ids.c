/* The ids of the primary context and of its legacy, per-thread and a created stream, before and
 * after cuDevicePrimaryCtxReset (gcc ids.c -lcuda). */
#include <cuda.h>
#include <stdio.h>
#define C(x) do { CUresult r_ = (x); if (r_) { printf("%s -> %d\n", #x, r_); } } while (0)
int main(void) {
	CUdevice d; CUcontext c, c2; unsigned long long id1 = 0, id2 = 0, s1 = 0, s2 = 0, p1 = 0, p2 = 0, cid1 = 0, cid2 = 0;
	CUstream s;
	C(cuInit(0)); C(cuDeviceGet(&d, 0));
	C(cuDevicePrimaryCtxRetain(&c, d)); C(cuCtxSetCurrent(c));
	C(cuCtxGetId(c, &cid1));
	C(cuStreamGetId(CU_STREAM_LEGACY, &id1));
	C(cuStreamGetId(CU_STREAM_PER_THREAD, &p1));
	C(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)); C(cuStreamGetId(s, &s1));
	printf("before: ctx %p id %llu legacy %llu per-thread %llu stream %p id %llu\n", (void *)c, cid1, id1, p1, (void *)s, s1);
	C(cuDevicePrimaryCtxRelease(d));
	C(cuDevicePrimaryCtxReset(d));
	C(cuDevicePrimaryCtxRetain(&c2, d)); C(cuCtxSetCurrent(c2));
	C(cuCtxGetId(c2, &cid2));
	C(cuStreamGetId(CU_STREAM_LEGACY, &id2));
	C(cuStreamGetId(CU_STREAM_PER_THREAD, &p2));
	CUstream t; C(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING)); C(cuStreamGetId(t, &s2));
	printf("after:  ctx %p id %llu legacy %llu per-thread %llu stream %p id %llu\n", (void *)c2, cid2, id2, p2, (void *)t, s2);
	CUcontext sc = 0; C(cuStreamGetCtx(CU_STREAM_LEGACY, &sc)); printf("legacy ctx %p\n", (void *)sc);
	return 0;
}
