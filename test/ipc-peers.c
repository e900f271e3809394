/* ipc-peers.c - a shared pool's lifetimes across processes, beyond one importer's round trip
 * (test/ipc.c): two importers of one pool at once, each importing and freeing from several
 * threads while the exporter grows the pool; an importer that dies holding its imports, or
 * sends the broker garbage; an exporter that destroys its pool, or exits, under an importer that
 * still maps some of its memory (nothing more may be imported, what was stays readable), with
 * a forked child of the exporter that outlives it; the exporter's trims and releases under a
 * live import; a piece released and made again at the same place; one pool imported several
 * times, through several exported descriptors; every byte of export data changed, one at a
 * time; an allocation over two pieces; more pieces asked for than the exporter keeps
 * descriptors of (it closes the least recently asked for, and exports it again); refused exports that start no thread and open no
 * descriptor, one broker per pool however often it is exported; imports and frees on several
 * threads racing the imported pool's destruction. Each process ends with its driver objects
 * and descriptors as they were before its first pool.
 *
 * The driver may not be used after fork in a process that used it, so main never touches sop:
 * it forks the processes of each scenario and waits for them. They order their work through
 * synchronizations and messages on Unix sockets, which carry the pool's descriptors too.
 *
 * Where the library breaks the contract the test says so and goes on (EXPECT), so that one run
 * names every case that fails; the process then exits 1.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#define POSIX_FD CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
#define NB 48      /* allocations of the two importers' scenario */
#define THREADS 4  /* importing threads in each importer */
#define MIB ((size_t)1 << 20)

static int failed;

/* A contract the library breaks: said, and the process fails at its end. */
#define EXPECT_EQ(got, want, what)                                                                 \
	do {                                                                                       \
		long long g_ = (long long)(got), w_ = (long long)(want);                           \
		if (g_ != w_) {                                                                    \
			fprintf(stderr, "%s:%d: %s: %s is %lld, expected %lld\n", __FILE__,       \
				__LINE__, what, #got, g_, w_);                                     \
			failed = 1;                                                                \
		}                                                                                  \
	} while (0)

enum op { POOL = 1, DATA, MORE, READ, WRITE, DONE, GO, DESTROYED };

struct msg {
	int op, n;
	uint32_t tag[NB];
	size_t size[NB];
	CUmemPoolPtrExportData d[NB];
};

/* ---- Messages, descriptors, time ------------------------------------------------------------- */

static void
send_msg(int s, int fd, const struct msg *m)
{
	th_send_fd(s, fd, m, sizeof *m);
}

/* The next message, which must be op; its descriptor, or -1. */
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
	static struct msg m;

	memset(&m, 0, sizeof m);
	m.op = op;
	send_msg(s, -1, &m);
}

static void
hear(int s, int op)
{
	static struct msg m;

	recv_msg(s, &m, op);
}

/* Wait until the peer's end of s is closed everywhere (its process gone). */
static void
hear_gone(int s)
{
	char c;

	TH_EQ(recv(s, &c, 1, 0), 0);
}

static int
open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	TH_ASSERT(d);
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1; /* the directory's own */
}

static int
threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	TH_ASSERT(d);
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* ---- What a process starts from and must come back to ------------------------------------- */

struct base {
	bool sim;
	struct sim_live live;
	int fds;
};

static struct base
base_take(void)
{
	struct base b;

	b.sim = th_init();
	b.live = th_live();
	b.fds = open_fds();
	return b;
}

/* Every pool destroyed, every stream of the test's own destroyed: the simulated driver's
 * objects and this process's descriptors are back where they were. On a GPU the driver opens
 * descriptors of its own, so they are counted on the simulated driver only. */
static void
base_check(const struct base *b, const char *who)
{
	struct sim_live l;

	if (!b->sim)
		return;
	/* What sop keeps for the next pool holds descriptors (an anchor's memory) too. */
	TH_OK(sop__va_kept_free());
	l = th_live();
	EXPECT_EQ(l.reservations, b->live.reservations, who);
	EXPECT_EQ(l.handles, b->live.handles, who);
	EXPECT_EQ(l.mappings, b->live.mappings, who);
	EXPECT_EQ(l.phys_bytes, b->live.phys_bytes, who);
	EXPECT_EQ(l.streams, b->live.streams, who);
	/* sop keeps a few probe events of its own for streams it has seen (order.c), not one per
	 * import or free. */
	if (l.events > b->live.events + 2 * SOP_PROBES) {
		fprintf(stderr, "ipc-peers: %s: %ld events left, %ld before\n", who, l.events,
			b->live.events);
		failed = 1;
	}
	EXPECT_EQ(open_fds(), b->fds, who);
}

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

static sop_pool_t
import_pool(int fd)
{
	sop_pool_t p;

	TH_OK(sop_pool_import_from_shareable_handle(&p, (void *)(intptr_t)fd, POSIX_FD, 0));
	return p;
}

/* Allocate, fill with tag and describe allocation i of m. */
static void *
make(struct msg *m, int i, sop_pool_t pool, size_t size, uint32_t tag, CUstream st)
{
	void *p;

	TH_OK(sop_malloc_from_pool_async(&p, size, pool, st));
	th_fill(p, size, tag, st);
	TH_OK(sop_pool_export_pointer(&m->d[i], p));
	m->size[i] = size;
	m->tag[i] = tag;
	if (m->n < i + 1)
		m->n = i + 1;
	return p;
}

/* Destroy an exporter's pool once all its memory is freed, and see it torn down. */
static void
pool_end(sop_pool_t pool, CUstream st)
{
	double t0 = th_seconds();

	TH_OK(sop_stream_synchronize(st));
	TH_OK(sop_pool_destroy(pool));
	/* The broker stops at once, whatever its importers did. */
	TH_ASSERT(th_seconds() - t0 < 2);
	TH_OK(sop_stream_synchronize(st));
	TH_ASSERT(TH_POOL(pool) == NULL);
}

/* ---- Two importers, several threads each, while the pool grows --------------------------- */

static const size_t mixed[8] = {4096, 12288, 65536, 1 << 20, 3 << 20, 9 << 20, 512, 40 << 20};

static int
two_exporter(int s0, int s1)
{
	static struct msg m;
	struct base b = base_take();
	CUstream st = th_stream();
	sop_pool_t pool = ipc_pool();
	size_t size[NB];
	void *p[NB];
	int fd0, fd1, i, k;

	/* Each export a descriptor of its own, to close once sent. */
	TH_OK(sop_pool_export_to_shareable_handle(&fd0, pool, POSIX_FD, 0));
	TH_OK(sop_pool_export_to_shareable_handle(&fd1, pool, POSIX_FD, 0));
	TH_ASSERT(fd0 != fd1);
	m.op = POOL;
	send_msg(s0, fd0, &m);
	send_msg(s1, fd1, &m);
	TH_EQ(close(fd0), 0);
	TH_EQ(close(fd1), 0);

	/* Half now; the other half made while the importers import the first. */
	for (k = 0; k < 2; k++) {
		memset(&m, 0, sizeof m);
		m.op = k ? MORE : DATA;
		for (i = k * NB / 2; i < (k + 1) * NB / 2; i++) {
			size[i] = mixed[i % 8] + (size_t)(i / 8) * 4096;
			p[i] = make(&m, i, pool, size[i], 0xa0000000u + (uint32_t)i, st);
		}
		TH_OK(sop_stream_synchronize(st));
		send_msg(s0, -1, &m);
		send_msg(s1, -1, &m);
	}
	hear(s0, READ);
	hear(s1, READ);
	say(s0, WRITE);
	say(s1, WRITE);
	hear(s0, DONE);
	hear(s1, DONE);
	/* Importer k wrote the allocations of its parity, and freed all its imports. */
	for (i = 0; i < NB; i++) {
		TH_ASSERT(th_verify(p[i], size[i],
				    0xb0000000u + (uint32_t)(i % 2) * 0x1000u + (uint32_t)i, st));
		TH_OK(sop_free_async(p[i], st));
	}
	pool_end(pool, st);
	TH_OK(sop_stream_destroy(st));
	base_check(&b, "two importers: exporter");
	return failed;
}

struct worker {
	sop_pool_t pool;
	const struct msg *m;
	CUcontext ctx;
	int me, parity, from, to;
	void **q;
	bool write; /* the second pass: write our parity's, and free */
};

static void *
two_worker(void *arg)
{
	struct worker *w = arg;
	CUstream st;
	sop_pool_t found;
	int i;

	TH_OK(th.cuCtxSetCurrent(w->ctx));
	st = th_stream();
	for (i = w->from + w->me; i < w->to; i += THREADS) {
		if (!w->write) {
			TH_OK(sop_pool_import_pointer(&w->q[i], w->pool,
						      (CUmemPoolPtrExportData *)&w->m->d[i]));
			TH_OK(sop_pointer_get_pool(&found, w->q[i]));
			TH_ASSERT(found == w->pool);
			TH_ASSERT(th_verify(w->q[i], w->m->size[i], w->m->tag[i], st));
			continue;
		}
		if (i % 2 == w->parity)
			th_fill(w->q[i], w->m->size[i],
				0xb0000000u + (uint32_t)w->parity * 0x1000u + (uint32_t)i, st);
		TH_OK(sop_free_async(w->q[i], st));
	}
	TH_OK(sop_stream_synchronize(st));
	TH_OK(sop_stream_destroy(st));
	return NULL;
}

static void
two_pass(struct worker *w, sop_pool_t pool, const struct msg *m, void **q, int k, int from,
	 int to, bool write)
{
	pthread_t t[THREADS];
	int i;

	for (i = 0; i < THREADS; i++) {
		w[i] = (struct worker){.pool = pool, .m = m, .me = i, .parity = k, .from = from,
				       .to = to, .q = q, .write = write};
		TH_OK(sop__drv.cuCtxGetCurrent(&w[i].ctx));
		TH_ASSERT(pthread_create(&t[i], NULL, two_worker, &w[i]) == 0);
	}
	for (i = 0; i < THREADS; i++)
		TH_ASSERT(pthread_join(t[i], NULL) == 0);
}

static int
two_importer(int s, int k)
{
	static struct msg m, more;
	struct base b = base_take();
	struct worker w[THREADS];
	sop_pool_t ipool;
	void *q[NB];
	size_t total = 0;
	int fd, i;

	fd = recv_msg(s, &m, POOL);
	ipool = import_pool(fd);
	TH_EQ(close(fd), 0);
	recv_msg(s, &m, DATA);
	two_pass(w, ipool, &m, q, k, 0, NB / 2, false);
	recv_msg(s, &more, MORE);
	for (i = NB / 2; i < NB; i++) {
		m.d[i] = more.d[i];
		m.size[i] = more.size[i];
		m.tag[i] = more.tag[i];
	}
	two_pass(w, ipool, &m, q, k, NB / 2, NB, false);
	for (i = 0; i < NB; i++)
		total += m.size[i];
	EXPECT_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), total, "two importers");
	TH_ASSERT(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= total);
	TH_CHECK(ipool);
	say(s, READ);
	hear(s, WRITE);
	two_pass(w, ipool, &m, q, k, 0, NB, true);
	EXPECT_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0, "two importers");
	EXPECT_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0, "two importers");
	EXPECT_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), total, "two importers");
	TH_CHECK(ipool);
	say(s, DONE);
	TH_OK(sop_pool_destroy(ipool));
	TH_ASSERT(TH_POOL(ipool) == NULL);
	base_check(&b, "two importers: importer");
	return failed;
}

/* ---- An importer that dies, and one that sends garbage ---------------------------------------- */

static int
dies_exporter(int s)
{
	static struct msg m;
	struct base b = base_take();
	CUstream st = th_stream();
	sop_pool_t pool = ipc_pool();
	void *p[3];
	int fd, i;

	TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, POSIX_FD, 0));
	m.op = POOL;
	p[0] = make(&m, 0, pool, 4096, 0xd0000000u, st);
	p[1] = make(&m, 1, pool, 3 * MIB, 0xd0000001u, st);
	p[2] = make(&m, 2, pool, 40 * MIB, 0xd0000002u, st);
	TH_OK(sop_stream_synchronize(st));
	send_msg(s, fd, &m);
	TH_EQ(close(fd), 0);
	/* It exits holding its imports, its pool not destroyed, its connection open. */
	hear_gone(s);
	for (i = 0; i < 3; i++) {
		TH_ASSERT(th_verify(p[i], m.size[i], m.tag[i], st));
		TH_OK(sop_free_async(p[i], st));
	}
	pool_end(pool, st);
	TH_OK(sop_stream_destroy(st));
	base_check(&b, "an importer that dies: exporter");
	return failed;
}

static int
dies_importer(int s)
{
	static struct msg m;
	struct sop__wire_hello junk;
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {&junk, sizeof junk};
	struct msghdr h = {0};
	struct cmsghdr *c = (struct cmsghdr *)cbuf;
	struct pollfd pfd;
	sop_pool_t ipool;
	void *q;
	char byte;
	int fd, pp[2], i;

	th_init();
	fd = recv_msg(s, &m, POOL);
	/* Garbage on the exported descriptor, carrying a pipe's end: the broker closes what it
	 * was sent (our end then reads end of file) and goes on serving. */
	TH_ASSERT(pipe(pp) == 0);
	memset(&junk, 0x5a, sizeof junk);
	memset(cbuf, 0, sizeof cbuf);
	h.msg_iov = &iov;
	h.msg_iovlen = 1;
	h.msg_control = cbuf;
	h.msg_controllen = sizeof cbuf;
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &pp[1], sizeof(int));
	TH_ASSERT(sendmsg(fd, &h, MSG_NOSIGNAL) == (ssize_t)sizeof junk);
	TH_EQ(close(pp[1]), 0);
	pfd = (struct pollfd){.fd = pp[0], .events = POLLIN};
	EXPECT_EQ(poll(&pfd, 1, 5000), 1, "garbage to the broker: its descriptor closed");
	if (pfd.revents)
		EXPECT_EQ(read(pp[0], &byte, 1), 0, "garbage to the broker: its descriptor closed");
	close(pp[0]);

	ipool = import_pool(fd);
	for (i = 0; i < m.n; i++) {
		TH_OK(sop_pool_import_pointer(&q, ipool, &m.d[i]));
		TH_ASSERT(th_verify(q, m.size[i], m.tag[i], NULL));
	}
	/* Gone, as a crash would leave it. */
	_exit(failed);
}

/* ---- An exporter that destroys its pool, and one that exits ------------------------------- */

static int
gone_exporter(int s, int child_wait)
{
	static struct msg m;
	CUstream st;
	sop_pool_t pool;
	void *d[2], *k[3];
	int fd;

	th_init();
	st = th_stream();

	/* A pool destroyed while two allocations of one piece are live, one of them imported. */
	pool = ipc_pool();
	TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, POSIX_FD, 0));
	memset(&m, 0, sizeof m);
	m.op = POOL;
	d[0] = make(&m, 0, pool, 4096, 0xde000000u, st);
	d[1] = make(&m, 1, pool, 4096, 0xde000001u, st);
	TH_OK(sop_stream_synchronize(st));
	send_msg(s, fd, &m);
	TH_EQ(close(fd), 0);
	hear(s, GO);
	TH_OK(sop_pool_destroy(pool));
	say(s, DESTROYED);
	hear(s, GO);
	TH_OK(sop_free_async(d[0], st));
	TH_OK(sop_free_async(d[1], st));
	TH_OK(sop_stream_synchronize(st));
	TH_ASSERT(TH_POOL(pool) == NULL);

	/* A pool whose exporter exits: two allocations of one piece, one of them imported, and
	 * one of its own piece, not. */
	pool = ipc_pool();
	TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, POSIX_FD, 0));
	memset(&m, 0, sizeof m);
	m.op = POOL;
	k[0] = make(&m, 0, pool, 4096, 0xe0000000u, st);
	k[1] = make(&m, 1, pool, 4096, 0xe0000001u, st);
	k[2] = make(&m, 2, pool, 32 * MIB, 0xe0000002u, st);
	TH_OK(sop_stream_synchronize(st));
	send_msg(s, fd, &m);
	TH_EQ(close(fd), 0);
	hear(s, GO);
	/* A child that outlives this process, as a worker forked by a server would: it never
	 * uses the driver, and holds, until told, whatever descriptors the fork gave it. */
	if (fork() == 0) {
		char c;
		close(s);
		while (read(child_wait, &c, 1) < 0 && errno == EINTR)
			;
		_exit(0);
	}
	(void)k;
	_exit(0);
}

static int
gone_importer(int s)
{
	static struct msg m;
	struct base b = base_take();
	CUstream st = th_stream();
	sop_pool_t ipool, p;
	void *q, *x;
	double t0;
	int fd;
	CUresult r;

	/* Destroyed. */
	fd = recv_msg(s, &m, POOL);
	ipool = import_pool(fd);
	TH_OK(sop_pool_import_pointer(&q, ipool, &m.d[0]));
	TH_ASSERT(th_verify(q, m.size[0], m.tag[0], st));
	say(s, GO);
	hear(s, DESTROYED);
	r = sop_pool_import_pointer(&x, ipool, &m.d[1]);
	EXPECT_EQ(r, CUDA_ERROR_INVALID_VALUE,
		  "import_pointer, after the exporter destroyed the pool, of a live allocation "
		  "on a piece mapped here");
	if (r == CUDA_SUCCESS)
		TH_OK(sop_free(x));
	r = sop_pool_import_pointer(&x, ipool, &m.d[0]);
	EXPECT_EQ(r, CUDA_ERROR_INVALID_VALUE,
		  "import_pointer, after the exporter destroyed the pool, of an allocation "
		  "imported here already");
	if (r == CUDA_SUCCESS)
		TH_OK(sop_free(x));
	EXPECT_EQ(sop_pool_import_from_shareable_handle(&p, (void *)(intptr_t)fd, POSIX_FD, 0),
		  CUDA_ERROR_INVALID_VALUE, "import of a destroyed pool");
	TH_ASSERT(th_verify(q, m.size[0], m.tag[0], st));
	TH_OK(sop_free_async(q, st));
	TH_OK(sop_stream_synchronize(st));
	EXPECT_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0, "destroyed exporter");
	TH_OK(sop_pool_destroy(ipool));
	TH_EQ(close(fd), 0);
	say(s, GO);

	/* Exited. */
	fd = recv_msg(s, &m, POOL);
	ipool = import_pool(fd);
	TH_OK(sop_pool_import_pointer(&q, ipool, &m.d[0]));
	TH_ASSERT(th_verify(q, m.size[0], m.tag[0], st));
	say(s, GO);
	hear_gone(s);
	r = sop_pool_import_pointer(&x, ipool, &m.d[1]);
	EXPECT_EQ(r, CUDA_ERROR_INVALID_VALUE,
		  "import_pointer, after the exporter exited, of an allocation on a piece "
		  "mapped here");
	if (r == CUDA_SUCCESS)
		TH_OK(sop_free(x));
	r = sop_pool_import_pointer(&x, ipool, &m.d[0]);
	EXPECT_EQ(r, CUDA_ERROR_INVALID_VALUE,
		  "import_pointer, after the exporter exited, of an allocation imported here");
	if (r == CUDA_SUCCESS)
		TH_OK(sop_free(x));
	/* Memory not mapped here: its broker is gone, though the exporter's child holds what
	 * the fork gave it. The answer is a refusal, and at once. */
	t0 = th_seconds();
	r = sop_pool_import_pointer(&x, ipool, &m.d[2]);
	EXPECT_EQ(r, CUDA_ERROR_INVALID_VALUE,
		  "import_pointer, after the exporter exited, of memory not mapped here");
	if (r == CUDA_SUCCESS)
		TH_OK(sop_free(x));
	if (th_seconds() - t0 >= 2) {
		fprintf(stderr,
			"ipc-peers: import_pointer after the exporter exited, its forked child "
			"alive, answered in %.1f s (expected within 2 s)\n", th_seconds() - t0);
		failed = 1;
	}
	t0 = th_seconds();
	EXPECT_EQ(sop_pool_import_from_shareable_handle(&p, (void *)(intptr_t)fd, POSIX_FD, 0),
		  CUDA_ERROR_INVALID_VALUE, "import of an exited exporter's pool");
	EXPECT_EQ(th_seconds() - t0 < 2, 1, "import of an exited exporter's pool: within 2 s");
	TH_ASSERT(th_verify(q, m.size[0], m.tag[0], st));
	TH_OK(sop_free_async(q, st));
	TH_OK(sop_stream_synchronize(st));
	EXPECT_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0, "exited exporter");
	EXPECT_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0, "exited exporter");
	TH_OK(sop_pool_destroy(ipool));
	TH_ASSERT(TH_POOL(ipool) == NULL);
	TH_EQ(close(fd), 0);
	TH_OK(sop_stream_destroy(st));
	base_check(&b, "a gone exporter: importer");
	return failed;
}

/* ---- Trims, a piece made again, several imports of one pool, changed bytes ------------------ */

static int
again_exporter(int s)
{
	static struct msg m;
	struct base b = base_take();
	CUstream st = th_stream();
	sop_pool_t pool = ipc_pool();
	cuuint64_t zero = 0;
	void *a, *small, *a2, *c;
	int fd;

	/* Refused exports start nothing and open nothing; a pool's first export starts its
	 * broker, the next ones share it, and the pool's destruction stops it. Counted on the
	 * simulated driver, whose threads and descriptors are all known. */
	if (b.sim) {
		sop_pool_t probe = ipc_pool();
		int t0 = threads(), f0 = open_fds(), fd2;

		EXPECT_EQ(sop_pool_export_to_shareable_handle(&fd, probe, CU_MEM_HANDLE_TYPE_NONE, 0),
			  CUDA_ERROR_INVALID_VALUE, "export of another type");
		EXPECT_EQ(sop_pool_export_to_shareable_handle(&fd, probe, POSIX_FD, 1),
			  CUDA_ERROR_INVALID_VALUE, "export with flags");
		EXPECT_EQ(sop_pool_export_to_shareable_handle(NULL, probe, POSIX_FD, 0),
			  CUDA_ERROR_INVALID_VALUE, "export to NULL");
		EXPECT_EQ(threads(), t0, "refused exports: threads");
		EXPECT_EQ(open_fds(), f0, "refused exports: descriptors");
		TH_OK(sop_pool_export_to_shareable_handle(&fd, probe, POSIX_FD, 0));
		TH_OK(sop_pool_export_to_shareable_handle(&fd2, probe, POSIX_FD, 0));
		/* The broker's two threads: one answers importers, one exports pieces ahead. */
		EXPECT_EQ(threads(), t0 + 2, "a pool exported twice: one broker");
		TH_EQ(close(fd), 0);
		TH_EQ(close(fd2), 0);
		TH_OK(sop_pool_destroy(probe));
		EXPECT_EQ(threads(), t0, "a destroyed pool's broker");
		EXPECT_EQ(open_fds(), f0, "a destroyed pool's descriptors");
	}

	TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, POSIX_FD, 0));
	m.op = POOL;
	send_msg(s, fd, &m);
	TH_EQ(close(fd), 0);
	TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, POSIX_FD, 0));
	send_msg(s, fd, &m);
	TH_EQ(close(fd), 0);

	memset(&m, 0, sizeof m);
	m.op = DATA;
	a = make(&m, 0, pool, 64 * MIB, 0x0a000000u, st);
	small = make(&m, 1, pool, 4096, 0x0a000001u, st);
	TH_OK(sop_stream_synchronize(st));
	send_msg(s, -1, &m);
	hear(s, GO);
	/* The importer wrote 0x0a0000ff into a through one of its pools, and freed everything. */
	TH_ASSERT(th_verify(a, 64 * MIB, 0x0a0000ffu, st));
	TH_OK(sop_free_async(a, st));
	TH_OK(sop_free_async(small, st));
	TH_OK(sop_stream_synchronize(st));
	TH_OK(sop_trim_to(pool, 0));
	TH_EQ(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);

	/* A new piece, most likely where the released one was. */
	memset(&m, 0, sizeof m);
	m.op = MORE;
	a2 = make(&m, 0, pool, 64 * MIB, 0x0b000000u, st);
	TH_OK(sop_stream_synchronize(st));
	if (a2 != a)
		printf("ipc-peers: the piece was made again elsewhere (%p, was %p)\n", a2, a);
	send_msg(s, -1, &m);
	hear(s, GO);

	/* Under the importer's live mapping: a growth, its free, a trim, a release threshold. */
	TH_OK(sop_malloc_from_pool_async(&c, 8 * MIB, pool, st));
	TH_OK(sop_free_async(c, st));
	TH_OK(sop_pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero));
	TH_OK(sop_stream_synchronize(st));
	TH_OK(sop_trim_to(pool, 0));
	TH_ASSERT(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 64 * MIB);
	TH_ASSERT(th_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) < 72 * MIB);
	say(s, GO);
	hear(s, GO);
	TH_ASSERT(th_verify(a2, 64 * MIB, 0x0b0000ffu, st));
	TH_OK(sop_free_async(a2, st));
	pool_end(pool, st);
	TH_OK(sop_stream_destroy(st));
	base_check(&b, "again: exporter");
	return failed;
}

static int
again_importer(int s)
{
	static struct msg m;
	struct base b = base_take();
	CUstream st = th_stream();
	CUmemPoolPtrExportData d;
	sop_pool_t ia, ia2, ib, found;
	void *qa, *qb, *qs, *x;
	cuuint64_t v;
	int fda, fdb, i;
	CUresult r;

	fda = recv_msg(s, &m, POOL);
	fdb = recv_msg(s, &m, POOL);
	TH_ASSERT(fda >= 0 && fdb >= 0);
	/* One descriptor imported twice (it stays the caller's), and a second descriptor. */
	ia = import_pool(fda);
	TH_ASSERT(fcntl(fda, F_GETFD) >= 0);
	ia2 = import_pool(fda);
	ib = import_pool(fdb);
	TH_ASSERT(ia != ia2 && ia != ib && ia2 != ib);

	recv_msg(s, &m, DATA);
	TH_OK(sop_pool_import_pointer(&qa, ia, &m.d[0]));
	TH_OK(sop_pool_import_pointer(&qb, ib, &m.d[0]));
	TH_ASSERT(qa != qb);
	TH_OK(sop_pointer_get_pool(&found, qb));
	TH_ASSERT(found == ib);
	TH_ASSERT(th_verify(qa, m.size[0], m.tag[0], st));
	/* One memory under two addresses here. */
	th_fill(qb, m.size[0], 0x0a0000ffu, st);
	TH_ASSERT(th_verify(qa, m.size[0], 0x0a0000ffu, st));
	TH_OK(sop_pool_import_pointer(&qs, ia2, &m.d[1]));
	TH_ASSERT(th_verify(qs, m.size[1], m.tag[1], st));

	/* The high-water mark of an imported pool is reset to zero only. */
	v = 1;
	EXPECT_EQ(sop_pool_set_attr(ia, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), CUDA_ERROR_INVALID_VALUE,
		  "imported pool: USED_MEM_HIGH set to 1");
	v = 0;
	TH_OK(sop_pool_set_attr(ia, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v));
	TH_EQ(th_attr(ia, CU_MEMPOOL_ATTR_USED_MEM_HIGH), m.size[0]);

	/* Another device's access, granted later, reaches what is mapped and what comes. */
	if (th_n_devices > 1) {
		CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
		CUmemAccessDesc desc = {loc, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
		CUmemAccess_flags f;
		unsigned long long gf;

		TH_OK(sop_pool_get_access(&f, ia2, &loc));
		EXPECT_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_NONE, "imported pool: device 1's access");
		TH_OK(sop_pool_set_access(ia2, &desc, 1));
		TH_OK(sop_pool_get_access(&f, ia2, &loc));
		EXPECT_EQ(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "imported pool: device 1's access");
		if (th.cuMemGetAccess) {
			TH_OK(th.cuMemGetAccess(&gf, &loc, (CUdeviceptr)(uintptr_t)qs));
			EXPECT_EQ(gf, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
				  "imported pool: device 1's access to a mapped import");
		}
		TH_OK(sop_pool_import_pointer(&x, ia2, &m.d[0]));
		if (th.cuMemGetAccess) {
			TH_OK(th.cuMemGetAccess(&gf, &loc, (CUdeviceptr)(uintptr_t)x));
			EXPECT_EQ(gf, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
				  "imported pool: device 1's access to a later import");
		}
		TH_OK(sop_free_async(x, st));
	}

	/* Data with any one byte changed is forged: refused, and nothing changes. */
	for (i = 0; i < (int)sizeof d.reserved; i++) {
		uint64_t used = th_attr(ia, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
		d = m.d[1];
		d.reserved[i] ^= 0x01;
		r = sop_pool_import_pointer(&x, ia, &d);
		if (r != CUDA_ERROR_INVALID_VALUE) {
			fprintf(stderr,
				"ipc-peers: export data with byte %d changed: import_pointer returned "
				"%d, expected %d (CUDA_ERROR_INVALID_VALUE)\n",
				i, (int)r, (int)CUDA_ERROR_INVALID_VALUE);
			failed = 1;
			if (r == CUDA_SUCCESS)
				TH_OK(sop_free(x));
		}
		TH_EQ(th_attr(ia, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used);
	}

	TH_OK(sop_free_async(qa, st));
	TH_OK(sop_free_async(qb, st));
	TH_OK(sop_free_async(qs, st));
	TH_OK(sop_stream_synchronize(st));
	EXPECT_EQ(sop_pointer_get_pool(&found, qb), CUDA_ERROR_INVALID_VALUE,
		  "pointer_get_pool of a freed import");
	TH_EQ(th_attr(ia, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	TH_EQ(th_attr(ib, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	TH_EQ(th_attr(ia2, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	say(s, GO);

	/* The exporter released that piece and made a new one: its memory is the new one's. */
	recv_msg(s, &m, MORE);
	TH_OK(sop_pool_import_pointer(&qa, ia, &m.d[0]));
	TH_ASSERT(th_verify(qa, m.size[0], m.tag[0], st));
	say(s, GO);
	hear(s, GO);
	/* The exporter trimmed and released around it: still here, still its memory. */
	TH_ASSERT(th_verify(qa, m.size[0], m.tag[0], st));
	th_fill(qa, m.size[0], 0x0b0000ffu, st);
	TH_OK(sop_free_async(qa, st));
	TH_OK(sop_stream_synchronize(st));
	say(s, GO);

	TH_OK(sop_pool_destroy(ia));
	TH_OK(sop_pool_destroy(ia2));
	TH_OK(sop_pool_destroy(ib));
	TH_EQ(close(fda), 0);
	TH_EQ(close(fdb), 0);
	TH_OK(sop_stream_destroy(st));
	base_check(&b, "again: importer");
	return failed;
}

/* ---- An allocation over two pieces -------------------------------------------------------- */

/* The second allocation starts in the free tail of the first one's piece and goes on into the
 * next piece (growth joins free memory at a hole's edge): imported after the first, one piece
 * is mapped here already and only the other comes. */
static int
span_exporter(int s)
{
	static struct msg m;
	struct base b = base_take();
	CUstream st = th_stream();
	sop_pool_t pool = ipc_pool();
	void *a, *y;
	int fd;

	TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, POSIX_FD, 0));
	memset(&m, 0, sizeof m);
	m.op = POOL;
	a = make(&m, 0, pool, 16 * MIB, 0x5a000000u, st);
	y = make(&m, 1, pool, 40 * MIB, 0x5a000001u, st);
	TH_OK(sop_stream_synchronize(st));
	send_msg(s, fd, &m);
	TH_EQ(close(fd), 0);
	hear(s, GO);
	TH_ASSERT(th_verify(a, m.size[0], 0x5a0000feu, st));
	TH_ASSERT(th_verify(y, m.size[1], 0x5a0000ffu, st));
	TH_OK(sop_free_async(a, st));
	TH_OK(sop_free_async(y, st));
	pool_end(pool, st);
	TH_OK(sop_stream_destroy(st));
	base_check(&b, "two pieces: exporter");
	return failed;
}

static int
span_importer(int s)
{
	static struct msg m;
	struct base b = base_take();
	CUstream st = th_stream();
	struct sim_live l0, l1, l2;
	sop_pool_t ipool;
	void *a, *y;
	int fd;

	fd = recv_msg(s, &m, POOL);
	ipool = import_pool(fd);
	TH_EQ(close(fd), 0);
	l0 = th_live();
	TH_OK(sop_pool_import_pointer(&a, ipool, &m.d[0]));
	l1 = th_live();
	TH_OK(sop_pool_import_pointer(&y, ipool, &m.d[1]));
	l2 = th_live();
	/* Where the exporter's layout is the one described above (the simulated driver's): one
	 * piece for the first, one more for the second. */
	if (b.sim && (char *)y == (char *)a + m.size[0]) {
		TH_EQ(l1.mappings - l0.mappings, 1);
		TH_EQ(l2.mappings - l1.mappings, 1);
		TH_EQ(l2.handles - l1.handles, 1);
	} else if (b.sim) {
		printf("ipc-peers: the second allocation is not next to the first: two pieces "
		       "not tested\n");
	}
	TH_ASSERT(th_verify(a, m.size[0], m.tag[0], st));
	TH_ASSERT(th_verify(y, m.size[1], m.tag[1], st));
	th_fill(a, m.size[0], 0x5a0000feu, st);
	TH_OK(sop_free_async(a, st));
	TH_OK(sop_stream_synchronize(st));
	/* The first's piece stays: the second still uses it. */
	TH_ASSERT(th_verify(y, m.size[1], m.tag[1], st));
	TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), m.size[1]);
	TH_ASSERT(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= m.size[0] + m.size[1]);
	th_fill(y, m.size[1], 0x5a0000ffu, st);
	TH_OK(sop_free_async(y, st));
	TH_OK(sop_stream_synchronize(st));
	TH_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	say(s, GO);
	TH_OK(sop_pool_destroy(ipool));
	TH_OK(sop_stream_destroy(st));
	base_check(&b, "two pieces: importer");
	return failed;
}

/* ---- More pieces asked for than the exporter keeps descriptors of ---------------------------- */

#define MANY 8 /* allocations of a piece each */
#define KEPT 3 /* the exporter's cap on kept descriptors, for the test */

/* Pieces with a kept descriptor: what the pool counts, and what is there. */
static void
kept_check(sop_pool_t pool, const char *who)
{
	struct sop_pool *p = TH_POOL(pool);
	struct sop__segment *seg;
	size_t i, n = 0;

	sop__mutex_take(&p->lock, SOP_RANK_POOL);
	for (seg = p->segments; seg; seg = seg->next)
		for (i = 0; i < seg->n_pieces; i++)
			n += seg->pieces[i]->fd_plus1 != 0;
	EXPECT_EQ(n, p->fds_kept, who);
	EXPECT_EQ(n <= KEPT, 1, who);
	sop__mutex_drop(&p->lock);
}

/* Once the broker's second thread has done with every piece of the pool (none marked, none
 * being exported): up to 10 s. */
static void
ahead_wait(sop_pool_t pool)
{
	int tries, busy = 1;

	for (tries = 0; busy && tries < 10000; tries++) {
		if (tries)
			usleep(1000);
		busy = th_pool_pieces(pool, NULL, NULL, 0).busy != 0;
	}
	EXPECT_EQ(busy, 0, "the broker's second thread");
}

static int
many_exporter(int s)
{
	static struct msg m;
	struct base b = base_take();
	CUstream st = th_stream();
	sop_pool_t pool = ipc_pool();
	void *p[MANY];
	unsigned long calls;
	int fd, i;

	sop__share_fds_max = KEPT;
	TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, POSIX_FD, 0));
	memset(&m, 0, sizeof m);
	m.op = POOL;
	calls = th.sim_calls ? th.sim_calls("cuMemExportToShareableHandle") : 0;
	for (i = 0; i < MANY; i++)
		p[i] = make(&m, i, pool, 32 * MIB, 0x6d000000u + (uint32_t)i, st);
	TH_OK(sop_stream_synchronize(st));
	/* Exported ahead up to the cap, and no further: the second thread never closes a kept
	 * descriptor to make room for its own (share.c, ahead_export). */
	ahead_wait(pool);
	kept_check(pool, "many pieces: ahead");
	EXPECT_EQ(TH_POOL(pool)->fds_kept, KEPT, "many pieces: ahead");
	if (th.sim_calls)
		EXPECT_EQ(th.sim_calls("cuMemExportToShareableHandle") - calls, KEPT,
			  "many pieces: ahead");
	send_msg(s, fd, &m);
	TH_EQ(close(fd), 0);
	/* The importer maps every piece, unmaps them all, and maps them again: the pieces whose
	 * descriptors were closed are exported again. */
	hear(s, GO);
	kept_check(pool, "many pieces: first round");
	say(s, GO);
	hear(s, GO);
	kept_check(pool, "many pieces: second round");
	for (i = 0; i < MANY; i++)
		TH_OK(sop_free_async(p[i], st));
	pool_end(pool, st);
	TH_OK(sop_stream_destroy(st));
	base_check(&b, "many pieces: exporter");
	return failed;
}

static int
many_importer(int s)
{
	static struct msg m;
	struct base b = base_take();
	CUstream st = th_stream();
	sop_pool_t ipool;
	void *p[MANY];
	int fd, i, round;

	fd = recv_msg(s, &m, POOL);
	ipool = import_pool(fd);
	TH_EQ(close(fd), 0);
	for (round = 0; round < 2; round++) {
		for (i = 0; i < m.n; i++) {
			TH_OK(sop_pool_import_pointer(&p[i], ipool, &m.d[i]));
			TH_ASSERT(th_verify(p[i], m.size[i], m.tag[i], st));
		}
		for (i = 0; i < m.n; i++)
			TH_OK(sop_free_async(p[i], st));
		TH_OK(sop_stream_synchronize(st));
		EXPECT_EQ(th_attr(ipool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0,
			  "many pieces: importer");
		say(s, GO);
		if (!round)
			hear(s, GO);
	}
	TH_OK(sop_pool_destroy(ipool));
	TH_OK(sop_stream_destroy(st));
	base_check(&b, "many pieces: importer");
	return failed;
}

/* ---- Imports and frees racing the imported pool's destruction ------------------------------ */

#define RACE_BLOCKS 16
#define RACE_THREADS 4

struct racer {
	sop_pool_t pool;
	const struct msg *m;
	CUcontext ctx;
	int me;
	atomic_int *stop, *destroying;
	int ok, refused; /* imports */
};

static void *
race_worker(void *arg)
{
	struct racer *w = arg;
	uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(w->me + 1);
	CUstream st;

	TH_OK(th.cuCtxSetCurrent(w->ctx));
	st = th_stream();
	while (!atomic_load(w->stop)) {
		int i;
		void *q;
		uint32_t word;
		CUresult r;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		i = (int)(x % RACE_BLOCKS);
		r = sop_pool_import_pointer(&q, w->pool, (CUmemPoolPtrExportData *)&w->m->d[i]);
		if (r == CUDA_ERROR_INVALID_VALUE) {
			/* Only once the pool's destruction has begun. */
			TH_ASSERT(atomic_load(w->destroying));
			w->refused++;
			usleep(100);
			continue;
		}
		TH_OK(r);
		w->ok++;
		TH_OK(th.cuMemcpyDtoHAsync(&word, (CUdeviceptr)(uintptr_t)q + w->m->size[i] - 4, 4,
					   st));
		TH_OK(sop__drv.cuStreamSynchronize(st));
		TH_EQ(word, w->m->tag[i]);
		/* An import's free is good whatever happened to its pool meanwhile. */
		TH_OK(sop_free_async(q, st));
		if (x & 1)
			TH_OK(sop_stream_synchronize(st));
	}
	TH_OK(sop_stream_synchronize(st));
	TH_OK(sop_stream_destroy(st));
	return NULL;
}

static int
race_exporter(int s)
{
	static struct msg m;
	struct base b = base_take();
	CUstream st = th_stream();
	sop_pool_t pool = ipc_pool();
	void *p[RACE_BLOCKS];
	int fd, i;

	TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, POSIX_FD, 0));
	memset(&m, 0, sizeof m);
	m.op = POOL;
	for (i = 0; i < RACE_BLOCKS; i++)
		p[i] = make(&m, i, pool, mixed[i % 8], 0x7a000000u + (uint32_t)i, st);
	TH_OK(sop_stream_synchronize(st));
	send_msg(s, fd, &m);
	TH_EQ(close(fd), 0);
	hear(s, DONE);
	for (i = 0; i < RACE_BLOCKS; i++)
		TH_OK(sop_free_async(p[i], st));
	pool_end(pool, st);
	TH_OK(sop_stream_destroy(st));
	base_check(&b, "a race with destruction: exporter");
	return failed;
}

static int
race_importer(int s)
{
	static struct msg m;
	struct base b = base_take();
	struct racer w[RACE_THREADS];
	pthread_t t[RACE_THREADS];
	atomic_int stop = 0, destroying = 0;
	sop_pool_t ipool;
	CUcontext ctx;
	int fd, i, ok = 0, refused = 0;

	fd = recv_msg(s, &m, POOL);
	ipool = import_pool(fd);
	TH_EQ(close(fd), 0);
	TH_OK(sop__drv.cuCtxGetCurrent(&ctx));
	for (i = 0; i < RACE_THREADS; i++) {
		w[i] = (struct racer){.pool = ipool, .m = &m, .ctx = ctx, .me = i, .stop = &stop,
				      .destroying = &destroying};
		TH_ASSERT(pthread_create(&t[i], NULL, race_worker, &w[i]) == 0);
	}
	usleep(200 * 1000);
	atomic_store(&destroying, 1);
	TH_OK(sop_pool_destroy(ipool));
	usleep(50 * 1000);
	atomic_store(&stop, 1);
	for (i = 0; i < RACE_THREADS; i++) {
		TH_ASSERT(pthread_join(t[i], NULL) == 0);
		ok += w[i].ok;
		refused += w[i].refused;
	}
	TH_ASSERT(ok > 0);
	/* Torn down once the last free completed. */
	TH_OK(sop_ctx_synchronize());
	TH_ASSERT(TH_POOL(ipool) == NULL);
	say(s, DONE);
	printf("ipc-peers: %d imports, %d refused after the destruction\n", ok, refused);
	base_check(&b, "a race with destruction: importer");
	return failed;
}

/* ---- The scenarios, each in processes of its own -------------------------------------------- */

static pid_t
start(int (*fn)(int, int), int a, int b, const int *close_fds, int n_close)
{
	pid_t pid = fork();
	int i;

	TH_ASSERT(pid >= 0);
	if (pid)
		return pid;
	for (i = 0; i < n_close; i++)
		close(close_fds[i]);
	_exit(fn(a, b));
}

static int
ok(pid_t pid, const char *what)
{
	int status;

	TH_ASSERT(waitpid(pid, &status, 0) == pid);
	if (WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == TH_SKIP))
		return WEXITSTATUS(status);
	fprintf(stderr, "ipc-peers: %s failed (status %#x)\n", what, status);
	return 1;
}

/* Results put together: any failure fails; else a skip (no driver, or no device) skips. */
static int
join(int r, int e)
{
	if (r == 1 || e == 1)
		return 1;
	return r == TH_SKIP || e == TH_SKIP ? TH_SKIP : 0;
}

/* The roles that take only their socket, as start runs them. */
#define ROLE(name)                                                                                 \
	static int run_##name(int s, int unused)                                                   \
	{                                                                                          \
		(void)unused;                                                                      \
		return name(s);                                                                    \
	}
ROLE(dies_exporter)
ROLE(dies_importer)
ROLE(gone_importer)
ROLE(span_exporter)
ROLE(span_importer)
ROLE(race_exporter)
ROLE(race_importer)
ROLE(again_exporter)
ROLE(again_importer)
ROLE(many_exporter)
ROLE(many_importer)

/* Two processes joined by one socket pair. */
static int
pair(int (*exp)(int, int), int (*imp)(int, int), const char *what, int extra, int *extra_close)
{
	int sv[2];
	int cl[3];
	pid_t pe, pi;

	TH_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
	cl[0] = sv[1];
	cl[1] = extra_close ? *extra_close : -1;
	pe = start(exp, sv[0], extra, cl, extra_close ? 2 : 1);
	cl[0] = sv[0];
	cl[1] = extra;
	pi = start(imp, sv[1], 0, cl, extra >= 0 ? 2 : 1);
	close(sv[0]);
	close(sv[1]);
	return join(ok(pe, what), ok(pi, what));
}

int
main(void)
{
	int a[2], b[2], w[2], r;
	pid_t pe, p0, p1;
	int cl[3];

	/* Two importers. */
	TH_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, a) == 0);
	TH_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, b) == 0);
	cl[0] = a[1];
	cl[1] = b[1];
	pe = start(two_exporter, a[0], b[0], cl, 2);
	cl[0] = a[0];
	cl[1] = b[0];
	cl[2] = b[1];
	p0 = start(two_importer, a[1], 0, cl, 3);
	cl[2] = a[1];
	p1 = start(two_importer, b[1], 1, cl, 3);
	close(a[0]);
	close(a[1]);
	close(b[0]);
	close(b[1]);
	r = ok(pe, "two importers: exporter");
	r = join(r, ok(p0, "two importers: importer 0"));
	r = join(r, ok(p1, "two importers: importer 1"));
	if (r == TH_SKIP)
		return TH_SKIP; /* no driver, or no device: the rest would skip as well */

	r = join(r, pair(run_dies_exporter, run_dies_importer, "an importer that dies", -1, NULL));

	/* The exporter's child waits on w[0] until every check is done. */
	TH_ASSERT(pipe(w) == 0);
	r = join(r, pair(gone_exporter, run_gone_importer, "a gone exporter", w[0], &w[1]));
	close(w[0]);
	close(w[1]);

	r = join(r, pair(run_span_exporter, run_span_importer, "an allocation over two pieces", -1,
			 NULL));
	r = join(r, pair(run_race_exporter, run_race_importer,
			 "imports and frees racing the pool's destruction", -1, NULL));
	r = join(r, pair(run_again_exporter, run_again_importer,
			 "trims, a piece made again, changed bytes", -1, NULL));
	r = join(r, pair(run_many_exporter, run_many_importer,
			 "more pieces than descriptors kept", -1, NULL));
	if (!r)
		printf("ipc-peers: two importers, a dying importer, a gone exporter, pieces made "
		       "again: ok\n");
	return r;
}
