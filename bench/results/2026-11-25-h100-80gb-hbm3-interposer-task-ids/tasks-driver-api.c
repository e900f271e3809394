/* Tasks through the driver's API (run under sop-run, or not for the driver's own pool): N threads,
 * each task makes a stream, 32 live blocks of 1 B..1 MiB, 256 replacements, frees, synchronizes,
 * destroys. Prints pairs/s, per-task phase times and cuStreamGetId calls per task when sop counts. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static CUcontext ctx; static atomic_int stop; static atomic_long tasks; static double ph[3];
static pthread_mutex_t mu=PTHREAD_MUTEX_INITIALIZER;
static void*worker(void*a){unsigned seed=(unsigned)(uintptr_t)a*7919+1;double p[3]={0};long n=0;cuCtxSetCurrent(ctx);
 while(!atomic_load(&stop)){CUstream s;CUdeviceptr live[32];double t0=now();cuStreamCreate(&s,CU_STREAM_NON_BLOCKING);double t1=now();
  for(int i=0;i<32;i++)cuMemAllocAsync(&live[i],1+rand_r(&seed)%(1<<20),s);
  for(int j=0;j<256;j++){int i=rand_r(&seed)%32;cuMemFreeAsync(live[i],s);cuMemAllocAsync(&live[i],1+rand_r(&seed)%(1<<20),s);}
  for(int i=0;i<32;i++)cuMemFreeAsync(live[i],s);double t2=now();cuStreamSynchronize(s);cuStreamDestroy(s);double t3=now();
  p[0]+=t1-t0;p[1]+=t2-t1;p[2]+=t3-t2;n++;}
 atomic_fetch_add(&tasks,n);pthread_mutex_lock(&mu);for(int i=0;i<3;i++)ph[i]+=p[i];pthread_mutex_unlock(&mu);return NULL;}
typedef CUresult (*calls_fn)(const char **, unsigned long long *, size_t *);
static unsigned long long c0[128];
static unsigned long long getid_calls(void){calls_fn f=(calls_fn)dlsym(RTLD_DEFAULT,"sop_driver_calls");if(!f)return 0;
 const char*nm[128];unsigned long long c[128];size_t k=128;if(f(nm,c,&k))return 0;unsigned long long g=0;
 for(size_t i=0;i<k;i++){if(getenv("ALL")&&c[i]!=c0[i]&&c0[0]!=~0ull&&tasks)printf("   %-36s %10.2f per task\n",nm[i],(double)(c[i]-c0[i])/tasks);c0[i]=c[i];if(!strcmp(nm[i],"cuStreamGetId"))g=c[i];}return g;}
int main(int argc,char**argv){int nt=atoi(argv[1]);CUdevice d;cuInit(0);cuDeviceGet(&d,0);cuDevicePrimaryCtxRetain(&ctx,d);cuCtxSetCurrent(ctx);
 /* warm */ {CUstream s;CUdeviceptr x;cuStreamCreate(&s,CU_STREAM_NON_BLOCKING);cuMemAllocAsync(&x,1<<20,s);cuMemFreeAsync(x,s);cuStreamSynchronize(s);cuStreamDestroy(s);}
 unsigned long long g0=getid_calls();pthread_t t[64];double t0=now();for(long i=0;i<nt;i++)pthread_create(&t[i],0,worker,(void*)i);
 struct timespec ts={0,700000000};nanosleep(&ts,0);atomic_store(&stop,1);for(int i=0;i<nt;i++)pthread_join(t[i],0);double el=now()-t0;long nk=atomic_load(&tasks);
 printf("%-8s %2d thr: %6.2f M pairs/s; per task us: create %.1f alloc %.1f sync+destroy %.1f; cuStreamGetId %.1f per task\n",getenv("LABEL")?getenv("LABEL"):"?",nt,nk*288/el/1e6,ph[0]/nk*1e6,ph[1]/nk*1e6,ph[2]/nk*1e6,(double)(getid_calls()-g0)/nk);return 0;}
