/* limits.c - device memory limits (SOP_DEVICE_MEMORY_LIMIT, sop_device_set_memory_limit) and the
 * out-of-memory report (SOP_OOM_REPORT).
 *
 * The limit caps what all of a device's pools hold: at the cap, memory another pool holds idle is
 * given back so that a pool can grow, and live memory is never taken: the request fails with
 * CUDA_ERROR_OUT_OF_MEMORY. A pool's own maxSize is no reason to take other pools' memory. Pools
 * growing on several threads at once at the cap neither deadlock nor pass it. The variables are
 * read once at sop's start, so each setting runs in a child process (this program again, with
 * --print or --oom); a value that is not a size makes sop refuse to start.
 */
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)

static uint64_t
reserved(sop_pool_t pool)
{
	return th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
}

static size_t
held(int device)
{
	size_t limit = 0, h = 0;

	TH_OK(sop_device_get_memory_limit(&limit, &h, device));
	return h;
}

static sop_pool_t
pool_keeping(int device)
{
	sop_pool_t pool = th_pool(device, 0);
	cuuint64_t keep = UINT64_MAX;

	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	return pool;
}

/* Two pools under one cap: the idle memory of one goes back so that the other can grow; live
 * memory stays, and the request fails at the cap. */
static void
two_pools(CUstream s)
{
	sop_pool_t a = pool_keeping(0), b = pool_keeping(0), c;
	void *p, *q, *r, *x = (void *)0x1;
	size_t limit = 1;

	TH_OK(sop_device_set_memory_limit(0, 96 * MiB));
	TH_OK(sop_device_get_memory_limit(&limit, NULL, 0));
	TH_EQ(limit, 96 * MiB);
	TH_EQ(held(0), 0);

	/* a holds 64 MiB idle (freed, synchronized, kept by its release threshold). */
	TH_OK(sop_malloc_from_pool_async(&p, 64 * MiB, a, s));
	TH_OK(sop_free_async(p, s));
	TH_OK(sop_stream_synchronize(s));
	TH_EQ(reserved(a), 64 * MiB);
	TH_EQ(held(0), 64 * MiB);

	/* A pool's own maxSize refuses a request: no reason to take a's memory. */
	c = th_pool(0, 8 * MiB);
	TH_EQ(sop_malloc_from_pool_async(&x, 16 * MiB, c, s), CUDA_ERROR_OUT_OF_MEMORY);
	TH_ASSERT(x == (void *)0x1);
	TH_EQ(reserved(a), 64 * MiB);
	TH_OK(sop_pool_destroy(c));

	/* b needs 64 MiB: past the cap unless a gives its idle memory back, which it does. */
	TH_OK(sop_malloc_from_pool_async(&q, 64 * MiB, b, s));
	TH_EQ(reserved(a), 0);
	TH_EQ(reserved(b), 64 * MiB);
	TH_EQ(held(0), 64 * MiB);
	th_fill(q, 64 * MiB, 0xabcd, s);

	/* With b's memory live, a can have what is left under the cap and no more. */
	TH_EQ(sop_malloc_from_pool_async(&x, 64 * MiB, a, s), CUDA_ERROR_OUT_OF_MEMORY);
	TH_ASSERT(x == (void *)0x1);
	TH_OK(sop_malloc_from_pool_async(&r, 32 * MiB, a, s));
	TH_EQ(held(0), 96 * MiB);
	TH_EQ(sop_malloc_from_pool_async(&x, 2 * MiB, b, s), CUDA_ERROR_OUT_OF_MEMORY);
	TH_ASSERT(x == (void *)0x1);
	TH_EQ(held(0), reserved(a) + reserved(b));
	TH_ASSERT(th_verify(q, 64 * MiB, 0xabcd, s));
	TH_CHECK(a);
	TH_CHECK(b);

	/* Other devices have caps of their own. */
	if (th_n_devices > 1) {
		sop_pool_t d1 = th_pool(1, 0);

		TH_OK(sop_device_set_memory_limit(1, 0));
		TH_OK(sop_malloc_from_pool_async(&x, 128 * MiB, d1, s));
		TH_EQ(held(1), reserved(d1));
		TH_OK(sop_free_async(x, s));
		TH_OK(sop_stream_synchronize(s));
		TH_EQ(held(1), 0);
		TH_OK(sop_pool_destroy(d1));
	}

	/* A cap lowered below what is held takes nothing, and refuses growth; lifted, growth is
	 * allowed again. */
	TH_OK(sop_device_set_memory_limit(0, 32 * MiB));
	TH_EQ(held(0), 96 * MiB);
	TH_EQ(sop_malloc_from_pool_async(&x, 2 * MiB, b, s), CUDA_ERROR_OUT_OF_MEMORY);
	TH_OK(sop_device_set_memory_limit(0, 0));
	TH_OK(sop_malloc_from_pool_async(&x, 2 * MiB, b, s));
	TH_OK(sop_free_async(x, s));

	TH_OK(sop_free_async(q, s));
	TH_OK(sop_free_async(r, s));
	TH_OK(sop_stream_synchronize(s));
	TH_OK(sop_trim_to(a, 0));
	TH_OK(sop_trim_to(b, 0));
	TH_EQ(held(0), 0);
	TH_OK(sop_pool_destroy(a));
	TH_OK(sop_pool_destroy(b));

	/* Arguments. */
	TH_EQ(sop_device_set_memory_limit(-1, 0), CUDA_ERROR_INVALID_DEVICE);
	TH_EQ(sop_device_set_memory_limit(th_n_devices, 0), CUDA_ERROR_INVALID_DEVICE);
	TH_EQ(sop_device_get_memory_limit(&limit, NULL, th_n_devices), CUDA_ERROR_INVALID_DEVICE);
	TH_EQ(sop_device_get_memory_limit(NULL, NULL, 0), CUDA_ERROR_INVALID_VALUE);
	printf("two pools under one cap: ok\n");
}

/* Threads growing pools of their own at once, each pool keeping its idle memory: every growth at
 * the cap takes the other pools' locks one by one, while they grow under theirs. Nobody waits
 * for ever, the cap is never passed, and what the device holds is what the pools reserve. */
#define RACE_THREADS 4
#define RACE_LIMIT (64 * MiB)

struct racer {
	CUcontext ctx;
	sop_pool_t pool;
	unsigned seed;
	unsigned n_oom;
};

static void *
race_run(void *arg)
{
	struct racer *w = arg;
	void *p[4] = {NULL, NULL, NULL, NULL};
	CUstream s;
	int i, k;

	TH_OK(th.cuCtxSetCurrent(w->ctx));
	s = th_stream();
	for (i = 0; i < 300; i++) {
		k = i % 4;
		if (p[k])
			TH_OK(sop_free_async(p[k], s));
		p[k] = NULL;
		w->seed = w->seed * 1103515245u + 12345u;
		switch (sop_malloc_from_pool_async(&p[k], (2 + (w->seed >> 16) % 14) * MiB, w->pool,
						   s)) {
		case CUDA_SUCCESS:
			break;
		case CUDA_ERROR_OUT_OF_MEMORY:
			p[k] = NULL;
			w->n_oom++;
			break;
		default:
			TH_ASSERT(0);
		}
		TH_ASSERT(held(0) <= RACE_LIMIT);
		if (i % 8 == 7)
			TH_OK(sop_stream_synchronize(s));
	}
	for (k = 0; k < 4; k++)
		if (p[k])
			TH_OK(sop_free_async(p[k], s));
	TH_OK(sop_stream_synchronize(s));
	th_stream_destroy(s);
	return NULL;
}

static void
race(void)
{
	struct racer w[RACE_THREADS];
	pthread_t t[RACE_THREADS];
	uint64_t sum = 0;
	unsigned n_oom = 0;
	int i;

	TH_OK(sop_device_set_memory_limit(0, RACE_LIMIT));
	for (i = 0; i < RACE_THREADS; i++) {
		TH_OK(sop__drv.cuCtxGetCurrent(&w[i].ctx));
		w[i].pool = pool_keeping(0);
		w[i].seed = 7u + (unsigned)i;
		w[i].n_oom = 0;
		TH_ASSERT(pthread_create(&t[i], NULL, race_run, &w[i]) == 0);
	}
	for (i = 0; i < RACE_THREADS; i++)
		TH_ASSERT(pthread_join(t[i], NULL) == 0);
	for (i = 0; i < RACE_THREADS; i++) {
		sum += reserved(w[i].pool);
		n_oom += w[i].n_oom;
		TH_CHECK(w[i].pool);
	}
	TH_EQ(held(0), sum);
	TH_ASSERT(sum <= RACE_LIMIT);
	for (i = 0; i < RACE_THREADS; i++)
		TH_OK(sop_pool_destroy(w[i].pool));
	TH_EQ(held(0), 0);
	TH_OK(sop_device_set_memory_limit(0, 0));
	printf("growth of %d pools at once under one cap: ok (%u refused)\n", RACE_THREADS, n_oom);
}

/* ---- Children: one setting of the variables each -------------------------------------------- */

/* --print: the limits sop read, or why it refused to start (before th_init, which would take a
 * refusal for a failure). */
static int
child_print(void)
{
	size_t l0 = 0, l1 = 0;
	sop_pool_t pool;
	CUresult r = sop_device_get_memory_limit(&l0, NULL, 0);

	if (r != CUDA_SUCCESS) {
		/* Every call refuses, the same way. */
		TH_EQ(sop_device_get_default_pool(&pool, 0), r);
		printf("refused %d\n", (int)r);
		return 0;
	}
	if (sop__device_count() > 1)
		TH_OK(sop_device_get_memory_limit(&l1, NULL, 1));
	printf("%zu %zu\n", l0, l1);
	return 0;
}

/* --oom: the default pool holds 40 MiB live; another pool 20 MiB, half of it freed and pending
 * on its stream; a request of 16 MiB on another stream fails at the 64 MiB cap. */
static int
child_oom(void)
{
	CUstream s = th_stream(), s2 = th_stream();
	sop_pool_t def, b;
	void *p, *q1, *q2, *x;

	TH_OK(sop_device_get_default_pool(&def, 0));
	b = th_pool(0, 0);
	TH_OK(sop_malloc_from_pool_async(&p, 40 * MiB, def, s));
	TH_OK(sop_malloc_from_pool_async(&q1, 10 * MiB, b, s));
	TH_OK(sop_malloc_from_pool_async(&q2, 10 * MiB, b, s));
	TH_OK(sop_free_async(q2, s));
	TH_EQ(sop_malloc_from_pool_async(&x, 16 * MiB, b, s2), CUDA_ERROR_OUT_OF_MEMORY);
	printf("default %#llx other %#llx\n", (unsigned long long)(uintptr_t)def,
	       (unsigned long long)(uintptr_t)b);
	return 0;
}

/* Run this program again with mode and the variables of env (name=value, NULL-terminated) in
 * place of every SOP_DEVICE_MEMORY_LIMIT* and SOP_OOM_REPORT; its stdout and stderr in out and
 * err. */
static void
child_run(const char *self, const char *mode, const char *const *env, char *out, size_t n_out,
	  char *err, size_t n_err)
{
	int po[2], pe[2], status;
	pid_t pid;
	ssize_t k;
	size_t got;

	TH_ASSERT(pipe(po) == 0 && pipe(pe) == 0);
	fflush(NULL);
	pid = fork();
	TH_ASSERT(pid >= 0);
	if (pid == 0) {
		char name[64];
		int i;

		unsetenv("SOP_DEVICE_MEMORY_LIMIT");
		unsetenv("SOP_OOM_REPORT");
		for (i = 0; i < 8; i++) {
			snprintf(name, sizeof name, "SOP_DEVICE_MEMORY_LIMIT_%d", i);
			unsetenv(name);
		}
		for (i = 0; env[i]; i++)
			putenv((char *)env[i]);
		dup2(po[1], 1);
		dup2(pe[1], 2);
		close(po[0]);
		close(pe[0]);
		execl(self, self, mode, (char *)NULL);
		_exit(127);
	}
	close(po[1]);
	close(pe[1]);
	for (got = 0; got + 1 < n_out && (k = read(po[0], out + got, n_out - 1 - got)) > 0;)
		got += (size_t)k;
	out[got] = 0;
	for (got = 0; got + 1 < n_err && (k = read(pe[0], err + got, n_err - 1 - got)) > 0;)
		got += (size_t)k;
	err[got] = 0;
	close(po[0]);
	close(pe[0]);
	TH_ASSERT(waitpid(pid, &status, 0) == pid);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "child %s failed (status %d): %s%s\n", mode, status, out, err);
		exit(1);
	}
}

static void
settings(const char *self)
{
	static const struct {
		const char *env[3];
		const char *want; /* for two devices */
	} cases[] = {
		{{"SOP_DEVICE_MEMORY_LIMIT=96m"}, "100663296 100663296\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT=1g", "SOP_DEVICE_MEMORY_LIMIT_1=4096K"},
		 "1073741824 4194304\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT_1=123456789"}, "0 123456789\n"},
		/* A device's own setting wins, 0 (no cap) included. */
		{{"SOP_DEVICE_MEMORY_LIMIT=2G", "SOP_DEVICE_MEMORY_LIMIT_0=0"}, "0 2147483648\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT=1024M", "SOP_DEVICE_MEMORY_LIMIT_7=1k"},
		 "1073741824 1073741824\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT="}, "0 0\n"},
		{{NULL}, "0 0\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT=1.5g"}, "refused 1\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT=g"}, "refused 1\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT=-1"}, "refused 1\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT=1gb"}, "refused 1\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT= 1g"}, "refused 1\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT=0x100"}, "refused 1\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT=18446744073709551616"}, "refused 1\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT=17179869184g"}, "refused 1\n"},
		{{"SOP_DEVICE_MEMORY_LIMIT=1g", "SOP_DEVICE_MEMORY_LIMIT_0=12x"}, "refused 1\n"},
	};
	char out[256], err[4096];
	size_t i;

	for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *want = cases[i].want;
		char one[64];

		child_run(self, "--print", cases[i].env, out, sizeof out, err, sizeof err);
		/* With one device, only the first figure. */
		if (th_n_devices == 1 && strncmp(want, "refused", 7)) {
			snprintf(one, sizeof one, "%.*s 0\n", (int)strcspn(want, " "), want);
			want = one;
		}
		if (strcmp(out, want)) {
			fprintf(stderr, "case %zu (%s): got \"%s\", expected \"%s\"\n", i,
				cases[i].env[0] ? cases[i].env[0] : "nothing set", out, want);
			exit(1);
		}
	}
	printf("settings: ok\n");
}

static void
report(const char *self)
{
	static const char *const on[] = {"SOP_DEVICE_MEMORY_LIMIT_0=64m", "SOP_OOM_REPORT=1",
					 NULL};
	static const char *const off[] = {"SOP_DEVICE_MEMORY_LIMIT_0=64m", NULL};
	unsigned long long def = 0, other = 0;
	char out[256], err[4096], line[512];

	child_run(self, "--oom", on, out, sizeof out, err, sizeof err);
	TH_EQ(sscanf(out, "default %llx other %llx", &def, &other), 2);
	snprintf(line, sizeof line,
		 "sop: out of memory: %zu bytes from pool %#llx on device 0\n", 16 * MiB, other);
	TH_ASSERT(strstr(err, line));
	snprintf(line, sizeof line, "sop: device 0: limit %zu, held by sop's pools %zu\n",
		 64 * MiB, 60 * MiB);
	TH_ASSERT(strstr(err, line));
	snprintf(line, sizeof line,
		 "sop:   pool %#llx (default): reserved %zu, used %zu, free 0, largest free "
		 "extent 0\n",
		 def, 40 * MiB, 40 * MiB);
	TH_ASSERT(strstr(err, line));
	snprintf(line, sizeof line,
		 "sop:   pool %#llx (this request): reserved %zu, used %zu, free %zu, largest "
		 "free extent %zu\n",
		 other, 20 * MiB, 10 * MiB, 10 * MiB, 10 * MiB);
	if (!strstr(err, line)) {
		fprintf(stderr, "report:\n%s\nlacks:\n%s", err, line);
		exit(1);
	}
	/* Without the switch, nothing. */
	child_run(self, "--oom", off, out, sizeof out, err, sizeof err);
	TH_EQ(strlen(err), 0);
	printf("out-of-memory report: ok\n");
}

int
main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	CUstream s;

	if (!strcmp(mode, "--print"))
		return child_print();
	th_init();
	if (!strcmp(mode, "--oom"))
		return child_oom();
	s = th_stream();
	two_pools(s);
	race();
	settings("/proc/self/exe");
	report("/proc/self/exe");
	th_stream_destroy(s);
	return 0;
}
