/* Tasks that each make a stream, timed by phase: create, allocations, sync, destroy. */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "sop.h"
void sop__stream_destroys_watch(void); void sop__capture_watch(void);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static CUcontext ctx; static sop_pool_t pool; static CUmemoryPool dpool; static int mode; /* 0 sop 1 drv 2 none */
static int sopdestroy, evrec, sq; static atomic_long tasks; static atomic_int stop; static double secs=0.5;
static double ph[4]; static pthread_mutex_t mu=PTHREAD_MUTEX_INITIALIZER;
static void*worker(void*a){
	unsigned seed=(unsigned)(uintptr_t)a*7919+1; long n=0; double p[4]={0};
	cuCtxSetCurrent(ctx);
	CUevent evs[8]; for(int i=0;i<8;i++)cuEventCreate(&evs[i],CU_EVENT_DISABLE_TIMING);
	while(!atomic_load(&stop)){
		CUstream s; void*live[32]; double t0=now();
		cuStreamCreate(&s,CU_STREAM_NON_BLOCKING); double t1=now();
		for(int i=0;i<evrec;i++)cuEventRecord(evs[i],s); for(int i=0;i<sq;i++)cuStreamQuery(s);
		if(mode!=2){
		for(int i=0;i<32;i++){size_t sz=1+rand_r(&seed)%(1<<20);
			if(mode)cuMemAllocFromPoolAsync((CUdeviceptr*)&live[i],sz,dpool,s);else sop_malloc_from_pool_async(&live[i],sz,pool,s);}
		for(int j=0;j<256;j++){int i=rand_r(&seed)%32;size_t sz=1+rand_r(&seed)%(1<<20);
			if(mode){cuMemFreeAsync((CUdeviceptr)live[i],s);cuMemAllocFromPoolAsync((CUdeviceptr*)&live[i],sz,dpool,s);}
			else{sop_free_async(live[i],s);sop_malloc_from_pool_async(&live[i],sz,pool,s);}}
		for(int i=0;i<32;i++){if(mode)cuMemFreeAsync((CUdeviceptr)live[i],s);else sop_free_async(live[i],s);}
		}
		double t2=now(); if(mode)cuStreamSynchronize(s);else sop_stream_synchronize(s); double t3=now();
		if(mode==0&&sopdestroy)sop_stream_destroy(s);else cuStreamDestroy(s); double t4=now();
		p[0]+=t1-t0;p[1]+=t2-t1;p[2]+=t3-t2;p[3]+=t4-t3; n++;
	}
	atomic_fetch_add(&tasks,n);
	pthread_mutex_lock(&mu);for(int i=0;i<4;i++)ph[i]+=p[i];pthread_mutex_unlock(&mu);
	return NULL;
}
int main(int argc,char**argv){
	int nt=argc>1?atoi(argv[1]):16; mode=getenv("DRV")?1:getenv("NONE")?2:0; sopdestroy=getenv("SOPD")!=NULL; evrec=getenv("EVREC")?atoi(getenv("EVREC")):0; sq=getenv("SQ")?atoi(getenv("SQ")):0;
	if(getenv("SECS"))secs=atof(getenv("SECS"));
	CUdevice d; cuInit(0); cuDeviceGet(&d,0); cuDevicePrimaryCtxRetain(&ctx,d); cuCtxSetCurrent(ctx);
	CUmemPoolProps p={0};p.allocType=CU_MEM_ALLOCATION_TYPE_PINNED;p.location.type=CU_MEM_LOCATION_TYPE_DEVICE;
	cuuint64_t keep=~0ull;
	if(mode==1){cuMemPoolCreate(&dpool,&p);cuMemPoolSetAttribute(dpool,CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,&keep);}
	else{sop_pool_create(&pool,&p);sop_pool_set_attr(pool,CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,&keep);}
	if(getenv("MEMO")){sop__stream_destroys_watch();sopdestroy=1;}
	if(getenv("CAPW"))sop__capture_watch();
	pthread_t t[64]; double t0=now();
	for(long i=0;i<nt;i++)pthread_create(&t[i],0,worker,(void*)i);
	struct timespec ts={(time_t)secs,(long)((secs-(time_t)secs)*1e9)};nanosleep(&ts,0);atomic_store(&stop,1);
	for(int i=0;i<nt;i++)pthread_join(t[i],0);
	double el=now()-t0; long nk=atomic_load(&tasks);
	printf("%-16s %2d thr: %6.2f M pairs/s %7.0f tasks/s; per task us: create %.1f alloc %.1f sync %.1f destroy %.1f\n",
	 getenv("LABEL")?getenv("LABEL"):"?",nt,nk*288/el/1e6,nk/el,ph[0]/nk*1e6,ph[1]/nk*1e6,ph[2]/nk*1e6,ph[3]/nk*1e6);
	if(mode!=1){cuuint64_t r=0,u=0;sop_pool_get_attr(pool,CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,&r);sop_pool_get_attr(pool,CU_MEMPOOL_ATTR_USED_MEM_HIGH,&u);if(mode==0)printf("   reserved high %.0f MiB used high %.0f MiB\n",r/1048576.0,u/1048576.0);}
	return 0;
}
