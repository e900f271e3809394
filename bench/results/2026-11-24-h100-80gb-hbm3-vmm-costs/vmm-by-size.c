/* VMM call costs by size, multi-piece access and unmap, remap of kept handles, reservation sizes. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
#define R 9
#define CK(x) do{CUresult e_=(x); if(e_){printf("%s:%d %s -> %d\n",__FILE__,__LINE__,#x,e_);}}while(0)
static CUmemAllocationProp ap; static CUmemAccessDesc ad;
int main(void){
	CUdevice d; CUcontext c;
	cuInit(0); cuDeviceGet(&d,0); cuDevicePrimaryCtxRetain(&c,d); cuCtxSetCurrent(c);
	ap.type=CU_MEM_ALLOCATION_TYPE_PINNED;ap.location.type=CU_MEM_LOCATION_TYPE_DEVICE;ap.location.id=0;
	ad.location.type=CU_MEM_LOCATION_TYPE_DEVICE; ad.location.id=0; ad.flags=CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CUdeviceptr base; CK(cuMemAddressReserve(&base,(size_t)64<<30,1<<30,0,0));
	/* one small neighbour mapping in the reservation, as a pool with memory has */
	CUmemGenericAllocationHandle nh; CK(cuMemCreate(&nh,2<<20,&ap,0)); CK(cuMemMap(base+((size_t)60<<30),2<<20,0,nh,0)); CK(cuMemSetAccess(base+((size_t)60<<30),2<<20,&ad,1));
	size_t sizes[]={2,32,128,512,1024,4096};
	printf("one piece, create/map/access/unmap/release\n");
	for(int si=0;si<6;si++){
		size_t sz=sizes[si]<<20; double v[5][R];
		for(int r=-1;r<R;r++){
			CUmemGenericAllocationHandle h; double t0,t1,t2,t3,t4,t5;
			t0=now(); CK(cuMemCreate(&h,sz,&ap,0)); t1=now(); CK(cuMemMap(base,sz,0,h,0)); t2=now();
			CK(cuMemSetAccess(base,sz,&ad,1)); t3=now(); CK(cuMemUnmap(base,sz)); t4=now(); CK(cuMemRelease(h)); t5=now();
			if(r>=0){v[0][r]=t1-t0;v[1][r]=t2-t1;v[2][r]=t3-t2;v[3][r]=t4-t3;v[4][r]=t5-t4;}
		}
		for(int k=0;k<5;k++)qsort(v[k],R,sizeof(double),cmp);
		printf("%5zu MiB: create %7.1f map %6.1f access %7.1f unmap %7.1f release %7.1f  sum %7.1f\n",sizes[si],v[0][R/2],v[1][R/2],v[2][R/2],v[3][R/2],v[4][R/2],
		       v[0][R/2]+v[1][R/2]+v[2][R/2]+v[3][R/2]+v[4][R/2]);
	}
	/* N pieces of P MiB contiguous: create+map each, one access over all, one unmap over all */
	printf("N pieces of P MiB: creates, maps, one access over the range, unmap range, releases\n");
	int ns[]={1,4,16,32}; size_t ps[]={32,64};
	for(int pi=0;pi<2;pi++) for(int ni=0;ni<4;ni++){
		int n=ns[ni]; size_t p=ps[pi]<<20; double v[6][R];
		CUmemGenericAllocationHandle hs[64];
		for(int r=-1;r<R;r++){
			double t0,t1,t2,t3,t4,t5,t6; CUresult ua;
			t0=now(); for(int i=0;i<n;i++) CK(cuMemCreate(&hs[i],p,&ap,0)); t1=now();
			for(int i=0;i<n;i++) CK(cuMemMap(base+i*p,p,0,hs[i],0)); t2=now();
			CK(cuMemSetAccess(base,n*p,&ad,1)); t3=now();
			ua=cuMemUnmap(base,n*p); t4=now();
			if(ua){ if(r==0)printf("  range unmap over %d pieces: %d; per piece\n",n,ua); for(int i=0;i<n;i++) CK(cuMemUnmap(base+i*p,p)); t4=now(); }
			for(int i=0;i<n;i++) CK(cuMemRelease(hs[i])); t5=now();
			t6=t5;
			if(r>=0){v[0][r]=t1-t0;v[1][r]=t2-t1;v[2][r]=t3-t2;v[3][r]=t4-t3;v[4][r]=t5-t4;v[5][r]=t6-t0;}
		}
		for(int k=0;k<6;k++)qsort(v[k],R,sizeof(double),cmp);
		printf("%2d x %3zu MiB: create %7.1f map %6.1f access %7.1f unmap %7.1f release %7.1f  total %7.1f\n",n,ps[pi],v[0][R/2],v[1][R/2],v[2][R/2],v[3][R/2],v[4][R/2],v[5][R/2]);
	}
	/* remap kept handles: unmap at A, map at B, access at B (no create/release) */
	printf("remap of kept handles (unmap, map elsewhere, access)\n");
	for(int ni=0;ni<4;ni++){
		int n=ns[ni]; size_t p=32<<20; double v[3][R];
		CUmemGenericAllocationHandle hs[64];
		for(int i=0;i<n;i++){CK(cuMemCreate(&hs[i],p,&ap,0)); CK(cuMemMap(base+i*p,p,0,hs[i],0));}
		CK(cuMemSetAccess(base,n*p,&ad,1));
		CUdeviceptr at=base, other=base+((size_t)8<<30);
		for(int r=-1;r<R;r++){
			double t0,t1,t2,t3;
			t0=now(); for(int i=0;i<n;i++) CK(cuMemUnmap(at+i*p,p)); t1=now();
			for(int i=0;i<n;i++) CK(cuMemMap(other+i*p,p,0,hs[i],0)); t2=now();
			CK(cuMemSetAccess(other,n*p,&ad,1)); t3=now();
			CUdeviceptr x=at; at=other; other=x;
			if(r>=0){v[0][r]=t1-t0;v[1][r]=t2-t1;v[2][r]=t3-t2;}
		}
		for(int i=0;i<n;i++){CK(cuMemUnmap(at+i*p,p)); CK(cuMemRelease(hs[i]));}
		for(int k=0;k<3;k++)qsort(v[k],R,sizeof(double),cmp);
		printf("%2d x 32 MiB: unmap %7.1f map %6.1f access %7.1f\n",n,v[0][R/2],v[1][R/2],v[2][R/2]);
	}
	/* reservation sizes */
	printf("address reserve / free by size\n");
	size_t rs[]={(size_t)32<<20,(size_t)1<<30,(size_t)16<<30,(size_t)80<<30,(size_t)320<<30,(size_t)1<<40};
	for(int i=0;i<6;i++){ double v[2][R];
		for(int r=-1;r<R;r++){ CUdeviceptr va; double t0,t1,t2;
			t0=now(); CK(cuMemAddressReserve(&va,rs[i],1<<30,0,0)); t1=now(); CK(cuMemAddressFree(va,rs[i])); t2=now();
			if(r>=0){v[0][r]=t1-t0;v[1][r]=t2-t1;} }
		for(int k=0;k<2;k++)qsort(v[k],R,sizeof(double),cmp);
		printf("%8zu MiB: reserve %7.1f free %7.1f\n",rs[i]>>20,v[0][R/2],v[1][R/2]);
	}
	/* reservation freed with a mapping freed just before (pool destroy's order) */
	printf("pool-destroy shape: 32 MiB piece in a reservation of size S: unmap, release, address free\n");
	for(int i=0;i<6;i++){ double v[3][R];
		for(int r=-1;r<R;r++){ CUdeviceptr va; CUmemGenericAllocationHandle h; double t0,t1,t2,t3;
			CK(cuMemAddressReserve(&va,rs[i],1<<30,0,0)); CK(cuMemCreate(&h,32<<20,&ap,0)); CK(cuMemMap(va,32<<20,0,h,0)); CK(cuMemSetAccess(va,32<<20,&ad,1));
			t0=now(); CK(cuMemUnmap(va,32<<20)); t1=now(); CK(cuMemRelease(h)); t2=now(); CK(cuMemAddressFree(va,rs[i])); t3=now();
			if(r>=0){v[0][r]=t1-t0;v[1][r]=t2-t1;v[2][r]=t3-t2;} }
		for(int k=0;k<3;k++)qsort(v[k],R,sizeof(double),cmp);
		printf("%8zu MiB: unmap %7.1f release %7.1f free %7.1f\n",rs[i]>>20,v[0][R/2],v[1][R/2],v[2][R/2]);
	}
	/* driver pool: create, first 1 MiB, destroy, and random <= 1 GiB memory behaviour summary */
	return 0;
}
