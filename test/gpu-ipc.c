/* gpu-ipc.c - two processes share a pool on a GPU, ordered only by interprocess events: each
 * round the exporter's kernels write tags into fresh allocations of mixed sizes (some large
 * enough to grow the pool after the import) and record an event; the importer's stream waits on
 * it, its kernels check the tags and write their own, it frees its imports in stream order and
 * records its event; the exporter's stream waits on that, its kernels check the importer's tags,
 * and it frees. Nothing on either side synchronizes with the host until the end, when the
 * counts of wrong blocks must be zero. Needs a GPU (exit 77 without).
 */
#include <dlfcn.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

#define ROUNDS 40
#define BLOCKS 6
#define SPIN 20000LL

struct msg {
	int round, n;
	size_t bytes[BLOCKS];
	CUmemPoolPtrExportData d[BLOCKS];
	CUipcEventHandle ev;
};

static __typeof__(cuIpcGetEventHandle) *get_ev;
static __typeof__(cuIpcOpenEventHandle) *open_ev;

static void
setup(void)
{
	void *dl, *sym;

	th_init();
	th_require_gpu();
	th_kernels_load();
	dl = sop__driver_handle();
	sym = dlsym(dl, "cuIpcGetEventHandle");
	memcpy(&get_ev, &sym, sizeof sym);
	sym = dlsym(dl, "cuIpcOpenEventHandle");
	memcpy(&open_ev, &sym, sizeof sym);
	TH_ASSERT(get_ev && open_ev);
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

static int
exporter(int s)
{
	CUmemPoolProps props = {0};
	CUipcEventHandle theirs;
	struct msg m;
	sop_pool_t pool;
	CUevent mine, ev_in;
	CUstream st;
	unsigned *bad, host_bad = 0;
	void *p[BLOCKS];
	int fd, r, i;

	setup();
	st = th_stream();
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	TH_OK(sop_pool_create(&pool, &props));
	TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
						  0));
	TH_OK(sop_malloc_async((void **)&bad, sizeof *bad, st));
	TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)bad, 0, 1, st));
	memset(&m, 0, sizeof m);
	mine = ipc_event(&m.ev);
	m.round = -1;
	th_send_fd(s, fd, &m, sizeof m);
	close(fd);
	th_recv_fd(s, &theirs, sizeof theirs);
	TH_OK(open_ev(&ev_in, theirs));

	for (r = 0; r < ROUNDS; r++) {
		memset(&m, 0, sizeof m);
		m.round = r;
		m.n = BLOCKS;
		for (i = 0; i < BLOCKS; i++) {
			m.bytes[i] = size_of(r, i);
			TH_OK(sop_malloc_from_pool_async(&p[i], m.bytes[i], pool, st));
			th_spin_fill(p[i], m.bytes[i] / 4, tag(0, r, i), SPIN, st);
			TH_OK(sop_pool_export_pointer(&m.d[i], p[i]));
		}
		TH_OK(sop_event_record(mine, st));
		th_send_fd(s, -1, &m, sizeof m);
		/* The importer's frees and tags, ordered by its event. */
		th_recv_fd(s, &m, sizeof m);
		TH_EQ(m.round, r);
		TH_OK(sop_stream_wait_event(st, ev_in, 0));
		for (i = 0; i < BLOCKS; i++) {
			th_check(p[i], m.bytes[i] / 4, tag(1, r, i), bad, st);
			TH_OK(sop_free_async(p[i], st));
		}
	}
	TH_OK(th.cuMemcpyDtoHAsync(&host_bad, (CUdeviceptr)(uintptr_t)bad, sizeof host_bad, st));
	TH_OK(sop_stream_synchronize(st));
	TH_EQ(host_bad, 0);
	TH_OK(sop_free_async(bad, st));
	TH_OK(sop_stream_synchronize(st));
	TH_OK(sop_pool_destroy(pool));
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
	unsigned *bad, host_bad = 0;
	void *q[BLOCKS];
	int fd, r, i, status;

	setup();
	st = th_stream();
	TH_OK(sop_malloc_async((void **)&bad, sizeof *bad, st));
	TH_OK(th.cuMemsetD32Async((CUdeviceptr)(uintptr_t)bad, 0, 1, st));
	fd = th_recv_fd(s, &m, sizeof m);
	TH_ASSERT(fd >= 0);
	TH_OK(sop_pool_import_from_shareable_handle(&ipool, (void *)(intptr_t)fd,
						    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	close(fd);
	TH_OK(open_ev(&ev_in, m.ev));
	mine = ipc_event(&h);
	th_send_fd(s, -1, &h, sizeof h);

	for (r = 0; r < ROUNDS; r++) {
		th_recv_fd(s, &m, sizeof m);
		TH_EQ(m.round, r);
		TH_OK(sop_stream_wait_event(st, ev_in, 0));
		for (i = 0; i < m.n; i++) {
			TH_OK(sop_pool_import_pointer(&q[i], ipool, &m.d[i]));
			th_check(q[i], m.bytes[i] / 4, tag(0, r, i), bad, st);
			th_spin_fill(q[i], m.bytes[i] / 4, tag(1, r, i), SPIN, st);
			TH_OK(sop_free_async(q[i], st));
		}
		TH_OK(sop_event_record(mine, st));
		th_send_fd(s, -1, &m, sizeof m);
	}
	TH_OK(th.cuMemcpyDtoHAsync(&host_bad, (CUdeviceptr)(uintptr_t)bad, sizeof host_bad, st));
	TH_OK(sop_stream_synchronize(st));
	TH_EQ(host_bad, 0);
	/* Every import's free has completed: nothing stays mapped. */
	TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	TH_OK(sop_pool_destroy(ipool));
	TH_ASSERT(waitpid(child, &status, 0) == child);
	TH_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	printf("gpu-ipc: %d rounds of %d blocks, tags checked both ways: ok\n", ROUNDS, BLOCKS);
	return 0;
}

int
main(void)
{
	int sv[2], status;
	pid_t pid;

	/* Is there a GPU? Asked in a child: the two processes must not inherit an initialised
	 * driver. */
	pid = fork();
	TH_ASSERT(pid >= 0);
	if (!pid) {
		setup();
		_exit(0);
	}
	TH_ASSERT(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
	if (WEXITSTATUS(status) == TH_SKIP) {
		printf("skip: needs a GPU\n");
		return TH_SKIP;
	}
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
