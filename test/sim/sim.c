/*
 * Core of the simulated CUDA driver: cuInit and the configuration read from
 * the environment, the gate every entry point passes (call counters, fault
 * rules, "not initialised", "no CUDA calls from host functions"), the control
 * API of sim.h, devices, primary and created contexts and the per-thread
 * context stack.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim-internal.h"

struct sim_config sim_cfg;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result;
static atomic_bool initialized;

/* Primary contexts never move: their CUcontext is a pointer into this array. */
static struct sim_ctx primaries[SIM_MAX_DEVICES];
/* Context ids are never reused, not even across primary context resets. */
static atomic_ullong next_ctx_id = 1;
/* Serials of created contexts start past those of the primary contexts. */
static atomic_ullong next_serial = SIM_MAX_DEVICES + 1;

/*
 * Created contexts not yet freed, destroyed ones included, so that a stale
 * handle can be told "destroyed" while its context is still current on some
 * thread. Taken alone.
 */
static pthread_mutex_t created_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sim_ctx *created;

static void ctx_stack_drop(struct sim_ctx *ctx);

void sim_die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

/* ---- per-thread state ---- */

static pthread_key_t thread_key;

/* Every thread's state, for sim_calls(), and the calls of threads gone. */
static pthread_mutex_t threads_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sim_thread *threads;
static unsigned long exited_calls[SIM_E_COUNT];

static void thread_exit(void *arg)
{
	struct sim_thread *t = arg;

	sim_stream_thread_exit(t);
	while (t->ctx_depth)
		ctx_stack_drop(t->ctx_stack[--t->ctx_depth]);
	pthread_mutex_lock(&threads_lock);
	for (int i = 0; i < SIM_E_COUNT; i++)
		exited_calls[i] += atomic_load_explicit(&t->calls[i], memory_order_relaxed);
	if (t->prev)
		t->prev->next = t->next;
	else
		threads = t->next;
	if (t->next)
		t->next->prev = t->prev;
	pthread_mutex_unlock(&threads_lock);
	free(t);
}

/* At load time, so that the gate on every call needs no pthread_once. */
__attribute__((constructor)) static void create_thread_key(void)
{
	if (pthread_key_create(&thread_key, thread_exit) != 0)
		sim_die("sim: pthread_key_create failed");
}

/*
 * A reader of a handle table slot holds it for a few loads and a reference
 * count increment, so waiting for it is a short spin; the lock keeps
 * thread states from going away meanwhile.
 */
void sim_thread_hazard_wait(const void *p)
{
	pthread_mutex_lock(&threads_lock);
	for (struct sim_thread *t = threads; t; t = t->next)
		for (int spins = 0; atomic_load(&t->hazard) == p; spins++)
			if (spins >= 64)
				sched_yield();
	pthread_mutex_unlock(&threads_lock);
}

struct sim_thread *sim_thread(bool create)
{
	struct sim_thread *t = pthread_getspecific(thread_key);

	if (!t && create) {
		t = calloc(1, sizeof(*t));
		if (!t || pthread_setspecific(thread_key, t) != 0)
			sim_die("sim: out of memory for thread state");
		pthread_mutex_lock(&threads_lock);
		t->next = threads;
		if (threads)
			threads->prev = t;
		threads = t;
		pthread_mutex_unlock(&threads_lock);
	}
	return t;
}

/* ---- call counters and fault rules ---- */

static const char *const entry_names[SIM_E_COUNT] = {
#define SIM_ENTRY_NAME(name) #name,
	SIM_ENTRY_POINTS(SIM_ENTRY_NAME)
#undef SIM_ENTRY_NAME
};

struct fault_rule {
	struct fault_rule *next;
	enum sim_entry entry;
	unsigned long left;	/* calls until it fires; it fires when this hits 0 */
	CUresult code;
};

static pthread_mutex_t rules_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fault_rule *rules;
/* Number of rules, read without the lock so that calls skip it when zero. */
static atomic_long nrules;

const char *sim_entry_name(enum sim_entry e)
{
	return (unsigned)e < SIM_E_COUNT ? entry_names[e] : NULL;
}

static int entry_by_name(const char *name)
{
	for (int i = 0; name && i < SIM_E_COUNT; i++)
		if (strcmp(entry_names[i], name) == 0)
			return i;
	return -1;
}

/* Counts one call of e against every rule for e; returns the code of a rule that fired. */
static CUresult apply_rules(enum sim_entry e)
{
	CUresult rc = CUDA_SUCCESS;
	struct fault_rule **link = &rules;

	pthread_mutex_lock(&rules_lock);
	while (*link) {
		struct fault_rule *r = *link;

		if (r->entry == e && --r->left == 0) {
			if (rc == CUDA_SUCCESS)
				rc = r->code;
			*link = r->next;
			free(r);
			atomic_fetch_sub(&nrules, 1);
			continue;
		}
		link = &r->next;
	}
	pthread_mutex_unlock(&rules_lock);
	return rc;
}

/*
 * Faults at a rate (sim_fail_rate): per entry point, the chance that a call
 * fails, in 2^-32 units, and its code; read without a lock on every call.
 * Calls draw from one sequence, so that a single thread's run is the same
 * every time for the same seed.
 */
static atomic_uint fail_rate[SIM_E_COUNT];
static atomic_int fail_rate_code[SIM_E_COUNT];
static atomic_ullong fail_draws;
/* Calls failed by a rule of either kind, per entry point (sim_fails). */
static atomic_ulong fails[SIM_E_COUNT];
/* A function called at the start of an entry point's calls (sim_hook); its argument. */
static _Atomic(sim_hook_fn) hooks[SIM_E_COUNT];
static void *_Atomic hook_args[SIM_E_COUNT];

static bool rate_fires(enum sim_entry e)
{
	unsigned rate = atomic_load_explicit(&fail_rate[e], memory_order_relaxed);
	uint64_t x;

	if (!rate)
		return false;
	/* splitmix64 of a shared counter: uniform, and cheap to share between threads. */
	x = atomic_fetch_add_explicit(&fail_draws, 0x9E3779B97F4A7C15ull, memory_order_relaxed);
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	x ^= x >> 31;
	return (uint32_t)x < rate;
}

/* Microseconds each physical-memory call takes (SOP_SIM_VMM_US; 0: none). */
static unsigned long vmm_us;

/* A real driver's cuMemCreate, cuMemMap and cuMemSetAccess take 20-70 us each (the H100's
 * 32 MiB growth: 60-70 us in all); the sim's take a few. Where what other threads do while a
 * growth is in the driver matters, SOP_SIM_VMM_US gives each that long, spent asleep, as a
 * driver waiting in the kernel is. */
static void vmm_wait(enum sim_entry e)
{
	struct timespec ts;

	if (!vmm_us || (e != SIM_E_cuMemCreate && e != SIM_E_cuMemMap && e != SIM_E_cuMemSetAccess))
		return;
	ts.tv_sec = (time_t)(vmm_us / 1000000);
	ts.tv_nsec = (long)(vmm_us % 1000000) * 1000;
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

CUresult sim_enter(enum sim_entry e, bool need_init)
{
	struct sim_thread *t = sim_thread(true);
	CUresult rc = CUDA_SUCCESS;

	atomic_fetch_add_explicit(&t->calls[e], 1, memory_order_relaxed);
	/* The driver documents that host functions must not call CUDA. */
	if (t->in_host_fn)
		return CUDA_ERROR_NOT_PERMITTED;
	if (need_init && !atomic_load_explicit(&initialized, memory_order_acquire))
		return CUDA_ERROR_NOT_INITIALIZED;
	{
		sim_hook_fn fn = atomic_load_explicit(&hooks[e], memory_order_acquire);
		if (fn)
			fn(atomic_load_explicit(&hook_args[e], memory_order_relaxed));
	}
	vmm_wait(e);
	if (atomic_load_explicit(&nrules, memory_order_relaxed))
		rc = apply_rules(e);
	if (rc == CUDA_SUCCESS && rate_fires(e))
		rc = (CUresult)atomic_load_explicit(&fail_rate_code[e], memory_order_relaxed);
	if (rc != CUDA_SUCCESS)
		atomic_fetch_add_explicit(&fails[e], 1, memory_order_relaxed);
	return rc;
}

static void add_rule(int entry, unsigned long nth, CUresult code)
{
	struct fault_rule *r, **tail;

	r = malloc(sizeof(*r));
	if (!r)
		sim_die("sim: out of memory for a fault rule");
	r->next = NULL;
	r->entry = (enum sim_entry)entry;
	r->left = nth;
	r->code = code;
	/* Appended, so that when two rules fire together the older one wins. */
	pthread_mutex_lock(&rules_lock);
	for (tail = &rules; *tail; tail = &(*tail)->next)
		;
	*tail = r;
	atomic_fetch_add(&nrules, 1);
	pthread_mutex_unlock(&rules_lock);
}

static void remove_rules(int entry)
{
	struct fault_rule **link = &rules;

	pthread_mutex_lock(&rules_lock);
	while (*link) {
		struct fault_rule *r = *link;

		if (entry < 0 || r->entry == (enum sim_entry)entry) {
			*link = r->next;
			free(r);
			atomic_fetch_sub(&nrules, 1);
			continue;
		}
		link = &r->next;
	}
	pthread_mutex_unlock(&rules_lock);
}

SIM_EXPORT void sim_fail(const char *entry, unsigned long nth, CUresult code)
{
	int e = entry_by_name(entry);

	if (e < 0)
		sim_die("sim: sim_fail: no entry point named '%s'", entry ? entry : "(null)");
	if (nth == 0)
		remove_rules(e);
	else
		add_rule(e, nth, code);
}

SIM_EXPORT void sim_fail_clear(void)
{
	remove_rules(-1);
	for (int e = 0; e < SIM_E_COUNT; e++)
		atomic_store(&fail_rate[e], 0);
}

SIM_EXPORT void sim_fail_rate(const char *entry, double rate, CUresult code)
{
	int e = entry_by_name(entry);

	if (e < 0)
		sim_die("sim: sim_fail_rate: no entry point named '%s'", entry ? entry : "(null)");
	if (!(rate >= 0.0 && rate <= 1.0))
		sim_die("sim: sim_fail_rate: rate %g for %s is not in [0, 1]", rate, entry);
	/* The code first: a call that sees the new rate must not fail with the old code. */
	atomic_store(&fail_rate_code[e], (int)code);
	atomic_store(&fail_rate[e], rate >= 1.0 ? UINT32_MAX : (unsigned)(rate * 4294967296.0));
}

SIM_EXPORT void sim_hook(const char *entry, sim_hook_fn fn, void *arg)
{
	int e = entry_by_name(entry);

	if (e < 0)
		sim_die("sim: sim_hook: no entry point named '%s'", entry ? entry : "(null)");
	atomic_store(&hook_args[e], arg);
	atomic_store_explicit(&hooks[e], fn, memory_order_release);
}

SIM_EXPORT void sim_fail_seed(unsigned long long seed)
{
	atomic_store(&fail_draws, seed * 0x9E3779B97F4A7C15ull);
}

SIM_EXPORT unsigned long sim_fails(const char *entry)
{
	int e = entry_by_name(entry);

	return e < 0 ? 0 : atomic_load(&fails[e]);
}

SIM_EXPORT unsigned long sim_calls(const char *entry)
{
	int e = entry_by_name(entry);
	unsigned long n;

	if (e < 0)
		return 0;
	pthread_mutex_lock(&threads_lock);
	n = exited_calls[e];
	for (struct sim_thread *t = threads; t; t = t->next)
		n += atomic_load_explicit(&t->calls[e], memory_order_relaxed);
	pthread_mutex_unlock(&threads_lock);
	return n;
}

SIM_EXPORT void sim_counts_reset(void)
{
	pthread_mutex_lock(&threads_lock);
	for (int i = 0; i < SIM_E_COUNT; i++) {
		exited_calls[i] = 0;
		for (struct sim_thread *t = threads; t; t = t->next)
			atomic_store_explicit(&t->calls[i], 0, memory_order_relaxed);
	}
	pthread_mutex_unlock(&threads_lock);
}

SIM_EXPORT void sim_live_get(struct sim_live *out)
{
	if (!out)
		return;
	memset(out, 0, sizeof(*out));
	for (int i = 0; i < SIM_MAX_DEVICES; i++)
		out->primary_ctx_refs += atomic_load(&primaries[i].refs);
	sim_vmm_live(out);
	sim_stream_live(out);
	out->contexts = sim_handle_count(SIM_HANDLE_CONTEXT);
}

/* ---- configuration ---- */

/* A byte count or number, optionally with a binary suffix K, M or G. */
static unsigned long long env_number(const char *name, unsigned long long def)
{
	const char *s = getenv(name);
	unsigned long long v;
	char *end;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s || *s == '-')
		sim_die("sim: %s=%s is not a number", name, s);
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	default: break;
	}
	if (*end)
		sim_die("sim: %s=%s is not a number", name, s);
	return v;
}

/* SOP_SIM_FAIL="cuMemCreate:3:2,cuMemMap:1:CUDA_ERROR_OUT_OF_MEMORY" */
static void parse_fail_env(void)
{
	const char *env = getenv("SOP_SIM_FAIL");
	char *copy, *item, *save = NULL;

	if (!env || !*env)
		return;
	copy = strdup(env);
	if (!copy)
		sim_die("sim: out of memory");
	for (item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		char *nth_s = strchr(item, ':');
		char *code_s = nth_s ? strchr(nth_s + 1, ':') : NULL;
		unsigned long nth;
		CUresult code;
		char *end;
		int e;

		if (!code_s)
			sim_die("sim: SOP_SIM_FAIL item '%s' is not entry:nth:code", item);
		*nth_s++ = '\0';
		*code_s++ = '\0';
		e = entry_by_name(item);
		if (e < 0)
			sim_die("sim: SOP_SIM_FAIL: no entry point named '%s'", item);
		errno = 0;
		nth = strtoul(nth_s, &end, 0);
		if (errno || end == nth_s || *end || nth == 0)
			sim_die("sim: SOP_SIM_FAIL: bad call number '%s' for %s", nth_s, item);
		if (!sim_error_by_name(code_s, &code)) {
			unsigned long v = strtoul(code_s, &end, 0);

			if (end == code_s || *end)
				sim_die("sim: SOP_SIM_FAIL: bad error code '%s' for %s",
					code_s, item);
			code = (CUresult)v;
		}
		add_rule(e, nth, code);
	}
	free(copy);
}

/* SOP_SIM_HANDLES=recycle|fresh; unset leaves the mode as it is (recycle unless changed). */
static void parse_handles_env(void)
{
	const char *s = getenv("SOP_SIM_HANDLES");

	if (!s || !*s)
		return;
	if (strcmp(s, "recycle") == 0)
		sim_handle_set_recycle(true);
	else if (strcmp(s, "fresh") == 0)
		sim_handle_set_recycle(false);
	else
		sim_die("sim: SOP_SIM_HANDLES=%s is neither recycle nor fresh", s);
}

/* SOP_SIM_DEAD_HANDLES=fault|error: what a call gets that names a destroyed stream's or event's
 * handle, which no stream or event has taken since. The driver faults there (580:
 * cuStreamGetId, cuStreamGetCtx and cuStreamQuery; cuEventQuery, cuEventSynchronize,
 * cuEventRecord and cuStreamWaitEvent), so that is the default: a library that asks about a
 * handle on its own, after the program may have destroyed what it named, crashes programs. The
 * selftest's checks of the codes such calls got ask for the error. */
static void parse_dead_handles_env(void)
{
	const char *s = getenv("SOP_SIM_DEAD_HANDLES");

	if (!s || !*s || strcmp(s, "fault") == 0)
		sim_cfg.dead_handles_fault = true;
	else if (strcmp(s, "error") == 0)
		sim_cfg.dead_handles_fault = false;
	else
		sim_die("sim: SOP_SIM_DEAD_HANDLES=%s is neither fault nor error", s);
}

static void read_config(void)
{
	unsigned long long ndev = env_number("SOP_SIM_DEVICES", 2);
	unsigned long long mem = env_number("SOP_SIM_MEMORY", 1ull << 30);
	unsigned long long gran = env_number("SOP_SIM_GRANULARITY", 2ull << 20);
	unsigned long long host_vmm;

	if (ndev > SIM_MAX_DEVICES)
		sim_die("sim: SOP_SIM_DEVICES=%llu, at most %d", ndev, SIM_MAX_DEVICES);
	/* Mappings are mmap()s, so the granularity must be whole pages. */
	if (gran < 4096 || (gran & (gran - 1)))
		sim_die("sim: SOP_SIM_GRANULARITY=%llu is not a power of two >= 4096", gran);
	sim_cfg.ndevices = (int)ndev;
	sim_cfg.memory = (size_t)mem;
	sim_cfg.granularity = (size_t)gran;
	vmm_us = (unsigned long)env_number("SOP_SIM_VMM_US", 0);
	parse_handles_env();
	parse_dead_handles_env();
	/* Unset leaves what sim_host_vmm set (on, unless changed). */
	host_vmm = env_number("SOP_SIM_HOST_VMM", 2);
	if (host_vmm == 0 || host_vmm == 1)
		sim_host_vmm((int)host_vmm);
	else if (host_vmm != 2)
		sim_die("sim: SOP_SIM_HOST_VMM=%llu is neither 0 nor 1", host_vmm);
}

static void init_contexts(void)
{
	for (int i = 0; i < SIM_MAX_DEVICES; i++) {
		primaries[i].handle = SIM_VALUE(&primaries[i]);
		primaries[i].device = i;
		primaries[i].primary = true;
		primaries[i].serial = (uint64_t)i + 1;
		pthread_mutex_init(&primaries[i].lock, NULL);
	}
}

static void do_init(void)
{
	read_config();
	if (sim_cfg.ndevices == 0) {
		init_result = CUDA_ERROR_NO_DEVICE;
		return;
	}
	init_contexts();
	parse_fail_env();
	init_result = CUDA_SUCCESS;
	atomic_store_explicit(&initialized, true, memory_order_release);
}

SIM_EXPORT CUresult CUDAAPI cuInit(unsigned int flags)
{
	SIM_ENTER_ANYTIME(cuInit);
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_once(&init_once, do_init);
	return init_result;
}

SIM_EXPORT CUresult CUDAAPI cuDriverGetVersion(int *version)
{
	SIM_ENTER_ANYTIME(cuDriverGetVersion);
	if (!version)
		return CUDA_ERROR_INVALID_VALUE;
	*version = CUDA_VERSION;
	return CUDA_SUCCESS;
}

/* ---- devices ---- */

bool sim_device_valid(int dev)
{
	return dev >= 0 && dev < sim_cfg.ndevices;
}

SIM_EXPORT CUresult CUDAAPI cuDeviceGetCount(int *count)
{
	SIM_ENTER(cuDeviceGetCount);
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = sim_cfg.ndevices;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
	SIM_ENTER(cuDeviceGet);
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_device_valid(ordinal))
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
	SIM_ENTER(cuDeviceGetName);
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "sop simulated GPU %d", dev);
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	SIM_ENTER(cuDeviceGetUuid);
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	memcpy(uuid->bytes, "sop-sim-device-", 15);
	uuid->bytes[15] = (char)dev;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
	SIM_ENTER(cuDeviceTotalMem);
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = sim_cfg.memory;
	return CUDA_SUCCESS;
}

/* Values of an H100 SXM where it matters little, the sim's truth where it matters. */
static bool device_attribute(CUdevice_attribute attr, int dev, int *value)
{
	switch (attr) {
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
	case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
	case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
	case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP:
		*value = 1;
		return true;
	case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
		*value = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
		return true;
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
	case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_INTEGRATED:
	case CU_DEVICE_ATTRIBUTE_TCC_DRIVER:
	case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
	case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT:
	case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
	case CU_DEVICE_ATTRIBUTE_MPS_ENABLED:
		*value = 0;
		return true;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
		*value = 9;
		return true;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
		*value = 0;
		return true;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
		*value = 132;
		return true;
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
		*value = 1024;
		return true;
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
		*value = 2048;
		return true;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
		*value = 32;
		return true;
	case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
		*value = 3;
		return true;
	case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
		*value = 50 << 20;
		return true;
	case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
		*value = 5120;
		return true;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
		*value = 0x10 + dev;
		return true;
	case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
		*value = 0;
		return true;
	/* Host memory through the VMM calls and the driver's pools, as a driver of CUDA 13 on an
	 * H100 answers (sim_host_vmm). */
	case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
		*value = sim_host_vmm_supported();
		return true;
	case CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED:
		*value = 0;
		return true;
	case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
		*value = sim_host_numa_id(dev);
		return true;
	default:
		return false;
	}
}

SIM_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	SIM_ENTER(cuDeviceGetAttribute);
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	return device_attribute(attrib, dev, pi) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult CUDAAPI cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
	SIM_ENTER(cuDeviceCanAccessPeer);
	if (!can)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_device_valid(dev) || !sim_device_valid(peer))
		return CUDA_ERROR_INVALID_DEVICE;
	*can = dev != peer;
	return CUDA_SUCCESS;
}

/* ---- context lifetime ---- */

void sim_ctx_ref(struct sim_ctx *ctx)
{
	if (!ctx->primary)
		atomic_fetch_add(&ctx->life, 1);
}

static void ctx_free(struct sim_ctx *ctx)
{
	struct sim_ctx **link;

	pthread_mutex_lock(&created_lock);
	for (link = &created; *link != ctx; link = &(*link)->created_next)
		;
	*link = ctx->created_next;
	pthread_mutex_unlock(&created_lock);
	sim_stream_ctx_free(ctx);
	pthread_mutex_destroy(&ctx->lock);
	free(ctx);
}

void sim_ctx_put(struct sim_ctx *ctx)
{
	if (!ctx->primary && atomic_fetch_sub(&ctx->life, 1) == 1)
		ctx_free(ctx);
}

/* A primary context released to zero, or a destroyed one. */
static bool ctx_gone(struct sim_ctx *ctx)
{
	return ctx->primary ? atomic_load(&ctx->refs) == 0 : atomic_load(&ctx->destroyed);
}

static CUcontext ctx_handle(const struct sim_ctx *ctx)
{
	return (CUcontext)(uintptr_t)ctx->handle;
}

static void ctx_take(void *obj, void *arg)
{
	sim_ctx_ref(obj);
	*(struct sim_ctx **)arg = obj;
}

/* The driver documents that a destroyed context still current on some thread reads as such. */
static bool ctx_destroyed_but_current(uint64_t value)
{
	bool found = false;

	pthread_mutex_lock(&created_lock);
	for (struct sim_ctx *c = created; c && !found; c = c->created_next)
		found = c->handle == value && atomic_load(&c->destroyed) &&
			atomic_load(&c->current) > 0;
	pthread_mutex_unlock(&created_lock);
	return found;
}

/*
 * The context a handle names, with a reference for sim_ctx_put: a primary
 * context (released or not), or a created one that cuCtxDestroy has not yet
 * finished with.
 */
static CUresult ctx_get(CUcontext handle, struct sim_ctx **out)
{
	uint64_t v = SIM_VALUE(handle);
	uint64_t first = SIM_VALUE(&primaries[0]);

	if (v >= first && v < SIM_VALUE(&primaries[sim_cfg.ndevices]) &&
	    (v - first) % sizeof(primaries[0]) == 0) {
		*out = &primaries[(v - first) / sizeof(primaries[0])];
		return CUDA_SUCCESS;
	}
	if (sim_handle_visit(SIM_HANDLE_CONTEXT, v, ctx_take, out))
		return CUDA_SUCCESS;
	return ctx_destroyed_but_current(v) ? CUDA_ERROR_CONTEXT_IS_DESTROYED
					     : CUDA_ERROR_INVALID_CONTEXT;
}

/* ---- primary contexts ---- */

SIM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	struct sim_ctx *ctx;

	SIM_ENTER(cuDevicePrimaryCtxRetain);
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	ctx = &primaries[dev];
	/* The lock makes "first retain gets a fresh id" atomic with the count. */
	pthread_mutex_lock(&ctx->lock);
	if (atomic_fetch_add(&ctx->refs, 1) == 0)
		atomic_store(&ctx->id, atomic_fetch_add(&next_ctx_id, 1));
	pthread_mutex_unlock(&ctx->lock);
	*pctx = ctx_handle(ctx);
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
	struct sim_ctx *ctx;
	CUresult rc = CUDA_SUCCESS;

	SIM_ENTER(cuDevicePrimaryCtxRelease);
	if (!sim_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	ctx = &primaries[dev];
	pthread_mutex_lock(&ctx->lock);
	if (atomic_load(&ctx->refs) == 0)
		rc = CUDA_ERROR_INVALID_CONTEXT;
	else
		atomic_fetch_sub(&ctx->refs, 1);
	pthread_mutex_unlock(&ctx->lock);
	return rc;
}

/* Resetting an active primary context waits for its work, then destroys every stream and event
 * of it: their handles are dead, as after their destroys, and its legacy and per-thread streams
 * are new ones, with new ids, at their next use. Then the context is gone, as if
 * released to zero, whoever retained it: on an H200 a call in it answers
 * CUDA_ERROR_CONTEXT_IS_DESTROYED until the next retain, which gives the same handle (and here a
 * fresh id). Memory made with cuMemCreate and its mappings stay whole, as there. Classic
 * allocations, which the driver frees, are not modelled. An inactive context has nothing to
 * reset. */
SIM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
	struct sim_ctx *ctx;

	SIM_ENTER(cuDevicePrimaryCtxReset);
	if (!sim_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	ctx = &primaries[dev];
	if (atomic_load(&ctx->refs) > 0) {
		sim_stream_ctx_destroy(ctx, true);
		pthread_mutex_lock(&ctx->lock);
		atomic_store(&ctx->refs, 0);
		/* Its per-thread streams are new ones from now on (ctx_per_thread). */
		atomic_store(&ctx->serial, atomic_fetch_add(&next_serial, 1));
		pthread_mutex_unlock(&ctx->lock);
	}
	return CUDA_SUCCESS;
}

/* The simulated driver makes no green contexts: no handle names one. */
SIM_EXPORT CUresult CUDAAPI cuGreenCtxDestroy(CUgreenCtx hCtx)
{
	SIM_ENTER(cuGreenCtxDestroy);
	return hCtx ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags,
							int *active)
{
	SIM_ENTER(cuDevicePrimaryCtxGetState);
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	*flags = 0;
	*active = atomic_load(&primaries[dev].refs) > 0;
	return CUDA_SUCCESS;
}

/* ---- the calling thread's context stack ---- */

/* Puts ctx on the stack entry the caller sets; the caller's reference goes with it. */
static struct sim_ctx *ctx_stack_hold(struct sim_ctx *ctx)
{
	atomic_fetch_add(&ctx->current, 1);
	return ctx;
}

/* Gives back the reference of a stack entry the caller removed. */
static void ctx_stack_drop(struct sim_ctx *ctx)
{
	atomic_fetch_sub(&ctx->current, 1);
	sim_ctx_put(ctx);
}

static struct sim_ctx *ctx_top(void)
{
	struct sim_thread *t = sim_thread(false);

	return t && t->ctx_depth ? t->ctx_stack[t->ctx_depth - 1] : NULL;
}

CUresult sim_ctx_current(struct sim_ctx **out)
{
	struct sim_ctx *ctx = ctx_top();

	if (!ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	/* A primary context released to zero is gone, as on the real driver. */
	if (ctx_gone(ctx))
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	*out = ctx;
	return CUDA_SUCCESS;
}

/* A context to make current: primary contexts even when released, created ones while alive. */
static CUresult ctx_get_for_stack(CUcontext handle, struct sim_ctx **out)
{
	CUresult rc = ctx_get(handle, out);

	if (rc == CUDA_SUCCESS && !(*out)->primary && ctx_gone(*out)) {
		sim_ctx_put(*out);
		rc = CUDA_ERROR_CONTEXT_IS_DESTROYED;
	}
	return rc;
}

SIM_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
	struct sim_ctx *ctx;

	SIM_ENTER(cuCtxGetCurrent);
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	ctx = ctx_top();
	*pctx = ctx ? ctx_handle(ctx) : NULL;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext handle)
{
	struct sim_thread *t;
	struct sim_ctx *ctx;
	CUresult rc;

	SIM_ENTER(cuCtxSetCurrent);
	if (!handle) {
		/* Documented: NULL pops the top, or does nothing on an empty stack. */
		t = sim_thread(false);
		if (t && t->ctx_depth)
			ctx_stack_drop(t->ctx_stack[--t->ctx_depth]);
		return CUDA_SUCCESS;
	}
	rc = ctx_get_for_stack(handle, &ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	t = sim_thread(true);
	if (t->ctx_depth == 0)
		t->ctx_depth = 1;
	else
		ctx_stack_drop(t->ctx_stack[t->ctx_depth - 1]);
	t->ctx_stack[t->ctx_depth - 1] = ctx_stack_hold(ctx);
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuCtxPushCurrent(CUcontext handle)
{
	struct sim_thread *t;
	struct sim_ctx *ctx;
	CUresult rc;

	SIM_ENTER(cuCtxPushCurrent);
	if (!handle)
		return CUDA_ERROR_INVALID_CONTEXT;
	rc = ctx_get_for_stack(handle, &ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	t = sim_thread(true);
	if (t->ctx_depth == SIM_CTX_STACK_MAX) {
		sim_ctx_put(ctx);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	t->ctx_stack[t->ctx_depth++] = ctx_stack_hold(ctx);
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx)
{
	struct sim_thread *t;
	struct sim_ctx *ctx;

	SIM_ENTER(cuCtxPopCurrent);
	t = sim_thread(false);
	if (!t || t->ctx_depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	ctx = t->ctx_stack[--t->ctx_depth];
	if (pctx)
		*pctx = ctx_handle(ctx);
	ctx_stack_drop(ctx);
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
	struct sim_ctx *ctx;
	CUresult rc;

	SIM_ENTER(cuCtxGetDevice);
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	rc = sim_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	*device = ctx->device;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuCtxGetId(CUcontext handle, unsigned long long *id)
{
	struct sim_ctx *ctx;
	CUresult rc;

	SIM_ENTER(cuCtxGetId);
	if (!id)
		return CUDA_ERROR_INVALID_VALUE;
	if (!handle) {
		rc = sim_ctx_current(&ctx);
		if (rc == CUDA_SUCCESS)
			*id = atomic_load(&ctx->id);
		return rc;
	}
	rc = ctx_get(handle, &ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (ctx_gone(ctx))
		rc = CUDA_ERROR_CONTEXT_IS_DESTROYED;
	else
		*id = atomic_load(&ctx->id);
	sim_ctx_put(ctx);
	return rc;
}

/* ---- created contexts ---- */

static bool sched_flags_valid(unsigned flags)
{
	const unsigned other = CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX;

	/* At most one scheduling flag; the other two are long-standing no-ops. */
	switch (flags & ~other) {
	case CU_CTX_SCHED_AUTO:
	case CU_CTX_SCHED_SPIN:
	case CU_CTX_SCHED_YIELD:
	case CU_CTX_SCHED_BLOCKING_SYNC:
		return true;
	default:
		return false;
	}
}

SIM_EXPORT CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, CUctxCreateParams *params,
					unsigned int flags, CUdevice dev)
{
	struct sim_thread *t;
	struct sim_ctx *ctx;

	SIM_ENTER(cuCtxCreate);
	if (!pctx || !sched_flags_valid(flags))
		return CUDA_ERROR_INVALID_VALUE;
	/* Execution affinity and CUDA-in-graphics contexts are not simulated. */
	if (params)
		return params->execAffinityParams || params->cigParams ? CUDA_ERROR_NOT_SUPPORTED
								       : CUDA_ERROR_INVALID_VALUE;
	if (!sim_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	t = sim_thread(true);
	if (t->ctx_depth == SIM_CTX_STACK_MAX)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx->device = dev;
	ctx->serial = atomic_fetch_add(&next_serial, 1);
	atomic_init(&ctx->id, atomic_fetch_add(&next_ctx_id, 1));
	/* One reference until cuCtxDestroy, one for the stack entry below. */
	atomic_init(&ctx->life, 2);
	atomic_init(&ctx->current, 1);
	pthread_mutex_init(&ctx->lock, NULL);
	if (!sim_handle_bind(SIM_HANDLE_CONTEXT, ctx, &ctx->handle)) {
		pthread_mutex_destroy(&ctx->lock);
		free(ctx);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	/* Listed with its handle set: ctx_destroyed_but_current reads it under the lock. */
	pthread_mutex_lock(&created_lock);
	ctx->created_next = created;
	created = ctx;
	pthread_mutex_unlock(&created_lock);
	/* The driver makes a new context current, above whatever was. */
	t->ctx_stack[t->ctx_depth++] = ctx;
	*pctx = ctx_handle(ctx);
	return CUDA_SUCCESS;
}

/*
 * The driver says that cuCtxDestroy may return errors of earlier
 * asynchronous work, so it synchronizes: the sim waits for every stream of
 * the context, destroyed ones still draining included, before it destroys.
 */
SIM_EXPORT CUresult CUDAAPI cuCtxDestroy(CUcontext handle)
{
	struct sim_thread *t;
	struct sim_ctx *ctx;
	bool claimed;
	CUresult rc;

	SIM_ENTER(cuCtxDestroy);
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	rc = ctx_get(handle, &ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	/* Primary contexts are released, not destroyed. */
	if (ctx->primary)
		return CUDA_ERROR_INVALID_CONTEXT;
	/* Under the lock, so that no stream or event joins it from here on. */
	pthread_mutex_lock(&ctx->lock);
	claimed = !atomic_exchange(&ctx->destroyed, true);
	pthread_mutex_unlock(&ctx->lock);
	if (!claimed) {
		sim_ctx_put(ctx);
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	}
	sim_stream_ctx_destroy(ctx, false);
	t = sim_thread(false);
	if (t && t->ctx_depth && t->ctx_stack[t->ctx_depth - 1] == ctx)
		ctx_stack_drop(t->ctx_stack[--t->ctx_depth]);
	/* Free for the next cuCtxCreate only now that the context is gone. */
	sim_handle_unbind(SIM_HANDLE_CONTEXT, ctx->handle, ctx);
	sim_ctx_put(ctx);	/* the one held until cuCtxDestroy */
	sim_ctx_put(ctx);	/* ctx_get's */
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
	struct sim_ctx *ctx;
	CUresult rc;

	SIM_ENTER(cuCtxGetStreamPriorityRange);
	rc = sim_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	/* As on an H100: 0 is the lowest priority, -5 the highest. */
	if (least)
		*least = 0;
	if (greatest)
		*greatest = -5;
	return CUDA_SUCCESS;
}

SIM_EXPORT CUresult CUDAAPI cuMemGetInfo(size_t *free_bytes, size_t *total)
{
	struct sim_ctx *ctx;
	size_t used;
	CUresult rc;

	SIM_ENTER(cuMemGetInfo);
	if (!free_bytes || !total)
		return CUDA_ERROR_INVALID_VALUE;
	rc = sim_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	used = sim_vmm_device_used(ctx->device);
	*total = sim_cfg.memory;
	*free_bytes = used < sim_cfg.memory ? sim_cfg.memory - used : 0;
	return CUDA_SUCCESS;
}

/* ---- no kernels in the simulator ---- */

SIM_EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
	SIM_ENTER(cuModuleLoadData);
	(void)module;
	(void)image;
	return CUDA_ERROR_NOT_SUPPORTED;
}

SIM_EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	SIM_ENTER(cuModuleGetFunction);
	(void)hfunc;
	(void)hmod;
	(void)name;
	return CUDA_ERROR_NOT_SUPPORTED;
}

SIM_EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
	SIM_ENTER(cuModuleUnload);
	(void)hmod;
	return CUDA_ERROR_NOT_SUPPORTED;
}

SIM_EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX,
					   unsigned int gridDimY, unsigned int gridDimZ,
					   unsigned int blockDimX, unsigned int blockDimY,
					   unsigned int blockDimZ, unsigned int sharedMemBytes,
					   CUstream hStream, void **kernelParams, void **extra)
{
	SIM_ENTER(cuLaunchKernel);
	(void)f;
	(void)gridDimX;
	(void)gridDimY;
	(void)gridDimZ;
	(void)blockDimX;
	(void)blockDimY;
	(void)blockDimZ;
	(void)sharedMemBytes;
	(void)hStream;
	(void)kernelParams;
	(void)extra;
	return CUDA_ERROR_NOT_SUPPORTED;
}
