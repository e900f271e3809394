/* CuPy's tasks on the simulated driver: threads whose tasks each make a stream, keep 32 blocks of
 * 1 B..1 MiB through 256 replacements at Python's pace (a global lock held for PY_US per
 * operation, as the GIL), each block filled and checked by a "kernel" (a host function of
 * KERNEL_US) on the stream, then free all, synchronize and destroy the stream. */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "sop.h"

static int THREADS = 4, TASKS = 20, PY_US = 60, KERNEL_US = 20;
static pthread_mutex_t gil = PTHREAD_MUTEX_INITIALIZER;
static _Atomic long live, peak, next_task;
static sop_pool_t pool;
static CUcontext ctx;

static void note(long d) {
	long v = atomic_fetch_add(&live, d) + d, p = atomic_load(&peak);
	while (v > p && !atomic_compare_exchange_weak(&peak, &p, v)) ;
}
static void CUDA_CB kern(void *arg) { (void)arg; usleep(KERNEL_US); }
static void py(void) { pthread_mutex_lock(&gil); usleep(PY_US); pthread_mutex_unlock(&gil); }
#define OK(x) do { CUresult r_ = (x); if (r_) { fprintf(stderr, "%s: %d\n", #x, r_); exit(1); } } while (0)

static void *worker(void *arg) {
	(void)arg;
	OK(cuCtxSetCurrent(ctx));
	for (;;) {
		long t = atomic_fetch_add(&next_task, 1);
		if (t >= (long)TASKS * THREADS) return NULL;
		unsigned seed = 0x7a5c0000u + (unsigned)t;
		CUstream s; void *p[32]; long n[32];
		OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
		for (int k = 0; k < 32; k++) {
			py(); n[k] = 1 + rand_r(&seed) % (1 << 20);
			OK(sop_malloc_from_pool_async(&p[k], n[k], pool, s)); note(n[k]);
			OK(cuLaunchHostFunc(s, kern, NULL));
		}
		for (int step = 0; step < 256; step++) {
			int k = rand_r(&seed) % 32;
			py(); OK(cuLaunchHostFunc(s, kern, NULL));
			OK(sop_free_async(p[k], s)); note(-n[k]);
			py(); n[k] = 1 + rand_r(&seed) % (1 << 20);
			OK(sop_malloc_from_pool_async(&p[k], n[k], pool, s)); note(n[k]);
			OK(cuLaunchHostFunc(s, kern, NULL));
		}
		for (int k = 0; k < 32; k++) {
			py(); OK(cuLaunchHostFunc(s, kern, NULL));
			OK(sop_free_async(p[k], s)); note(-n[k]);
		}
		OK(sop_stream_synchronize(s));
		OK(sop_stream_destroy(s));
	}
}

int main(int argc, char **argv) {
	if (argc > 1) THREADS = atoi(argv[1]);
	if (argc > 2) TASKS = atoi(argv[2]);
	if (argc > 3) PY_US = atoi(argv[3]);
	if (argc > 4) KERNEL_US = atoi(argv[4]);
	CUdevice d; cuuint64_t keep = UINT64_MAX, high = 0;
	OK(cuInit(0)); OK(cuDeviceGet(&d, 0)); OK(cuDevicePrimaryCtxRetain(&ctx, d)); OK(cuCtxSetCurrent(ctx));
	OK(sop_device_get_default_pool(&pool, d));
	OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	pthread_t th[64];
	struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, worker, NULL);
	for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
	clock_gettime(CLOCK_MONOTONIC, &b);
	OK(sop_pool_get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &high));
	printf("threads %d tasks %d: reserved-high %llu MiB, live peak %.1f MiB, ratio %.3f, %.1f tasks/s\n",
	       THREADS, TASKS * THREADS, (unsigned long long)high >> 20, atomic_load(&peak) / 1048576.0,
	       (double)high / atomic_load(&peak),
	       TASKS * THREADS / ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9));
	return 0;
}
