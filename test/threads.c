/* threads.c - several threads on several streams allocating and freeing at once: each thread
 * works on its own stream with a random mix of sizes, tags every block with work on its stream
 * and checks the tag before freeing it; some blocks are handed to a neighbour thread, which
 * frees them on its own stream after waiting on an event; threads turn compaction on and off as
 * they go. At the end the pool is consistent and its accounting adds up, and its free extents
 * read in passing never pass what it holds. Last, frees racing on one stream's record keep its
 * newest tag. Run under ThreadSanitizer in CI. */
#include <sched.h>
#include <string.h>

#include "helpers.h"

#define THREADS 8
#define LIVE 32
#define OPS 3000

static sop_pool_t pool;
static CUcontext ctx0;

/* A mailbox per thread: blocks another thread allocated, to be freed here. */
struct mailbox {
	pthread_mutex_t lock;
	void *ptr[LIVE * 4];
	int n;
};
static struct mailbox boxes[THREADS];
static atomic_int bad;

static uint64_t
rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void
drain(struct mailbox *box, CUstream s)
{
	pthread_mutex_lock(&box->lock);
	while (box->n > 0) {
		if (sop_free_async(box->ptr[--box->n], s) != CUDA_SUCCESS)
			atomic_fetch_add(&bad, 1);
	}
	pthread_mutex_unlock(&box->lock);
}

static void *
worker(void *arg)
{
	int me = (int)(intptr_t)arg;
	uint64_t seed = 0x9E3779B97F4A7C15u * (uint64_t)(me + 1);
	void *live[LIVE] = {0};
	size_t sizes[LIVE] = {0};
	uint32_t tags[LIVE] = {0};
	CUstream s;
	CUevent ev;
	int i;

	TH_OK(th.cuCtxSetCurrent(ctx0));
	s = th_stream();
	TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	for (i = 0; i < OPS; i++) {
		int k = (int)(rnd(&seed) % LIVE);
		if (live[k]) {
			uint32_t got;
			/* The first word still holds our tag: nobody else was handed the block. */
			TH_OK(th.cuMemcpyDtoHAsync(&got, (CUdeviceptr)(uintptr_t)live[k], 4, s));
			TH_OK(sop__drv.cuStreamSynchronize(s));
			if (got != tags[k])
				atomic_fetch_add(&bad, 1);
			if (rnd(&seed) % 8 == 0) {
				/* Hand it to the next thread, ordered by an event. */
				struct mailbox *box = &boxes[(me + 1) % THREADS];
				TH_OK(sop_event_record(ev, s));
				TH_OK(sop_event_synchronize(ev));
				pthread_mutex_lock(&box->lock);
				if (box->n < LIVE * 4) {
					box->ptr[box->n++] = live[k];
					live[k] = NULL;
				}
				pthread_mutex_unlock(&box->lock);
			}
			if (live[k] && sop_free_async(live[k], s) != CUDA_SUCCESS)
				atomic_fetch_add(&bad, 1);
			live[k] = NULL;
		} else {
			size_t sz = 4 + rnd(&seed) % (rnd(&seed) % 4 ? 8192 : (2 << 20));
			sz &= ~(size_t)3;
			if (sop_malloc_from_pool_async(&live[k], sz, pool, s) != CUDA_SUCCESS) {
				atomic_fetch_add(&bad, 1);
				live[k] = NULL;
				continue;
			}
			sizes[k] = sz;
			tags[k] = (uint32_t)(me << 24) | (uint32_t)i;
			th_fill(live[k], sz, tags[k], s);
		}
		if (i % 64 == 0)
			drain(&boxes[me], s);
		if (i % 100 == me) {
			/* Read while the others allocate and free: a view of some moment. */
			size_t largest, total;

			TH_OK(sop_pool_get_free_extents(pool, &largest, &total));
			if (largest > total ||
			    total > th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH))
				atomic_fetch_add(&bad, 1);
		}
		if (i % 250 == me) {
			/* Compaction on and off while the others grow and place. */
			int on = -1;

			TH_OK(sop_pool_set_compaction(pool, (i / 250 + me) & 1));
			TH_OK(sop_pool_get_compaction(pool, &on));
			if (on != 0 && on != 1)
				atomic_fetch_add(&bad, 1);
		}
		if (i % 500 == 0)
			TH_OK(sop_stream_synchronize(s));
	}
	for (i = 0; i < LIVE; i++)
		if (live[i] && sop_free_async(live[i], s) != CUDA_SUCCESS)
			atomic_fetch_add(&bad, 1);
	(void)sizes;
	TH_OK(sop_stream_synchronize(s));
	TH_OK(th.cuEventDestroy(ev));
	th_stream_destroy(s);
	return NULL;
}

/* Frees on one stream from two threads at once, as far as the stream's record goes: each tags
 * its free and raises the record's newest tag (sop__stream_freed), from which a destroy decides
 * whether it needs a probe for the frees not yet covered. Racing frees must leave the newest tag
 * there, or a free would wait for a synchronization of the context. The main thread and one
 * other raise it at nearly the same moment, round after round, the other spinning on the round
 * counter (yielding now and then, where the machine has fewer processors than spinning
 * threads). */
#define TAG_ROUNDS 300000

static struct sop__stream tag_st;
static atomic_int tag_round, tag_done;

static void
spin_until(atomic_int *v, int want)
{
	for (unsigned n = 0; atomic_load_explicit(v, memory_order_acquire) != want; n++)
		if (n % 4096 == 4095)
			sched_yield();
}

static void *
tag_worker(void *arg)
{
	(void)arg;
	for (int r = 1; r <= TAG_ROUNDS; r++) {
		spin_until(&tag_round, r);
		sop__stream_freed(&tag_st, 2 * (uint64_t)r + 1);
		atomic_store_explicit(&tag_done, r, memory_order_release);
	}
	return NULL;
}

static void
racing_tags(void)
{
	pthread_t t;
	int lost = 0;

	TH_ASSERT(pthread_create(&t, NULL, tag_worker, NULL) == 0);
	for (int r = 1; r <= TAG_ROUNDS; r++) {
		atomic_store(&tag_st.last_free, 0);
		atomic_store_explicit(&tag_round, r, memory_order_release);
		sop__stream_freed(&tag_st, 2 * (uint64_t)r);
		spin_until(&tag_done, r);
		lost += atomic_load(&tag_st.last_free) != 2 * (uint64_t)r + 1;
	}
	pthread_join(t, NULL);
	printf("threads: racing frees' tags, %d of %d rounds lost the newest\n", lost, TAG_ROUNDS);
	TH_EQ(lost, 0);
}

int
main(void)
{
	pthread_t t[THREADS];
	CUstream s;
	int i;

	th_init();
	TH_OK(sop__drv.cuCtxGetCurrent(&ctx0));
	pool = th_pool(0, 0);
	for (i = 0; i < THREADS; i++)
		pthread_mutex_init(&boxes[i].lock, NULL);
	for (i = 0; i < THREADS; i++)
		TH_ASSERT(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i) == 0);
	for (i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	/* Whatever is left in the mailboxes. */
	s = th_stream();
	for (i = 0; i < THREADS; i++)
		drain(&boxes[i], s);
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_ctx_synchronize());
	TH_EQ(atomic_load(&bad), 0);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	TH_CHECK(pool);
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	{
		size_t largest = 1, total = 1;

		TH_OK(sop_pool_get_free_extents(pool, &largest, &total));
		TH_EQ(largest, 0);
		TH_EQ(total, 0);
	}
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(s);
	racing_tags();
	printf("threads: ok\n");
	return 0;
}
