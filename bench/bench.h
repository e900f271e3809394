/* bench.h - what the files of sop-bench share.
 *
 * sop-bench runs each workload against sop and against the driver's own stream-ordered pool in
 * one process, interleaved repetition by repetition, and reports the median, min and max of each
 * side and their ratio. driver_side.c loads the driver and puts every allocator behind one small
 * interface (struct side); workloads.c and replay.c are the workloads; bench.c parses the command
 * line, keeps the results and writes the reports. bench/README.md says what each workload does.
 */
#ifndef SOP_BENCH_H
#define SOP_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <sop.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

#define BENCH_MAX_REPS 64
#define BENCH_MAX_LIST 16
#define BENCH_MAX_TRACES 32
#define BENCH_COUNT_MAX 64 /* driver entry points sop_driver_calls may report */

/* ---- driver_side.c: the driver, the machine, the allocators under test -------------------- */

/* The driver entry points the harness calls itself (sop loads its own). Names go through
 * cuda.h's macros, as in lib/driver.c, so each is loaded by its versioned exported name. */
#define BENCH_DRIVER_ENTRIES(X)                                                                    \
	X(cuInit)                                                                                  \
	X(cuDriverGetVersion)                                                                      \
	X(cuGetErrorName)                                                                          \
	X(cuDeviceGet)                                                                             \
	X(cuDeviceGetName)                                                                         \
	X(cuDeviceGetAttribute)                                                                    \
	X(cuDeviceTotalMem)                                                                        \
	X(cuMemGetInfo)                                                                            \
	X(cuDevicePrimaryCtxRetain)                                                                \
	X(cuCtxSetCurrent)                                                                         \
	X(cuCtxSynchronize)                                                                        \
	X(cuStreamCreate)                                                                          \
	X(cuStreamDestroy)                                                                         \
	X(cuStreamSynchronize)                                                                     \
	X(cuStreamWaitEvent)                                                                       \
	X(cuEventCreate)                                                                           \
	X(cuEventDestroy)                                                                          \
	X(cuEventRecord)                                                                           \
	X(cuEventSynchronize)                                                                      \
	X(cuModuleLoadData)                                                                        \
	X(cuModuleGetFunction)                                                                     \
	X(cuModuleUnload)                                                                          \
	X(cuLaunchKernel)                                                                          \
	X(cuDeviceGetDefaultMemPool)                                                               \
	X(cuMemPoolCreate)                                                                         \
	X(cuMemPoolDestroy)                                                                        \
	X(cuMemPoolSetAttribute)                                                                   \
	X(cuMemPoolGetAttribute)                                                                   \
	X(cuMemPoolTrimTo)                                                                         \
	X(cuMemAllocFromPoolAsync)                                                                 \
	X(cuMemAllocAsync)                                                                         \
	X(cuMemFreeAsync)                                                                          \
	X(cuMemGetAllocationGranularity)                                                           \
	X(cuMemAddressReserve)                                                                     \
	X(cuMemAddressFree)                                                                        \
	X(cuMemCreate)                                                                             \
	X(cuMemRelease)                                                                            \
	X(cuMemMap)                                                                                \
	X(cuMemUnmap)                                                                              \
	X(cuMemSetAccess)                                                                          \
	X(cuMemHostAlloc)                                                                          \
	X(cuMemFreeHost)                                                                           \
	X(cuMemcpyAsync)                                                                           \
	X(cuEventQuery)                                                                            \
	X(cuMemPoolSetAccess)                                                                      \
	X(cuMemPoolExportToShareableHandle)                                                        \
	X(cuMemPoolImportFromShareableHandle)                                                      \
	X(cuMemPoolExportPointer)                                                                  \
	X(cuMemPoolImportPointer)

struct bench_driver {
#define BENCH_X(name) __typeof__(name) *name;
	BENCH_DRIVER_ENTRIES(BENCH_X)
#undef BENCH_X
};
extern struct bench_driver drv;

/* What the machine offers, found once at start. */
struct bench_env {
	bool simulated; /* the simulated driver: sop only, and no timing means anything */
	bool pools;     /* the driver's stream-ordered pools are there */
	bool kernels;   /* kernels can be launched */
	bool counting;  /* sop_driver_calls answers: sop's driver calls are counted */
	CUdevice dev;
	CUcontext ctx;
	char device[128];
	int driver_version;
	size_t total_mem;
	size_t free_mem; /* at start */
	CUfunction k_spin, k_fill;
	CUmemoryPool default_pool;
};
extern struct bench_env env;

/* The allocators under test, and the no-allocation floor of some workloads. */
enum side_kind {
	SIDE_SOP,     /* sop_malloc_from_pool_async on a sop pool */
	SIDE_POOL,    /* cuMemAllocFromPoolAsync on a pool from cuMemPoolCreate */
	SIDE_DEFAULT, /* cuMemAllocAsync on the device's default pool */
	SIDE_IDEAL,   /* the same work with no allocator (streams, handoff, growth) */
	/* Pinned host memory (the host workload): */
	SIDE_HOSTALLOC, /* cuMemHostAlloc and cuMemFreeHost per use */
	SIDE_EVCACHE,   /* cuMemHostAlloc blocks cached by hand, one event per use */
	SIDE_PAGEABLE,  /* malloc'd memory, not pinned (copies only) */
	N_SIDES
};
#define SIDE_BIT(k) (1u << (k))
extern const char *const side_names[N_SIDES];

struct side {
	enum side_kind kind;
	sop_pool_t sop;
	CUmemoryPool pool; /* SIDE_POOL: its own; SIDE_DEFAULT: the device's default pool */
};

/* Set the driver up; returns 0, or the exit status to leave with (77: no driver, a skip). */
int env_init(void);
void env_fini(void);
/* Exit with a message when a driver or sop call fails. */
void check_fail(CUresult r, const char *expr, const char *file, int line);
#define CHECK(call)                                                                                \
	do {                                                                                       \
		CUresult r_ = (call);                                                              \
		if (r_ != CUDA_SUCCESS)                                                            \
			check_fail(r_, #call, __FILE__, __LINE__);                                 \
	} while (0)

/* Open the sides of `want` (SIDE_BIT mask) that the command line and the machine allow, in
 * side order, each on a fresh pool (SIDE_DEFAULT: the default pool) with that release
 * threshold and maxSize (0: none; not applied to the default pool); returns how many. */
int sides_open(struct side *out, unsigned want, uint64_t threshold, size_t max_size);
/* Synchronize the context and destroy (SIDE_DEFAULT: trim) each pool. */
void sides_close(struct side *sd, int n);
/* Whether the command line and the machine allow this side. */
bool side_allowed(enum side_kind kind);
bool side_open(struct side *sd, enum side_kind kind, uint64_t threshold, size_t max_size);
void side_close(struct side *sd);

static inline CUresult
side_alloc(const struct side *sd, void **p, size_t n, CUstream s)
{
	CUdeviceptr d = 0;
	CUresult r;

	switch (sd->kind) {
	case SIDE_SOP:
		return sop_malloc_from_pool_async(p, n, sd->sop, s);
	case SIDE_POOL:
		r = drv.cuMemAllocFromPoolAsync(&d, n, sd->pool, s);
		break;
	default:
		r = drv.cuMemAllocAsync(&d, n, s);
		break;
	}
	if (r == CUDA_SUCCESS)
		*p = (void *)(uintptr_t)d;
	return r;
}

static inline CUresult
side_free(const struct side *sd, void *p, CUstream s)
{
	if (sd->kind == SIDE_SOP)
		return sop_free_async(p, s);
	return drv.cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, s);
}

/* The synchronization calls of each side: sop's wrappers, which let sop see stream order, or
 * the driver's own. */
CUresult side_sync(const struct side *sd, CUstream s);
CUresult side_ctx_sync(const struct side *sd);
CUresult side_record(const struct side *sd, CUevent ev, CUstream s);
CUresult side_wait(const struct side *sd, CUstream s, CUevent ev);
CUresult side_event_sync(const struct side *sd, CUevent ev);
CUresult side_event_destroy(const struct side *sd, CUevent ev);
/* Destroy a stream: sop_stream_destroy, which tells sop the stream is gone, or cuStreamDestroy. */
CUresult side_stream_destroy(const struct side *sd, CUstream s);
/* Release what the pool holds beyond keep bytes (sop_trim_to, cuMemPoolTrimTo). */
void side_trim(const struct side *sd, size_t keep);
/* A pool attribute as a 64-bit value; set_attr writes one. */
uint64_t side_attr(const struct side *sd, CUmemPool_attribute attr);
void side_set_attr(const struct side *sd, CUmemPool_attribute attr, uint64_t v);

CUstream stream_new(void);
void stream_free(CUstream s);
/* Launch bench_spin(out, cycles) as one thread, or bench_fill(p, bytes / 4 words, v). */
void launch_spin(void *out, long long cycles, CUstream s);
void launch_fill(void *p, size_t bytes, unsigned v, CUstream s);

/* Counts of sop's driver calls, by entry point (all zero when not counting). */
struct calls {
	unsigned long long n[BENCH_COUNT_MAX];
};
void calls_read(struct calls *c);
unsigned calls_entries(void);
const char *calls_name(unsigned i);

/* ---- bench.c: options, timing, results ---------------------------------------------------- */

enum level { LEVEL_FULL, LEVEL_QUICK, LEVEL_SMOKE };

struct list {
	size_t v[BENCH_MAX_LIST];
	int n;
};

struct bench_opts {
	int reps;
	enum level level;
	unsigned sides; /* SIDE_BIT mask the command line allows */
	double scale;   /* multiplies iteration counts */
	double budget_s;
	const char *out;
	struct list sizes, batch, max_mib, threads, streams;
	const char *traces[BENCH_MAX_TRACES];
	int n_traces;
};
extern struct bench_opts opts;

double now_ns(void);
/* An iteration count for the level, times --scale, at least 1. */
long scaled(long full, long quick, long smoke);
/* The list given on the command line, else the default for the level. */
struct list list_pick(const struct list *given, const size_t *full, int n_full, const size_t *quick,
		      int n_quick, const size_t *smoke, int n_smoke);
/* False once the run has spent its time budget: workloads stop starting new cases. */
bool budget_left(const char *what);
/* "256 B", "4 KiB", "64 MiB" */
const char *fmt_size(char *buf, size_t len, size_t n);
/* What the running workload did, for its section of the report (printf-like). */
void describe(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A line for the notes of the report (and stderr). */
void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One measured quantity of one case of a workload, with a value per repetition and side. */
struct metric;
struct metric *metric_new(const char *workload, const char *group, const char *cas,
			  const char *name, const char *unit, double x, bool higher_better);
void metric_add(struct metric *m, enum side_kind side, double v);
/* Add sop's driver calls between two counter readings, over `ops` operations. */
void metric_calls(struct metric *m, const struct calls *before, const struct calls *after,
		  double ops);
/* Print the medians of a finished metric to stderr. */
void metric_done(const struct metric *m);

/* A timed run: note the counters (for sop) and the clock; span_end gives the nanoseconds and
 * adds sop's calls to m (NULL: none) over ops operations. */
struct span {
	enum side_kind kind;
	struct calls c0;
	double t0;
};
void span_begin(struct span *sp, enum side_kind kind);
double span_end(struct span *sp, struct metric *m, double ops);

/* A small fast random generator (splitmix64): the same seed gives both sides the same
 * sequence. */
struct rng {
	uint64_t s;
};

static inline uint64_t
rng_next(struct rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [0, n). */
static inline uint64_t
rng_below(struct rng *r, uint64_t n)
{
	return rng_next(r) % n;
}

/* ---- workloads.c, replay.c ------------------------------------------------------------------ */

/* Untimed pairs before the first workload, while the machine settles (workloads.c). */
void wl_settle(void);
void wl_pair(void);
void wl_batch(void);
void wl_random(void);
void wl_threads(void);
void wl_streams(void);
void wl_handoff(void);
void wl_fragmentation(void);
void wl_growth(void);
void wl_host(void);
void wl_ipc(void);
void wl_replay(void);
/* The importing process of the ipc workload (sop-bench --ipc-child FD): its exit status. */
int ipc_child(int sock);

#endif /* SOP_BENCH_H */
