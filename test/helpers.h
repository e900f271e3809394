/* helpers.h - what every test program shares: assertions that are always on, the exit codes
 * (0 pass, 1 fail, 77 skip), the driver entry points tests call themselves, the simulated
 * driver's control API when it is the driver loaded, and a gate that keeps a stream busy.
 *
 * A test runs against whatever driver sop loads: the simulated one when SOP_DRIVER_LIBRARY names
 * it (the unit suite), the real one otherwise (the gpu suite). Without a driver it skips.
 */
#ifndef SOP_TEST_HELPERS_H
#define SOP_TEST_HELPERS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"
#include "sim/sim.h"
#include "sop.h"

#define TH_SKIP 77

/* A failed check: says which phase the test was in (th_phase), then exits 1. */
_Noreturn void th_fail(void);
/* Name what the test does now (printf-style), for a failure's message and the watchdog's. */
void th_phase(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define TH_ASSERT(cond)                                                                            \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__,      \
				#cond);                                                            \
			th_fail();                                                                 \
		}                                                                                  \
	} while (0)

#define TH_EQ(got, want)                                                                           \
	do {                                                                                       \
		long long g_ = (long long)(got), w_ = (long long)(want);                           \
		if (g_ != w_) {                                                                    \
			fprintf(stderr, "%s:%d: %s is %lld, expected %lld\n", __FILE__, __LINE__, \
				#got, g_, w_);                                                     \
			th_fail();                                                                 \
		}                                                                                  \
	} while (0)

#define TH_OK(call) TH_EQ((call), CUDA_SUCCESS)

/* The object behind a handle, for tests that look inside a pool (NULL once it is torn down). */
#define TH_POOL(handle) sop__pool_lookup(handle)

/* The pool's invariants hold (nothing to check once it is torn down). */
#define TH_CHECK(pool)                                                                             \
	do {                                                                                       \
		int l_ = sop__pool_check(TH_POOL(pool));                                           \
		if (l_) {                                                                          \
			fprintf(stderr, "%s:%d: pool check failed at check.c:%d\n", __FILE__,     \
				__LINE__, l_);                                                     \
			th_fail();                                                                 \
		}                                                                                  \
	} while (0)

/* Driver entry points the tests use beyond sop's own table (NULL where the driver lacks one). */
struct th_driver {
	__typeof__(cuStreamCreate) *cuStreamCreate;
	__typeof__(cuStreamDestroy) *cuStreamDestroy;
	__typeof__(cuStreamQuery) *cuStreamQuery;
	__typeof__(cuLaunchHostFunc) *cuLaunchHostFunc;
	__typeof__(cuMemsetD32Async) *cuMemsetD32Async;
	__typeof__(cuMemcpyDtoHAsync) *cuMemcpyDtoHAsync;
	__typeof__(cuMemcpyHtoDAsync) *cuMemcpyHtoDAsync;
	__typeof__(cuMemcpyDtoDAsync) *cuMemcpyDtoDAsync;
	__typeof__(cuMemcpyAsync) *cuMemcpyAsync;
	__typeof__(cuCtxCreate) *cuCtxCreate;
	__typeof__(cuCtxDestroy) *cuCtxDestroy;
	__typeof__(cuCtxPushCurrent) *cuCtxPushCurrent;
	__typeof__(cuCtxPopCurrent) *cuCtxPopCurrent;
	__typeof__(cuCtxSetCurrent) *cuCtxSetCurrent;
	__typeof__(cuEventCreate) *cuEventCreate;
	__typeof__(cuEventDestroy) *cuEventDestroy;
	__typeof__(cuEventQuery) *cuEventQuery;
	__typeof__(cuMemGetInfo) *cuMemGetInfo;
	__typeof__(cuModuleLoadData) *cuModuleLoadData;
	__typeof__(cuModuleGetFunction) *cuModuleGetFunction;
	__typeof__(cuLaunchKernel) *cuLaunchKernel;
	__typeof__(cuStreamWaitEvent) *cuStreamWaitEvent;
	__typeof__(cuEventRecord) *cuEventRecord;
	__typeof__(cuMemRetainAllocationHandle) *cuMemRetainAllocationHandle;
	__typeof__(cuMemGetAllocationPropertiesFromHandle) *cuMemGetAllocationPropertiesFromHandle;
	__typeof__(cuMemGetAccess) *cuMemGetAccess;
	/* The simulated driver's control API; all NULL on a real driver. */
	__typeof__(sim_fail) *sim_fail;
	__typeof__(sim_fail_clear) *sim_fail_clear;
	__typeof__(sim_calls) *sim_calls;
	__typeof__(sim_live_get) *sim_live_get;
	__typeof__(sim_handles_recycle) *sim_handles_recycle;
	__typeof__(sim_fail_rate) *sim_fail_rate;
	__typeof__(sim_fail_seed) *sim_fail_seed;
	__typeof__(sim_fails) *sim_fails;
	__typeof__(sim_host_vmm) *sim_host_vmm;
	__typeof__(sim_stream_dead_ok) *sim_stream_dead_ok;
	__typeof__(sim_event_dead_ok) *sim_event_dead_ok;
	__typeof__(sim_hook) *sim_hook;
};

extern struct th_driver th;
extern int th_n_devices;

/* Seconds on the monotonic clock. */
double th_seconds(void);

/* Initialise sop and the table, make device 0's primary context current. Exits 77 when no
 * driver or no device is there. Returns true when the driver is the simulated one.
 *
 * With SOP_TEST_WATCHDOG=N (the gpu suite sets it), a test still running after N seconds says
 * which phase it is in and where its main thread is, and exits 124: a test that waits forever
 * otherwise holds the suite until the runner's timeout and says nothing. */
bool th_init(void);
/* Exit 77 unless the simulated driver is loaded (tests of fault injection and leaks). */
void th_require_sim(void);
/* Exit 77 unless a real GPU is there. */
void th_require_gpu(void);

/* The test kernels (test/kernels.cu), on a GPU. th_kernels_load loads them into the current
 * context; th_spin_fill spins about `cycles` clocks, then writes v to words 32-bit words at p;
 * th_check adds 1 to *bad for a block whose words are not all v. Both on stream s. */
void th_kernels_load(void);
void th_spin_fill(void *p, size_t words, uint32_t v, long long cycles, CUstream s);
void th_check(void *p, size_t words, uint32_t v, unsigned *bad, CUstream s);

CUstream th_stream(void); /* a new non-blocking stream */
void th_stream_destroy(CUstream s);

/* A gate: th_gate_block(g, s) enqueues a host function on s that waits until th_gate_open(g);
 * everything enqueued on s after it waits too. A gate is opened once. A test that exits with a
 * gate still closed (a failed check) has it opened on the way out: the driver's teardown at exit
 * may wait for the host function, which would turn the failure into a hang
 * (SOP_TEST_GATES_AT_EXIT=0 leaves it closed: test/scaffold.c). A timed gate also opens by
 * itself after its time: on a GPU, streams share the device's few hardware queues, so work on
 * another stream may wait behind the gate, and a test that waits for that work before opening the
 * gate would wait forever (it then proves less, not wrong: the other stream's work ran later). */
struct th_gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool open, reached;
	long timeout_ms; /* 0: none */
};
void th_gate_init(struct th_gate *g);
void th_gate_init_timed(struct th_gate *g, long timeout_ms);
void th_gate_block(struct th_gate *g, CUstream s);
void th_gate_open(struct th_gate *g);
bool th_gate_is_open(struct th_gate *g);
/* Wait (on the host) until the stream has reached the gate. */
void th_gate_wait_reached(struct th_gate *g);

/* Statistics of a pool. */
uint64_t th_attr(sop_pool_t pool, CUmemPool_attribute attr);
/* An attribute of type int (or an enum), by id: also those of CUDA 13.2 the headers lack. */
int th_attr_int(sop_pool_t pool, int attr);
/* The physical pieces of a pool, all of them (n_ptr 0) or those under any of n_ptr allocations
 * (ptr[k], size[k] bytes), as the pool lock sees them at once: how many, how many have no kept
 * descriptor (IPC pools), and how many the broker's second thread has marked or is exporting. */
struct th_pieces {
	size_t n, bare, busy;
};
struct th_pieces th_pool_pieces(sop_pool_t pool, void *const *ptr, const size_t *size, int n_ptr);
/* A fresh pool on device with optional cap; release threshold as given. */
sop_pool_t th_pool(int device, size_t max_size);

/* Fill n 32-bit words at p with v on stream s; read them back and check (synchronizes s). */
void th_fill(void *p, size_t bytes, uint32_t v, CUstream s);
bool th_verify(void *p, size_t bytes, uint32_t v, CUstream s);

/* Messages between the processes of a test, on a Unix socket: n bytes and, where fd >= 0, a
 * descriptor with them (SCM_RIGHTS); the receiver gets the descriptor (close-on-exec) or -1.
 * Both assert that the whole message went. */
void th_send_fd(int sock, int fd, const void *buf, size_t n);
int th_recv_fd(int sock, void *buf, size_t n);

/* Live objects in the simulated driver, for leak checks; zeros on a real driver. Less what
 * sop keeps for the next pool (reservations and their anchors: vmm.c), which no pool holds;
 * th_live_all counts those too. */
struct sim_live th_live(void);
struct sim_live th_live_all(void);

#endif /* SOP_TEST_HELPERS_H */
