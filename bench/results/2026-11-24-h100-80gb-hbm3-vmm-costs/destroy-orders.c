/* Pool destroy: the driver's pool against the bare calls in several orders. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
#define R 21
#define CK(x) do{CUresult e_=(x); if(e_){printf("%s:%d %s -> %d\n",__FILE__,__LINE__,#x,e_);}}while(0)
static CUmemAllocationProp ap; static CUmemAccessDesc ad;
static double med(double*v){qsort(v,R,sizeof(double),cmp);return v[R/2];}
int main(void){
	CUdevice d; CUcontext c; CUstream s;
	cuInit(0); cuDeviceGet(&d,0); cuDevicePrimaryCtxRetain(&c,d); cuCtxSetCurrent(c);
	cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	ap.type=CU_MEM_ALLOCATION_TYPE_PINNED;ap.location.type=CU_MEM_LOCATION_TYPE_DEVICE;ap.location.id=0;
	ad.location.type=CU_MEM_LOCATION_TYPE_DEVICE; ad.location.id=0; ad.flags=CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	size_t RS=(size_t)320<<30, P=32<<20;
	const char *names[]={"unmap,release,free","release,unmap,free","unmap,free,release","release,free(no unmap)","unmap-whole-range,release,free","driver pool destroy","driver pool destroy (2 MiB held?)"};
	double v[8][R]; double parts[3][R];
	for(int r=-1;r<R;r++){
		for(int k=0;k<6;k++){
			int kk=(k+r+6)%6;
			CUdeviceptr va; CUmemGenericAllocationHandle h; double t0,t1,t2,t3; CUresult e1=0,e2=0,e3=0;
			if(kk<5){
				CK(cuMemAddressReserve(&va,RS,1<<30,0,0)); CK(cuMemCreate(&h,P,&ap,0)); CK(cuMemMap(va,P,0,h,0)); CK(cuMemSetAccess(va,P,&ad,1));
				t0=now();
				switch(kk){
				case 0: e1=cuMemUnmap(va,P); t1=now(); e2=cuMemRelease(h); t2=now(); e3=cuMemAddressFree(va,RS); t3=now(); break;
				case 1: e1=cuMemRelease(h); t1=now(); e2=cuMemUnmap(va,P); t2=now(); e3=cuMemAddressFree(va,RS); t3=now(); break;
				case 2: e1=cuMemUnmap(va,P); t1=now(); e2=cuMemAddressFree(va,RS); t2=now(); e3=cuMemRelease(h); t3=now(); break;
				case 3: e1=cuMemRelease(h); t1=now(); e2=cuMemAddressFree(va,RS); t2=now(); t3=t2; if(e2){cuMemUnmap(va,P); cuMemAddressFree(va,RS);} break;
				case 4: e1=cuMemUnmap(va,RS); t1=now(); if(e1) cuMemUnmap(va,P); e2=cuMemRelease(h); t2=now(); e3=cuMemAddressFree(va,RS); t3=now(); break;
				}
				if(r==0&&(e1||e2||e3)) printf("%s: errors %d %d %d\n",names[kk],e1,e2,e3);
				if(r>=0){v[kk][r]=t3-t0; if(kk==0){parts[0][r]=t1-t0;parts[1][r]=t2-t1;parts[2][r]=t3-t2;}}
			} else {
				CUmemoryPool p; CUmemPoolProps pp; memset(&pp,0,sizeof pp);
				pp.allocType=CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type=CU_MEM_LOCATION_TYPE_DEVICE; pp.location.id=0;
				CK(cuMemPoolCreate(&p,&pp)); cuuint64_t th=~0ull; CK(cuMemPoolSetAttribute(p,CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,&th));
				CUdeviceptr x; CK(cuMemAllocFromPoolAsync(&x,1<<20,p,s)); CK(cuMemFreeAsync(x,s)); CK(cuStreamSynchronize(s));
				cuuint64_t res=0; cuMemPoolGetAttribute(p,CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,&res);
				if(r==0) printf("driver pool holds %llu MiB before destroy\n",(unsigned long long)res>>20);
				t0=now(); CK(cuMemPoolDestroy(p)); t1=now();
				if(r>=0) v[5][r]=t1-t0;
			}
		}
	}
	for(int k=0;k<6;k++) printf("%-32s %7.1f us\n",names[k],med(v[k]));
	printf("parts of the first: unmap %.1f release %.1f free %.1f\n",med(parts[0]),med(parts[1]),med(parts[2]));
	return 0;
}
