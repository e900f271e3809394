/* hotpath.c - a same-stream allocation makes one driver call, the query of who its stream is
 * (cuStreamGetId: the driver gives a destroyed stream's handle to the next stream at once), and
 * its free none: counted with sop_driver_calls. Without the interposer, which counts captures,
 * an allocation also asks whether its stream captures (cuStreamIsCapturing), and so does a probe
 * before its record; those are counted apart (captures), and frees ask nothing while no capture
 * was ever seen. Once several streams are in use, frees record a
 * probe event now and then (asking who the stream is first), never more than one per 64 frees in
 * a steady same-stream loop, nor, where the stream is alone in its pool, more than one per
 * 200 us of it (order.c's PROBE_GAP_NS). A thread that records an event on one stream and
 * makes another wait on it makes those two calls and the two queries, whichever two streams
 * they are. */
#include <string.h>
#include <time.h>

#include "helpers.h"

#define PAIRS 20000

/* The capture queries among them, apart from the sum that total_calls returns. */
static unsigned long long captures;

/* Every driver call sop made but the capture queries, and those of cuEventRecord and
 * cuStreamGetId. */
static unsigned long long
total_calls(unsigned long long *record, unsigned long long *ids)
{
	const char *names[64];
	unsigned long long counts[64], sum = 0;
	size_t n = 64, i;

	TH_OK(sop_driver_calls(names, counts, &n));
	TH_ASSERT(n > 0 && n <= 64);
	*record = *ids = 0;
	for (i = 0; i < n; i++) {
		if (!strcmp(names[i], "cuStreamIsCapturing")) {
			captures = counts[i];
			continue;
		}
		sum += counts[i];
		if (!strcmp(names[i], "cuEventRecord"))
			*record = counts[i];
		if (!strcmp(names[i], "cuStreamGetId"))
			*ids = counts[i];
	}
	return sum;
}

/* Wall time less the thread's CPU time: the nanoseconds the thread spent off its CPU between two
 * marks are the second less the first. That can come out a little below zero, where the thread's
 * CPU clock ran ahead of the wall clock (on an H200's host, once): read as none. */
static int64_t
off_cpu_mark(void)
{
	struct timespec cpu;

	TH_ASSERT(clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0);
	return (int64_t)sop__now_ns() - ((int64_t)cpu.tv_sec * 1000000000 + cpu.tv_nsec);
}

static void
pairs(sop_pool_t pool, CUstream s)
{
	static const size_t sizes[] = {256, 4096, 1 << 20, 40 << 20};
	int i;

	for (i = 0; i < PAIRS; i++) {
		void *p;
		TH_OK(sop_malloc_from_pool_async(&p, sizes[i % 4], pool, s));
		TH_OK(sop_free_async(p, s));
	}
}

int
main(void)
{
	unsigned long long before, after, rec0, rec1, id0, id1, cap0;
	uint64_t t0, t1, off;
	int64_t mark;
	const char *names[1];
	unsigned long long counts[1];
	size_t n = 0;
	sop_pool_t pool;
	CUstream s, s2;
	void *p;

	th_init();
	TH_OK(sop_driver_calls(NULL, NULL, &n));
	TH_ASSERT(n > 10);
	n = 1;
	TH_EQ(sop_driver_calls(names, NULL, &n), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_driver_calls(NULL, counts, NULL), CUDA_ERROR_INVALID_VALUE);

	s = th_stream();
	pool = th_pool(0, 0);
	/* Warm: the pool has grown and the thread knows the stream. */
	pairs(pool, s);
	before = total_calls(&rec0, &id0);
	cap0 = captures;
	pairs(pool, s);
	after = total_calls(&rec1, &id1);
	printf("hotpath: %d same-stream pairs, one stream in use: %llu driver calls and %llu "
	       "capture queries\n",
	       PAIRS, after - before, captures - cap0);
	TH_EQ(id1 - id0, PAIRS);
	TH_EQ(after - before, PAIRS);
	TH_EQ(captures - cap0, PAIRS);

	/* A second stream in use in the pool: probes by count, one per 64 frees, which the other
	 * stream may be waiting for. A thread kept off its CPU for a millisecond or more in the
	 * loop makes its stream look slow there (order.c, sop__stream_pace: frees less often than
	 * once in 100 us over a window of at least 1 ms), and its next 64 frees then get a probe
	 * each: so many more for each millisecond the loop spent off the CPU, none in a loop that
	 * ran undisturbed. */
	s2 = th_stream();
	TH_OK(sop_malloc_from_pool_async(&p, 4096, pool, s2));
	TH_OK(sop_free_async(p, s2));
	pairs(pool, s);
	before = total_calls(&rec0, &id0);
	cap0 = captures;
	mark = off_cpu_mark();
	pairs(pool, s);
	mark = off_cpu_mark() - mark;
	off = mark > 0 ? (uint64_t)mark : 0;
	after = total_calls(&rec1, &id1);
	printf("hotpath: %d same-stream pairs, two streams in the pool: %llu driver calls, %llu "
	       "event records, %.2f ms off the CPU\n",
	       PAIRS, after - before, rec1 - rec0, (double)off / 1e6);
	TH_EQ(captures - cap0, PAIRS + (rec1 - rec0));
	TH_ASSERT(rec1 - rec0 <= PAIRS / 64 + 1 + 64 * (off / 1000000));
	TH_ASSERT(rec1 - rec0 >= PAIRS / 128);
	/* One query per allocation, and one before each probe a free records. */
	TH_EQ(id1 - id0, PAIRS + (rec1 - rec0));
	TH_EQ(after - before, (id1 - id0) + (rec1 - rec0));

	/* The same loop in a pool of its own, with the other stream still about: its probes serve
	 * only itself, and come no sooner than 200 us after the one before (order.c's
	 * PROBE_GAP_NS). */
	{
		sop_pool_t own = th_pool(0, 0);

		pairs(own, s);
		before = total_calls(&rec0, &id0);
		cap0 = captures;
		t0 = sop__now_ns(); /* the clock the gap is kept by */
		pairs(own, s);
		t1 = sop__now_ns();
		after = total_calls(&rec1, &id1);
		printf("hotpath: %d same-stream pairs alone in a pool, another stream about: %llu "
		       "driver calls, %llu event records in %.2f ms\n",
		       PAIRS, after - before, rec1 - rec0, (double)(t1 - t0) / 1e6);
		TH_EQ(captures - cap0, PAIRS + (rec1 - rec0));
		TH_ASSERT(rec1 - rec0 <= 1 + (t1 - t0) / 200000);
		TH_EQ(id1 - id0, PAIRS + (rec1 - rec0));
		TH_EQ(after - before, (id1 - id0) + (rec1 - rec0));
		TH_OK(sop_stream_synchronize(s));
		TH_OK(sop_pool_destroy(own));
	}

	{
		/* Any two streams: the thread's cache of who each stream is keeps both. */
		enum { STREAMS = 48, ROUNDS = 4 };
		CUstream st[STREAMS];
		CUevent ev;
		int i, j, k;

		TH_OK(th.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
		for (i = 0; i < STREAMS; i++)
			st[i] = th_stream();
		for (i = 0; i < STREAMS; i++) {
			for (j = 0; j < STREAMS; j++) {
				if (i == j)
					continue;
				TH_OK(sop_event_record(ev, st[i]));
				TH_OK(sop_stream_wait_event(st[j], ev, 0));
				before = total_calls(&rec0, &id0);
				for (k = 0; k < ROUNDS; k++) {
					TH_OK(sop_event_record(ev, st[i]));
					TH_OK(sop_stream_wait_event(st[j], ev, 0));
				}
				after = total_calls(&rec1, &id1);
				TH_EQ(id1 - id0, 2 * ROUNDS);
				TH_EQ(after - before, 4 * ROUNDS);
			}
		}
		TH_OK(sop_ctx_synchronize());
		TH_OK(sop_event_destroy(ev));
		for (i = 0; i < STREAMS; i++)
			th_stream_destroy(st[i]);
	}

	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_stream_synchronize(s2));
	TH_CHECK(pool);
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(s);
	th_stream_destroy(s2);
	printf("hotpath: ok\n");
	return 0;
}
