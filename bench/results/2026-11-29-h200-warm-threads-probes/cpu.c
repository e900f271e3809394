/* What sixteen threads of this machine give with no allocator and no driver: each thread runs a
 * loop for a fixed count, pinned to a CPU of a list, and prints its ns per step.
 *   cpu alu|tput|mem N CPU...   alu: a chain of multiplies and shifts (latency-bound); tput: eight
 *   independent chains (bound by the core's multipliers, which two hardware threads of one core
 *   share); mem: dependent random reads in a 1 MiB array of the thread's own (L2-resident). All
 *   threads start behind a barrier. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static long N; static int mem, tput; static pthread_barrier_t bar;
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e9+t.tv_nsec;}
struct arg { int cpu; double ns; uint64_t sink; };
static void *run(void *a_)
{
	struct arg *a = a_; cpu_set_t s; CPU_ZERO(&s); CPU_SET(a->cpu, &s);
	pthread_setaffinity_np(pthread_self(), sizeof s, &s);
	uint32_t n = 1u << 17, *v = malloc(n * sizeof *v); uint64_t x = 0x9e3779b97f4a7c15ull + a->cpu;
	for (uint32_t i = 0; i < n; i++) v[i] = i;
	for (uint32_t i = n - 1; i > 0; i--) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; uint32_t j = x % (i + 1), t = v[i]; v[i] = v[j]; v[j] = t; }
	pthread_barrier_wait(&bar);
	double t0 = now(); uint32_t k = 0;
	if (mem) for (long i = 0; i < N; i++) k = v[k];
	else if (tput) {
		uint64_t y[8]; for (int j = 0; j < 8; j++) y[j] = x + j;
		for (long i = 0; i < N; i++) for (int j = 0; j < 8; j++) y[j] *= 0xbf58476d1ce4e5b9ull;
		for (int j = 0; j < 8; j++) x += y[j];
	}
	else for (long i = 0; i < N; i++) { x = x * 0xbf58476d1ce4e5b9ull; x ^= x >> 31; }
	a->ns = (now() - t0) / N; a->sink = x + k; free(v);
	return NULL;
}
int main(int argc, char **argv)
{
	if (argc < 4) return 2;
	mem = !strcmp(argv[1], "mem"); tput = !strcmp(argv[1], "tput"); N = atol(argv[2]);
	int T = argc - 3; pthread_t th[256]; struct arg a[256];
	pthread_barrier_init(&bar, NULL, T);
	for (int i = 0; i < T; i++) { a[i].cpu = atoi(argv[3 + i]); pthread_create(&th[i], NULL, run, &a[i]); }
	for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
	for (int i = 0; i < T; i++) printf("%s%d:%.2f", i ? " " : "", a[i].cpu, a[i].ns);
	printf("\n");
	return 0;
}
