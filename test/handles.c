/* handles.c - a stream destroyed, and a new one the driver creates at the same handle: the new
 * stream's frees must become reusable at its synchronization and be released by a trim, whatever
 * the thread remembered about the handle's old stream. The driver on an H100 hands a destroyed
 * stream's handle to the next stream at once, and so does the simulated driver unless told to
 * hand out fresh values (SOP_SIM_HANDLES=fresh): the test creates streams until one lands on the
 * old handle, and skips if none does. test/recycle.c has the scenarios with the old stream still
 * busy. */
#include <unistd.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)
/* Streams destroyed in turn, and new streams made after each, while looking for one at the
 * destroyed one's handle. */
#define ROUNDS 16
#define TRIES 64

int
main(void)
{
	cuuint64_t keep = UINT64_MAX;
	sop_pool_t pool;
	CUstream s1 = NULL, s2 = NULL;
	void *p;
	int rounds, tries = 0;
	bool found = false;

	th_init();
	pool = th_pool(0, 0);
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	/* On the H100 the next stream mostly lands on the old handle at once, but now and then a
	 * destroyed stream's handle did not come back in 1024 new streams: then another stream is
	 * destroyed and looked for. */
	for (rounds = 0; rounds < ROUNDS && !found; rounds++) {
		int t;

		s1 = th_stream();
		TH_OK(sop_stream_synchronize(s1)); /* the thread now knows s1's handle */
		th_stream_destroy(s1);
		for (t = 0; t < TRIES; t++, tries++) {
			/* The simulated driver frees a destroyed stream once its worker has exited:
			 * give it the moment, so that the next stream can land where it was. */
			usleep(200);
			s2 = th_stream();
			if ((found = s2 == s1))
				break;
			th_stream_destroy(s2);
		}
	}
	if (!found) {
		printf("handles: skip (the driver reused none of %d handles)\n", rounds);
		TH_OK(sop_pool_destroy(pool));
		return TH_SKIP;
	}
	TH_OK(sop_malloc_from_pool_async(&p, 8 * MiB, pool, s2));
	TH_OK(sop_free_async(p, s2));
	TH_OK(sop_stream_synchronize(s2)); /* the free is complete, and known to be */
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(s2);
	printf("handles: ok (new stream at the old handle after %d tries, in round %d)\n", tries + 1,
	       rounds);
	return 0;
}
