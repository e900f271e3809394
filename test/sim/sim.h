/*
 * Control API of the simulated CUDA driver (libsopsim.so).
 *
 * Tests resolve these functions with dlsym() from the same library that sop
 * loads as its driver, so they talk to the very instance sop is using. They
 * inject failures into chosen driver calls, count calls, and read the number
 * of live driver objects to check that nothing leaked.
 */
#ifndef SOP_SIM_H
#define SOP_SIM_H

#include <stddef.h>
#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Fail the nth (1-based, counted from now) future call of entry point `entry`
 * (base name as written in source, e.g. "cuMemCreate", "cuStreamDestroy")
 * with `code`. nth = 0 removes every rule for `entry`. Several rules may be
 * active, also for the same entry point; each counts calls on its own. A call
 * failed this way does nothing else. An unknown entry name aborts the process
 * (a rule that can never fire is a bug in the test).
 */
void sim_fail(const char *entry, unsigned long nth, CUresult code);

/* Remove every fault rule, those of sim_fail_rate() too. */
void sim_fail_clear(void);

/*
 * Fail each future call of `entry` with probability `rate` (0 to 1), with
 * `code`, until changed (rate 0 stops it) or sim_fail_clear(); a failed call
 * does nothing else. For soaks: the draws come from one sequence, which
 * sim_fail_seed() starts, so that a run on one thread can be repeated. A
 * rule of sim_fail() that fires on the same call wins. An unknown entry name
 * or a rate outside [0, 1] aborts the process.
 */
void sim_fail_rate(const char *entry, double rate, CUresult code);
void sim_fail_seed(unsigned long long seed);

/*
 * Call fn(arg) at the start of every future call of `entry` (after it is
 * counted, before anything else, fault rules included), on the calling thread,
 * until changed (fn NULL removes it). For tests that drive an interleaving:
 * what other threads do while a thread is inside a driver call. fn may call
 * the driver; it is called again for a call of `entry` it makes, unless it
 * removed itself first. An unknown entry name aborts the process.
 */
typedef void (*sim_hook_fn)(void *arg);
void sim_hook(const char *entry, sim_hook_fn fn, void *arg);

/* Number of calls of `entry` failed by a rule of either kind since start. */
unsigned long sim_fails(const char *entry);

/*
 * Number of calls of `entry` since start or the last sim_counts_reset().
 * Every call counts, failed ones too. Unknown names give 0.
 */
unsigned long sim_calls(const char *entry);

/* Set every call counter to zero. */
void sim_counts_reset(void);

/* Live driver objects, for leak checks. */
struct sim_live {
	long reservations;	/* cuMemAddressReserve not yet freed */
	long handles;		/* create/import/retain not yet released */
	long mappings;		/* cuMemMap not yet unmapped */
	long streams;		/* cuStreamCreate* not yet destroyed */
	long events;		/* cuEventCreate not yet destroyed */
	long primary_ctx_refs;	/* sum of primary context reference counts */
	size_t phys_bytes;	/* physical memory still allocated, all devices */
	long contexts;		/* cuCtxCreate not yet destroyed (last, as it came last) */
};

void sim_live_get(struct sim_live *out);

/*
 * Handle values of streams, events and created contexts: with on (the
 * default, and SOP_SIM_HANDLES=recycle), a create gets the value destroyed
 * most recently, at once, as the real driver does even while the destroyed
 * stream's work still runs; with on = 0 (SOP_SIM_HANDLES=fresh), a value
 * never handed out before. Affects the creates that follow.
 */
void sim_handles_recycle(int on);

/*
 * Host memory through the virtual memory calls (cuMemCreate with CU_MEM_LOCATION_TYPE_HOST or
 * HOST_NUMA): with on (the default, and SOP_SIM_HOST_VMM=1) the sim makes it as a CUDA 13 driver
 * does; with on = 0 (SOP_SIM_HOST_VMM=0) it answers as a driver that cannot:
 * cuMemCreate and cuMemGetAllocationGranularity give CUDA_ERROR_NOT_SUPPORTED for those
 * locations, and the device attributes HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
 * HOST_NUMA_MEMORY_POOLS_SUPPORTED, HOST_MEMORY_POOLS_SUPPORTED and
 * HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED read 0. Affects the calls that follow.
 */
void sim_host_vmm(int on);

/*
 * A call that names a destroyed stream's handle which no stream has taken since faults, as on
 * the driver (SOP_SIM_DEAD_HANDLES). After sim_stream_dead_ok(h), calls of this thread that
 * name h get CUDA_ERROR_INVALID_HANDLE instead, until the next sim_stream_dead_ok (NULL: none):
 * for a test that hands a library such a handle on purpose, where a call on any other dead
 * handle, which the library would have asked about on its own, still faults.
 */
void sim_stream_dead_ok(CUstream h);
/* The same for a destroyed event's handle. */
void sim_event_dead_ok(CUevent h);

#ifdef __cplusplus
}
#endif

#endif /* SOP_SIM_H */
