/* Warmed threads as the harness runs them, a fixed count: T threads, each its own stream, one
 * pool, 256 live blocks of 1 B..MAX, then K pairs (free a random one, allocate a new size in its
 * place), once untimed and once timed. Prints the mean over threads of ns per pair. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <time.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/time.h>
#include <sys/resource.h>
#include <ucontext.h>
#include "sop.h"
#define OK(x) do { CUresult r_ = (x); if (r_) { printf("%s: %d line %d\n", #x, r_, __LINE__); exit(1); } } while (0)
#define LIVE 256
static CUcontext ctx; static sop_pool_t pool; static __thread sop_pool_t mypool; static int own; static pthread_barrier_t bar;
static CUresult (*setcur)(CUcontext); static CUresult (*mks)(CUstream *, unsigned);
static int T = 1; static long K = 200000; static size_t MAX = 1 << 20;
static uint64_t rs(uint64_t *s){uint64_t z=(*s+=0x9e3779b97f4a7c15ull);z=(z^(z>>30))*0xbf58476d1ce4e5b9ull;z=(z^(z>>27))*0x94d049bb133111ebull;return z^(z>>31);}
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e9+t.tv_nsec;}
static CUresult (*getid)(CUstream, unsigned long long *); static CUresult (*iscap)(CUstream, CUstreamCaptureStatus *); static int queries, rec_every; static CUresult (*evrec)(CUevent, CUstream); static CUresult (*evmk)(CUevent *, unsigned);
__attribute__((noinline)) void steady(void **live, CUstream s, uint64_t *seed)
{
	if (queries) {
		static __thread CUevent ev;
		if (rec_every && !ev) OK(evmk(&ev, 2 /* CU_EVENT_DISABLE_TIMING */));
		for (long i = 0; i < K; i++) {
			unsigned long long id; CUstreamCaptureStatus st;
			OK(getid(s, &id)); OK(iscap(s, &st));
			if (rec_every && i % rec_every == 0) { OK(getid(s, &id)); OK(iscap(s, &st)); OK(evrec(ev, s)); }
		}
		return;
	}
	for (long i = 0; i < K; i++) {
		uint64_t x = rs(seed); int k = (int)(x % LIVE);
		OK(sop_free_async(live[k], s));
		OK(sop_malloc_from_pool_async(&live[k], 1 + (x >> 20) % MAX, mypool, s));
	}
}
static double ns[64];
static struct rusage ru0, ru1; /* the process's, around the timed pass */
/* SAMPLE=FILE: in the timed pass, each thread takes SIGPROF every 50 us of wall time (a timer of
 * its own); the interrupted instruction's address goes to FILE, then the process's maps
 * (resolved by sample.py). */
#define N_SAMPLES (1 << 20)
static uintptr_t samples[N_SAMPLES]; static atomic_ulong n_samples; static atomic_int sampling;
static void on_prof(int sig, siginfo_t *si, void *uc)
{
	(void)sig, (void)si;
	if (!atomic_load_explicit(&sampling, memory_order_relaxed)) return;
	unsigned long i = atomic_fetch_add_explicit(&n_samples, 1, memory_order_relaxed);
	if (i < N_SAMPLES) samples[i] = (uintptr_t)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
}
static void sample_start(void)
{
	struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_sigaction = on_prof; sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigaction(SIGPROF, &sa, NULL);
}
static timer_t thread_timer(void)
{
	struct sigevent ev; memset(&ev, 0, sizeof ev); timer_t t;
	ev.sigev_notify = SIGEV_THREAD_ID; ev.sigev_signo = SIGPROF; ev._sigev_un._tid = gettid();
	if (timer_create(CLOCK_MONOTONIC, &ev, &t)) { perror("timer_create"); exit(1); }
	struct itimerspec it = {{0, 50000}, {0, 50000}}; timer_settime(t, 0, &it, NULL);
	return t;
}
static void sample_dump(const char *path)
{
	FILE *f = fopen(path, "w"), *m = fopen("/proc/self/maps", "r"); char line[512];
	unsigned long n = atomic_load(&n_samples); if (n > N_SAMPLES) n = N_SAMPLES;
	for (unsigned long i = 0; i < n; i++) fprintf(f, "S %lx\n", (unsigned long)samples[i]);
	while (fgets(line, sizeof line, m)) fprintf(f, "M %s", line);
	fclose(m); fclose(f);
}
/* Modes, by environment: OWN (a pool per thread), QUERIES (the driver's two queries per pair
 * alone, no pool calls), RECORD=N (with QUERIES: also a probe's calls every N pairs). */
static void *worker(void *a_)
{
	int id = (int)(uintptr_t)a_; uint64_t seed = 0x5eed0000u + id; void *live[LIVE]; CUstream s;
	OK(setcur(ctx)); OK(mks(&s, 1)); mypool = pool;
	if (own) { CUmemPoolProps pp; memset(&pp, 0, sizeof pp); pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE; OK(sop_pool_create(&mypool, &pp)); cuuint64_t t = ~0ull; OK(sop_pool_set_attr(mypool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t)); }
	for (int i = 0; i < LIVE; i++) OK(sop_malloc_from_pool_async(&live[i], 1 + rs(&seed) % MAX, mypool, s));
	steady(live, s, &seed); /* warm */
	pthread_barrier_wait(&bar);
	if (id == 0) getrusage(RUSAGE_SELF, &ru0);
	timer_t tm = 0;
	if (getenv("SAMPLE")) { atomic_store(&sampling, 1); tm = thread_timer(); }
	double t0 = now(); steady(live, s, &seed); ns[id] = (now() - t0) / K;
	if (tm) timer_delete(tm);
	pthread_barrier_wait(&bar);
	if (id == 0) { atomic_store(&sampling, 0); getrusage(RUSAGE_SELF, &ru1); }
	for (int i = 0; i < LIVE; i++) OK(sop_free_async(live[i], s));
	OK(sop_stream_synchronize(s));
	return NULL;
}
int main(int argc, char **argv)
{
	if (argc > 1) T = atoi(argv[1]);
	if (argc > 2) K = atol(argv[2]);
	own = getenv("OWN") != NULL; queries = getenv("QUERIES") != NULL; rec_every = getenv("RECORD") ? atoi(getenv("RECORD")) : 0;
	if (argc > 3) MAX = strtoul(argv[3], 0, 0);
	void *lib = dlopen(getenv("SOP_DRIVER_LIBRARY") ? getenv("SOP_DRIVER_LIBRARY") : "libcuda.so.1", RTLD_NOW);
	CUresult (*init)(unsigned) = dlsym(lib, "cuInit"); CUresult (*retain)(CUcontext *, CUdevice) = dlsym(lib, "cuDevicePrimaryCtxRetain");
	setcur = dlsym(lib, "cuCtxSetCurrent"); mks = dlsym(lib, "cuStreamCreate"); getid = dlsym(lib, "cuStreamGetId"); iscap = dlsym(lib, "cuStreamIsCapturing"); evrec = dlsym(lib, "cuEventRecord"); evmk = dlsym(lib, "cuEventCreate");
	OK(init(0)); OK(retain(&ctx, 0)); OK(setcur(ctx));
	CUmemPoolProps pp; memset(&pp, 0, sizeof pp); pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	OK(sop_pool_create(&pool, &pp)); cuuint64_t t = ~0ull; OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
	pthread_t th[64]; pthread_barrier_init(&bar, NULL, T);
	if (getenv("SAMPLE")) sample_start();
	for (int i = 0; i < T; i++) pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
	for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
	if (getenv("SAMPLE")) sample_dump(getenv("SAMPLE"));
	double sum = 0; for (int i = 0; i < T; i++) sum += ns[i];
	printf("%s%s%d threads, max %zu: %.1f ns/pair per thread (mean)", queries ? (rec_every ? "queries+record " : "queries ") : "", own ? "own pools " : "", T, MAX, sum / T);
	if (getenv("RUSAGE"))
		printf("; timed pass: %ld minor faults, %ld voluntary and %ld involuntary switches",
		       ru1.ru_minflt - ru0.ru_minflt, ru1.ru_nvcsw - ru0.ru_nvcsw, ru1.ru_nivcsw - ru0.ru_nivcsw);
	printf("\n");
	return 0;
}
