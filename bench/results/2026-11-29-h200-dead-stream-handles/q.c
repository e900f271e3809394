/* Which query of a destroyed stream's handle the driver survives. argv[1]: idle or busy;
 * argv[2]: id or ctx or query. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

int
main(int argc, char **argv)
{
	CUdevice d;
	CUcontext prim, c;
	CUstream s;
	CUdeviceptr buf;
	unsigned long long id = 0;
	CUresult r;

	cuInit(0);
	cuDeviceGet(&d, 0);
	cuDevicePrimaryCtxRetain(&prim, d);
	cuCtxSetCurrent(prim);
	cuMemAlloc(&buf, (size_t)1 << 26);
	cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	if (!strcmp(argv[1], "busy"))
		cuMemsetD8Async(buf, 1, (size_t)1 << 26, s);
	cuStreamDestroy(s);
	printf("%s %s: asking\n", argv[1], argv[2]);
	fflush(stdout);
	if (!strcmp(argv[2], "id"))
		r = cuStreamGetId(s, &id);
	else if (!strcmp(argv[2], "ctx"))
		r = cuStreamGetCtx(s, &c);
	else
		r = cuStreamQuery(s);
	printf("%s %s: %d\n", argv[1], argv[2], (int)r);
	return 0;
}
