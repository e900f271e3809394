/* ipc.c - the ipc workload: what sharing a pool with another process costs, sop's IPC pool
 * against the driver's.
 *
 * The importer is a second process: sop-bench starts itself again (--ipc-child), so that it
 * opens the driver afresh, as a process that did not fork from a CUDA process must. Per
 * repetition and side, the exporter makes a pool with the POSIX file descriptor handle type,
 * allocates N blocks (more than one 32 MiB step, so that they lie in several pieces), exports the
 * pool and every pointer, and sends the descriptor and the export data over a Unix socket. The
 * importer imports the pool, imports the first pointer (which maps memory) and then the others
 * (most in memory already mapped), frees them in stream order, synchronizes, destroys the pool,
 * and sends back what each step took.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define IPC_BLOCKS 48
#define IPC_BLOCK ((size_t)1 << 20)

struct ipc_order {
	int kind; /* SIDE_SOP or SIDE_POOL; -1: stop */
	int n;
	CUmemPoolPtrExportData data[IPC_BLOCKS];
};

struct ipc_times {
	int ok;
	double pool_import_us, first_import_us, import_us, free_us, destroy_us;
};

static void
send_fd(int sock, int fd, const void *buf, size_t n)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {(void *)buf, n};
	struct msghdr m = {0};

	memset(cbuf, 0, sizeof cbuf);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	if (fd >= 0) {
		struct cmsghdr *c = (struct cmsghdr *)cbuf;
		m.msg_control = cbuf;
		m.msg_controllen = sizeof cbuf;
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof fd);
	}
	if (sendmsg(sock, &m, 0) != (ssize_t)n) {
		fprintf(stderr, "sop-bench: ipc: sendmsg: %s\n", strerror(errno));
		exit(1);
	}
}

/* A message, and the descriptor it carried (-1 if none); false at the end of the stream. */
static bool
recv_fd(int sock, void *buf, size_t n, int *fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {buf, n};
	struct msghdr m = {0};
	struct cmsghdr *c;

	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = cbuf;
	m.msg_controllen = sizeof cbuf;
	*fd = -1;
	if (recvmsg(sock, &m, 0) != (ssize_t)n)
		return false;
	c = CMSG_FIRSTHDR(&m);
	if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
		memcpy(fd, CMSG_DATA(c), sizeof *fd);
	return true;
}

/* ---- The importer ------------------------------------------------------------------------ */

static CUresult
import_pool(int kind, int fd, sop_pool_t *sp, CUmemoryPool *dp)
{
	void *h = (void *)(intptr_t)fd;

	if (kind == SIDE_SOP)
		return sop_pool_import_from_shareable_handle(sp, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
							     0);
	return drv.cuMemPoolImportFromShareableHandle(dp, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
						      0);
}

static CUresult
import_ptr(int kind, sop_pool_t sp, CUmemoryPool dp, CUmemPoolPtrExportData *d, void **p)
{
	CUdeviceptr q;
	CUresult r;

	if (kind == SIDE_SOP)
		return sop_pool_import_pointer(p, sp, d);
	r = drv.cuMemPoolImportPointer(&q, dp, d);
	if (r == CUDA_SUCCESS)
		*p = (void *)(uintptr_t)q;
	return r;
}

static void
import_one(int sock, const struct ipc_order *o, int fd, CUstream s)
{
	struct ipc_times t = {0};
	void *p[IPC_BLOCKS];
	sop_pool_t sp = NULL;
	CUmemoryPool dp = NULL;
	double t0;
	int i;

	t0 = now_ns();
	if (import_pool(o->kind, fd, &sp, &dp) != CUDA_SUCCESS)
		goto out;
	t.pool_import_us = (now_ns() - t0) / 1e3;
	close(fd);
	fd = -1;
	t0 = now_ns();
	CHECK(import_ptr(o->kind, sp, dp, (CUmemPoolPtrExportData *)&o->data[0], &p[0]));
	t.first_import_us = (now_ns() - t0) / 1e3;
	t0 = now_ns();
	for (i = 1; i < o->n; i++)
		CHECK(import_ptr(o->kind, sp, dp, (CUmemPoolPtrExportData *)&o->data[i], &p[i]));
	t.import_us = (now_ns() - t0) / 1e3 / (o->n - 1);
	t0 = now_ns();
	for (i = 0; i < o->n; i++)
		CHECK(o->kind == SIDE_SOP ? sop_free_async(p[i], s)
					  : drv.cuMemFreeAsync((CUdeviceptr)(uintptr_t)p[i], s));
	CHECK(o->kind == SIDE_SOP ? sop_stream_synchronize(s) : drv.cuStreamSynchronize(s));
	t.free_us = (now_ns() - t0) / 1e3 / o->n;
	t0 = now_ns();
	CHECK(o->kind == SIDE_SOP ? sop_pool_destroy(sp) : drv.cuMemPoolDestroy(dp));
	t.destroy_us = (now_ns() - t0) / 1e3;
	t.ok = 1;
out:
	if (fd >= 0)
		close(fd);
	send_fd(sock, -1, &t, sizeof t);
}

int
ipc_child(int sock)
{
	static struct ipc_order o;
	CUstream s;
	int fd, status = env_init();

	if (status)
		return status;
	s = stream_new();
	while (recv_fd(sock, &o, sizeof o, &fd) && o.kind >= 0)
		import_one(sock, &o, fd, s);
	stream_free(s);
	env_fini();
	return 0;
}

/* ---- The exporter ------------------------------------------------------------------------ */

struct ipc_side {
	int kind;
	sop_pool_t sp;
	CUmemoryPool dp;
};

static bool
ipc_pool(struct ipc_side *x, int kind)
{
	CUmemPoolProps props = {0};

	memset(x, 0, sizeof *x);
	x->kind = kind;
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = env.dev;
	props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	if (kind == SIDE_SOP)
		return sop_pool_create(&x->sp, &props) == CUDA_SUCCESS;
	return env.pools && drv.cuMemPoolExportToShareableHandle && drv.cuMemPoolImportPointer &&
	       drv.cuMemPoolCreate(&x->dp, &props) == CUDA_SUCCESS;
}

/* One repetition of one side: false if the side cannot share pools here. */
static bool
export_one(int sock, int kind, CUstream s, struct metric **m)
{
	static struct ipc_order o;
	struct ipc_times t;
	struct ipc_side x;
	void *p[IPC_BLOCKS];
	double t0, t_export;
	int fd = -1, back, i;
	CUresult r;

	if (!ipc_pool(&x, kind))
		return false;
	for (i = 0; i < IPC_BLOCKS; i++) {
		if (kind == SIDE_SOP) {
			CHECK(sop_malloc_from_pool_async(&p[i], IPC_BLOCK, x.sp, s));
		} else {
			CUdeviceptr d;
			CHECK(drv.cuMemAllocFromPoolAsync(&d, IPC_BLOCK, x.dp, s));
			p[i] = (void *)(uintptr_t)d;
		}
	}
	t0 = now_ns();
	r = kind == SIDE_SOP ? sop_pool_export_to_shareable_handle(
				       &fd, x.sp, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
			     : drv.cuMemPoolExportToShareableHandle(
				       &fd, x.dp, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	t_export = (now_ns() - t0) / 1e3;
	if (r == CUDA_SUCCESS) {
		metric_add(m[0], kind, t_export);
		t0 = now_ns();
		for (i = 0; i < IPC_BLOCKS; i++)
			CHECK(kind == SIDE_SOP ? sop_pool_export_pointer(&o.data[i], p[i])
					       : drv.cuMemPoolExportPointer(
							 &o.data[i], (CUdeviceptr)(uintptr_t)p[i]));
		metric_add(m[1], kind, (now_ns() - t0) / 1e3 / IPC_BLOCKS);
		CHECK(kind == SIDE_SOP ? sop_stream_synchronize(s) : drv.cuStreamSynchronize(s));
		o.kind = kind;
		o.n = IPC_BLOCKS;
		send_fd(sock, fd, &o, sizeof o);
		close(fd);
		if (!recv_fd(sock, &t, sizeof t, &back) || !t.ok) {
			fprintf(stderr, "sop-bench: ipc: the importer failed (%s)\n", side_names[kind]);
			exit(1);
		}
		metric_add(m[2], kind, t.pool_import_us);
		metric_add(m[3], kind, t.first_import_us);
		metric_add(m[4], kind, t.import_us);
		metric_add(m[5], kind, t.free_us);
		metric_add(m[6], kind, t.destroy_us);
	}
	for (i = 0; i < IPC_BLOCKS; i++)
		CHECK(kind == SIDE_SOP ? sop_free_async(p[i], s)
				       : drv.cuMemFreeAsync((CUdeviceptr)(uintptr_t)p[i], s));
	CHECK(kind == SIDE_SOP ? sop_stream_synchronize(s) : drv.cuStreamSynchronize(s));
	CHECK(kind == SIDE_SOP ? sop_pool_destroy(x.sp) : drv.cuMemPoolDestroy(x.dp));
	return r == CUDA_SUCCESS;
}

void
wl_ipc(void)
{
	static const int kinds[] = {SIDE_SOP, SIDE_POOL};
	static const char *const names[7] = {"pool export",    "pointer export", "pool import",
					     "first pointer import", "pointer import",
					     "imported free",  "imported pool destroy"};
	struct ipc_order stop = {.kind = -1};
	struct metric *m[7];
	bool gone[2] = {false, false};
	char arg[16];
	int sv[2], status, r, k, i;
	CUstream s;
	pid_t pid;

	describe("An exportable pool (POSIX file descriptor) shared with a second process (this "
		 "program, started again): the exporter allocates %d blocks of 1 MiB, exports the "
		 "pool and each pointer, and sends the descriptor and the data over a Unix socket; "
		 "the importer imports the pool, the first pointer (which maps memory), the rest, "
		 "frees them in stream order and synchronizes, and destroys the imported pool. "
		 "Per-pointer figures are means over the blocks of a repetition.",
		 IPC_BLOCKS);
	for (i = 0; i < 7; i++)
		m[i] = metric_new("ipc", "two processes", names[i], names[i], "us", 0, false);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
		note("ipc: no socket pair: %s", strerror(errno));
		return;
	}
	snprintf(arg, sizeof arg, "%d", sv[1]);
	pid = fork();
	if (pid == 0) {
		/* The child keeps its end across exec; nothing else of this process. */
		int fl = fcntl(sv[1], F_GETFD);
		fcntl(sv[1], F_SETFD, fl & ~FD_CLOEXEC);
		execl("/proc/self/exe", "sop-bench", "--ipc-child", arg, (char *)NULL);
		_exit(127);
	}
	close(sv[1]);
	if (pid < 0) {
		note("ipc: cannot start the importer: %s", strerror(errno));
		close(sv[0]);
		return;
	}
	s = stream_new();
	for (r = 0; r < opts.reps && budget_left("ipc"); r++)
		for (k = 0; k < 2; k++) {
			int kind = kinds[(r + k) % 2];
			if (gone[kind == SIDE_POOL] || !side_allowed(kind))
				continue;
			if (!export_one(sv[0], kind, s, m)) {
				gone[kind == SIDE_POOL] = true;
				note("ipc: %s cannot export a pool here", side_names[kind]);
			}
		}
	send_fd(sv[0], -1, &stop, sizeof stop);
	close(sv[0]);
	waitpid(pid, &status, 0);
	stream_free(s);
	for (i = 0; i < 7; i++)
		metric_done(m[i]);
}
