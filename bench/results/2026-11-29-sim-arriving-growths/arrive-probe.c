/* Threads arriving one by one on a pool that other threads used before (the harness's variant,
 * with a fixed count of steps in place of a time box): a first set of T threads starts together,
 * each makes a stream, allocates until 256 blocks of 1 B..1 MiB are live, replaces random ones
 * STEPS times, frees everything, synchronizes and destroys its stream; then T new threads start
 * GAP us apart and do the same. Live bytes counted exactly; reserved-high over the live peak. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <dlfcn.h>
#include "internal.h"
#include "sop.h"
#define OK(x) do { CUresult r_ = (x); if (r_) { printf("%s: %d line %d\n", #x, r_, __LINE__); exit(1); } } while (0)
#define LIVE 256
static CUcontext ctx; static sop_pool_t pool;
static CUresult (*setcur)(CUcontext); static CUresult (*mks)(CUstream *, unsigned);
static _Atomic uint64_t live, peak;
static int T = 16, STEPS = 4000, GAP = 3120;
static uint64_t rs(uint64_t *s){uint64_t z=(*s+=0x9e3779b97f4a7c15ull);z=(z^(z>>30))*0xbf58476d1ce4e5b9ull;z=(z^(z>>27))*0x94d049bb133111ebull;return z^(z>>31);}
static void note(int64_t d){uint64_t n=atomic_fetch_add(&live,(uint64_t)d)+(uint64_t)d,p=atomic_load(&peak);while(n>p&&!atomic_compare_exchange_weak(&peak,&p,n));}
static void *worker(void *a_)
{
	uint64_t seed = 0x7a5c0000u + (uint64_t)(uintptr_t)a_;
	void *p[LIVE]; size_t sz[LIVE]; CUstream s;
	OK(setcur(ctx));
	OK(mks(&s, 1));
	for (int i = 0; i < LIVE; i++) { sz[i] = 1 + rs(&seed) % (1 << 20); OK(sop_malloc_from_pool_async(&p[i], sz[i], pool, s)); note((int64_t)sz[i]); }
	struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int st = 0;; st++) {
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if ((t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000 >= STEPS) break;
		int k = (int)(rs(&seed) % LIVE);
		OK(sop_free_async(p[k], s)); note(-(int64_t)sz[k]);
		sz[k] = 1 + rs(&seed) % (1 << 20);
		OK(sop_malloc_from_pool_async(&p[k], sz[k], pool, s)); note((int64_t)sz[k]);
	}
	for (int i = 0; i < LIVE; i++) { OK(sop_free_async(p[i], s)); note(-(int64_t)sz[i]); }
	OK(sop_stream_synchronize(s)); OK(sop_stream_destroy(s));
	return NULL;
}
#define M(x) ((x) / 1048576.0)
int main(int argc, char **argv)
{
	if (argc > 1) T = atoi(argv[1]);
	if (argc > 2) STEPS = atoi(argv[2]);
	if (argc > 3) GAP = atoi(argv[3]);
	void *lib = dlopen(getenv("SOP_DRIVER_LIBRARY"), RTLD_NOW);
	CUresult (*init)(unsigned) = dlsym(lib, "cuInit"); CUresult (*retain)(CUcontext *, CUdevice) = dlsym(lib, "cuDevicePrimaryCtxRetain");
	setcur = dlsym(lib, "cuCtxSetCurrent"); mks = dlsym(lib, "cuStreamCreate");
	OK(init(0)); OK(retain(&ctx, 0)); OK(setcur(ctx));
	CUmemPoolProps pp; memset(&pp, 0, sizeof pp); pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	OK(sop_pool_create(&pool, &pp)); cuuint64_t t = ~0ull; OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
	pthread_t th[128];
	for (int i = 0; i < T; i++) pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
	for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
	cuuint64_t hi1 = 0, res1 = 0; OK(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &hi1)); OK(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res1));
	uint64_t pk1 = atomic_load(&peak);
	fprintf(stderr, "PHASE2\n");
	atomic_store(&peak, 0);
	for (int i = 0; i < T; i++) { pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)(100 + i)); usleep(GAP); }
	for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
	cuuint64_t hi = 0; OK(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &hi));
	uint64_t pk2 = atomic_load(&peak), pk = pk1 > pk2 ? pk1 : pk2;
	printf("%d threads, box %d us, %d us apart: first set peak %.0f MiB reserved-high %.0f (%.3f), after it %.0f; second set peak %.0f; reserved-high %.0f MiB: %.3f of the peak of both\n",
	       T, STEPS, GAP, M(pk1), M(hi1), (double)hi1 / pk1, M(res1), M(pk2), M(hi), (double)hi / pk);
	return 0;
}
