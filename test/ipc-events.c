/* ipc-events.c - two processes share a pool, ordered by interprocess events alone (the driver's
 * way, as test/gpu-ipc.c does with kernels on a GPU): each round the exporter fills fresh
 * allocations of mixed sizes (some larger than anything mapped yet, so that the pool grows after
 * the import) and records its event; the importer's stream waits on it, checks the exporter's
 * tags, writes its own, frees its imports in stream order and records its event; the exporter's
 * stream waits on that, checks the importer's tags, and frees. Neither synchronizes with the
 * host until the end: each side's work starts with a nap on its stream, so a wait that did not
 * hold would let the other side read the memory before it was written. Checks are copies to
 * the host followed, in stream order, by a host function that compares (a few hundred bytes at
 * each end of every allocation).
 *
 * First, the events themselves: a record not yet reached is not complete in the other process,
 * and is once reached.
 */
#include <dlfcn.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

#define ROUNDS 30
#define BLOCKS 6
#define SAMPLE 256 /* bytes checked at each end */

struct msg {
	int round, n;
	size_t bytes[BLOCKS];
	CUmemPoolPtrExportData d[BLOCKS];
	CUipcEventHandle ev;
};

static __typeof__(cuIpcGetEventHandle) *get_ev;
static __typeof__(cuIpcOpenEventHandle) *open_ev;

/* The driver, and its interprocess events; exits 77 without them. */
static void
setup(void)
{
	void *dl, *sym;

	th_init();
	dl = sop__driver_handle();
	sym = dlsym(dl, "cuIpcGetEventHandle");
	memcpy(&get_ev, &sym, sizeof sym);
	sym = dlsym(dl, "cuIpcOpenEventHandle");
	memcpy(&open_ev, &sym, sizeof sym);
	if (!get_ev || !open_ev) {
		printf("skip: the driver has no interprocess events\n");
		exit(TH_SKIP);
	}
}

static CUevent
ipc_event(CUipcEventHandle *h)
{
	CUevent e;

	TH_OK(th.cuEventCreate(&e, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
	TH_OK(get_ev(h, e));
	return e;
}

static size_t
size_of(int round, int i)
{
	/* Mixed: small, a few MiB, and every fourth round one of 96 MiB, past what is mapped. */
	static const size_t sz[BLOCKS] = {4096, 65536, (size_t)1 << 20, (size_t)3 << 20, 512,
					  (size_t)8 << 20};
	if (i == BLOCKS - 1 && round % 4 == 3)
		return (size_t)96 << 20;
	return sz[i] + (size_t)(round % 3) * 512;
}

static uint32_t
tag(int side, int round, int i)
{
	return 0x10000000u * (uint32_t)(side + 1) + (uint32_t)round * 64 + (uint32_t)i;
}

/* ---- Work in stream order ------------------------------------------------------------------ */

static atomic_int bad, checked;

static void CUDA_CB
nap(void *arg)
{
	(void)arg;
	usleep(2000);
}

/* What a check copied, and what it must be. */
struct sample {
	uint32_t want;
	size_t words;
	uint32_t w[2 * SAMPLE / 4];
};

static void CUDA_CB
compare(void *arg)
{
	struct sample *sm = arg;
	size_t i;

	for (i = 0; i < sm->words; i++)
		if (sm->w[i] != sm->want) {
			atomic_fetch_add(&bad, 1);
			break;
		}
	atomic_fetch_add(&checked, 1);
	free(sm);
}

/* Enqueue on st: copy both ends of [p, p + bytes) to the host, then compare them with want. */
static void
check(void *p, size_t bytes, uint32_t want, CUstream st)
{
	struct sample *sm = calloc(1, sizeof *sm);
	CUdeviceptr d = (CUdeviceptr)(uintptr_t)p;
	size_t end = bytes < SAMPLE ? bytes : SAMPLE;

	TH_ASSERT(sm);
	sm->want = want;
	sm->words = 2 * end / 4;
	TH_OK(th.cuMemcpyDtoHAsync(sm->w, d, end, st));
	TH_OK(th.cuMemcpyDtoHAsync(sm->w + end / 4, d + bytes - end, end, st));
	TH_OK(th.cuLaunchHostFunc(st, compare, sm));
}

/* Enqueue on st: a nap, then [p, p + bytes) filled with v. */
static void
late_fill(void *p, size_t bytes, uint32_t v, CUstream st)
{
	TH_OK(th.cuLaunchHostFunc(st, nap, NULL));
	th_fill(p, bytes, v, st);
}

static void
finish(CUstream st, int expect_checked)
{
	TH_OK(sop_stream_synchronize(st));
	TH_EQ(atomic_load(&bad), 0);
	TH_EQ(atomic_load(&checked), expect_checked);
}

/* ---- The two processes ---------------------------------------------------------------------- */

static int
exporter(int s)
{
	CUmemPoolProps props = {0};
	CUipcEventHandle theirs;
	struct th_gate gate;
	struct msg m;
	sop_pool_t pool;
	CUevent mine, ev_in;
	CUstream st;
	void *p[BLOCKS];
	int fd, r, i, go;

	setup();
	st = th_stream();
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	TH_OK(sop_pool_create(&pool, &props));
	TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
						  0));
	memset(&m, 0, sizeof m);
	mine = ipc_event(&m.ev);
	m.round = -1;

	/* The events: a record behind a closed gate is not complete over there. */
	th_gate_init(&gate);
	th_gate_block(&gate, st);
	TH_OK(sop_event_record(mine, st));
	th_send_fd(s, fd, &m, sizeof m);
	close(fd);
	th_recv_fd(s, &theirs, sizeof theirs);
	TH_OK(open_ev(&ev_in, theirs));
	th_recv_fd(s, &go, sizeof go);
	th_gate_open(&gate);
	TH_OK(sop_stream_synchronize(st));
	/* Until the importer has seen the record complete, none comes after it. */
	th_recv_fd(s, &go, sizeof go);

	for (r = 0; r < ROUNDS; r++) {
		memset(&m, 0, sizeof m);
		m.round = r;
		m.n = BLOCKS;
		TH_OK(th.cuLaunchHostFunc(st, nap, NULL));
		for (i = 0; i < BLOCKS; i++) {
			m.bytes[i] = size_of(r, i);
			TH_OK(sop_malloc_from_pool_async(&p[i], m.bytes[i], pool, st));
			late_fill(p[i], m.bytes[i], tag(0, r, i), st);
			TH_OK(sop_pool_export_pointer(&m.d[i], p[i]));
		}
		TH_OK(sop_event_record(mine, st));
		th_send_fd(s, -1, &m, sizeof m);
		/* The importer's tags and frees, ordered by its event. */
		th_recv_fd(s, &m, sizeof m);
		TH_EQ(m.round, r);
		TH_OK(sop_stream_wait_event(st, ev_in, 0));
		for (i = 0; i < BLOCKS; i++) {
			check(p[i], m.bytes[i], tag(1, r, i), st);
			TH_OK(sop_free_async(p[i], st));
		}
	}
	finish(st, ROUNDS * BLOCKS);
	TH_OK(sop_pool_destroy(pool));
	TH_OK(sop_event_destroy(mine));
	TH_OK(sop_event_destroy(ev_in));
	TH_OK(sop_stream_destroy(st));
	return 0;
}

static int
importer(int s, pid_t child)
{
	CUipcEventHandle h;
	struct msg m;
	sop_pool_t ipool;
	CUevent mine, ev_in;
	CUstream st;
	void *q[BLOCKS];
	int fd, r, i, status, go = 1;

	setup();
	st = th_stream();
	fd = th_recv_fd(s, &m, sizeof m);
	TH_ASSERT(fd >= 0);
	TH_OK(sop_pool_import_from_shareable_handle(&ipool, (void *)(intptr_t)fd,
						    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	close(fd);
	TH_OK(open_ev(&ev_in, m.ev));
	mine = ipc_event(&h);
	th_send_fd(s, -1, &h, sizeof h);

	/* The exporter's record waits behind its gate, which opens after this message. */
	TH_EQ(th.cuEventQuery(ev_in), CUDA_ERROR_NOT_READY);
	th_send_fd(s, -1, &go, sizeof go);
	TH_OK(sop_event_synchronize(ev_in));
	TH_OK(th.cuEventQuery(ev_in));
	th_send_fd(s, -1, &go, sizeof go);

	for (r = 0; r < ROUNDS; r++) {
		th_recv_fd(s, &m, sizeof m);
		TH_EQ(m.round, r);
		TH_OK(sop_stream_wait_event(st, ev_in, 0));
		TH_OK(th.cuLaunchHostFunc(st, nap, NULL));
		for (i = 0; i < m.n; i++) {
			TH_OK(sop_pool_import_pointer(&q[i], ipool, &m.d[i]));
			check(q[i], m.bytes[i], tag(0, r, i), st);
			late_fill(q[i], m.bytes[i], tag(1, r, i), st);
			TH_OK(sop_free_async(q[i], st));
		}
		TH_OK(sop_event_record(mine, st));
		th_send_fd(s, -1, &m, sizeof m);
	}
	finish(st, ROUNDS * BLOCKS);
	/* Every import's free has completed: nothing stays mapped. */
	TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	TH_OK(sop_pool_destroy(ipool));
	TH_ASSERT(waitpid(child, &status, 0) == child);
	TH_ASSERT(WIFEXITED(status));
	if (WEXITSTATUS(status) == TH_SKIP)
		return TH_SKIP;
	TH_EQ(WEXITSTATUS(status), 0);
	TH_OK(sop_event_destroy(mine));
	TH_OK(sop_event_destroy(ev_in));
	TH_OK(sop_stream_destroy(st));
	printf("ipc-events: %d rounds of %d allocations, ordered by interprocess events: ok\n",
	       ROUNDS, BLOCKS);
	return 0;
}

int
main(void)
{
	int sv[2], status;
	pid_t pid;

	/* Is there a driver with interprocess events? Asked in a child: the two processes must
	 * not inherit an initialised driver. */
	pid = fork();
	TH_ASSERT(pid >= 0);
	if (!pid) {
		setup();
		_exit(0);
	}
	TH_ASSERT(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
	if (WEXITSTATUS(status) == TH_SKIP)
		return TH_SKIP;
	TH_EQ(WEXITSTATUS(status), 0);
	TH_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
	pid = fork();
	TH_ASSERT(pid >= 0);
	if (!pid) {
		close(sv[0]);
		_exit(exporter(sv[1]));
	}
	close(sv[1]);
	return importer(sv[0], pid);
}
