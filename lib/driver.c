/* driver.c - the only file that calls into the CUDA driver library.
 *
 * The driver is loaded at run time with dlopen, so that a program linked with sop starts on a
 * machine with no driver and gets CUDA_ERROR_NOT_INITIALIZED from its sop calls instead of a
 * loader error. SOP_DRIVER_LIBRARY names another library to load instead of libcuda.so.1; the
 * tests point it at the simulated driver (test/sim/). Entry points are resolved by the exported
 * names cuda.h's macros give (cuMemGetInfo -> cuMemGetInfo_v2), so the table is the same whether
 * it is filled from the real driver or the simulated one.
 *
 * Every other file of sop calls the driver through sop__drv. The interposer (preload.c) is the
 * one other file that calls it: what sop does not serve it forwards to entry points of its own.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct sop__driver sop__drv;

/* The entry points' names, as written in source, for sop_driver_calls. */
static const char *const entry_names[SOP_N_ENTRIES] = {
#define SOP_X(name) #name,
	SOP_DRIVER_ENTRIES(SOP_X)
#undef SOP_X
};

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static CUresult driver_status = CUDA_ERROR_NOT_INITIALIZED;
static void *driver_dl;

#define SOP_STR2(x) #x
#define SOP_STR(x) SOP_STR2(x)

/* Built into the interposer (preload.c), which overrides dlsym to hand programs its own
 * functions: sop's table must hold the driver's, or sop's driver calls would come back to sop. */
#ifdef SOP_PRELOAD
#define driver_dlsym sop__preload_dlsym
#else
#define driver_dlsym dlsym
#endif

static bool
driver_resolve(void *dl)
{
	void *sym;

#define SOP_X(name)                                                                                \
	sym = driver_dlsym(dl, SOP_STR(name));                                                     \
	if (!sym)                                                                                  \
		return false;                                                                      \
	memcpy(&sop__drv.name, &sym, sizeof sym);
	SOP_DRIVER_ENTRIES(SOP_X)
#undef SOP_X
	return true;
}

static void
driver_load(void)
{
	const char *name = getenv("SOP_DRIVER_LIBRARY");
	void *dl;
	CUresult r;

	if (!name || !*name)
		name = "libcuda.so.1";
	dl = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!dl)
		return; /* no driver: CUDA_ERROR_NOT_INITIALIZED */
	if (!driver_resolve(dl)) {
		/* A driver too old for the virtual memory API. */
		memset(&sop__drv, 0, sizeof sop__drv);
		dlclose(dl);
		driver_status = CUDA_ERROR_NOT_SUPPORTED;
		return;
	}
	r = SOP_DRV(cuInit)(0);
	if (r != CUDA_SUCCESS) {
		driver_status = r;
		return;
	}
	driver_dl = dl;
	driver_status = CUDA_SUCCESS;
}

CUresult
sop__driver_init(void)
{
	pthread_once(&driver_once, driver_load);
	return driver_status;
}

void *
sop__driver_handle(void)
{
	return sop__driver_init() == CUDA_SUCCESS ? driver_dl : NULL;
}

/* ---- Primary contexts ---------------------------------------------------------------------- */

static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext *primary;
static int n_primary;

CUresult
sop__driver_primary(CUdevice device, CUcontext *out)
{
	unsigned int flags;
	CUcontext ctx = NULL;
	CUresult r = CUDA_SUCCESS;
	int active = 0, n = 0;

	pthread_mutex_lock(&primary_lock);
	if (!primary) {
		r = SOP_DRV(cuDeviceGetCount)(&n);
		if (r == CUDA_SUCCESS && n > 0 && (primary = calloc((size_t)n, sizeof *primary)))
			n_primary = n;
		else if (r == CUDA_SUCCESS)
			r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (r == CUDA_SUCCESS && (device < 0 || device >= n_primary))
		r = CUDA_ERROR_INVALID_DEVICE;
	/* Retaining an inactive primary context would create one: a stream of a device whose
	 * primary context is inactive cannot be in it. */
	if (r == CUDA_SUCCESS && !primary[device]) {
		r = SOP_DRV(cuDevicePrimaryCtxGetState)(device, &flags, &active);
		if (r == CUDA_SUCCESS && active) {
			r = SOP_DRV(cuDevicePrimaryCtxRetain)(&ctx, device);
			if (r == CUDA_SUCCESS)
				primary[device] = ctx;
		}
	}
	if (r == CUDA_SUCCESS)
		*out = primary[device];
	pthread_mutex_unlock(&primary_lock);
	return r;
}

CUcontext
sop__driver_primary_held(CUdevice device)
{
	CUcontext ctx = NULL;

	pthread_mutex_lock(&primary_lock);
	if (device >= 0 && device < n_primary)
		ctx = primary[device];
	pthread_mutex_unlock(&primary_lock);
	return ctx;
}

/* ---- A relaxed capture mode, paid when due ---------------------------------------------------- */

__thread int sop__relax_state __attribute__((tls_model("initial-exec")));
__thread int sop__relax_saved __attribute__((tls_model("initial-exec")));

void
sop__relax_pay(void)
{
	CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;

	/* Paid before the exchange, which goes through here no more. */
	sop__relax_state = SOP_RELAX_PAID;
	sop__count(SOP_N_cuThreadExchangeStreamCaptureMode);
	if (sop__drv.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS)
		sop__relax_saved = (int)mode;
	else
		sop__relax_saved = -1; /* nothing exchanged, nothing to restore */
}

/* ---- Call counts ---------------------------------------------------------------------------- */

__thread struct sop__counts *sop__tcounts __attribute__((tls_model("initial-exec")));

static pthread_mutex_t counts_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sop__counts *counts_live;     /* every thread's block */
static unsigned long long counts_gone[SOP_N_ENTRIES]; /* what exited threads counted */
static pthread_key_t counts_key;
static pthread_once_t counts_once = PTHREAD_ONCE_INIT;

/* A thread exits: its counts go to counts_gone and its block away. */
static void
counts_retire(void *p)
{
	struct sop__counts *c = p;
	size_t i;

	pthread_mutex_lock(&counts_lock);
	for (i = 0; i < SOP_N_ENTRIES; i++)
		counts_gone[i] += atomic_load_explicit(&c->n[i], memory_order_relaxed);
	if (c->prev)
		c->prev->next = c->next;
	else
		counts_live = c->next;
	if (c->next)
		c->next->prev = c->prev;
	pthread_mutex_unlock(&counts_lock);
	sop__tcounts = NULL;
	free(c);
}

static void
counts_key_make(void)
{
	pthread_key_create(&counts_key, counts_retire);
}

struct sop__counts *
sop__counts_slow(void)
{
	struct sop__counts *c;

	pthread_once(&counts_once, counts_key_make);
	c = calloc(1, sizeof *c);
	if (!c)
		return NULL; /* without host memory the call goes uncounted */
	pthread_mutex_lock(&counts_lock);
	c->next = counts_live;
	if (counts_live)
		counts_live->prev = c;
	counts_live = c;
	pthread_mutex_unlock(&counts_lock);
	pthread_setspecific(counts_key, c);
	sop__tcounts = c;
	return c;
}

SOP_API CUresult
sop_driver_calls(const char **names, unsigned long long *counts, size_t *n)
{
	struct sop__counts *c;
	size_t i;

	if (!n || (*n && (!names || !counts)))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&counts_lock);
	for (i = 0; i < *n && i < SOP_N_ENTRIES; i++) {
		names[i] = entry_names[i];
		counts[i] = counts_gone[i];
		for (c = counts_live; c; c = c->next)
			counts[i] += atomic_load_explicit(&c->n[i], memory_order_relaxed);
	}
	pthread_mutex_unlock(&counts_lock);
	*n = SOP_N_ENTRIES;
	return CUDA_SUCCESS;
}

/* ---- A pool's context ------------------------------------------------------------------------ */

/* The pool's context made current around driver calls that need one (the virtual memory calls,
 * from any thread). A thread that has it current already, as a program's threads mostly do,
 * asks which is current and pushes nothing: a push and pop cost about 1 us on the H100 (the pop
 * 0.9-1.1 us) against 0.05 for the question, on every growth, release and destroy. Each
 * nesting level of a thread's pushes remembers whether it pushed, in one bit (levels past 64
 * always push). */
static __thread uint64_t ctx_pushed __attribute__((tls_model("initial-exec")));
static __thread unsigned int ctx_depth __attribute__((tls_model("initial-exec")));

CUresult
sop__pool_ctx_push(struct sop_pool *pool)
{
	CUcontext cur = NULL;
	unsigned int d = ctx_depth;
	CUresult r;

	if (d < 64 && SOP_DRV(cuCtxGetCurrent)(&cur) == CUDA_SUCCESS && cur == pool->ctx) {
		ctx_pushed &= ~((uint64_t)1 << d);
		ctx_depth = d + 1;
		return CUDA_SUCCESS;
	}
	r = SOP_DRV(cuCtxPushCurrent)(pool->ctx);
	if (r == CUDA_SUCCESS) {
		if (d < 64)
			ctx_pushed |= (uint64_t)1 << d;
		ctx_depth = d + 1;
	}
	return r;
}

void
sop__pool_ctx_pop(struct sop_pool *pool)
{
	unsigned int d = --ctx_depth;
	CUcontext popped;

	(void)pool;
	if (d >= 64 || (ctx_pushed >> d & 1))
		SOP_DRV(cuCtxPopCurrent)(&popped);
}
