/* count.c - libsopcount.so: a driver shim that counts the cu* calls sop makes.
 *
 * sop-bench points SOP_DRIVER_LIBRARY at this library and SOP_COUNT_TARGET at the driver it
 * would have loaded (libcuda.so.1, or the simulated driver). sop then loads its entry points
 * from here: each bumps its counter and calls the real one. The harness's own driver calls
 * (the driver's pools, kernels, streams) go straight to the driver and are not counted. A counted
 * call costs one relaxed atomic add more: a few ns against the 120 ns and up of any driver call.
 *
 * The wrappers are written with their cuda.h prototypes, so the compiler checks every one, and
 * the list must cover every entry point sop loads (SOP_DRIVER_ENTRIES in lib/internal.h): sop
 * refuses a driver library that lacks one, so the build fails below when the list falls behind.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "count.h"
#include "internal.h"

#define COUNT_STR2(x) #x
#define COUNT_STR(x) COUNT_STR2(x)

/* W(name, parameters, arguments) for every entry point sop loads. */
#define COUNT_ENTRIES(W)                                                                           \
	W(cuInit, (unsigned int flags), (flags))                                                   \
	W(cuDriverGetVersion, (int *version), (version))                                           \
	W(cuGetErrorString, (CUresult error, const char **str), (error, str))                      \
	W(cuDeviceGetCount, (int *count), (count))                                                 \
	W(cuDeviceGet, (CUdevice *device, int ordinal), (device, ordinal))                         \
	W(cuDeviceGetAttribute, (int *pi, CUdevice_attribute attrib, CUdevice dev),                \
	  (pi, attrib, dev))                                                                       \
	W(cuDeviceTotalMem, (size_t *bytes, CUdevice dev), (bytes, dev))                           \
	W(cuDeviceCanAccessPeer, (int *can, CUdevice dev, CUdevice peer), (can, dev, peer))        \
	W(cuDevicePrimaryCtxRetain, (CUcontext *ctx, CUdevice dev), (ctx, dev))                    \
	W(cuDevicePrimaryCtxRelease, (CUdevice dev), (dev))                                        \
	W(cuCtxGetCurrent, (CUcontext *ctx), (ctx))                                                \
	W(cuCtxPushCurrent, (CUcontext ctx), (ctx))                                                \
	W(cuCtxPopCurrent, (CUcontext *ctx), (ctx))                                                \
	W(cuCtxGetDevice, (CUdevice *device), (device))                                            \
	W(cuCtxSynchronize, (void), ())                                                            \
	W(cuStreamGetCtx, (CUstream stream, CUcontext *ctx), (stream, ctx))                        \
	W(cuStreamGetId, (CUstream stream, unsigned long long *id), (stream, id))                  \
	W(cuStreamSynchronize, (CUstream stream), (stream))                                        \
	W(cuStreamWaitEvent, (CUstream stream, CUevent event, unsigned int flags),                 \
	  (stream, event, flags))                                                                  \
	W(cuEventCreate, (CUevent *event, unsigned int flags), (event, flags))                     \
	W(cuEventDestroy, (CUevent event), (event))                                                \
	W(cuEventRecord, (CUevent event, CUstream stream), (event, stream))                        \
	W(cuEventQuery, (CUevent event), (event))                                                  \
	W(cuEventSynchronize, (CUevent event), (event))                                            \
	W(cuMemGetAllocationGranularity,                                                           \
	  (size_t *granularity, const CUmemAllocationProp *prop,                                   \
	   CUmemAllocationGranularity_flags option),                                               \
	  (granularity, prop, option))                                                             \
	W(cuMemAddressReserve,                                                                     \
	  (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,                      \
	   unsigned long long flags),                                                              \
	  (ptr, size, alignment, addr, flags))                                                     \
	W(cuMemAddressFree, (CUdeviceptr ptr, size_t size), (ptr, size))                           \
	W(cuMemCreate,                                                                             \
	  (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,     \
	   unsigned long long flags),                                                              \
	  (handle, size, prop, flags))                                                             \
	W(cuMemRelease, (CUmemGenericAllocationHandle handle), (handle))                           \
	W(cuMemMap,                                                                                \
	  (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,       \
	   unsigned long long flags),                                                              \
	  (ptr, size, offset, handle, flags))                                                      \
	W(cuMemUnmap, (CUdeviceptr ptr, size_t size), (ptr, size))                                 \
	W(cuMemSetAccess,                                                                          \
	  (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count),               \
	  (ptr, size, desc, count))

enum {
#define COUNT_ENUM(name, params, args) COUNT_##name,
	COUNT_ENTRIES(COUNT_ENUM)
#undef COUNT_ENUM
	COUNT_N
};

/* A name missing here fails the build with "COUNT_<name> undeclared": wrap it above. */
#define COUNT_COVERS(name) _Static_assert(COUNT_##name >= 0, "wrap " #name " in COUNT_ENTRIES");
SOP_DRIVER_ENTRIES(COUNT_COVERS)
#undef COUNT_COVERS

static const char *const count_names[COUNT_N] = {
#define COUNT_NAME(name, params, args) #name,
	COUNT_ENTRIES(COUNT_NAME)
#undef COUNT_NAME
};

static atomic_ulong count_calls[COUNT_N];

#define COUNT_REAL(name, params, args) static __typeof__(name) *real_##name;
COUNT_ENTRIES(COUNT_REAL)
#undef COUNT_REAL

/* Loaded when sop dlopens the shim, before sop resolves a single entry point. */
__attribute__((constructor)) static void
count_load(void)
{
	const char *target = getenv("SOP_COUNT_TARGET");
	void *dl, *sym;

	if (!target || !*target)
		target = "libcuda.so.1";
	dl = dlopen(target, RTLD_NOW | RTLD_LOCAL);
	if (!dl)
		return; /* every wrapper answers CUDA_ERROR_NOT_INITIALIZED */
#define COUNT_LOAD(name, params, args)                                                             \
	sym = dlsym(dl, COUNT_STR(name));                                                          \
	memcpy(&real_##name, &sym, sizeof sym);
	COUNT_ENTRIES(COUNT_LOAD)
#undef COUNT_LOAD
}

#define COUNT_WRAP(name, params, args)                                                             \
	CUresult CUDAAPI name params                                                               \
	{                                                                                          \
		atomic_fetch_add_explicit(&count_calls[COUNT_##name], 1, memory_order_relaxed);   \
		if (!real_##name)                                                                  \
			return CUDA_ERROR_NOT_INITIALIZED;                                         \
		return real_##name args;                                                           \
	}
COUNT_ENTRIES(COUNT_WRAP)
#undef COUNT_WRAP

unsigned
sop_count_entries(void)
{
	return COUNT_N;
}

const char *
sop_count_name(unsigned i)
{
	return i < COUNT_N ? count_names[i] : NULL;
}

unsigned long
sop_count_read(unsigned i)
{
	return i < COUNT_N ? atomic_load_explicit(&count_calls[i], memory_order_relaxed) : 0;
}
