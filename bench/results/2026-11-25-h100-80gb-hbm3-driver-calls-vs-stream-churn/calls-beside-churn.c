/* Tasks with no allocator on N threads, each: create a non-blocking stream, Q rounds of driver
 * calls on it (M: 1 cuStreamGetId, 2 cuStreamIsCapturing, 3 both, as sop's calls make per
 * allocation without the interposer; 8 cuCtxGetCurrent), synchronize it, destroy it, for half a
 * second. Prints tasks/s and each phase's microseconds a task.
 *
 *   calls-beside-churn N Q [M]   (gcc -O2 calls-beside-churn.c -lcuda -lpthread) */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static CUcontext ctx; static int Q, M; static atomic_int stop; static atomic_long tasks;
static double ph[4]; static pthread_mutex_t mu=PTHREAD_MUTEX_INITIALIZER;
static void*worker(void*a){(void)a;double p[4]={0};long n=0;cuCtxSetCurrent(ctx);
 while(!atomic_load(&stop)){CUstream s;unsigned long long id;CUstreamCaptureStatus cs;double t0=now();
  cuStreamCreate(&s,CU_STREAM_NON_BLOCKING);double t1=now();
  for(int i=0;i<Q;i++){if(M&1)cuStreamGetId(s,&id);if(M&2)cuStreamIsCapturing(s,&cs);if(M&4){CUcontext c;cuStreamGetCtx(s,&c);}if(M&8){CUcontext c;cuCtxGetCurrent(&c);}}double t2=now();
  cuStreamSynchronize(s);double t3=now();cuStreamDestroy(s);double t4=now();
  p[0]+=t1-t0;p[1]+=t2-t1;p[2]+=t3-t2;p[3]+=t4-t3;n++;}
 atomic_fetch_add(&tasks,n);pthread_mutex_lock(&mu);for(int i=0;i<4;i++)ph[i]+=p[i];pthread_mutex_unlock(&mu);return NULL;}
int main(int argc,char**argv){int nt=atoi(argv[1]);Q=atoi(argv[2]);M=argc>3?atoi(argv[3]):3;CUdevice d;cuInit(0);cuDeviceGet(&d,0);cuDevicePrimaryCtxRetain(&ctx,d);cuCtxSetCurrent(ctx);
 pthread_t t[64];double t0=now();for(long i=0;i<nt;i++)pthread_create(&t[i],0,worker,(void*)i);
 struct timespec ts={0,500000000};nanosleep(&ts,0);atomic_store(&stop,1);for(int i=0;i<nt;i++)pthread_join(t[i],0);
 double el=now()-t0;long nk=atomic_load(&tasks);
 printf("%2d thr M=%d Q=%3d: %7.0f tasks/s; per task us: create %.1f queries %.1f sync %.1f destroy %.1f\n",nt,M,Q,nk/el,ph[0]/nk*1e6,ph[1]/nk*1e6,ph[2]/nk*1e6,ph[3]/nk*1e6);return 0;}
