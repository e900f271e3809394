/* stress.h - the data-integrity stress's workers (stress.c), over a table of the calls they make:
 * sop's API (integrity.c) or the driver's names as an unchanged program calls them under the
 * interposer (preload-integrity.c).
 */
#ifndef SOP_TEST_STRESS_H
#define SOP_TEST_STRESS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda.h>

#define STRESS_MAX_THREADS 16

/* A driver call that must succeed: else it is printed and the process exits 1. */
#define STRESS_OK(call)                                                                            \
	do {                                                                                       \
		CUresult r_ = (call);                                                              \
		if (r_ != CUDA_SUCCESS) {                                                          \
			fprintf(stderr, "%s:%d: %s gave %d\n", __FILE__, __LINE__, #call, (int)r_); \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

/* What the workers call. The first group is the allocator's (and the calls it learns stream order
 * from); the second, the driver's own. */
struct stress_api {
	/* From pool 0 (capped: it runs out and reuses through inserted dependencies) or pool 1. */
	CUresult (*alloc)(CUdeviceptr *p, size_t bytes, int pool, CUstream s);
	CUresult (*free)(CUdeviceptr p, CUstream s);
	CUresult (*event_record)(CUevent ev, CUstream s);
	CUresult (*stream_wait_event)(CUstream s, CUevent ev, unsigned int flags);
	CUresult (*stream_synchronize)(CUstream s);
	CUresult (*event_synchronize)(CUevent ev);
	CUresult (*ctx_synchronize)(void);
	CUresult (*trim)(int pool, size_t keep);
	CUresult (*event_destroy)(CUevent ev);
	CUresult (*stream_destroy)(CUstream s);
	/* Called with each allocation made (may be NULL). */
	void (*allocated)(CUdeviceptr p);

	CUresult (*event_create)(CUevent *ev, unsigned int flags);
	CUresult (*event_destroy_direct)(CUevent ev); /* behind the allocator's back */
	CUresult (*stream_create)(CUstream *s, unsigned int flags);
	CUresult (*ctx_set_current)(CUcontext ctx);
	CUresult (*launch)(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
			   unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
			   CUstream s, void **params, void **extra);
	CUresult (*memset32)(CUdeviceptr p, unsigned int v, size_t n, CUstream s);
	CUresult (*copy_dtoh)(void *dst, CUdeviceptr src, size_t bytes, CUstream s);
	CUresult (*host_func)(CUstream s, CUhostFn fn, void *arg);
};

struct stress {
	const struct stress_api *api;
	int n_threads;
	double seconds;
	uint64_t seed;
	unsigned replace_permille; /* of operations that replace one of a thread's streams */
	size_t trim_step;          /* a trim keeps 0 to 3 of these */
	CUcontext ctx;
	/* On a GPU the fill and the check kernels (kernels.cu), and one counter of wrong tags per
	 * thread in device memory; on the simulated driver NULL: a memset, and copies back checked
	 * by a host function. */
	CUfunction spin_fill, check;
	unsigned *dev_errors;
	atomic_ulong errors, ops, oom, handoffs, syncs, trims, replaced;
};

/* Take the option name with its value if it is one of the stress's (--seconds, --threads, --seed,
 * --replace PERMILLE): true if it was. */
bool stress_option(struct stress *s, const char *name, const char *value);

/* Run s->n_threads workers for s->seconds, each on two streams of its own, then hand over what
 * is still in their mailboxes, synchronize the context, add the GPU's counts to s->errors and
 * destroy the workers' streams. A failed call prints itself and exits 1. */
void stress_run(struct stress *s);

#endif
