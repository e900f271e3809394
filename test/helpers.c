/* helpers.c - shared test scaffolding; see helpers.h. */
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/socket.h>

#include "helpers.h"
#include "kernels.ptx.h"

struct th_driver th;
int th_n_devices;
static bool th_is_sim;

#define TH_STR2(x) #x
#define TH_STR(x) TH_STR2(x)

static void *
th_sym(void *dl, const char *name)
{
	return dlsym(dl, name);
}

#define TH_LOAD(dl, name)                                                                          \
	do {                                                                                       \
		void *s_ = th_sym(dl, TH_STR(name));                                               \
		memcpy(&th.name, &s_, sizeof s_);                                                  \
	} while (0)

double
th_seconds(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* ---- Failures, phases and the watchdog ----------------------------------------------------- */

static pthread_mutex_t phase_lock = PTHREAD_MUTEX_INITIALIZER;
static char phase[160];

void
th_phase(const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&phase_lock);
	va_start(ap, fmt);
	vsnprintf(phase, sizeof phase, fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&phase_lock);
}

void
th_fail(void)
{
	pthread_mutex_lock(&phase_lock);
	if (phase[0])
		fprintf(stderr, "  (during %s)\n", phase);
	pthread_mutex_unlock(&phase_lock);
	exit(1);
}

/* Gates blocking a stream and not yet opened, opened at exit. */
#define TH_GATES 64
static pthread_mutex_t gates_lock = PTHREAD_MUTEX_INITIALIZER;
static struct th_gate *gates_closed[TH_GATES];

static void gate_release(struct th_gate *g);

static void
gates_open_all(void)
{
	int i;

	pthread_mutex_lock(&gates_lock);
	for (i = 0; i < TH_GATES; i++)
		if (gates_closed[i]) {
			gate_release(gates_closed[i]);
			gates_closed[i] = NULL;
		}
	pthread_mutex_unlock(&gates_lock);
}

static pthread_t main_thread;
static atomic_bool where_told;

/* The main thread, stopped by the watchdog: where it was, then nothing more until the exit. */
static void
where_handler(int sig)
{
	void *frames[48];
	int n = backtrace(frames, 48);
	static const char head[] = "watchdog: the main thread is at\n";

	(void)sig;
	if (write(2, head, sizeof head - 1) > 0)
		backtrace_symbols_fd(frames, n, 2);
	atomic_store(&where_told, true);
	for (;;)
		pause();
}

static void *
watchdog(void *arg)
{
	unsigned seconds = (unsigned)(uintptr_t)arg;
	char what[sizeof phase];

	while (seconds)
		seconds = sleep(seconds);
	pthread_mutex_lock(&phase_lock);
	memcpy(what, phase, sizeof what);
	pthread_mutex_unlock(&phase_lock);
	fprintf(stderr, "watchdog: still running after %lu s, during %s\n",
		(unsigned long)(uintptr_t)arg, what[0] ? what : "(no phase named)");
	pthread_kill(main_thread, SIGUSR2);
	for (int i = 0; i < 200 && !atomic_load(&where_told); i++)
		usleep(10000);
	/* Not exit(): its handlers (the driver's teardown among them) may be what waits. */
	_exit(124);
}

static void
watchdog_start(void)
{
	const char *v = getenv("SOP_TEST_WATCHDOG");
	unsigned long seconds = v ? strtoul(v, NULL, 10) : 0;
	struct sigaction sa;
	pthread_t t;
	void *warm[1];

	if (!seconds)
		return;
	backtrace(warm, 1); /* loads what backtrace needs before a signal handler calls it */
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = where_handler;
	sigaction(SIGUSR2, &sa, NULL);
	main_thread = pthread_self();
	if (pthread_create(&t, NULL, watchdog, (void *)(uintptr_t)seconds) == 0)
		pthread_detach(t);
}

bool
th_init(void)
{
	sop_pool_t pool;
	CUcontext ctx;
	CUresult r;
	void *dl;

	setvbuf(stdout, NULL, _IONBF, 0);
	watchdog_start();
	r = sop_device_get_default_pool(&pool, 0);
	if (r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_NO_DEVICE ||
	    r == CUDA_ERROR_NOT_SUPPORTED) {
		printf("skip: no usable CUDA driver (%d)\n", (int)r);
		exit(TH_SKIP);
	}
	TH_OK(r);
	/* Registered after the driver started, so it runs before the driver's teardown.
	 * SOP_TEST_GATES_AT_EXIT=0 leaves them closed (test/scaffold.c). */
	{
		const char *v = getenv("SOP_TEST_GATES_AT_EXIT");
		if (!v || strcmp(v, "0"))
			atexit(gates_open_all);
	}
	dl = sop__driver_handle();
	TH_ASSERT(dl);
	TH_LOAD(dl, cuStreamCreate);
	TH_LOAD(dl, cuStreamDestroy);
	TH_LOAD(dl, cuStreamQuery);
	TH_LOAD(dl, cuLaunchHostFunc);
	TH_LOAD(dl, cuMemsetD32Async);
	TH_LOAD(dl, cuMemcpyDtoHAsync);
	TH_LOAD(dl, cuMemcpyHtoDAsync);
	TH_LOAD(dl, cuMemcpyDtoDAsync);
	TH_LOAD(dl, cuMemcpyAsync);
	TH_LOAD(dl, cuCtxCreate);
	TH_LOAD(dl, cuCtxDestroy);
	TH_LOAD(dl, cuCtxPushCurrent);
	TH_LOAD(dl, cuCtxPopCurrent);
	TH_LOAD(dl, cuCtxSetCurrent);
	TH_LOAD(dl, cuEventCreate);
	TH_LOAD(dl, cuEventDestroy);
	TH_LOAD(dl, cuEventQuery);
	TH_LOAD(dl, cuMemGetInfo);
	TH_LOAD(dl, cuModuleLoadData);
	TH_LOAD(dl, cuModuleGetFunction);
	TH_LOAD(dl, cuLaunchKernel);
	TH_LOAD(dl, cuStreamWaitEvent);
	TH_LOAD(dl, cuEventRecord);
	TH_LOAD(dl, cuMemRetainAllocationHandle);
	TH_LOAD(dl, cuMemGetAllocationPropertiesFromHandle);
	TH_LOAD(dl, cuMemGetAccess);
	TH_LOAD(dl, sim_fail);
	TH_LOAD(dl, sim_fail_clear);
	TH_LOAD(dl, sim_calls);
	TH_LOAD(dl, sim_live_get);
	TH_LOAD(dl, sim_handles_recycle);
	TH_LOAD(dl, sim_fail_rate);
	TH_LOAD(dl, sim_fail_seed);
	TH_LOAD(dl, sim_fails);
	TH_LOAD(dl, sim_host_vmm);
	TH_LOAD(dl, sim_stream_dead_ok);
	TH_LOAD(dl, sim_event_dead_ok);
	TH_LOAD(dl, sim_hook);
	th_is_sim = th.sim_fail != NULL;
	th_n_devices = sop__device_count();
	TH_OK(sop__drv.cuDevicePrimaryCtxRetain(&ctx, 0));
	TH_OK(th.cuCtxSetCurrent(ctx));
	return th_is_sim;
}

void
th_require_sim(void)
{
	if (!th_is_sim) {
		printf("skip: needs the simulated driver\n");
		exit(TH_SKIP);
	}
}

void
th_require_gpu(void)
{
	if (th_is_sim) {
		printf("skip: needs a GPU\n");
		exit(TH_SKIP);
	}
}

static CUfunction k_check, k_spin_fill;

void
th_kernels_load(void)
{
	CUmodule mod;

	TH_OK(th.cuModuleLoadData(&mod, sop_kernels_ptx));
	TH_OK(th.cuModuleGetFunction(&k_check, mod, "sop_check"));
	TH_OK(th.cuModuleGetFunction(&k_spin_fill, mod, "sop_spin_fill"));
}

static void
kernel_launch(CUfunction f, CUstream s, void **args)
{
	TH_OK(th.cuLaunchKernel(f, 64, 1, 1, 256, 1, 1, 0, s, args, NULL));
}

void
th_spin_fill(void *p, size_t words, uint32_t v, long long cycles, CUstream s)
{
	unsigned long long n = words;
	void *args[] = {&p, &n, &v, &cycles};

	kernel_launch(k_spin_fill, s, args);
}

void
th_check(void *p, size_t words, uint32_t v, unsigned *bad, CUstream s)
{
	unsigned long long n = words;
	void *args[] = {&p, &n, &v, &bad};

	kernel_launch(k_check, s, args);
}

CUstream
th_stream(void)
{
	CUstream s;

	TH_OK(th.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	return s;
}

void
th_stream_destroy(CUstream s)
{
	TH_OK(th.cuStreamDestroy(s));
}

void
th_gate_init(struct th_gate *g)
{
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	g->open = false;
	g->reached = false;
	g->timeout_ms = 0;
}

void
th_gate_init_timed(struct th_gate *g, long timeout_ms)
{
	th_gate_init(g);
	g->timeout_ms = timeout_ms;
}

static void CUDA_CB
gate_fn(void *arg)
{
	struct th_gate *g = arg;
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += g->timeout_ms / 1000;
	until.tv_nsec += (g->timeout_ms % 1000) * 1000000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&g->lock);
	g->reached = true;
	pthread_cond_broadcast(&g->cond);
	while (!g->open) {
		if (!g->timeout_ms)
			pthread_cond_wait(&g->cond, &g->lock);
		else if (pthread_cond_timedwait(&g->cond, &g->lock, &until))
			break;
	}
	pthread_mutex_unlock(&g->lock);
}

void
th_gate_block(struct th_gate *g, CUstream s)
{
	int i, free_slot = -1;

	/* A timed gate opens by itself. */
	pthread_mutex_lock(&gates_lock);
	for (i = 0; i < TH_GATES && gates_closed[i] != g; i++)
		if (!gates_closed[i] && free_slot < 0)
			free_slot = i;
	if (!g->timeout_ms && i == TH_GATES && free_slot >= 0)
		gates_closed[free_slot] = g;
	pthread_mutex_unlock(&gates_lock);
	TH_OK(th.cuLaunchHostFunc(s, gate_fn, g));
}

static void
gate_release(struct th_gate *g)
{
	pthread_mutex_lock(&g->lock);
	g->open = true;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
}

void
th_gate_open(struct th_gate *g)
{
	int i;

	pthread_mutex_lock(&gates_lock);
	for (i = 0; i < TH_GATES; i++)
		if (gates_closed[i] == g)
			gates_closed[i] = NULL;
	pthread_mutex_unlock(&gates_lock);
	gate_release(g);
}

bool
th_gate_is_open(struct th_gate *g)
{
	bool open;

	pthread_mutex_lock(&g->lock);
	open = g->open;
	pthread_mutex_unlock(&g->lock);
	return open;
}

void
th_gate_wait_reached(struct th_gate *g)
{
	pthread_mutex_lock(&g->lock);
	while (!g->reached)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
}

uint64_t
th_attr(sop_pool_t pool, CUmemPool_attribute attr)
{
	cuuint64_t v = 0;

	TH_OK(sop_pool_get_attr(pool, attr, &v));
	return v;
}

int
th_attr_int(sop_pool_t pool, int attr)
{
	unsigned char buf[8];
	int v;

	memset(buf, 0xa5, sizeof buf);
	TH_OK(sop_pool_get_attr(pool, (CUmemPool_attribute)attr, buf));
	TH_EQ(buf[sizeof v], 0xa5); /* nothing written past the int */
	memcpy(&v, buf, sizeof v);
	return v;
}

struct th_pieces
th_pool_pieces(sop_pool_t pool, void *const *ptr, const size_t *size, int n_ptr)
{
	struct sop_pool *p = TH_POOL(pool);
	struct th_pieces c = {0, 0, 0};
	struct sop__segment *seg;
	size_t i;
	int k;

	TH_ASSERT(p);
	sop__mutex_take(&p->lock, SOP_RANK_POOL);
	for (seg = p->segments; seg; seg = seg->next) {
		for (i = 0; i < seg->n_pieces; i++) {
			const struct sop__piece *pc = seg->pieces[i];
			for (k = 0; k < n_ptr; k++)
				if (pc->va < (CUdeviceptr)ptr[k] + size[k] &&
				    (CUdeviceptr)ptr[k] < pc->va + pc->size)
					break;
			if (n_ptr && k == n_ptr)
				continue;
			c.n++;
			c.bare += !pc->fd_plus1;
			c.busy += pc->ahead || pc->exporting;
		}
	}
	sop__mutex_drop(&p->lock);
	return c;
}

sop_pool_t
th_pool(int device, size_t max_size)
{
	CUmemPoolProps props;
	sop_pool_t pool;

	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = device;
	props.maxSize = max_size;
	TH_OK(sop_pool_create(&pool, &props));
	return pool;
}

void
th_fill(void *p, size_t bytes, uint32_t v, CUstream s)
{
	TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)p, v, bytes / 4, s));
}

bool
th_verify(void *p, size_t bytes, uint32_t v, CUstream s)
{
	uint32_t *h = malloc(bytes);
	bool ok = true;
	size_t i;

	TH_ASSERT(h);
	TH_OK(th.cuMemcpyDtoHAsync(h, (CUdeviceptr)(uintptr_t)p, bytes, s));
	TH_OK(sop__drv.cuStreamSynchronize(s));
	for (i = 0; i < bytes / 4 && ok; i++)
		ok = h[i] == v;
	free(h);
	return ok;
}

struct sim_live
th_live_all(void)
{
	struct sim_live l;

	memset(&l, 0, sizeof l);
	if (th.sim_live_get)
		th.sim_live_get(&l);
	return l;
}

struct sim_live
th_live(void)
{
	struct sim_live l = th_live_all();
	long reservations, anchors;
	size_t bytes;

	if (!th.sim_live_get)
		return l;
	sop__va_kept(&reservations, &anchors, &bytes);
	l.reservations -= reservations;
	l.handles -= anchors;
	l.mappings -= anchors;
	l.phys_bytes -= bytes;
	return l;
}

void
th_send_fd(int sock, int fd, const void *buf, size_t n)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {(void *)buf, n};
	struct msghdr h = {0};

	memset(cbuf, 0, sizeof cbuf);
	h.msg_iov = &iov;
	h.msg_iovlen = 1;
	if (fd >= 0) {
		struct cmsghdr *c = (struct cmsghdr *)cbuf;
		h.msg_control = cbuf;
		h.msg_controllen = sizeof cbuf;
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof fd);
	}
	TH_ASSERT(sendmsg(sock, &h, MSG_NOSIGNAL) == (ssize_t)n);
}

int
th_recv_fd(int sock, void *buf, size_t n)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {buf, n};
	struct msghdr h = {0};
	struct cmsghdr *c;
	int fd = -1;

	h.msg_iov = &iov;
	h.msg_iovlen = 1;
	h.msg_control = cbuf;
	h.msg_controllen = sizeof cbuf;
	TH_ASSERT(recvmsg(sock, &h, MSG_CMSG_CLOEXEC) == (ssize_t)n);
	c = CMSG_FIRSTHDR(&h);
	if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
		memcpy(&fd, CMSG_DATA(c), sizeof fd);
	return fd;
}
