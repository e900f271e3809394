/* A same-stream pair through the driver's API (cuMemAllocAsync/cuMemFreeAsync): run plainly (the
 * driver's pool) and under the interposer (sop). Median ns per pair over REPS loops of N. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define N 200000
#define REPS 9
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
typedef CUresult (*calls_fn)(const char **, unsigned long long *, size_t *);
static unsigned long long getid(void){ calls_fn f=(calls_fn)dlsym(RTLD_DEFAULT,"sop_driver_calls"); const char*nm[64]; unsigned long long c[64]; size_t n=64; if(!f||f(nm,c,&n))return 0; for(size_t i=0;i<n&&i<64;i++) if(!strcmp(nm[i],"cuStreamGetId")) return c[i]; return 0; }
int main(void){
	CUdevice d; CUcontext c; CUstream s; CUdeviceptr p; double t[REPS];
	cuInit(0); cuDeviceGet(&d,0); cuDevicePrimaryCtxRetain(&c,d); cuCtxSetCurrent(c);
	cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	size_t size = getenv("SIZE") ? strtoul(getenv("SIZE"),0,0) : 4096;
	for(int i=0;i<10000;i++){cuMemAllocAsync(&p,size,s);cuMemFreeAsync(p,s);}
	unsigned long long g0=getid();
	for(int r=0;r<REPS;r++){double t0=now(); for(int i=0;i<N;i++){cuMemAllocAsync(&p,size,s);cuMemFreeAsync(p,s);} t[r]=(now()-t0)/N;}
	unsigned long long g1=getid();
	qsort(t,REPS,sizeof(double),cmp);
	printf("%s: %.1f ns/pair (%.1f-%.1f), cuStreamGetId per pair %.3f\n", getenv("LABEL")?getenv("LABEL"):"?", t[REPS/2], t[0], t[REPS-1], (double)(g1-g0)/(REPS*(double)N));
	return 0;
}
