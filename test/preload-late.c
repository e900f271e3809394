/* preload-late.c - a program that does not link libcuda and loads it late, with dlopen, after it
 * started (as Python frameworks do), under the interposer: what it finds with dlsym on that
 * handle, and with the driver's cuGetProcAddress, is the interposer's, and its allocations are
 * sop's. Run under LD_PRELOAD on the simulated driver's libcuda.so.1, and through sop-run on a
 * GPU; exit 77 without a driver.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "sop.h"

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define OK(call) CHECK((call) == CUDA_SUCCESS)

static void *
sym(void *dl, const char *name)
{
	void *p = dlsym(dl, name);

	if (!p) {
		fprintf(stderr, "no %s\n", name);
		exit(1);
	}
	return p;
}

/* The function at p as a function of this type. */
#define AS(type, p) ((type)fn_from(p))
static void (*fn_from(void *p))(void)
{
	void (*f)(void);

	memcpy(&f, &p, sizeof f);
	return f;
}

/* Whether p lies in the library that exports sop's calls: the interposer. */
static bool
in_preload(void *p)
{
	Dl_info a, b;
	void *probe = dlsym(RTLD_DEFAULT, "sop_driver_calls");

	return probe && p && dladdr(p, &a) && dladdr(probe, &b) && a.dli_fbase == b.dli_fbase;
}

int
main(void)
{
	__typeof__(sop_pointer_get_pool) *get_pool;
	CUdriverProcAddressQueryResult status;
	CUcontext ctx;
	CUstream s;
	CUdeviceptr p;
	sop_pool_t pool;
	void *dl, *fn;
	int n = 0;

	*(void **)&get_pool = dlsym(RTLD_DEFAULT, "sop_pointer_get_pool");
	if (!get_pool) {
		fprintf(stderr, "libsop-preload.so is not loaded: run it under sop-run\n");
		return 1;
	}
	dl = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!dl) {
		printf("skip: no libcuda.so.1\n");
		return 77;
	}
	if (AS(__typeof__(&cuInit), sym(dl, "cuInit"))(0) != CUDA_SUCCESS ||
	    AS(__typeof__(&cuDeviceGetCount), sym(dl, "cuDeviceGetCount"))(&n) != CUDA_SUCCESS ||
	    n < 1) {
		printf("skip: no usable CUDA driver\n");
		return 77;
	}
	OK(AS(__typeof__(&cuDevicePrimaryCtxRetain), sym(dl, "cuDevicePrimaryCtxRetain"))(&ctx, 0));
	OK(AS(__typeof__(&cuCtxSetCurrent), sym(dl, "cuCtxSetCurrent"))(ctx));
	OK(AS(__typeof__(&cuStreamCreate), sym(dl, "cuStreamCreate"))(&s, CU_STREAM_NON_BLOCKING));
	CHECK(in_preload(sym(dl, "cuMemAllocAsync")));
	CHECK(in_preload(sym(dl, "cuStreamBeginCapture_v2")));
	CHECK(!in_preload(sym(dl, "cuStreamCreate")));
	OK(AS(__typeof__(&cuMemAllocAsync), sym(dl, "cuMemAllocAsync"))(&p, 4096, s));
	OK(get_pool(&pool, (void *)(uintptr_t)p));
	OK(AS(__typeof__(&cuGetProcAddress), sym(dl, "cuGetProcAddress_v2"))("cuMemFreeAsync", &fn,
									       12000, 0, &status));
	CHECK(in_preload(fn));
	OK(AS(__typeof__(&cuMemFreeAsync), fn)(p, s));
	OK(AS(__typeof__(&cuStreamSynchronize), sym(dl, "cuStreamSynchronize"))(s));
	printf("libcuda loaded late: ok\n");
	return 0;
}
