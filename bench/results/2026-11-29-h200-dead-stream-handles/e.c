/* What the driver does with a destroyed event's handle that no event has taken since.
 * argv[1]: recorded or fresh; argv[2]: query, sync, record or wait. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

int
main(int argc, char **argv)
{
	CUdevice d;
	CUcontext prim;
	CUstream s;
	CUevent e;
	CUresult r;

	(void)argc;
	cuInit(0);
	cuDeviceGet(&d, 0);
	cuDevicePrimaryCtxRetain(&prim, d);
	cuCtxSetCurrent(prim);
	cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
	if (!strcmp(argv[1], "recorded"))
		cuEventRecord(e, s);
	cuEventDestroy(e);
	printf("%s %s: asking\n", argv[1], argv[2]);
	fflush(stdout);
	if (!strcmp(argv[2], "query"))
		r = cuEventQuery(e);
	else if (!strcmp(argv[2], "sync"))
		r = cuEventSynchronize(e);
	else if (!strcmp(argv[2], "record"))
		r = cuEventRecord(e, s);
	else
		r = cuStreamWaitEvent(s, e, 0);
	printf("%s %s: %d\n", argv[1], argv[2], (int)r);
	return 0;
}
