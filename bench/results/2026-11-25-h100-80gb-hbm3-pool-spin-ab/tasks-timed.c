/* tasks-timed.c - the threads workload's stream per task, timed phase by phase: n threads, each
 * running tasks until 200 ms have passed; a task makes a non-blocking stream, keeps 32 blocks of
 * random sizes (1 B..1 MiB) live through 256 replacements, frees them, synchronizes the stream
 * and destroys it, with sop_stream_synchronize and sop_stream_destroy (mode 2). Mode 0 does the
 * stream's creation, synchronization and destruction alone; modes 1 and 3 add, per allocation,
 * the queries sop makes without the interposer (cuStreamIsCapturing and cuStreamGetId, or the
 * first alone). Prints pairs per second over the whole span and the time per task of each
 * phase, summed over the threads. One fresh process per run, on a fresh pool with release
 * threshold UINT64_MAX.
 *
 *   cc -O2 tasks-timed.c -lsop -lcuda -lpthread; ./a.out THREADS MODE
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "sop.h"

#define CK(x) do { CUresult r_ = (x); if (r_) { fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, r_); exit(1); } } while (0)
#define LIVE 32
#define STEPS 256
static CUcontext ctx;
static sop_pool_t pool;
static int mode;
static double box = 200e6;
static pthread_barrier_t bar;
static atomic_long ntasks;
static double phase[16][6];

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static uint64_t rn(uint64_t *s) { uint64_t z = (*s += 0x9e3779b97f4a7c15ull); z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; z = (z ^ (z >> 27)) * 0x94d049bb133111ebull; return z ^ (z >> 31); }

struct w { int id; double t0, t1; long tasks; };

static void task(int id, long t)
{
	double a = now(), b, c, d, e;
	CUstream s; void *p[LIVE]; uint64_t seed = 0x7a5c0000u + t; int i;
	CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	b = now();
	if (mode == 1 || mode == 3) {
		for (i = 0; i < LIVE + STEPS; i++) {
			CUstreamCaptureStatus st; unsigned long long v;
			CK(cuStreamIsCapturing(s, &st));
			if (mode == 1) CK(cuStreamGetId(s, &v));
		}
	} else if (mode == 2) {
		for (i = 0; i < LIVE + STEPS; i++) {
			int k = i; uint64_t x = rn(&seed);
			if (i >= LIVE) { k = x % LIVE; CK(sop_free_async(p[k], s)); }
			CK(sop_malloc_from_pool_async(&p[k], 1 + (x >> 20) % (1 << 20), pool, s));
		}
	}
	c = now();
	if (mode == 2) for (i = 0; i < LIVE; i++) CK(sop_free_async(p[i], s));
	d = now();
	if (mode == 2) { CK(sop_stream_synchronize(s)); e = now(); CK(sop_stream_destroy(s)); }
	else { CK(cuStreamSynchronize(s)); e = now(); CK(cuStreamDestroy(s)); }
	double f = now();
	phase[id][0] += b - a; phase[id][1] += c - b; phase[id][2] += d - c; phase[id][3] += e - d; phase[id][4] += f - e;
}

static void *run(void *arg)
{
	struct w *w = arg;
	CK(cuCtxSetCurrent(ctx));
	pthread_barrier_wait(&bar);
	w->t0 = now();
	do { long t = atomic_fetch_add(&ntasks, 1); task(w->id, t); w->tasks++; w->t1 = now(); } while (w->t1 - w->t0 < box);
	return NULL;
}

int main(int argc, char **argv)
{
	int n = atoi(argv[1]); mode = atoi(argv[2]);
	CUdevice dev; struct w ws[16]; pthread_t th[16];
	CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
	if (mode == 2) {
		CUmemPoolProps pp; memset(&pp, 0, sizeof pp);
		pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE; pp.location.id = 0;
		CK(sop_pool_create(&pool, &pp));
		cuuint64_t th_ = UINT64_MAX; CK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &th_));
	}
	memset(phase, 0, sizeof phase);
	pthread_barrier_init(&bar, NULL, n);
	for (int i = 0; i < n; i++) { ws[i] = (struct w){i}; pthread_create(&th[i], NULL, run, &ws[i]); }
	double t0 = 1e30, t1 = 0; long tasks = 0; double ph[6] = {0};
	for (int i = 0; i < n; i++) { pthread_join(th[i], NULL); if (ws[i].t0 < t0) t0 = ws[i].t0; if (ws[i].t1 > t1) t1 = ws[i].t1; tasks += ws[i].tasks; for (int j = 0; j < 5; j++) ph[j] += phase[i][j]; }
	printf("mode %d threads %2d: %.2f M pairs/s, tasks %ld, per task us: create %.1f loop %.1f frees %.1f sync %.1f destroy %.1f\n",
	       mode, n, tasks * 288.0 / (t1 - t0) * 1e3, tasks, ph[0] / tasks / 1e3, ph[1] / tasks / 1e3, ph[2] / tasks / 1e3, ph[3] / tasks / 1e3, ph[4] / tasks / 1e3);
	if (mode == 2) { cuuint64_t r; CK(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &r)); printf("  reserved-high %.1f MiB\n", r / 1048576.0); }
	return 0;
}
