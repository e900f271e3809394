/* Does cuCtxSynchronize from a helper thread in relaxed capture mode disturb a capture that
 * another thread runs (global, thread-local, relaxed)? And does it wait for work of a stream
 * destroyed with work still pending? */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include <time.h>
static CUcontext ctx;
static CUresult helper_rc;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
static void *helper(void *a){CUstreamCaptureMode m=CU_STREAM_CAPTURE_MODE_RELAXED;(void)a;cuCtxSetCurrent(ctx);
 cuThreadExchangeStreamCaptureMode(&m);helper_rc=cuCtxSynchronize();return 0;}
static const char*nm(CUresult r){const char*s="?";cuGetErrorName(r,&s);return s;}
int main(void){CUdevice d;cuInit(0);cuDeviceGet(&d,0);cuDevicePrimaryCtxRetain(&ctx,d);cuCtxSetCurrent(ctx);
 CUdeviceptr buf;cuMemAlloc(&buf,1<<20);
 const CUstreamCaptureMode modes[]={CU_STREAM_CAPTURE_MODE_GLOBAL,CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,CU_STREAM_CAPTURE_MODE_RELAXED};
 const char*mn[]={"global","thread-local","relaxed"};
 for(int i=0;i<3;i++){CUstream s;cuStreamCreate(&s,CU_STREAM_NON_BLOCKING);
  CUresult b=cuStreamBeginCapture(s,modes[i]);cuMemsetD8Async(buf,1,1<<20,s);
  pthread_t t;pthread_create(&t,0,helper,0);pthread_join(t,0);
  cuMemsetD8Async(buf,2,1<<20,s);CUgraph g=0;CUresult e=cuStreamEndCapture(s,&g);
  printf("capture %-12s begin %s, helper's cuCtxSynchronize %s, end capture %s\n",mn[i],nm(b),nm(helper_rc),nm(e));
  if(g)cuGraphDestroy(g);
  cuStreamDestroy(s);}
 /* A stream destroyed with work pending: a long memset train, then destroy, then ctx sync. */
 CUdeviceptr big;cuMemAlloc(&big,(size_t)8<<30);CUstream s;cuStreamCreate(&s,CU_STREAM_NON_BLOCKING);
 CUevent ev;cuEventCreate(&ev,0);
 double t0=now();for(int k=0;k<200;k++)cuMemsetD8Async(big,k,(size_t)8<<30,s);cuEventRecord(ev,s);double t1=now();
 cuStreamDestroy(s);pthread_t t;pthread_create(&t,0,helper,0);pthread_join(t,0);double t2=now();
 printf("destroyed stream's work: enqueue %.1f ms, helper's cuCtxSynchronize %s after %.1f ms, its last event then %s\n",t1-t0,nm(helper_rc),t2-t1,nm(cuEventQuery(ev)));
 return 0;}
