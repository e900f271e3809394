/* Arriving threads on the simulated driver, with the driver's work of the harness's run of
 * record (phase 1: 16 threads start together and fill ~160 blocks each; phase 2: 16 new threads
 * start STAGGER_US apart and make ~1290 operations each, 256 live), counted exactly. At the
 * peak of phase 2 (every thread holding its blocks), prints the segments: size mapped, whose,
 * and the bytes ALLOC / CACHED / FREE in each. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <dlfcn.h>
#include "internal.h"
#include "sop.h"
#define OK(x) do { CUresult r_ = (x); if (r_) { printf("%s: %d line %d\n", #x, r_, __LINE__); exit(1); } } while (0)
#define N 16
#define LIVE 256
static CUcontext ctx; static sop_pool_t pool;
static CUresult (*setcur)(CUcontext); static CUresult (*mks)(CUstream *, unsigned);
static _Atomic uint64_t live, peak;
static pthread_barrier_t start_b, held_b, dumped_b;
static int phase_ops[2][N]; static long stagger_us = 3125; static int dump_phase = 1;
static const struct sop__sstream *whose[2][N];
static uint64_t rs(uint64_t *s){uint64_t z=(*s+=0x9e3779b97f4a7c15ull);z=(z^(z>>30))*0xbf58476d1ce4e5b9ull;z=(z^(z>>27))*0x94d049bb133111ebull;return z^(z>>31);}
struct arg { int ph, i; };
static void note(int64_t d){uint64_t n=atomic_fetch_add(&live,(uint64_t)d)+(uint64_t)d,p=atomic_load(&peak);while(n>p&&!atomic_compare_exchange_weak(&peak,&p,n));}
static void *worker(void *a_)
{
	struct arg *a = a_; uint64_t seed = 0xa1100000u + (uint64_t)a->ph * 0x100000u + (uint64_t)a->i;
	void *p[LIVE]; size_t sz[LIVE]; int n = 0; CUstream s;
	OK(setcur(ctx)); pthread_barrier_wait(&start_b);
	if (a->ph == 1) usleep((useconds_t)(stagger_us * a->i));
	OK(mks(&s, 1));
	for (int op = 0; op < phase_ops[a->ph][a->i]; ) {
		uint64_t x = rs(&seed); int k = n;
		if (n < LIVE) n++; else { k = (int)(x % LIVE); OK(sop_free_async(p[k], s)); note(-(int64_t)sz[k]); op++; }
		sz[k] = 1 + (x >> 20) % (1 << 20);
		OK(sop_malloc_from_pool_async(&p[k], sz[k], pool, s)); note((int64_t)sz[k]); op++;
	}
	{ struct sop_pool *pp = sop__pool_lookup(pool); struct sop__sstream *ss; for (ss = pp->streams; ss; ss = ss->next) if (ss->st && ss->st->id) {} }
	whose[a->ph][a->i] = NULL;
	pthread_barrier_wait(&held_b);
	pthread_barrier_wait(&dumped_b);
	for (int i = 0; i < n; i++) { OK(sop_free_async(p[i], s)); note(-(int64_t)sz[i]); }
	OK(sop_stream_synchronize(s)); OK(sop_stream_destroy(s));
	return NULL;
}
static void dump(const char *what)
{
	struct sop_pool *pp = sop__pool_lookup(pool);
	struct sop__segment *seg; size_t tot = 0, a_all = 0, c_all = 0, f_all = 0; int k = 0;
	cuuint64_t res = 0; OK(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res));
	printf("== %s: reserved %.0f MiB, live %.0f MiB, %zu segments\n", what, res / 1048576.0, atomic_load(&live) / 1048576.0, pp->n_segments);
	pthread_mutex_lock(&pp->lock);
	for (seg = pp->segments; seg; seg = seg->next, k++) {
		size_t al = 0, ca = 0, fr = 0, ho = 0;
		for (struct sop__block *b = seg->first; b; b = b->phys_next) {
			switch (sop__block_state(b)) { case SOP_BLOCK_ALLOC: al += b->size; break; case SOP_BLOCK_CACHED: ca += b->size; break; case SOP_BLOCK_FREE: fr += b->size; break; default: ho += b->size; }
		}
		tot += seg->mapped; a_all += al; c_all += ca; f_all += fr;
		printf("  seg %2d: mapped %5.0f MiB home %-14p alloc %5.1f cached %5.1f free %5.1f\n", k, seg->mapped / 1048576.0, (const void *)seg->home, al / 1048576.0, ca / 1048576.0, fr / 1048576.0);
	}
	pthread_mutex_unlock(&pp->lock);
	printf("  mapped %.0f MiB: alloc %.0f, cached %.0f, free %.0f\n", tot / 1048576.0, a_all / 1048576.0, c_all / 1048576.0, f_all / 1048576.0);
}
int main(int argc, char **argv)
{
	int n1 = argc > 1 ? atoi(argv[1]) : 160, n2 = argc > 2 ? atoi(argv[2]) : 1290;
	if (argc > 3) stagger_us = atol(argv[3]);
	void *lib = dlopen(getenv("SOP_DRIVER_LIBRARY"), RTLD_NOW);
	CUresult (*init)(unsigned) = dlsym(lib, "cuInit"); CUresult (*retain)(CUcontext *, CUdevice) = dlsym(lib, "cuDevicePrimaryCtxRetain");
	setcur = dlsym(lib, "cuCtxSetCurrent"); mks = dlsym(lib, "cuStreamCreate");
	OK(init(0)); OK(retain(&ctx, 0)); OK(setcur(ctx));
	CUmemPoolProps pp; memset(&pp, 0, sizeof pp); pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	OK(sop_pool_create(&pool, &pp)); cuuint64_t t = ~0ull; OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
	for (int ph = 0; ph < 2; ph++) {
		pthread_t th[N]; struct arg a[N];
		for (int i = 0; i < N; i++) phase_ops[ph][i] = ph ? n2 : n1;
		pthread_barrier_init(&start_b, NULL, N + 1); pthread_barrier_init(&held_b, NULL, N + 1); pthread_barrier_init(&dumped_b, NULL, N + 1);
		for (int i = 0; i < N; i++) { a[i].ph = ph; a[i].i = i; pthread_create(&th[i], NULL, worker, &a[i]); }
		pthread_barrier_wait(&start_b); pthread_barrier_wait(&held_b);
		dump(ph ? "phase 2 at its peak" : "phase 1 at its peak");
		pthread_barrier_wait(&dumped_b);
		for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
		dump(ph ? "phase 2 done" : "phase 1 done");
	}
	cuuint64_t hi = 0; OK(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &hi));
	printf("reserved-high %.0f MiB, live peak %.0f MiB: %.3f\n", hi / 1048576.0, atomic_load(&peak) / 1048576.0, (double)hi / (double)atomic_load(&peak));
	return 0;
}
