/* model.c - the public API fuzzed against a simple model.
 *
 * A random sequence of calls (allocations of random sizes on random streams, valid frees on the
 * allocating or another stream, sop_free, bad frees of every kind, synchronizations, trims,
 * attribute reads and watermark resets, pointer lookups) runs against two pools, one capped. A
 * model keeps the live allocations; after every call the library must agree with it: the
 * return code, the used memory (exact requested bytes), no new allocation overlapping a live
 * one, the pool of any address inside a live allocation, and the pool's own invariants
 * (sop__pool_check). On the simulated driver a free that came too early would also fault.
 *
 * Usage: test-model [--ops N] [--seed N]
 */
#include <string.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)
#define LIVE 192
#define STREAMS 4

struct alloc {
	char *p;
	size_t size;
	int pool;
};

static struct alloc live[LIVE];
static int n_live;
static sop_pool_t pools[2];
static CUstream streams[STREAMS];
static uint64_t rng;

static uint64_t
rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static uint64_t
model_used(int pool)
{
	uint64_t u = 0;
	int i;

	for (i = 0; i < n_live; i++)
		if (live[i].pool == pool)
			u += live[i].size;
	return u;
}

static void
agree(unsigned long op)
{
	int k;

	for (k = 0; k < 2; k++) {
		uint64_t used = th_attr(pools[k], CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
		if (used != model_used(k)) {
			fprintf(stderr, "op %lu: pool %d uses %llu bytes, the model %llu\n", op, k,
				(unsigned long long)used, (unsigned long long)model_used(k));
			exit(1);
		}
		TH_ASSERT(th_attr(pools[k], CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= used);
		TH_CHECK(pools[k]);
	}
}

static CUstream
any_stream(void)
{
	unsigned r = (unsigned)(rnd() % (STREAMS + 1));

	return r < STREAMS ? streams[r] : NULL; /* the legacy stream too */
}

static void
op_alloc(void)
{
	int k = (int)(rnd() % 2), i;
	unsigned e = (unsigned)(rnd() % 27);
	size_t size = rnd() % 16 == 0 ? 0 : ((size_t)1 << e) + rnd() % ((size_t)1 << e);
	void *p = (void *)0x1;
	CUresult r;

	if (n_live == LIVE)
		return;
	r = sop_malloc_from_pool_async(&p, size, pools[k], any_stream());
	if (r == CUDA_ERROR_OUT_OF_MEMORY) {
		TH_ASSERT(p == (void *)0x1); /* untouched */
		return;
	}
	TH_OK(r);
	if (!size) {
		TH_ASSERT(p == NULL);
		return;
	}
	TH_ASSERT(p != NULL && ((uintptr_t)p & 511) == 0);
	for (i = 0; i < n_live; i++) {
		/* A block handed out twice would overlap a live one. */
		TH_ASSERT((char *)p + size <= live[i].p || live[i].p + live[i].size <= (char *)p);
	}
	live[n_live++] = (struct alloc){p, size, k};
}

static void
op_free(void)
{
	int i;
	struct alloc a;

	if (!n_live)
		return;
	i = (int)(rnd() % (unsigned)n_live);
	a = live[i];
	live[i] = live[--n_live];
	if (rnd() % 8 == 0) {
		/* sop_free vouches that nothing uses the block: make it true first. */
		TH_OK(sop_ctx_synchronize());
		TH_OK(sop_free(a.p));
	} else {
		TH_OK(sop_free_async(a.p, any_stream()));
	}
	/* Now it is gone: freeing it again, or asking about it, is an error. */
	if (rnd() % 4 == 0)
		TH_EQ(sop_free_async(a.p, any_stream()), CUDA_ERROR_INVALID_VALUE);
	if (rnd() % 4 == 0) {
		sop_pool_t owner;
		/* Unless the same address was handed out again since, which it was not yet. */
		TH_EQ(sop_pointer_get_pool(&owner, a.p), CUDA_ERROR_INVALID_VALUE);
	}
}

static void
op_bad_free(void)
{
	char host[16];
	int i;

	switch (rnd() % 3) {
	case 0:
		TH_EQ(sop_free_async(host, any_stream()), CUDA_ERROR_INVALID_VALUE);
		break;
	case 1:
		if (n_live) {
			i = (int)(rnd() % (unsigned)n_live);
			if (live[i].size > 512)
				TH_EQ(sop_free_async(live[i].p + 512, any_stream()),
				      CUDA_ERROR_INVALID_VALUE);
			TH_EQ(sop_free(live[i].p + 1), CUDA_ERROR_INVALID_VALUE);
		}
		break;
	default:
		TH_EQ(sop_free_async((void *)(uintptr_t)(rnd() | 1), any_stream()),
		      CUDA_ERROR_INVALID_VALUE);
		break;
	}
}

static void
op_lookup(void)
{
	sop_pool_t owner = NULL;
	int i;

	if (!n_live)
		return;
	i = (int)(rnd() % (unsigned)n_live);
	TH_OK(sop_pointer_get_pool(&owner, live[i].p + rnd() % live[i].size));
	TH_ASSERT(owner == pools[live[i].pool]);
}

static void
op_misc(void)
{
	cuuint64_t zero = 0, v;
	CUevent ev;

	switch (rnd() % 6) {
	case 0:
		TH_OK(sop_stream_synchronize(any_stream()));
		break;
	case 1:
		TH_OK(sop_ctx_synchronize());
		break;
	case 2:
		TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
		TH_OK(sop_event_record(ev, any_stream()));
		if (rnd() % 2)
			TH_OK(sop_stream_wait_event(any_stream(), ev, 0));
		TH_OK(sop_event_synchronize(ev));
		TH_OK(sop_event_destroy(ev));
		break;
	case 3:
		TH_OK(sop_trim_to(pools[rnd() % 2], (size_t)(rnd() % 4) * 32 * MiB));
		break;
	case 4:
		TH_OK(sop_pool_set_attr(pools[rnd() % 2], CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
		break;
	default:
		v = rnd() % 2 ? 0 : UINT64_MAX;
		TH_OK(sop_pool_set_attr(pools[rnd() % 2], CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
		break;
	}
}

int
main(int argc, char **argv)
{
	unsigned long ops = 20000, op;
	uint64_t seed = 1;
	int i;

	for (i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--ops"))
			ops = strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--seed"))
			seed = strtoull(argv[i + 1], NULL, 0);
	}
	rng = 0x9E3779B97F4A7C15u * (seed + 1);
	th_init();
	for (i = 0; i < STREAMS; i++)
		streams[i] = th_stream();
	pools[0] = th_pool(0, 0);
	pools[1] = th_pool(0, 256 * MiB);
	for (op = 0; op < ops; op++) {
		unsigned r = (unsigned)(rnd() % 100);
		if (r < 45)
			op_alloc();
		else if (r < 85)
			op_free();
		else if (r < 90)
			op_bad_free();
		else if (r < 95)
			op_lookup();
		else
			op_misc();
		agree(op);
	}
	while (n_live)
		TH_OK(sop_free_async(live[--n_live].p, any_stream()));
	TH_OK(sop_ctx_synchronize());
	agree(ops);
	for (i = 0; i < 2; i++)
		TH_OK(sop_pool_destroy(pools[i]));
	for (i = 0; i < STREAMS; i++)
		th_stream_destroy(streams[i]);
	printf("model: %lu operations, seed %llu: the library agreed with the model\n", ops,
	       (unsigned long long)seed);
	return 0;
}
