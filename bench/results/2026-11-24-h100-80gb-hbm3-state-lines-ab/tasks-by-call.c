/* Tasks that each make a stream (or KEEP=1: one stream per thread for all its tasks), timed by
 * phase and by call: where the allocation phase's time goes at 16 threads. */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "sop.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static inline unsigned long ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000ul+t.tv_nsec;}
static CUcontext ctx; static sop_pool_t pool; static int keep;
static atomic_long tasks; static atomic_int stop; static double secs=0.5;
static double ph[4]; static pthread_mutex_t mu=PTHREAD_MUTEX_INITIALIZER;
/* per call: count, total ns, slow (>2us) count and ns, by kind 0 alloc 1 free; by position: first 32 allocs vs steps */
static atomic_ulong cn[3], cns[3], sn[3], sns[3], vsn[3], vsns[3];
static void acc(int k, unsigned long d, unsigned long *loc){loc[k*4]++;loc[k*4+1]+=d;if(d>2000){loc[k*4+2]++;loc[k*4+3]+=d;}}
static void*worker(void*a){
	unsigned seed=(unsigned)(uintptr_t)a*7919+1; long n=0; double p[4]={0}; unsigned long loc[12]={0}, vs[6]={0};
	cuCtxSetCurrent(ctx);
	CUstream ks=0; if(keep)cuStreamCreate(&ks,CU_STREAM_NON_BLOCKING);
	while(!atomic_load(&stop)){
		CUstream s; void*live[32]; double t0=now();
		if(keep)s=ks;else cuStreamCreate(&s,CU_STREAM_NON_BLOCKING); double t1=now();
		for(int i=0;i<32;i++){size_t sz=1+rand_r(&seed)%(1<<20); unsigned long a0=ns();
			sop_malloc_from_pool_async(&live[i],sz,pool,s); unsigned long d=ns()-a0; acc(0,d,loc); if(d>20000){vs[0]++;vs[1]+=d;}}
		for(int j=0;j<256;j++){int i=rand_r(&seed)%32;size_t sz=1+rand_r(&seed)%(1<<20);
			unsigned long a0=ns(); sop_free_async(live[i],s); unsigned long a1=ns(); sop_malloc_from_pool_async(&live[i],sz,pool,s); unsigned long a2=ns();
			acc(1,a1-a0,loc); acc(2,a2-a1,loc); if(a1-a0>20000){vs[2]++;vs[3]+=a1-a0;} if(a2-a1>20000){vs[4]++;vs[5]+=a2-a1;}}
		for(int i=0;i<32;i++)sop_free_async(live[i],s);
		double t2=now(); sop_stream_synchronize(s); double t3=now();
		if(!keep)sop_stream_destroy(s); double t4=now();
		p[0]+=t1-t0;p[1]+=t2-t1;p[2]+=t3-t2;p[3]+=t4-t3; n++;
	}
	if(keep)sop_stream_destroy(ks);
	atomic_fetch_add(&tasks,n);
	for(int k=0;k<3;k++){cn[k]+=loc[k*4];cns[k]+=loc[k*4+1];sn[k]+=loc[k*4+2];sns[k]+=loc[k*4+3];vsn[k]+=vs[k*2];vsns[k]+=vs[k*2+1];}
	pthread_mutex_lock(&mu);for(int i=0;i<4;i++)ph[i]+=p[i];pthread_mutex_unlock(&mu);
	return NULL;
}
int main(int argc,char**argv){
	int nt=argc>1?atoi(argv[1]):16; keep=getenv("KEEP")!=NULL;
	if(getenv("SECS"))secs=atof(getenv("SECS"));
	CUdevice d; cuInit(0); cuDeviceGet(&d,0); cuDevicePrimaryCtxRetain(&ctx,d); cuCtxSetCurrent(ctx);
	CUmemPoolProps p={0};p.allocType=CU_MEM_ALLOCATION_TYPE_PINNED;p.location.type=CU_MEM_LOCATION_TYPE_DEVICE;
	cuuint64_t kp=~0ull;
	sop_pool_create(&pool,&p);sop_pool_set_attr(pool,CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,&kp);
	pthread_t t[64]; double t0=now();
	for(long i=0;i<nt;i++)pthread_create(&t[i],0,worker,(void*)i);
	struct timespec ts={(time_t)secs,(long)((secs-(time_t)secs)*1e9)};nanosleep(&ts,0);atomic_store(&stop,1);
	for(int i=0;i<nt;i++)pthread_join(t[i],0);
	double el=now()-t0; long nk=atomic_load(&tasks);
	printf("%-10s %2d thr: %6.2f M pairs/s %7.0f tasks/s; per task us: create %.1f alloc %.1f sync %.1f destroy %.1f\n",
	 getenv("LABEL")?getenv("LABEL"):"?",nt,nk*288/el/1e6,nk/el,ph[0]/nk*1e6,ph[1]/nk*1e6,ph[2]/nk*1e6,ph[3]/nk*1e6);
	const char*nm[3]={"fill alloc","step free","step alloc"};
	for(int k=0;k<3;k++)printf("   %-10s mean %7.0f ns; >2us %5.2f%% of calls, %5.1f%% of time; >20us %ld calls/task, %.1f us/task\n",nm[k],(double)cns[k]/cn[k],100.0*sn[k]/cn[k],100.0*sns[k]/cns[k],(long)0+ (long)(vsn[k]/ (nk?nk:1)),(double)vsns[k]/1e3/(nk?nk:1));
	cuuint64_t r=0,u=0;sop_pool_get_attr(pool,CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,&r);sop_pool_get_attr(pool,CU_MEMPOOL_ATTR_USED_MEM_HIGH,&u);printf("   reserved high %.0f MiB used high %.0f MiB\n",r/1048576.0,u/1048576.0);
	return 0;
}
