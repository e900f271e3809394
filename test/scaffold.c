/* scaffold.c - the test scaffolding itself (helpers.c). A failed check while a gate keeps a
 * stream busy fails the test at once, naming the phase it was in, with the gate opened on the
 * way out (a process that exits with a host function still blocked may wait for it in the
 * driver's teardown). The watchdog stops a test that waits forever, saying where it waits.
 * Each case runs in a child process that starts the driver itself (the child of a process that
 * has started it cannot use it) and reports on its standard error, which the parent reads.
 * Last, for the record and asserting nothing: how long the driver takes to let a process exit
 * with the gate left closed, and whether creating a stream waits for a destroyed stream's
 * pending work (no sop call in between).
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)
#define CHILD_SECONDS 60

/* Fail a check while a gate holds a stream with work behind it. */
static void
child_gated_failure(void)
{
	struct th_gate g;
	CUstream s;
	void *p;

	th_init();
	s = th_stream();
	th_phase("a gated stream, %d", 7);
	th_gate_init(&g);
	th_gate_block(&g, s);
	TH_OK(sop_malloc_async(&p, MiB, s));
	th_fill(p, MiB, 0x5a5a5a5a, s);
	TH_OK(sop_free_async(p, s));
	TH_EQ(1, 2);
}

/* Wait for a gate nobody opens. */
static void
child_waits_forever(void)
{
	struct th_gate g;
	CUstream s;

	setenv("SOP_TEST_WATCHDOG", "1", 1);
	th_init();
	s = th_stream();
	th_gate_init(&g);
	th_gate_block(&g, s);
	th_phase("waiting for a closed gate");
	sop_stream_synchronize(s);
	printf("scaffold: the closed gate let the synchronization through\n");
	exit(3);
}

/* The gated failure, with the gate left closed at exit. */
static void
child_gate_left_closed(void)
{
	setenv("SOP_TEST_GATES_AT_EXIT", "0", 1);
	child_gated_failure();
}

/* Destroy a stream whose gate is closed, then create streams beside, without sop. On two
 * H100s the driver's creation of the 32nd new stream waited for the destroyed stream's work. */
static atomic_int created;

static void *
create_streams(void *arg)
{
	TH_OK(th.cuCtxSetCurrent(arg));
	for (int i = 0; i < 64; i++) {
		th_stream();
		atomic_fetch_add(&created, 1);
	}
	return NULL;
}

static void
child_create_after_gated_destroy(void)
{
	struct th_gate g;
	pthread_t t;
	double t0;
	CUcontext ctx;
	CUstream s;

	th_init();
	TH_OK(sop__drv.cuCtxGetCurrent(&ctx));
	s = th_stream();
	th_gate_init(&g);
	th_gate_block(&g, s);
	th_stream_destroy(s);
	t0 = th_seconds();
	TH_EQ(pthread_create(&t, NULL, create_streams, ctx), 0);
	while (atomic_load(&created) < 64 && th_seconds() < t0 + 3)
		usleep(1000);
	fprintf(stderr, "%d of 64 streams created in %.3f s while a destroyed stream's host function "
		"was blocked\n", atomic_load(&created), th_seconds() - t0);
	th_gate_open(&g);
	TH_EQ(pthread_join(t, NULL), 0);
	exit(0);
}

/* Run one case in a child; its exit status (or -1 if it outlived seconds: killed), and what it
 * wrote to its standard error, in err. */
static int
run_child(void (*fn)(void), double seconds, char *err, size_t cap)
{
	int fd[2], status = 0;
	size_t len = 0;
	double until;
	pid_t pid;

	TH_EQ(pipe(fd), 0);
	pid = fork();
	TH_ASSERT(pid >= 0);
	if (pid == 0) {
		close(fd[0]);
		dup2(fd[1], 2);
		fn();
		exit(0);
	}
	close(fd[1]);
	fcntl(fd[0], F_SETFL, O_NONBLOCK);
	until = th_seconds() + seconds;
	for (;;) {
		struct pollfd p = {fd[0], POLLIN, 0};
		ssize_t n;

		if (waitpid(pid, &status, WNOHANG) == pid)
			break;
		if (th_seconds() > until) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			status = -1;
			break;
		}
		poll(&p, 1, 100);
		n = read(fd[0], err + len, cap - 1 - len);
		if (n > 0)
			len += (size_t)n;
	}
	for (;;) {
		ssize_t n = read(fd[0], err + len, cap - 1 - len);

		if (n <= 0)
			break;
		len += (size_t)n;
	}
	err[len] = 0;
	close(fd[0]);
	if (status == -1)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void
expect(const char *what, void (*fn)(void), int want_status, const char *want_text)
{
	char err[8192];
	int st = run_child(fn, CHILD_SECONDS, err, sizeof err);

	if (st == TH_SKIP) {
		printf("skip: no usable CUDA driver\n");
		exit(TH_SKIP);
	}
	if (st != want_status || !strstr(err, want_text)) {
		fprintf(stderr, "scaffold: %s: exit %d (want %d), stderr:\n%s\n", what, st,
			want_status, err);
		exit(1);
	}
	printf("scaffold: %s: exit %d, as it should\n", what, st);
}

int
main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	expect("a failed check with a gate closed", child_gated_failure, 1,
	       "(during a gated stream, 7)");
	expect("a wait that never ends", child_waits_forever, 124,
	       "watchdog: still running after 1 s, during waiting for a closed gate");
	{
		char err[8192];
		double t0 = th_seconds();
		int st = run_child(child_gate_left_closed, 15, err, sizeof err);

		if (st < 0)
			printf("scaffold: with the gate left closed, the process had not exited after "
			       "15 s (killed)\n");
		else
			printf("scaffold: with the gate left closed, the process exited %d after %.1f s\n",
			       st, th_seconds() - t0);
	}
	{
		char err[8192];
		int st = run_child(child_create_after_gated_destroy, 15, err, sizeof err);

		printf("scaffold: exit %d: %s", st, st < 0 ? "killed after 15 s\n" : err);
	}
	printf("scaffold: ok\n");
	return 0;
}
