/*
 * Name tables of the simulated driver: error names and texts for
 * cuGetErrorName / cuGetErrorString, and the entry point table behind
 * cuGetProcAddress.
 */
#include <string.h>

#include "sim-internal.h"

struct error_text {
	CUresult code;
	const char *name;
	const char *text;	/* NULL: the sim has no text of its own, see below */
};

#define ERR(code, text) { code, #code, text }

/* Every code of cuda.h's CUresult, so that only unknown codes are refused. */
static const struct error_text errors[] = {
	ERR(CUDA_SUCCESS, "no error"),
	ERR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
	ERR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
	ERR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
	ERR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
	ERR(CUDA_ERROR_PROFILER_DISABLED, NULL),
	ERR(CUDA_ERROR_PROFILER_NOT_INITIALIZED, NULL),
	ERR(CUDA_ERROR_PROFILER_ALREADY_STARTED, NULL),
	ERR(CUDA_ERROR_PROFILER_ALREADY_STOPPED, NULL),
	ERR(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
	ERR(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, NULL),
	ERR(CUDA_ERROR_DEVICE_UNAVAILABLE, NULL),
	ERR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
	ERR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
	ERR(CUDA_ERROR_DEVICE_NOT_LICENSED, NULL),
	ERR(CUDA_ERROR_INVALID_IMAGE, NULL),
	ERR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
	ERR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current"),
	ERR(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
	ERR(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed"),
	ERR(CUDA_ERROR_ARRAY_IS_MAPPED, NULL),
	ERR(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"),
	ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, NULL),
	ERR(CUDA_ERROR_ALREADY_ACQUIRED, NULL),
	ERR(CUDA_ERROR_NOT_MAPPED, "resource not mapped"),
	ERR(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, NULL),
	ERR(CUDA_ERROR_NOT_MAPPED_AS_POINTER, NULL),
	ERR(CUDA_ERROR_ECC_UNCORRECTABLE, NULL),
	ERR(CUDA_ERROR_UNSUPPORTED_LIMIT, NULL),
	ERR(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, NULL),
	ERR(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, NULL),
	ERR(CUDA_ERROR_INVALID_PTX, NULL),
	ERR(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, NULL),
	ERR(CUDA_ERROR_NVLINK_UNCORRECTABLE, NULL),
	ERR(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, NULL),
	ERR(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, NULL),
	ERR(CUDA_ERROR_JIT_COMPILATION_DISABLED, NULL),
	ERR(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, NULL),
	ERR(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, NULL),
	ERR(CUDA_ERROR_CONTAINED, NULL),
	ERR(CUDA_ERROR_INVALID_SOURCE, NULL),
	ERR(CUDA_ERROR_FILE_NOT_FOUND, NULL),
	ERR(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, NULL),
	ERR(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, NULL),
	ERR(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"),
	ERR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
	ERR(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
	ERR(CUDA_ERROR_LOSSY_QUERY, NULL),
	ERR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
	ERR(CUDA_ERROR_NOT_READY, "device not ready"),
	ERR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
	ERR(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, NULL),
	ERR(CUDA_ERROR_LAUNCH_TIMEOUT, NULL),
	ERR(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, NULL),
	ERR(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled"),
	ERR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled"),
	ERR(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
	    "cannot set while device is active in this process"),
	ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
	ERR(CUDA_ERROR_ASSERT, NULL),
	ERR(CUDA_ERROR_TOO_MANY_PEERS, NULL),
	ERR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, NULL),
	ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, NULL),
	ERR(CUDA_ERROR_HARDWARE_STACK_ERROR, NULL),
	ERR(CUDA_ERROR_ILLEGAL_INSTRUCTION, NULL),
	ERR(CUDA_ERROR_MISALIGNED_ADDRESS, NULL),
	ERR(CUDA_ERROR_INVALID_ADDRESS_SPACE, NULL),
	ERR(CUDA_ERROR_INVALID_PC, NULL),
	ERR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
	ERR(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, NULL),
	ERR(CUDA_ERROR_TENSOR_MEMORY_LEAK, NULL),
	ERR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
	ERR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
	ERR(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized"),
	ERR(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, NULL),
	ERR(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, NULL),
	ERR(CUDA_ERROR_MPS_CONNECTION_FAILED, NULL),
	ERR(CUDA_ERROR_MPS_RPC_FAILURE, NULL),
	ERR(CUDA_ERROR_MPS_SERVER_NOT_READY, NULL),
	ERR(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, NULL),
	ERR(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, NULL),
	ERR(CUDA_ERROR_MPS_CLIENT_TERMINATED, NULL),
	ERR(CUDA_ERROR_CDP_NOT_SUPPORTED, NULL),
	ERR(CUDA_ERROR_CDP_VERSION_MISMATCH, NULL),
	ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, NULL),
	ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, NULL),
	ERR(CUDA_ERROR_STREAM_CAPTURE_MERGE, NULL),
	ERR(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, NULL),
	ERR(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, NULL),
	ERR(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, NULL),
	ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, NULL),
	ERR(CUDA_ERROR_CAPTURED_EVENT, NULL),
	ERR(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, NULL),
	ERR(CUDA_ERROR_TIMEOUT, "wait operation timed out"),
	ERR(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, NULL),
	ERR(CUDA_ERROR_EXTERNAL_DEVICE, NULL),
	ERR(CUDA_ERROR_INVALID_CLUSTER_SIZE, NULL),
	ERR(CUDA_ERROR_FUNCTION_NOT_LOADED, NULL),
	ERR(CUDA_ERROR_INVALID_RESOURCE_TYPE, NULL),
	ERR(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, NULL),
	ERR(CUDA_ERROR_KEY_ROTATION, NULL),
	ERR(CUDA_ERROR_UNKNOWN, "unknown error"),
};

#undef ERR

static const struct error_text *find_error(CUresult code)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == code)
			return &errors[i];
	return NULL;
}

bool sim_error_by_name(const char *name, CUresult *code)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++) {
		if (strcmp(errors[i].name, name) == 0) {
			*code = errors[i].code;
			return true;
		}
	}
	return false;
}

SIM_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char **str)
{
	const struct error_text *e;

	SIM_ENTER_ANYTIME(cuGetErrorName);
	if (!str)
		return CUDA_ERROR_INVALID_VALUE;
	e = find_error(error);
	/* Like the driver: an unknown code is an invalid argument and gives NULL. */
	*str = e ? e->name : NULL;
	return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char **str)
{
	const struct error_text *e;

	SIM_ENTER_ANYTIME(cuGetErrorString);
	if (!str)
		return CUDA_ERROR_INVALID_VALUE;
	e = find_error(error);
	if (!e) {
		*str = NULL;
		return CUDA_ERROR_INVALID_VALUE;
	}
	/* Codes the sim never returns itself get a generic text. */
	*str = e->text ? e->text : "error (no description in the simulated driver)";
	return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---- */

typedef void (*sim_fn)(void);

struct proc {
	const char *name;	/* base name, as cuGetProcAddress is asked */
	const char *exported;	/* the exported symbol, e.g. cuStreamDestroy_v2 */
	sim_fn fn;
};

/*
 * #name stays the base name; the bare `name` expands through cuda.h's macros
 * to the versioned function defined here (cuStreamDestroy -> _v2).
 */
#define SIM_PROC(name) { #name, SIM_STR(name), (sim_fn)name },

static const struct proc procs[] = {
	SIM_ENTRY_POINTS(SIM_PROC)
};

#undef SIM_PROC

_Static_assert(sizeof(void *) == sizeof(sim_fn), "function pointers must fit in void *");

SIM_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
					     cuuint64_t flags,
					     CUdriverProcAddressQueryResult *status)
{
	SIM_ENTER_ANYTIME(cuGetProcAddress);
	(void)cudaVersion;
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
				  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
		return CUDA_ERROR_INVALID_VALUE;
#ifdef SIM_LIBCUDA
	{
		CUresult rc;

		if (sim_libcuda_lookup(symbol, pfn, cudaVersion, flags, status, &rc))
			return rc;
	}
#endif
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
		if (strcmp(procs[i].name, symbol) == 0 || strcmp(procs[i].exported, symbol) == 0) {
			/* ISO C has no function-to-object pointer cast; copy the bits. */
			memcpy(pfn, &procs[i].fn, sizeof(*pfn));
			if (status)
				*status = CU_GET_PROC_ADDRESS_SUCCESS;
			return CUDA_SUCCESS;
		}
	}
	*pfn = NULL;
	if (status)
		*status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return CUDA_ERROR_NOT_FOUND;
}
