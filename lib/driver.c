/* driver.c - the only file that calls into the CUDA driver library.
 *
 * The driver is loaded at run time with dlopen, so that a program linked with sop starts on a
 * machine with no driver and gets CUDA_ERROR_NOT_INITIALIZED from its sop calls instead of a
 * loader error. SOP_DRIVER_LIBRARY names another library to load instead of libcuda.so.1; the
 * tests point it at the simulated driver (test/sim/). Entry points are resolved by the exported
 * names cuda.h's macros give (cuMemGetInfo -> cuMemGetInfo_v2), so the table is the same whether
 * it is filled from the real driver or the simulated one.
 *
 * Every other file calls the driver through sop__drv.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct sop__driver sop__drv;
atomic_ullong sop__calls[SOP_N_ENTRIES];

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

static bool
driver_resolve(void *dl)
{
	void *sym;

#define SOP_X(name)                                                                                \
	sym = dlsym(dl, SOP_STR(name));                                                            \
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

SOP_API CUresult
sop_driver_calls(const char **names, unsigned long long *counts, size_t *n)
{
	size_t i;

	if (!n || (*n && (!names || !counts)))
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < *n && i < SOP_N_ENTRIES; i++) {
		names[i] = entry_names[i];
		counts[i] = atomic_load_explicit(&sop__calls[i], memory_order_relaxed);
	}
	*n = SOP_N_ENTRIES;
	return CUDA_SUCCESS;
}
