/* A stream per task on the simulated driver: T threads each run K tasks; a task makes a stream,
 * keeps 32 blocks of 1 B..1 MiB live through 256 replacements, frees them, synchronizes and
 * destroys its stream (the harness's variant). Live bytes counted exactly. A monitor samples
 * the pool every 500 us under its lock: reserved, live, and the mapped bytes ALLOC, CACHED
 * (nothing pending: seq 0, a refill's rest; or pending) and FREE, by whether their segment is
 * some stream's or nobody's; it prints the sample where reserved was highest. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dlfcn.h>
#include "internal.h"
#include "sop.h"
#define OK(x) do { CUresult r_ = (x); if (r_) { printf("%s: %d line %d\n", #x, r_, __LINE__); exit(1); } } while (0)
#define LIVE 32
#define STEPS 256
static CUcontext ctx; static sop_pool_t pool;
static CUresult (*setcur)(CUcontext); static CUresult (*mks)(CUstream *, unsigned);
static _Atomic uint64_t live, peak; static atomic_bool stop;
static int T = 4, K = 100;
static uint64_t rs(uint64_t *s){uint64_t z=(*s+=0x9e3779b97f4a7c15ull);z=(z^(z>>30))*0xbf58476d1ce4e5b9ull;z=(z^(z>>27))*0x94d049bb133111ebull;return z^(z>>31);}
static void note(int64_t d){uint64_t n=atomic_fetch_add(&live,(uint64_t)d)+(uint64_t)d,p=atomic_load(&peak);while(n>p&&!atomic_compare_exchange_weak(&peak,&p,n));}
static void *worker(void *a_)
{
	uint64_t seed = 0x7a5c0000u + (uint64_t)(uintptr_t)a_;
	OK(setcur(ctx));
	for (int t = 0; t < K; t++) {
		void *p[LIVE]; size_t sz[LIVE]; CUstream s;
		OK(mks(&s, 1));
		for (int i = 0; i < LIVE; i++) { sz[i] = 1 + rs(&seed) % (1 << 20); OK(sop_malloc_from_pool_async(&p[i], sz[i], pool, s)); note((int64_t)sz[i]); }
		for (int st = 0; st < STEPS; st++) {
			int k = (int)(rs(&seed) % LIVE);
			OK(sop_free_async(p[k], s)); note(-(int64_t)sz[k]);
			sz[k] = 1 + rs(&seed) % (1 << 20);
			OK(sop_malloc_from_pool_async(&p[k], sz[k], pool, s)); note((int64_t)sz[k]);
		}
		for (int i = 0; i < LIVE; i++) { OK(sop_free_async(p[i], s)); note(-(int64_t)sz[i]); }
		OK(sop_stream_synchronize(s)); OK(sop_stream_destroy(s));
	}
	return NULL;
}
struct sample { uint64_t res, live; size_t seg, homed, al[2], c0[2], cp[2], fr[2]; };
static struct sample best;
static void *monitor(void *u)
{
	(void)u;
	struct sop_pool *pp = sop__pool_lookup(pool);
	while (!atomic_load(&stop)) {
		struct sample s; memset(&s, 0, sizeof s);
		pthread_mutex_lock(&pp->lock);
		s.res = atomic_load(&pp->reserved); s.live = atomic_load(&live);
		if (s.res >= best.res) {
			for (struct sop__segment *seg = pp->segments; seg; seg = seg->next) {
				int h = seg->home != NULL; s.seg++; s.homed += h;
				sop__segment_lock(seg);
				for (struct sop__block *b = seg->first; b; b = b->phys_next) {
					switch (sop__block_state(b)) {
					case SOP_BLOCK_ALLOC: s.al[h] += b->size; break;
					case SOP_BLOCK_CACHED: if (b->seq) s.cp[h] += b->size; else s.c0[h] += b->size; break;
					case SOP_BLOCK_FREE: s.fr[h] += b->size; break;
					default: break;
					}
				}
				sop__lock_drop(&seg->lock);
			}
			if (s.res > best.res || s.live > best.live) best = s;
		}
		pthread_mutex_unlock(&pp->lock);
		usleep(500);
	}
	return NULL;
}
#define M(x) ((x) / 1048576.0)
int main(int argc, char **argv)
{
	if (argc > 1) T = atoi(argv[1]);
	if (argc > 2) K = atoi(argv[2]);
	void *lib = dlopen(getenv("SOP_DRIVER_LIBRARY"), RTLD_NOW);
	CUresult (*init)(unsigned) = dlsym(lib, "cuInit"); CUresult (*retain)(CUcontext *, CUdevice) = dlsym(lib, "cuDevicePrimaryCtxRetain");
	setcur = dlsym(lib, "cuCtxSetCurrent"); mks = dlsym(lib, "cuStreamCreate");
	OK(init(0)); OK(retain(&ctx, 0)); OK(setcur(ctx));
	CUmemPoolProps pp; memset(&pp, 0, sizeof pp); pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	OK(sop_pool_create(&pool, &pp)); cuuint64_t t = ~0ull; OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
	pthread_t th[64], mon;
	if (!getenv("NOMON")) pthread_create(&mon, NULL, monitor, NULL);
	for (int i = 0; i < T; i++) pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
	for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
	atomic_store(&stop, true); if (!getenv("NOMON")) pthread_join(mon, NULL);
	cuuint64_t hi = 0; OK(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &hi));
	printf("%d threads x %d tasks: reserved-high %.0f MiB, live peak %.1f MiB: %.3f; at the sample of most reserved (%.0f MiB, live %.1f, %zu segments, %zu some stream's):"
	       " own segments alloc %.1f cached-refill %.1f cached-pending %.1f free %.1f | nobody's alloc %.1f cached-refill %.1f cached-pending %.1f free %.1f\n",
	       T, K, M(hi), M(atomic_load(&peak)), (double)hi / (double)atomic_load(&peak), M(best.res), M(best.live), best.seg, best.homed,
	       M(best.al[1]), M(best.c0[1]), M(best.cp[1]), M(best.fr[1]), M(best.al[0]), M(best.c0[0]), M(best.cp[0]), M(best.fr[0]));
	return 0;
}
