/* Where a fresh pool's first allocation and its destroy spend their time: every driver call
 * sop makes, timed by wrapping the entries of its driver table (each wrapper forwards twelve
 * integer arguments, which covers every entry sop calls on x86-64, whose arguments are all
 * integers and pointers), against sop's total, the driver's pool, and the bare calls with a
 * small and a pool-sized reservation. Second round of 61 repetitions, medians.
 *   gcc -O2 -flto=auto -Ilib -Iinclude -I<cuda>/include parts.c build/libsop-core.a -ldl -lpthread */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <dlfcn.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/membarrier.h>
#include "internal.h"
#include "sop.h"
#define OK(x) do { CUresult r_ = (x); if (r_) { printf("%s: %d (line %d)\n", #x, r_, __LINE__); exit(1); } } while (0)
#define N 61
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmpd(const void *a, const void *b){double x=*(const double*)a,y=*(const double*)b;return x<y?-1:x>y;}
static double med(double *v, int n){double w[N];memcpy(w,v,n*sizeof *w);qsort(w,n,sizeof *w,cmpd);return w[n/2];}
static struct sop__driver real;
static double acc[SOP_N_ENTRIES]; static int cnt[SOP_N_ENTRIES];
typedef uint64_t u;
typedef CUresult (*fn12)(u,u,u,u,u,u,u,u,u,u,u,u);
#define SOP_X(name) static CUresult w_##name(u a,u b,u c,u d,u e,u f,u g,u h,u i,u j,u k,u l){ \
	double t=now(); CUresult r=((fn12)(void*)real.name)(a,b,c,d,e,f,g,h,i,j,k,l); \
	acc[SOP_N_##name]+=now()-t; cnt[SOP_N_##name]++; return r; }
SOP_DRIVER_ENTRIES(SOP_X)
#undef SOP_X
static const char *names[] = {
#define SOP_X(name) #name,
SOP_DRIVER_ENTRIES(SOP_X)
#undef SOP_X
};
/* per phase: per-entry time per rep */
static double ph[2][SOP_N_ENTRIES][N]; static int phc[2][SOP_N_ENTRIES];
static double tot[2][N], drv[2][N];
static void snap(int p, int i, double total){
	double s=0; for(int e=0;e<SOP_N_ENTRIES;e++){ph[p][e][i]=acc[e]; s+=acc[e]; if(i==0) phc[p][e]=cnt[e];}
	tot[p][i]=total; drv[p][i]=s;
}
static long flt(void){struct rusage u;getrusage(RUSAGE_SELF,&u);return u.ru_minflt+u.ru_majflt;}
static double pf[2][N];
static void zero(void){memset(acc,0,sizeof acc);memset(cnt,0,sizeof cnt);}
int main(void)
{
	CUstream s; CUcontext ctx;
	sop_pool_t p0; /* init the library */
	CUmemPoolProps pp; memset(&pp, 0, sizeof pp);
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	OK(sop_pool_create(&p0, &pp)); OK(sop_pool_destroy(p0));
	OK(sop__drv.cuDevicePrimaryCtxRetain(&ctx, 0));
	CUresult (*setcur)(CUcontext) = dlsym(sop__driver_handle(), "cuCtxSetCurrent");
	CUresult (*mks)(CUstream *, unsigned) = dlsym(sop__driver_handle(), "cuStreamCreate");
	CUresult (*pcreate)(CUmemoryPool *, const CUmemPoolProps *) = dlsym(sop__driver_handle(), "cuMemPoolCreate");
	CUresult (*pdestroy)(CUmemoryPool) = dlsym(sop__driver_handle(), "cuMemPoolDestroy");
	CUresult (*palloc)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) = dlsym(sop__driver_handle(), "cuMemAllocFromPoolAsync");
	CUresult (*psetattr)(CUmemoryPool, CUmemPool_attribute, void *) = dlsym(sop__driver_handle(), "cuMemPoolSetAttribute");
	OK(setcur(ctx)); OK(mks(&s, 1));
	real = sop__drv;
#define SOP_X(name) memcpy(&sop__drv.name, &(void *){(void *)w_##name}, sizeof(void *));
	SOP_DRIVER_ENTRIES(SOP_X)
#undef SOP_X
	cuuint64_t thr = ~0ull;
	double dfirst[N], ddestroy[N], create[N], bres[2][N], bmap[2][N], bun[2][N], bfree[2][N], mb[N], crel[N], touch[N];
	size_t total = 0; OK(real.cuDeviceTotalMem(&total, 0));
	size_t big = ((total * 4) + (1ull << 30) - 1) & ~((1ull << 30) - 1);
	CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	CUmemAccessDesc acc; memset(&acc, 0, sizeof acc); acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	for (int w = 0; w < 2; w++) for (int i = 0; i < N; i++) {
		sop_pool_t p; void *q;
		double t0 = now(); OK(sop_pool_create(&p, &pp)); create[i] = now() - t0;
		OK(sop_pool_set_attr(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
		long f0 = flt(); zero(); t0 = now(); OK(sop_malloc_from_pool_async(&q, 1 << 20, p, s)); snap(0, i, now() - t0); pf[0][i] = flt() - f0;
		OK(sop_free_async(q, s)); OK(sop_stream_synchronize(s));
		f0 = flt(); zero(); t0 = now(); OK(sop_pool_destroy(p)); snap(1, i, now() - t0); pf[1][i] = flt() - f0;
		CUmemoryPool dp; CUdeviceptr dq;
		if (!pcreate) { dfirst[i] = ddestroy[i] = 0; continue; }
		OK(pcreate(&dp, &pp)); OK(psetattr(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
		t0 = now(); OK(palloc(&dq, 1 << 20, dp, s)); dfirst[i] = now() - t0;
		OK(real.cuMemFreeAsync(dq, s)); OK(real.cuStreamSynchronize(s));
		t0 = now(); OK(pdestroy(dp)); ddestroy[i] = now() - t0;
		for (int r = 0; r < 2; r++) {
			CUdeviceptr va; CUmemGenericAllocationHandle hd;
			size_t seg = 32 << 20, vs = r ? big : seg;
			t0 = now(); OK(real.cuMemAddressReserve(&va, vs, r ? (size_t)1 << 30 : 0, 0, 0)); bres[r][i] = now() - t0;
			t0 = now(); OK(real.cuMemCreate(&hd, seg, &prop, 0)); OK(real.cuMemMap(va, seg, 0, hd, 0)); OK(real.cuMemSetAccess(va, seg, &acc, 1)); bmap[r][i] = now() - t0;
			t0 = now(); OK(real.cuMemUnmap(va, seg)); OK(real.cuMemRelease(hd)); bun[r][i] = now() - t0;
			t0 = now(); OK(real.cuMemAddressFree(va, vs)); bfree[r][i] = now() - t0;
		}
		t0 = now(); syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0); mb[i] = now() - t0;
		CUcontext c2; OK(real.cuDevicePrimaryCtxRetain(&c2, 0)); t0 = now(); OK(real.cuDevicePrimaryCtxRelease(0)); crel[i] = now() - t0;
		t0 = now(); void *hm = malloc(64 << 10); memset(hm, 1, 64 << 10); free(hm); touch[i] = now() - t0;
	}
	printf("medians of %d (second round)\n", N);
	printf("sop create %.1f us\n", med(create, N));
	printf("driver pool: first 1 MiB %.1f us, destroy %.1f us\n", med(dfirst, N), med(ddestroy, N));
	for (int r = 0; r < 2; r++)
		printf("bare, reservation %zu MiB: reserve %.1f, create+map+access 32 MiB %.1f, unmap+release %.1f, address free %.1f us\n",
		       (r ? big : (size_t)32 << 20) >> 20, med(bres[r], N), med(bmap[r], N), med(bun[r], N), med(bfree[r], N));
	printf("membarrier %.2f us, primary ctx release (retained twice) %.2f us, 64 KiB malloc+touch+free %.2f us\n", med(mb, N), med(crel, N), med(touch, N));
	const char *pn[2] = {"first 1 MiB", "destroy"};
	for (int p = 0; p < 2; p++) {
		printf("sop %s: total %.1f us, in driver calls %.1f, own %.1f, page faults %.0f\n", pn[p], med(tot[p], N), med(drv[p], N),
		       med(tot[p], N) - med(drv[p], N), med(pf[p], N));
		for (int e = 0; e < SOP_N_ENTRIES; e++) if (phc[p][e])
			printf("   %-32s x%d  %.2f us\n", names[e], phc[p][e], med(ph[p][e], N));
	}
	return 0;
}
