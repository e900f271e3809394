/* ipc.c - pools shared between two processes: export and import of pools and pointers, data
 * written by each side and read by the other, memory the exporter maps after the import, the
 * importer's frees and what they unmap, an exporter that destroys its pool or exits, and every
 * misuse the driver refuses, each with its code and nothing changed. No descriptor and no driver
 * object is left behind.
 *
 * The processes part before either touches the driver (a child of a process that initialised
 * CUDA may not use it). The importer is the parent, so that the exporter can exit under it. They
 * order their work through synchronizations and messages on a Unix socket, which also carries
 * the pool's descriptor (SCM_RIGHTS).
 */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#define POSIX_FD CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR

enum op { GO, POOL, MORE, OTHER, STALE, HOSTNUMA, KEEP, DESTROYED, DONE };

struct msg {
	int op, n;
	size_t size[4];
	CUmemPoolPtrExportData d[4];
};

static void
send_msg(int s, int fd, const struct msg *m)
{
	th_send_fd(s, fd, m, sizeof *m);
}

/* The next message (op checked), and its descriptor or -1. */
static int
recv_msg(int s, struct msg *m, int op)
{
	int fd = th_recv_fd(s, m, sizeof *m);

	TH_EQ(m->op, op);
	return fd;
}

static void
say(int s, int op)
{
	struct msg m = {.op = op};

	send_msg(s, -1, &m);
}

static int
open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1; /* the directory's own */
}

/* ---- The exporter (the child) -------------------------------------------------------------- */

static sop_pool_t
ipc_pool(void)
{
	CUmemPoolProps props = {0};
	sop_pool_t p;

	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.handleTypes = POSIX_FD;
	TH_OK(sop_pool_create(&p, &props));
	return p;
}

/* The pieces under n allocations of pool, once the broker's second thread has done with them
 * (none marked or being exported: share.c, ahead_export) and the simulated driver has failed
 * `fails` exports: how many, and in *bare how many of them have no descriptor. Up to 10 s. */
static size_t
ahead_settled(sop_pool_t pool, void *const *ptr, const size_t *size, int n, unsigned long fails,
	      size_t *bare)
{
	struct th_pieces pc = {0, 0, 0};
	int tries, busy = 1;

	for (tries = 0; busy && tries < 10000; tries++) {
		if (tries)
			usleep(1000);
		busy = fails && th.sim_fails("cuMemExportToShareableHandle") < fails;
		pc = th_pool_pieces(pool, ptr, size, n);
		busy |= pc.busy != 0;
	}
	TH_EQ(busy, 0);
	*bare = pc.bare;
	return pc.n;
}

/* Once n pointers of pool were exported, the pieces under them get their descriptors without
 * any importer asking (share.c, ahead_mark). The simulated driver's count of exports then,
 * where there is one, each of those pieces once. */
static unsigned long
ahead_check(sop_pool_t pool, void *const *ptr, const size_t *size, int n)
{
	size_t bare, pieces = ahead_settled(pool, ptr, size, n, 0, &bare);

	TH_EQ(bare, 0);
	TH_ASSERT(pieces >= 2);
	if (!th.sim_calls)
		return 0;
	TH_EQ(th.sim_calls("cuMemExportToShareableHandle"), pieces);
	return pieces;
}

static int
exporter(int s)
{
	static const size_t sizes[3] = {4096, (size_t)3 << 20, (size_t)64 << 20};
	CUmemPoolPtrExportData d;
	struct msg m = {0};
	sop_pool_t pool, plain, def, other;
	void *p[3], *q, *more, *x, *keep;
	CUstream st;
	int fd, i;
	unsigned long long flags = 1;
	unsigned long exports, calls = 0, fails = 0;
	size_t more_pieces = 0, bare = 0, more_size = (size_t)256 << 20;

	th_init();
	st = th_stream();
	pool = ipc_pool();
	plain = th_pool(0, 0);
	TH_OK(sop_device_get_default_pool(&def, 0));

	/* Pools that do not export, and arguments the driver refuses. */
	TH_EQ(sop_pool_export_to_shareable_handle(&fd, def, POSIX_FD, 0), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_export_to_shareable_handle(&fd, plain, POSIX_FD, 0), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_export_to_shareable_handle(&fd, pool, CU_MEM_HANDLE_TYPE_NONE, 0),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_export_to_shareable_handle(&fd, pool, CU_MEM_HANDLE_TYPE_FABRIC, 0),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_export_to_shareable_handle(&fd, pool, POSIX_FD, flags),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_export_to_shareable_handle(NULL, pool, POSIX_FD, 0), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_export_to_shareable_handle(&fd, NULL, POSIX_FD, 0), CUDA_ERROR_INVALID_VALUE);

	/* Pointers that do not export. */
	TH_OK(sop_malloc_from_pool_async(&q, 4096, plain, st));
	TH_EQ(sop_pool_export_pointer(&d, q), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_free_async(q, st));
	TH_OK(sop_malloc_from_pool_async(&q, 8192, pool, st));
	TH_EQ(sop_pool_export_pointer(&d, (char *)q + 512), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_export_pointer(NULL, q), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_export_pointer(&d, NULL), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_free_async(q, st));
	TH_OK(sop_stream_synchronize(st));
	TH_EQ(sop_pool_export_pointer(&d, q), CUDA_ERROR_INVALID_VALUE);

	/* The pool and three allocations, filled. */
	TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, POSIX_FD, 0));
	m.op = POOL;
	m.n = 3;
	for (i = 0; i < 3; i++) {
		TH_OK(sop_malloc_from_pool_async(&p[i], sizes[i], pool, st));
		th_fill(p[i], sizes[i], 0xe0000000u + (unsigned)i, st);
		TH_OK(sop_pool_export_pointer(&m.d[i], p[i]));
		m.size[i] = sizes[i];
	}
	TH_OK(sop_stream_synchronize(st));
	exports = ahead_check(pool, p, sizes, 3);
	send_msg(s, fd, &m);
	TH_EQ(close(fd), 0);

	/* The importer wrote its own patterns and freed its imports first: the pieces exported
	 * ahead served its requests, and none was exported again. */
	recv_msg(s, &m, GO);
	if (th.sim_calls)
		TH_EQ(th.sim_calls("cuMemExportToShareableHandle"), exports);
	for (i = 0; i < 3; i++) {
		TH_ASSERT(th_verify(p[i], sizes[i], 0x10000000u + (unsigned)i, st));
		TH_OK(sop_free_async(p[i], st));
	}
	TH_OK(sop_stream_synchronize(st));

	/* Memory mapped after the import: a growth of 256 MiB. */
	TH_OK(sop_malloc_from_pool_async(&more, (size_t)256 << 20, pool, st));
	th_fill(more, (size_t)256 << 20, 0xabcd0001u, st);
	memset(&m, 0, sizeof m);
	m.op = MORE;
	m.n = 1;
	m.size[0] = (size_t)256 << 20;
	/* Its first export ahead fails: the piece is left to the importer's request, which
	 * exports it (share.c, ahead_export), and nothing is left half done. */
	if (th.sim_fail) {
		calls = th.sim_calls("cuMemExportToShareableHandle");
		fails = th.sim_fails("cuMemExportToShareableHandle");
		th.sim_fail("cuMemExportToShareableHandle", 1, CUDA_ERROR_OUT_OF_MEMORY);
	}
	TH_OK(sop_pool_export_pointer(&m.d[0], more));
	if (th.sim_fail) {
		more_pieces = ahead_settled(pool, &more, &more_size, 1, fails + 1, &bare);
		TH_EQ(bare, 1);
		TH_EQ(th.sim_calls("cuMemExportToShareableHandle"), calls + more_pieces);
	}
	TH_OK(sop_stream_synchronize(st));
	send_msg(s, -1, &m);
	recv_msg(s, &m, GO);
	if (th.sim_fail) {
		TH_EQ(th.sim_calls("cuMemExportToShareableHandle"), calls + more_pieces + 1);
		TH_EQ(ahead_settled(pool, &more, &more_size, 1, fails + 1, &bare), more_pieces);
		TH_EQ(bare, 0);
	}
	TH_OK(sop_free_async(more, st));

	/* Another exportable pool: its data is refused by the first one's import. */
	other = ipc_pool();
	TH_OK(sop_pool_export_to_shareable_handle(&fd, other, POSIX_FD, 0));
	TH_OK(sop_malloc_from_pool_async(&x, 4096, other, st));
	th_fill(x, 4096, 0x0777u, st);
	memset(&m, 0, sizeof m);
	m.op = OTHER;
	m.n = 1;
	m.size[0] = 4096;
	TH_OK(sop_pool_export_pointer(&m.d[0], x));
	TH_OK(sop_stream_synchronize(st));
	send_msg(s, fd, &m);
	TH_EQ(close(fd), 0);
	recv_msg(s, &m, GO);
	TH_OK(sop_free_async(x, st));

	/* Stale data: exported, freed, the same block allocated again. */
	TH_OK(sop_malloc_from_pool_async(&q, 4096, pool, st));
	memset(&m, 0, sizeof m);
	m.op = STALE;
	m.n = 1;
	TH_OK(sop_pool_export_pointer(&m.d[0], q));
	TH_OK(sop_free_async(q, st));
	TH_OK(sop_stream_synchronize(st));
	TH_OK(sop_malloc_from_pool_async(&x, 4096, pool, st));
	send_msg(s, -1, &m);
	recv_msg(s, &m, GO);
	TH_OK(sop_free_async(x, st));

	/* Pinned host memory of a NUMA node, shared: the CPUs of both processes read and write
	 * it. Where the driver makes no such memory, the pool is not made and nothing is sent. */
	{
		CUmemPoolProps hp = {0};
		sop_pool_t host = NULL;
		unsigned *h = NULL;
		int hfd = -1;
		size_t k;

		hp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		hp.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
		hp.location.id = 0;
		hp.handleTypes = POSIX_FD;
		memset(&m, 0, sizeof m);
		m.op = HOSTNUMA;
		if (sop_pool_create(&host, &hp) == CUDA_SUCCESS) {
			TH_OK(sop_malloc_from_pool_async((void **)&h, (size_t)1 << 20, host, st));
			TH_OK(sop_stream_synchronize(st));
			for (k = 0; k < ((size_t)1 << 20) / 4; k++)
				h[k] = 0x4e554d41u + (unsigned)k;
			TH_OK(sop_pool_export_to_shareable_handle(&hfd, host, POSIX_FD, 0));
			TH_OK(sop_pool_export_pointer(&m.d[0], h));
			m.n = 1;
			m.size[0] = (size_t)1 << 20;
		}
		send_msg(s, hfd, &m);
		if (hfd >= 0)
			close(hfd);
		recv_msg(s, &m, GO);
		if (host) {
			for (k = 0; k < ((size_t)1 << 20) / 4; k++)
				TH_EQ(h[k], ~(0x4e554d41u + (unsigned)k));
			TH_OK(sop_free_async(h, st));
			TH_OK(sop_stream_synchronize(st));
			TH_OK(sop_pool_destroy(host));
		}
	}

	/* A block the importer keeps while this process destroys its other pool and exits. */
	TH_OK(sop_malloc_from_pool_async(&keep, (size_t)1 << 20, pool, st));
	th_fill(keep, (size_t)1 << 20, 0x4b454550u, st);
	memset(&m, 0, sizeof m);
	m.op = KEEP;
	m.n = 1;
	m.size[0] = (size_t)1 << 20;
	TH_OK(sop_pool_export_pointer(&m.d[0], keep));
	TH_OK(sop_stream_synchronize(st));
	send_msg(s, -1, &m);
	recv_msg(s, &m, GO);
	TH_OK(sop_stream_synchronize(st));
	TH_OK(sop_pool_destroy(other));
	say(s, DESTROYED);
	recv_msg(s, &m, GO);
	/* Exit with the kept block allocated, its pool alive: the importer's mapping must stay. */
	_exit(0);
}

/* ---- The importer (the parent) ------------------------------------------------------------- */

static void
import_refusals(sop_pool_t ipool)
{
	CUmemPoolPtrExportData junk;
	int pipefd[2], sv[2], devnull, closed;
	sop_pool_t p;
	void *q;
	double t0;
	size_t i;

	TH_EQ(sop_pool_import_from_shareable_handle(NULL, (void *)(intptr_t)0, POSIX_FD, 0),
	      CUDA_ERROR_INVALID_VALUE);
	TH_ASSERT(pipe(pipefd) == 0);
	TH_EQ(sop_pool_import_from_shareable_handle(&p, (void *)(intptr_t)pipefd[0], POSIX_FD, 0),
	      CUDA_ERROR_INVALID_VALUE);
	devnull = open("/dev/null", O_RDWR);
	TH_ASSERT(devnull >= 0);
	TH_EQ(sop_pool_import_from_shareable_handle(&p, (void *)(intptr_t)devnull, POSIX_FD, 0),
	      CUDA_ERROR_INVALID_VALUE);
	closed = devnull;
	close(devnull);
	TH_EQ(sop_pool_import_from_shareable_handle(&p, (void *)(intptr_t)closed, POSIX_FD, 0),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_import_from_shareable_handle(&p, (void *)(intptr_t)-1, POSIX_FD, 0),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_import_from_shareable_handle(&p, (void *)(intptr_t)pipefd[0],
						    CU_MEM_HANDLE_TYPE_NONE, 0),
	      CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_import_from_shareable_handle(&p, (void *)(intptr_t)pipefd[0], POSIX_FD, 1),
	      CUDA_ERROR_INVALID_VALUE);
	close(pipefd[0]);
	close(pipefd[1]);
	/* A socket nobody serves answers within seconds. */
	TH_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
	t0 = th_seconds();
	TH_EQ(sop_pool_import_from_shareable_handle(&p, (void *)(intptr_t)sv[0], POSIX_FD, 0),
	      CUDA_ERROR_INVALID_VALUE);
	TH_ASSERT(th_seconds() - t0 < 15);
	close(sv[0]);
	close(sv[1]);

	/* An imported pool allocates nothing, is nobody's current pool, exports nothing. */
	TH_EQ(sop_malloc_from_pool_async(&q, 4096, ipool, NULL), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_device_set_pool(0, ipool), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_export_to_shareable_handle(&sv[0], ipool, POSIX_FD, 0),
	      CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_trim_to(ipool, 0));
	/* CUDA 13.2's EXPORT_HANDLE_TYPES (10) says so; LOCATION_TYPE (12) and ALLOCATION_TYPE (9)
	 * are the exporter's. */
	TH_EQ(th_attr_int(ipool, 10), CU_MEM_HANDLE_TYPE_NONE);
	TH_EQ(th_attr_int(ipool, 12), CU_MEM_LOCATION_TYPE_DEVICE);
	TH_EQ(th_attr_int(ipool, 9), CU_MEM_ALLOCATION_TYPE_PINNED);

	/* Forged data. */
	for (i = 0; i < sizeof junk.reserved; i++)
		junk.reserved[i] = (unsigned char)(i * 37 + 11);
	TH_EQ(sop_pool_import_pointer(&q, ipool, &junk), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_import_pointer(NULL, ipool, &junk), CUDA_ERROR_INVALID_VALUE);
	TH_EQ(sop_pool_import_pointer(&q, ipool, NULL), CUDA_ERROR_INVALID_VALUE);
}

static int
importer(int s, pid_t child)
{
	struct msg m, more, other;
	sop_pool_t ipool, ipool2, found;
	void *q[3], *x;
	CUstream st;
	int fd, fd2, i, status, fds0;
	bool sim;
	struct sim_live live0;
	size_t total = 0;
	unsigned char saved;

	sim = th_init();
	st = th_stream();
	live0 = th_live();
	fds0 = open_fds();

	fd = recv_msg(s, &m, POOL);
	TH_ASSERT(fd >= 0);
	TH_OK(sop_pool_import_from_shareable_handle(&ipool, (void *)(intptr_t)fd, POSIX_FD, 0));
	import_refusals(ipool);
	TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	for (i = 0; i < m.n; i++) {
		TH_OK(sop_pool_import_pointer(&q[i], ipool, &m.d[i]));
		TH_OK(sop_pointer_get_pool(&found, q[i]));
		TH_ASSERT(found == ipool);
		TH_ASSERT(th_verify(q[i], m.size[i], 0xe0000000u + (unsigned)i, st));
		total += m.size[i];
	}
	/* A byte changed in valid data is refused, as the same data imported twice is not. */
	saved = m.d[1].reserved[20];
	m.d[1].reserved[20] ^= 0x40;
	TH_EQ(sop_pool_import_pointer(&x, ipool, &m.d[1]), CUDA_ERROR_INVALID_VALUE);
	m.d[1].reserved[20] = saved;
	TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), total);
	TH_ASSERT(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= total);
	TH_CHECK(ipool);
	for (i = 0; i < m.n; i++) {
		th_fill(q[i], m.size[i], 0x10000000u + (unsigned)i, st);
		TH_OK(sop_free_async(q[i], st));
	}
	TH_EQ(sop_free_async(q[0], st), CUDA_ERROR_INVALID_VALUE); /* freed already */
	TH_OK(sop_stream_synchronize(st));
	TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0); /* unmapped */
	TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), total);
	TH_CHECK(ipool);
	say(s, GO);

	/* Memory the exporter mapped after the import. */
	recv_msg(s, &more, MORE);
	if (sim) {
		/* Its piece not opened, and its unmap refused: the import fails with the driver's
		 * code and the piece stays mapped, kept and unused, until an unmap goes through,
		 * tried at a synchronization point and before the range is mapped again. */
		struct sim_live l0 = th_live();
		int round;

		for (round = 0; round < 2; round++) {
			th.sim_fail("cuMemSetAccess", 1, CUDA_ERROR_UNKNOWN);
			th.sim_fail_rate("cuMemUnmap", 1.0, CUDA_ERROR_UNKNOWN);
			x = (void *)0x1;
			TH_EQ(sop_pool_import_pointer(&x, ipool, &more.d[0]), CUDA_ERROR_UNKNOWN);
			TH_ASSERT(x == (void *)0x1);
			th.sim_fail_clear();
			TH_EQ(th_live().mappings, l0.mappings + 1);
			TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
			TH_CHECK(ipool);
			if (!round) {
				TH_OK(sop_ctx_synchronize());
				TH_EQ(th_live().mappings, l0.mappings);
				TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
			}
		}
		/* Then imports and frees with the mapping calls failing at random: each import
		 * succeeds, with its data, or fails with the driver's code; the pool stays sound,
		 * and once the driver cooperates a synchronization leaves nothing mapped. */
		th.sim_fail_seed(15);
		for (round = 0; round < 100; round++) {
			CUresult r;

			th.sim_fail_rate("cuMemMap", 0.2, CUDA_ERROR_UNKNOWN);
			th.sim_fail_rate("cuMemSetAccess", 0.3, CUDA_ERROR_UNKNOWN);
			th.sim_fail_rate("cuMemUnmap", 0.4, CUDA_ERROR_UNKNOWN);
			th.sim_fail_rate("cuMemRelease", 0.3, CUDA_ERROR_UNKNOWN);
			r = sop_pool_import_pointer(&x, ipool, &more.d[0]);
			th.sim_fail_clear();
			TH_ASSERT(r == CUDA_SUCCESS || r == CUDA_ERROR_UNKNOWN);
			TH_CHECK(ipool);
			if (r == CUDA_SUCCESS) {
				/* Its first and last MiB: the whole of it each time is slow under TSan. */
				TH_ASSERT(th_verify(x, 1 << 20, 0xabcd0001u, st));
				TH_ASSERT(th_verify((char *)x + more.size[0] - (1 << 20), 1 << 20,
						    0xabcd0001u, st));
				th.sim_fail_rate("cuMemUnmap", 0.4, CUDA_ERROR_UNKNOWN);
				th.sim_fail_rate("cuMemRelease", 0.3, CUDA_ERROR_UNKNOWN);
				TH_OK(round % 2 ? sop_free(x) : sop_free_async(x, st));
				th.sim_fail_clear();
				TH_CHECK(ipool);
			}
			if (round % 7 == 0)
				TH_OK(sop_ctx_synchronize());
		}
		TH_OK(sop_ctx_synchronize());
		TH_EQ(th_live().mappings, l0.mappings);
		TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
		TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	}
	TH_OK(sop_pool_import_pointer(&x, ipool, &more.d[0]));
	TH_ASSERT(th_verify(x, more.size[0], 0xabcd0001u, st));
	TH_OK(sop_free(x)); /* the synchronous free unmaps at once */
	TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	say(s, GO);

	/* Data of another pool: refused by this one, taken by its own. */
	fd2 = recv_msg(s, &other, OTHER);
	TH_EQ(sop_pool_import_pointer(&x, ipool, &other.d[0]), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_pool_import_from_shareable_handle(&ipool2, (void *)(intptr_t)fd2, POSIX_FD, 0));
	TH_OK(sop_pool_import_pointer(&x, ipool2, &other.d[0]));
	TH_ASSERT(th_verify(x, 4096, 0x0777u, st));
	TH_OK(sop_free_async(x, st));
	TH_OK(sop_stream_synchronize(st));
	TH_OK(sop_pool_destroy(ipool2));
	TH_EQ(sop_pool_destroy(ipool2), CUDA_ERROR_INVALID_VALUE);
	say(s, GO);

	/* Stale data. */
	recv_msg(s, &m, STALE);
	TH_EQ(sop_pool_import_pointer(&x, ipool, &m.d[0]), CUDA_ERROR_INVALID_VALUE);
	say(s, GO);

	/* Host memory of a NUMA node, read and written by this process's CPU. */
	{
		int hfd = recv_msg(s, &m, HOSTNUMA);
		sop_pool_t hpool;
		unsigned *h;
		size_t k;

		if (m.n) {
			CUmemLocation cpu = {CU_MEM_LOCATION_TYPE_HOST_NUMA, 0};
			CUmemAccess_flags f = CU_MEM_ACCESS_FLAGS_PROT_NONE;

			TH_ASSERT(hfd >= 0);
			TH_OK(sop_pool_import_from_shareable_handle(&hpool, (void *)(intptr_t)hfd,
								    POSIX_FD, 0));
			close(hfd);
			TH_OK(sop_pool_get_access(&f, hpool, &cpu));
			TH_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
			TH_OK(sop_pool_import_pointer((void **)&h, hpool, &m.d[0]));
			for (k = 0; k < m.size[0] / 4; k++) {
				TH_EQ(h[k], 0x4e554d41u + (unsigned)k);
				h[k] = ~h[k];
			}
			TH_OK(sop_free(h));
			TH_OK(sop_pool_destroy(hpool));
			printf("ipc: a HOST_NUMA pool shared\n");
		} else {
			printf("ipc: no HOST_NUMA pool with a shareable handle on this driver\n");
		}
	}
	say(s, GO);

	/* A block kept across the exporter's destruction of its other pool, and its exit. */
	recv_msg(s, &m, KEEP);
	TH_OK(sop_pool_import_pointer(&x, ipool, &m.d[0]));
	TH_ASSERT(th_verify(x, m.size[0], 0x4b454550u, st));
	say(s, GO);
	recv_msg(s, &m, DESTROYED);
	{
		/* The other pool's descriptor names a broker that is gone. */
		sop_pool_t p;
		TH_EQ(sop_pool_import_from_shareable_handle(&p, (void *)(intptr_t)fd2, POSIX_FD, 0),
		      CUDA_ERROR_INVALID_VALUE);
		TH_EQ(sop_pool_import_pointer(&x, ipool, &other.d[0]), CUDA_ERROR_INVALID_VALUE);
	}
	say(s, GO);
	TH_ASSERT(waitpid(child, &status, 0) == child);
	TH_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* The exporter is gone: what was imported stays, nothing more comes. */
	TH_ASSERT(th_verify(x, m.size[0], 0x4b454550u, st));
	TH_EQ(sop_pool_import_pointer(&q[0], ipool, &more.d[0]), CUDA_ERROR_INVALID_VALUE);
	{
		sop_pool_t p;
		TH_EQ(sop_pool_import_from_shareable_handle(&p, (void *)(intptr_t)fd, POSIX_FD, 0),
		      CUDA_ERROR_INVALID_VALUE);
	}
	/* Destroyed with the import live: torn down once its free has completed. */
	TH_OK(sop_pool_destroy(ipool));
	TH_EQ(sop_pool_import_pointer(&q[0], ipool, &m.d[0]), CUDA_ERROR_INVALID_VALUE);
	TH_OK(sop_free_async(x, st));
	TH_OK(sop_stream_synchronize(st));
	TH_ASSERT(TH_POOL(ipool) == NULL);

	close(fd);
	close(fd2);
	if (sim) {
		struct sim_live l = th_live();
		TH_EQ(l.reservations, live0.reservations);
		TH_EQ(l.handles, live0.handles);
		TH_EQ(l.mappings, live0.mappings);
	}
	/* The driver opens descriptors of its own on a GPU: counted only on the simulated one. */
	if (sim)
		TH_EQ(open_fds(), fds0);
	th_stream_destroy(st);
	printf("ipc: two processes, %zu bytes imported and written both ways: ok\n", total);
	return 0;
}

int
main(void)
{
	int sv[2];
	pid_t pid;

	TH_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
	pid = fork();
	TH_ASSERT(pid >= 0);
	if (!pid) {
		close(sv[0]);
		exporter(sv[1]);
		_exit(0);
	}
	close(sv[1]);
	return importer(sv[0], pid);
}
