/* preload-integrity.c - the data-integrity stress (integrity.c) as an unchanged program meets the
 * interposer: this program links libcuda.so.1, knows nothing of sop, and allocates with the
 * driver's stream-ordered calls (cuMemAllocAsync from the device's default pool, and
 * cuMemAllocFromPoolAsync from a pool of its own capped at 64 MiB, which runs out and reuses).
 * Under sop-run those calls are sop's, and so are the calls sop learns stream order from: event
 * records and waits, synchronizations, stream destroys, which the interposer sees. Several
 * threads, each with two streams, run a random mix of allocations filled with a tag by work on
 * their stream, checks of the tag right before each free, frees on the allocating stream, on the
 * thread's other stream after an event, or by the next thread after an event, synchronizations
 * of streams, events and the context, trims, and streams destroyed while their work runs and
 * made again (the driver may hand the new stream the old handle, which sop then answers from its
 * memo of stream ids). A block handed out while work that may still touch it can run shows up
 * as a wrong tag.
 *
 * On a GPU the fill and the check are kernels (the fill spins first, so that work overlaps the
 * host's calls); on the simulated driver's libcuda.so.1 (whose own pools are not there: it runs
 * only under the interposer) a memset, and copies back checked by a host function.
 *
 * Usage: test-preload-integrity [--seconds N] [--threads N] [--seed N] [--expect sop|driver]
 * --expect says whose memory every allocation must be (sop's, found with sop_pointer_get_pool
 * through dlsym(RTLD_DEFAULT); the driver's: no sop in the process). Exits 77 without a driver.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#include "kernels.ptx.h"
#include "sop.h"

#define MiB ((size_t)1 << 20)
#define MAX_THREADS 16
#define SLOTS 24
#define BOX 64
#define EDGE 256

#define OK(call)                                                                                   \
	do {                                                                                       \
		CUresult r_ = (call);                                                              \
		if (r_ != CUDA_SUCCESS) {                                                          \
			fprintf(stderr, "%s:%d: %s gave %d\n", __FILE__, __LINE__, #call, (int)r_); \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

static int n_threads = 4;
static double seconds = 2.0;
static uint64_t seed0 = 1;
static const char *expect = "";
static bool gpu;
static CUcontext ctx;
static CUmemoryPool capped;
static CUfunction k_spin_fill, k_check;
static unsigned *dev_errors;
static __typeof__(sop_pointer_get_pool) *pointer_get_pool;
static atomic_ulong host_errors, n_ops, n_oom, n_handoffs, n_syncs, n_replaced, n_sop, n_allocs;

struct block {
	CUdeviceptr p;
	size_t bytes;
	uint32_t tag;
};

struct mailbox {
	pthread_mutex_t lock;
	struct block b[BOX];
	CUevent ev[BOX];
	int n;
};
static struct mailbox boxes[MAX_THREADS];

struct worker {
	int tid;
	CUstream s[2];
	struct block slot[SLOTS];
	int slot_stream[SLOTS];
	uint64_t rng;
};

static uint64_t
rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static CUstream
stream_new(void)
{
	CUstream s;

	OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	return s;
}

static CUevent
event_new(void)
{
	CUevent e;

	OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
	return e;
}

/* ---- Fill and check ------------------------------------------------------------------------- */

static void
fill(struct block *b, CUstream s, long long spin)
{
	if (gpu) {
		unsigned long long n = b->bytes / 4;
		void *args[] = {&b->p, &n, &b->tag, &spin};
		OK(cuLaunchKernel(k_spin_fill, 32, 1, 1, 256, 1, 1, 0, s, args, NULL));
	} else {
		OK(cuMemsetD32Async(b->p, b->tag, b->bytes / 4, s));
	}
}

struct host_check {
	uint32_t words[2 * EDGE];
	size_t n;
	uint32_t tag;
};

static void CUDA_CB
host_check_fn(void *arg)
{
	struct host_check *c = arg;
	size_t i;

	for (i = 0; i < c->n; i++) {
		if (c->words[i] != c->tag) {
			atomic_fetch_add(&host_errors, 1);
			break;
		}
	}
	free(c);
}

static void
check(struct block *b, CUstream s, int tid)
{
	if (gpu) {
		unsigned long long n = b->bytes / 4;
		unsigned *bad = dev_errors + tid;
		void *args[] = {&b->p, &n, &b->tag, &bad};
		OK(cuLaunchKernel(k_check, 32, 1, 1, 256, 1, 1, 0, s, args, NULL));
	} else {
		struct host_check *c = malloc(sizeof *c);
		size_t words = b->bytes / 4, edge = words < EDGE ? words : EDGE;

		if (!c)
			exit(1);
		c->tag = b->tag;
		c->n = 2 * edge;
		OK(cuMemcpyDtoHAsync(c->words, b->p, edge * 4, s));
		OK(cuMemcpyDtoHAsync(c->words + edge, b->p + (words - edge) * 4, edge * 4, s));
		OK(cuLaunchHostFunc(s, host_check_fn, c));
	}
}

/* ---- The workers ------------------------------------------------------------------------------ */

static void
take_mail(struct worker *w)
{
	struct mailbox *box = &boxes[w->tid];

	pthread_mutex_lock(&box->lock);
	while (box->n > 0) {
		box->n--;
		OK(cuStreamWaitEvent(w->s[0], box->ev[box->n], 0));
		check(&box->b[box->n], w->s[0], w->tid);
		OK(cuMemFreeAsync(box->b[box->n].p, w->s[0]));
		OK(cuEventDestroy(box->ev[box->n]));
	}
	pthread_mutex_unlock(&box->lock);
}

static void
op_alloc(struct worker *w, int k)
{
	struct block *b = &w->slot[k];
	int which = (int)(rnd(&w->rng) % 2);
	unsigned e = (unsigned)(rnd(&w->rng) % 14); /* 512 B .. 8 MiB, log-uniform */
	size_t bytes = (((size_t)512 << e) + (rnd(&w->rng) % ((size_t)512 << e))) & ~(size_t)3;
	CUresult r;

	if (rnd(&w->rng) % 2)
		r = cuMemAllocAsync(&b->p, bytes, w->s[which]);
	else
		r = cuMemAllocFromPoolAsync(&b->p, bytes, capped, w->s[which]);
	if (r == CUDA_ERROR_OUT_OF_MEMORY) {
		atomic_fetch_add(&n_oom, 1);
		b->p = 0;
		return;
	}
	OK(r);
	if (pointer_get_pool) {
		sop_pool_t owner;
		atomic_fetch_add(&n_sop, pointer_get_pool(&owner, (void *)(uintptr_t)b->p) == CUDA_SUCCESS);
	}
	atomic_fetch_add(&n_allocs, 1);
	b->bytes = bytes;
	b->tag = (uint32_t)rnd(&w->rng) | 1;
	w->slot_stream[k] = which;
	fill(b, w->s[which], (long long)(rnd(&w->rng) % 20000));
}

static void
op_free(struct worker *w, int k)
{
	struct block *b = &w->slot[k];
	CUstream s = w->s[w->slot_stream[k]], other = w->s[!w->slot_stream[k]];
	unsigned how = (unsigned)(rnd(&w->rng) % 100);
	CUevent ev;

	check(b, s, w->tid);
	if (how < 60) {
		OK(cuMemFreeAsync(b->p, s));
	} else if (how < 85 || n_threads == 1) {
		ev = event_new(); /* freed on the other stream, ordered after this one */
		OK(cuEventRecord(ev, s));
		OK(cuStreamWaitEvent(other, ev, 0));
		OK(cuMemFreeAsync(b->p, other));
		OK(cuEventDestroy(ev)); /* the next event may get this handle */
	} else {
		struct mailbox *box = &boxes[(w->tid + 1) % n_threads];
		ev = event_new(); /* handed to the next thread, which checks it again and frees it */
		OK(cuEventRecord(ev, s));
		pthread_mutex_lock(&box->lock);
		if (box->n < BOX) {
			box->b[box->n] = *b;
			box->ev[box->n++] = ev;
			ev = NULL;
		}
		pthread_mutex_unlock(&box->lock);
		if (ev) {
			OK(cuMemFreeAsync(b->p, s));
			OK(cuEventDestroy(ev));
		} else {
			atomic_fetch_add(&n_handoffs, 1);
		}
	}
	b->p = 0;
}

/* Free what the thread holds on one of its streams there, destroy the stream with that work
 * still running, and make a new one; half the time ordered after the old one's work. */
static void
op_replace(struct worker *w, int which)
{
	CUstream old = w->s[which];
	bool chain = rnd(&w->rng) % 2;
	CUevent ev = NULL;
	int k;

	for (k = 0; k < SLOTS; k++) {
		struct block *b = &w->slot[k];
		if (b->p && w->slot_stream[k] == which) {
			check(b, old, w->tid);
			OK(cuMemFreeAsync(b->p, old));
			b->p = 0;
		}
	}
	if (chain) {
		ev = event_new();
		OK(cuEventRecord(ev, old));
	}
	OK(cuStreamDestroy(old));
	w->s[which] = stream_new();
	if (chain) {
		OK(cuStreamWaitEvent(w->s[which], ev, 0));
		OK(cuEventDestroy(ev));
	}
	atomic_fetch_add(&n_replaced, 1);
}

static void
op_misc(struct worker *w)
{
	unsigned r = (unsigned)(rnd(&w->rng) % 1000);

	if (r >= 998) {
		op_replace(w, (int)(rnd(&w->rng) % 2));
	} else if (r < 5) {
		OK(cuStreamSynchronize(w->s[r % 2]));
		atomic_fetch_add(&n_syncs, 1);
	} else if (r < 7) {
		CUevent ev = event_new();
		OK(cuEventRecord(ev, w->s[r % 2]));
		OK(cuEventSynchronize(ev));
		OK(cuEventDestroy(ev));
		atomic_fetch_add(&n_syncs, 1);
	} else if (r < 8 && rnd(&w->rng) % 4 == 0) {
		OK(cuCtxSynchronize());
		atomic_fetch_add(&n_syncs, 1);
	} else if (r < 10) {
		OK(cuMemPoolTrimTo(capped, (size_t)(rnd(&w->rng) % 4) * 16 * MiB));
	}
}

static void *
worker_fn(void *arg)
{
	struct worker *w = arg;
	double end = now_s() + seconds;
	unsigned long ops = 0;
	int k;

	OK(cuCtxSetCurrent(ctx));
	w->s[0] = stream_new();
	w->s[1] = stream_new();
	while (now_s() < end) {
		for (int i = 0; i < 64; i++, ops++) {
			k = (int)(rnd(&w->rng) % SLOTS);
			if (w->slot[k].p)
				op_free(w, k);
			else
				op_alloc(w, k);
			op_misc(w);
		}
		take_mail(w);
	}
	for (k = 0; k < SLOTS; k++)
		if (w->slot[k].p)
			op_free(w, k);
	atomic_fetch_add(&n_ops, ops);
	return NULL;
}

int
main(int argc, char **argv)
{
	struct worker *w;
	pthread_t t[MAX_THREADS];
	unsigned bad[MAX_THREADS] = {0};
	CUmemPoolProps props;
	CUdeviceptr errors;
	CUdevice dev;
	CUstream s;
	void *sym;
	int i;

	for (i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--seconds"))
			seconds = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--threads"))
			n_threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--seed"))
			seed0 = strtoull(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--expect"))
			expect = argv[i + 1];
	}
	if (n_threads < 1 || n_threads > MAX_THREADS)
		n_threads = 4;
	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS) {
		printf("skip: no driver or no device\n");
		return 77;
	}
	OK(cuDevicePrimaryCtxRetain(&ctx, dev));
	OK(cuCtxSetCurrent(ctx));
	gpu = dlsym(RTLD_DEFAULT, "sim_calls") == NULL;
	sym = dlsym(RTLD_DEFAULT, "sop_pointer_get_pool");
	memcpy(&pointer_get_pool, &sym, sizeof sym); /* ISO C has no cast from data to function */
	if (!gpu && !pointer_get_pool) {
		printf("skip: the simulated driver has no pools of its own\n");
		return 77;
	}
	if (gpu) {
		CUmodule mod;
		OK(cuModuleLoadData(&mod, sop_kernels_ptx));
		OK(cuModuleGetFunction(&k_spin_fill, mod, "sop_spin_fill"));
		OK(cuModuleGetFunction(&k_check, mod, "sop_check"));
	}
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = dev;
	props.maxSize = 64 * MiB;
	OK(cuMemPoolCreate(&capped, &props));
	s = stream_new();
	OK(cuMemAllocAsync(&errors, sizeof bad, s));
	OK(cuMemsetD32Async(errors, 0, MAX_THREADS, s));
	OK(cuStreamSynchronize(s));
	dev_errors = (unsigned *)(uintptr_t)errors;
	w = calloc((size_t)n_threads, sizeof *w);
	if (!w)
		return 1;
	for (i = 0; i < n_threads; i++) {
		pthread_mutex_init(&boxes[i].lock, NULL);
		w[i].tid = i;
		w[i].rng = (seed0 + 1) * 0x9E3779B97F4A7C15u ^ (uint64_t)(i + 1) * 0xBF58476D1CE4E5B9u;
	}
	for (i = 0; i < n_threads; i++)
		if (pthread_create(&t[i], NULL, worker_fn, &w[i]) != 0)
			return 1;
	for (i = 0; i < n_threads; i++)
		pthread_join(t[i], NULL);
	for (i = 0; i < n_threads; i++)
		take_mail(&w[i]);
	OK(cuCtxSynchronize());
	if (gpu) {
		OK(cuMemcpyDtoHAsync(bad, errors, sizeof bad, s));
		OK(cuStreamSynchronize(s));
		for (i = 0; i < n_threads; i++)
			atomic_fetch_add(&host_errors, bad[i]);
	}
	printf("preload-integrity: %s, %s, %d threads, %.0f s, seed %llu: %lu operations, %lu "
	       "allocations (%lu sop's), %lu handoffs, %lu synchronizations, %lu streams replaced "
	       "busy, %lu out of memory, %lu errors\n",
	       gpu ? "GPU" : "simulated driver", pointer_get_pool ? "under the interposer" : "no sop",
	       n_threads, seconds, (unsigned long long)seed0, atomic_load(&n_ops),
	       atomic_load(&n_allocs), atomic_load(&n_sop), atomic_load(&n_handoffs),
	       atomic_load(&n_syncs), atomic_load(&n_replaced), atomic_load(&n_oom),
	       atomic_load(&host_errors));
	for (i = 0; i < n_threads; i++) {
		OK(cuStreamDestroy(w[i].s[0]));
		OK(cuStreamDestroy(w[i].s[1]));
	}
	OK(cuMemFreeAsync(errors, s));
	OK(cuStreamSynchronize(s));
	OK(cuStreamDestroy(s));
	OK(cuMemPoolDestroy(capped));
	free(w);
	if (atomic_load(&host_errors) || !atomic_load(&n_allocs))
		return 1;
	if (!strcmp(expect, "sop") && atomic_load(&n_sop) != atomic_load(&n_allocs)) {
		fprintf(stderr, "preload-integrity: memory not sop's under the interposer\n");
		return 1;
	}
	if (!strcmp(expect, "driver") && atomic_load(&n_sop)) {
		fprintf(stderr, "preload-integrity: sop's memory without the interposer\n");
		return 1;
	}
	return 0;
}
