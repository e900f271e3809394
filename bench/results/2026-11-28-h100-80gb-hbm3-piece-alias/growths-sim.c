/* Build: gcc -std=c11 -D_GNU_SOURCE -I test -I lib -I include -I build -I CUDA/include growths-sim.c
 * build/test/libsop-test-helpers.a build/libsop-core.a -lpthread -ldl -lm; run with the simulated
 * driver (SOP_DRIVER_LIBRARY=build/test/sim/libsopsim.so SOP_SIM_MEMORY=80G). */
/* Random sizes up to 1 GiB (the harness's first, untimed run): how many allocations grow the
 * pool, and how many of those found enough free bytes in it, in pieces too small. */
#include <stdlib.h>
#include "helpers.h"
#include "internal.h"
static int cmp(const void *a, const void *b) { size_t x = *(const size_t *)a, y = *(const size_t *)b; return x < y ? 1 : x > y ? -1 : 0; }
static size_t fr[100000];
/* free blocks needed, largest first, to cover size */
static int frags(sop_pool_t h, size_t size, size_t *nfree) { struct sop_pool *pool = TH_POOL(h); struct sop__segment *sg; struct sop__block *b; size_t n = 0, acc = 0; int k = 0;
 for (sg = pool->segments; sg; sg = sg->next) for (b = sg->first; b; b = b->phys_next) { int st = sop__block_state(b); if (st == SOP_BLOCK_FREE || st == SOP_BLOCK_CACHED) fr[n++] = b->size; }
 *nfree = n; qsort(fr, n, sizeof *fr, cmp); while (acc < size && k < (int)n) acc += fr[k++]; return acc >= size ? k : -1; }
struct rng { uint64_t s; };
static uint64_t rng_next(struct rng *r) { uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; z = (z ^ (z >> 27)) * 0x94d049bb133111ebull; return z ^ (z >> 31); }
int main(void) {
	size_t MiB = 1 << 20, max_size = 1024 * MiB, max_usage = 10068 * MiB;
	long n_allocs = 10000, allocs = 0, grows = 0, grows_fit = 0, n_live = 0, i;
	struct rng rng = {20240601};
	static void *p[20000]; static size_t sz[20000];
	size_t bytes = 0, peak = 0, grown_bytes = 0, grown_fit_bytes = 0;
	CUstream s; sop_pool_t pool; cuuint64_t max = UINT64_MAX;
	th_init(); s = th_stream(); pool = th_pool(0, 0);
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
	if (getenv("COMPACT")) TH_OK(sop_pool_set_compaction(pool, 1));
	for (i = 0; i < 2 * n_allocs; i++) {
		size_t size = 1 + rng_next(&rng) % max_size;
		int alloc = n_live == 0 || rng_next(&rng) % 100 < 73;
		if (alloc && allocs < n_allocs && bytes + size < max_usage) {
			size_t nf; int need;
			TH_OK(sop_stream_synchronize(s));
			need = frags(pool, size, &nf);
			uint64_t res0 = th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
			uint64_t used0 = th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
			TH_OK(sop_malloc_from_pool_async(&p[n_live], size, pool, s));
			uint64_t res1 = th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
			if (res1 > res0) { grows++; grown_bytes += res1 - res0;
				if (res0 - used0 >= size) { printf("grow %zu MiB: free blocks %zu, %d of them cover it\n", size >> 20, nf, need); grows_fit++; grown_fit_bytes += res1 - res0; } }
			sz[n_live++] = size; allocs++; bytes += size; if (bytes > peak) peak = bytes; continue;
		}
		if (n_live) { long j = (long)(rng_next(&rng) % (uint64_t)n_allocs % (uint64_t)n_live);
			TH_OK(sop_free_async(p[j], s)); bytes -= sz[j]; p[j] = p[--n_live]; sz[j] = sz[n_live]; }
	}
	printf("ops %ld allocs %ld grows %ld (%.2f%%), of them with enough free bytes %ld; grown %.0f MiB, %.0f of it with enough free; peak %.0f MiB reserved-high %.0f MiB (%.3fx)\n",
	       2 * n_allocs, allocs, grows, 100.0 * grows / allocs, grows_fit, grown_bytes / 1048576.0, grown_fit_bytes / 1048576.0, peak / 1048576.0,
	       th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) / 1048576.0, (double)th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) / peak);
	printf("calls: create %lu map %lu unmap %lu release %lu\n", th.sim_calls("cuMemCreate"), th.sim_calls("cuMemMap"), th.sim_calls("cuMemUnmap"), th.sim_calls("cuMemRelease"));
	return 0;
}
