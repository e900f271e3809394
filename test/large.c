/* large.c - reserved memory under large random sizes: RMM's random loop (73% allocations, sizes
 * uniform up to 256 MiB, 2 GiB live at most) on one stream of a compacting pool, whose growth
 * comes in pieces that can be given back on their own. The stream's work is done before each
 * call, as in a loop without kernels: its frees are complete, and growth must learn that, merge
 * them and give back idle pieces in place of new ones, rather than keep them cached beside new
 * memory. The pool's reserved high stays under 1.25 times the peak of live bytes (1.5 before
 * growth asked whether the stream's work was done and spared the free memory its plan joins). */
#include <stdlib.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)
#define N_ALLOCS 1500
#define MAX_SIZE (256 * MiB)
#define MAX_LIVE (2048 * MiB)

struct rng {
	uint64_t s;
};

/* splitmix64, as bench/ draws its sizes. */
static uint64_t
rng_next(struct rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t
rng_below(struct rng *r, uint64_t n)
{
	return rng_next(r) % n;
}

/* The stream's work done, told only to the driver, not to sop. */
static void
stream_idle(CUstream s)
{
	CUresult r;

	while ((r = th.cuStreamQuery(s)) == CUDA_ERROR_NOT_READY)
		;
	TH_OK(r);
}

static double
random_large(CUstream s, uint64_t seed)
{
	struct rng rng = {seed};
	sop_pool_t pool = th_pool(0, 0);
	void **p = calloc(N_ALLOCS, sizeof *p);
	size_t *sz = calloc(N_ALLOCS, sizeof *sz);
	size_t live = 0, peak = 0, n = 0, allocs = 0, high;
	long i;

	TH_ASSERT(p && sz);
	TH_OK(sop_pool_set_compaction(pool, 1));
	for (i = 0; i < 2 * N_ALLOCS; i++) {
		size_t size = 1 + rng_below(&rng, MAX_SIZE);
		bool alloc = n == 0 || rng_below(&rng, 100) < 73;

		stream_idle(s);
		if (alloc && allocs < N_ALLOCS && live + size < MAX_LIVE) {
			TH_OK(sop_malloc_from_pool_async(&p[n], size, pool, s));
			sz[n++] = size;
			allocs++;
			live += size;
			if (live > peak)
				peak = live;
			continue;
		}
		if (n) {
			size_t j = rng_below(&rng, N_ALLOCS) % n;

			TH_OK(sop_free_async(p[j], s));
			live -= sz[j];
			p[j] = p[--n];
			sz[j] = sz[n];
		}
	}
	TH_CHECK(pool);
	while (n)
		TH_OK(sop_free_async(p[--n], s));
	TH_OK(sop_stream_synchronize(s));
	high = th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
	TH_OK(sop_pool_destroy(pool));
	free(p);
	free(sz);
	return (double)high / (double)peak;
}

int
main(void)
{
	CUstream s;
	uint64_t seed;

	/* Room on the simulated device for the pool's high (the real driver ignores this). */
	setenv("SOP_SIM_MEMORY", "16G", 0);
	th_init();
	s = th_stream();
	for (seed = 1; seed <= 3; seed++) {
		double ratio = random_large(s, seed);

		printf("large: seed %llu: reserved high %.3f x the live peak\n",
		       (unsigned long long)seed, ratio);
		TH_ASSERT(ratio < 1.25);
	}
	th_stream_destroy(s);
	printf("large: ok\n");
	return 0;
}
