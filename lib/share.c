/* share.c - the exporting side of a pool shared between processes: export data for an
 * allocation, and the broker that hands an exported pool's physical pieces to importers.
 *
 * A pool is many physical pieces, made and released as it grows and shrinks, and an importer may
 * need any of them, including pieces made after it imported the pool. So the descriptor sop
 * exports is not a piece's: it is one end of a socket pair whose other end a thread of the
 * exporter (the broker) reads. An importer sends on it, once, a connection of its own (a socket,
 * as SCM_RIGHTS); then, per imported pointer, it asks on that connection for the pieces under
 * the allocation, and the broker answers with their serials, offsets and sizes, and exports as
 * descriptors those the importer does not map yet. A piece's export takes about 0.6 ms: the
 * broker's second thread exports the pieces under each pointer exported while its data travels,
 * and the descriptors are kept open for the next requests, a bounded number of them. A message
 * on the shared end is one datagram of a SOCK_SEQPACKET socket, so importers of many processes
 * never interleave there, and when the exporter exits, or destroys the pool, its ends close and
 * every importer's next call fails cleanly (doc/design.md, Sharing pools).
 *
 * The broker takes the pool lock for the length of a lookup (and of the export of a piece not
 * exported ahead), and never sends with it held; the second thread never exports with it held.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "internal.h"

/* ---- Export data ----------------------------------------------------------------------------- */

uint64_t
sop__share_check(const struct sop__export_data *d)
{
	uint64_t h = d->token ^ 0x736f7020706f6f6cull;

	h = (h ^ d->off) * 0x9e3779b97f4a7c15ull;
	h = (h ^ d->size) * 0xc2b2ae3d27d4eb4full;
	h = (h ^ d->gen) * 0x165667b19e3779f9ull;
	return h ^ (h >> 29);
}

/* The pool's board, made at its first export. Pool lock held. */
static bool
board_ensure(struct sop_pool *pool)
{
	void *m;
	int fd;

	if (pool->board)
		return true;
	fd = memfd_create("sop-board", MFD_CLOEXEC);
	if (fd < 0)
		return false;
	if (ftruncate(fd, (off_t)SOP_BOARD_BYTES) ||
	    (m = mmap(NULL, SOP_BOARD_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) ==
		    MAP_FAILED) {
		close(fd);
		return false;
	}
	pool->board_fd_plus1 = fd + 1;
	/* Published: a free reads it without the pool lock (sop__share_forget). */
	__atomic_store_n(&pool->board, (struct sop__board_slot *)m, __ATOMIC_RELEASE);
	return true;
}

/* The serial of the one piece under [addr, addr + size), or 0 if several (or none). Pool lock
 * held. */
static uint64_t
piece_under(const struct sop__segment *seg, CUdeviceptr addr, size_t size);
static struct sop__segment *segment_of(struct sop_pool *pool, CUdeviceptr addr);
static size_t pieces_from(const struct sop__segment *seg, CUdeviceptr addr);

/* Put an exported allocation on the board, if a slot near its place is free. Pool lock held.
 * Once at most: an allocation exported again finds its entry anywhere in its probes (a slot
 * before it may have been freed since), and its free takes off the one entry there is. */
static void
board_put(struct sop_pool *pool, const struct sop__export_data *d, uint64_t serial)
{
	size_t h = sop__board_hash(d->off), k;
	struct sop__board_slot *free_slot = NULL;

	if (!board_ensure(pool))
		return;
	for (k = 0; k < SOP_BOARD_PROBES; k++) {
		struct sop__board_slot *sl = &pool->board[(h + k) & (SOP_BOARD_SLOTS - 1)];
		uint64_t g = atomic_load_explicit(&sl->gen, memory_order_relaxed);
		if (g == d->gen)
			return; /* exported before */
		if (!g && !free_slot)
			free_slot = sl;
	}
	if (!free_slot)
		return;
	atomic_store_explicit(&free_slot->off, d->off, memory_order_relaxed);
	atomic_store_explicit(&free_slot->size, d->size, memory_order_relaxed);
	atomic_store_explicit(&free_slot->serial, serial, memory_order_relaxed);
	atomic_store_explicit(&free_slot->gen, d->gen, memory_order_release);
}

/* Take an export's entry off the board, if it is there. Pool lock held. */
static void
board_take(struct sop_pool *pool, const struct sop__export_data *d)
{
	size_t h = sop__board_hash(d->off), k;

	if (!pool->board)
		return;
	for (k = 0; k < SOP_BOARD_PROBES; k++) {
		struct sop__board_slot *sl = &pool->board[(h + k) & (SOP_BOARD_SLOTS - 1)];
		uint64_t g = d->gen;

		if (atomic_compare_exchange_strong(&sl->gen, &g, 0))
			return;
	}
}

void
sop__share_forget(struct sop_pool *pool, struct sop__block *b)
{
	uint64_t gen = __atomic_load_n(&b->gen, __ATOMIC_RELAXED);
	size_t h = sop__board_hash(b->addr - pool->va_base), k;
	struct sop__board_slot *board = __atomic_load_n(&pool->board, __ATOMIC_ACQUIRE);

	if (!board)
		return;
	for (k = 0; k < SOP_BOARD_PROBES; k++) {
		struct sop__board_slot *sl = &board[(h + k) & (SOP_BOARD_SLOTS - 1)];
		if (atomic_load_explicit(&sl->gen, memory_order_relaxed) == gen) {
			atomic_store_explicit(&sl->gen, 0, memory_order_release);
			return;
		}
	}
}

/* Exporting a piece as a descriptor takes 0.6 ms (piece_fd), which the first import of a
 * pointer it backs waited for: 988 us on an H200, where the driver's pool took 141. So an
 * export of a pointer marks the pieces under it that have no descriptor yet, and the broker's
 * second thread, woken, exports them while the pointer's data travels to the importer
 * (ahead_main). Pool lock held. */
static void
ahead_mark(struct sop_pool *pool, const struct sop__segment *seg, CUdeviceptr addr, size_t size)
{
	bool marked = false;
	size_t i;

	for (i = pieces_from(seg, addr); i < seg->n_pieces && seg->pieces[i]->va < addr + size;
	     i++) {
		struct sop__piece *pc = seg->pieces[i];
		if (!pc->fd_plus1 && !pc->ahead)
			marked = pc->ahead = true;
	}
	/* A byte is enough however many are marked; a full pipe already wakes the thread. */
	if (marked && pool->broker && pool->broker->hint[1] >= 0) {
		char c = 0;
		while (write(pool->broker->hint[1], &c, 1) < 0 && errno == EINTR)
			;
	}
}

CUresult
sop__share_pointer(struct sop_pool *pool, CUdeviceptr addr, CUmemPoolPtrExportData *out)
{
	struct sop__export_data d = {0};
	struct sop__segment *seg;
	struct sop__block *b;

	if (!(pool->props.handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) || pool->imported)
		return CUDA_ERROR_INVALID_VALUE;
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	b = atomic_load(&pool->dead) ? NULL : sop__map_get(pool, addr);
	if (!b || atomic_load_explicit(&b->tag, memory_order_acquire) !=
			  sop__tag(addr, SOP_BLOCK_ALLOC)) {
		sop__mutex_drop(&pool->lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	/* Exported once per allocation: later exports of it carry the same serial, and its next
	 * hand-out clears it, so that data of this allocation names nothing after its free. */
	if (!__atomic_load_n(&b->gen, __ATOMIC_RELAXED))
		__atomic_store_n(&b->gen, ++pool->export_serial, __ATOMIC_RELAXED);
	d.magic = SOP_WIRE_MAGIC;
	d.version = SOP_WIRE_VERSION;
	d.token = pool->token;
	d.off = addr - pool->va_base;
	d.size = __atomic_load_n(&b->req, __ATOMIC_RELAXED);
	d.gen = __atomic_load_n(&b->gen, __ATOMIC_RELAXED);
	seg = segment_of(pool, addr);
	board_put(pool, &d, seg ? piece_under(seg, addr, d.size) : 0);
	/* A free racing this export claims the block without the pool lock, then reads its serial
	 * to take it off the board. Either that free comes after this load in the order of the two
	 * (its claim and its read of the serial are sequentially consistent, this a full fence), and
	 * then it sees the serial and the entry put above, or this load sees the block claimed, and
	 * the export takes its entry off itself and is refused, as an export of a freed block is. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&b->tag, memory_order_relaxed) != sop__tag(addr, SOP_BLOCK_ALLOC)) {
		board_take(pool, &d);
		sop__mutex_drop(&pool->lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (seg)
		ahead_mark(pool, seg, addr, d.size);
	sop__mutex_drop(&pool->lock);
	d.check = sop__share_check(&d);
	_Static_assert(sizeof d <= sizeof *out, "export data fits the driver's");
	memset(out, 0, sizeof *out);
	memcpy(out, &d, sizeof d);
	return CUDA_SUCCESS;
}

/* ---- The wire ------------------------------------------------------------------------------ */

bool
sop__wire_send(int sock, const void *buf, size_t n, const int *fds, size_t n_fd, int flags)
{
	char cbuf[CMSG_SPACE(SOP_WIRE_PIECES_MAX * sizeof(int))];
	struct iovec iov = {(void *)buf, n};
	struct msghdr m = {0};

	if (n_fd > SOP_WIRE_PIECES_MAX)
		return false;
	memset(cbuf, 0, sizeof cbuf);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	if (n_fd) {
		struct cmsghdr *c = (struct cmsghdr *)cbuf;
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(n_fd * sizeof(int));
		memcpy(CMSG_DATA(c), fds, n_fd * sizeof(int));
		m.msg_control = cbuf;
		m.msg_controllen = CMSG_SPACE(n_fd * sizeof(int));
	}
	return sendmsg(sock, &m, MSG_NOSIGNAL | flags) == (ssize_t)n;
}

ssize_t
sop__wire_recv(int sock, void *buf, size_t n, int *fds, size_t max_fd, size_t *n_fd, int flags)
{
	char cbuf[CMSG_SPACE(SOP_WIRE_PIECES_MAX * sizeof(int))];
	struct iovec iov = {buf, n};
	struct msghdr m = {0};
	struct cmsghdr *c;
	ssize_t got;

	*n_fd = 0;
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = cbuf;
	m.msg_controllen = sizeof cbuf;
	got = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | flags);
	if (got < 0)
		return got;
	/* Every descriptor that came is kept or closed, whatever the message was. */
	for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		size_t k, k_n;
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		k_n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (k = 0; k < k_n; k++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof fd);
			if (*n_fd < max_fd && got == (ssize_t)n)
				fds[(*n_fd)++] = fd;
			else
				close(fd);
		}
	}
	/* Descriptors the kernel dropped: the message cannot be read as it was sent. */
	if (m.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) {
		sop__wire_fds_close(fds, *n_fd);
		*n_fd = 0;
		return -1;
	}
	return got;
}

void
sop__wire_fds_close(const int *fds, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* ---- The broker ------------------------------------------------------------------------------ */

/* Every running broker, so that a forked child can let go of its copies of their sockets. */
static pthread_mutex_t brokers_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sop__broker *brokers;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void
fork_prepare(void)
{
	pthread_mutex_lock(&brokers_lock);
}

static void
fork_parent(void)
{
	pthread_mutex_unlock(&brokers_lock);
}

/* The child has no broker threads. It closes its copies of their sockets, the shared ends and
 * every importer's connection, so that an exporter that exits leaves no open end behind in a
 * child that outlives it (importers would wait on it rather than fail), and its pools export
 * nothing more (doc/differences.md). */
static void
fork_child(void)
{
	struct sop__broker *bk;

	for (bk = brokers; bk; bk = bk->next) {
		size_t i;

		close(bk->b);
		close(bk->wake[0]);
		close(bk->wake[1]);
		close(bk->hint[0]);
		close(bk->hint[1]);
		bk->b = bk->wake[0] = bk->wake[1] = bk->hint[0] = bk->hint[1] = -1;
		for (i = 0; i < bk->n_conn; i++)
			close(bk->conn[i]);
		bk->n_conn = 0;
	}
	pthread_mutex_unlock(&brokers_lock);
}

static void
fork_register(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* The pieces of seg under [addr, addr + size), from the one that holds addr. */
static size_t
pieces_from(const struct sop__segment *seg, CUdeviceptr addr)
{
	size_t lo = 0, hi = seg->n_pieces;

	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (seg->pieces[mid]->va <= addr)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* The segment that holds addr. Pool lock held. */
static struct sop__segment *
segment_of(struct sop_pool *pool, CUdeviceptr addr)
{
	struct sop__segment *seg;

	for (seg = pool->segments; seg; seg = seg->next)
		if (addr >= seg->va && addr - seg->va < seg->size)
			return seg;
	return NULL;
}

static uint64_t
piece_under(const struct sop__segment *seg, CUdeviceptr addr, size_t size)
{
	const struct sop__piece *pc;

	if (!seg->n_pieces)
		return 0;
	pc = seg->pieces[pieces_from(seg, addr)];
	return pc->va <= addr && addr + size <= pc->va + pc->size ? pc->serial : 0;
}

static bool
had(const struct sop__wire_request *q, uint64_t serial)
{
	uint32_t i;

	for (i = 0; i < q->n_have && i < SOP_WIRE_HAVE; i++)
		if (q->have[i] == serial)
			return true;
	return false;
}

/* Pieces' descriptors an exported pool keeps open, at most. Each is a descriptor of the
 * application's process: a pool of a thousand pieces that importers had all asked for would
 * take a thousand of them, past the usual soft limit of 1024, and the application's own opens
 * would fail. Importers map a piece once, however many pointers it backs, so one asked for
 * again is rare; past the limit the one asked for least recently is closed, and exported again
 * if it is asked for again. */
size_t sop__share_fds_max = 64;

/* Close the descriptor pc keeps (release.c does the same when it releases the piece). Pool
 * lock held. */
static void
piece_fd_drop(struct sop_pool *pool, struct sop__piece *pc)
{
	close(pc->fd_plus1 - 1);
	pc->fd_plus1 = 0;
	pool->fds_kept--;
}

/* Close the kept descriptor that served a request least recently, other than keep's. Pool lock
 * held. */
static void
fds_shed(struct sop_pool *pool, const struct sop__piece *keep)
{
	struct sop__piece *old = NULL;
	struct sop__segment *seg;
	size_t i;

	for (seg = pool->segments; seg; seg = seg->next)
		for (i = 0; i < seg->n_pieces; i++) {
			struct sop__piece *pc = seg->pieces[i];
			if (pc->fd_plus1 && pc != keep && (!old || pc->fd_used < old->fd_used))
				old = pc;
		}
	if (old)
		piece_fd_drop(pool, old);
}

/* A descriptor of the piece's physical memory (0.6 ms on the H100, where sending one costs
 * microseconds). Context current; the pool lock held or not (ahead_export). */
static CUresult
piece_export(CUmemGenericAllocationHandle handle, int *fd)
{
	return SOP_DRV(cuMemExportToShareableHandle)(fd, handle,
						     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
}

/* Keep d, a descriptor of pc just exported, as the one pc keeps; d is closed. Pool lock held. */
static CUresult
piece_keep(struct sop_pool *pool, struct sop__piece *pc, int d)
{
	/* Kept close-on-exec: a program the application executes gets none of them. */
	int kept = fcntl(d, F_DUPFD_CLOEXEC, 0);

	close(d);
	if (kept < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pc->fd_plus1 = kept + 1;
	pool->fds_kept++;
	while (pool->fds_kept > sop__share_fds_max && pool->fds_kept > 1)
		fds_shed(pool, pc);
	return CUDA_SUCCESS;
}

/* A descriptor of the piece for one answer, closed once sent: a copy of the one the piece keeps,
 * exported ahead (ahead_export) or here, at the first request for it, and closed when the piece
 * is released (release.c), or when the pool keeps sop__share_fds_max others used more
 * recently. Pool lock held, context current. */
static CUresult
piece_fd(struct sop_pool *pool, struct sop__piece *pc, int *fd)
{
	CUresult r;
	int d;

	if (!pc->fd_plus1) {
		r = piece_export(pc->handle, &d);
		if (r == CUDA_SUCCESS)
			r = piece_keep(pool, pc, d);
		if (r != CUDA_SUCCESS)
			return r;
	}
	pc->fd_used = ++pool->fd_clock;
	*fd = fcntl(pc->fd_plus1 - 1, F_DUPFD_CLOEXEC, 0);
	return *fd >= 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* What a request asks for, looked up under the pool lock: the pieces under the allocation in
 * *out (malloc'd), each exported as a descriptor unless the importer has it. */
static CUresult
answer_make(struct sop__broker *bk, const struct sop__wire_request *q,
	    struct sop__wire_piece **out, int **fds_out, size_t *n_out)
{
	struct sop_pool *pool = bk->pool;
	const struct sop__export_data *d = &q->data;
	struct sop__wire_piece *v = NULL;
	struct sop__segment *seg;
	struct sop__block *b;
	CUdeviceptr addr, end;
	size_t i, n = 0, cap = 0;
	int *fds = NULL, mode;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	if (d->magic != SOP_WIRE_MAGIC || d->version != SOP_WIRE_VERSION || d->zero || d->pad[0] ||
	    d->pad[1] || d->check != sop__share_check(d) || d->token != pool->token || !d->gen ||
	    !d->size ||
	    d->off >= pool->va_size || d->size > pool->va_size - d->off)
		return CUDA_ERROR_INVALID_VALUE;
	addr = pool->va_base + d->off;
	end = addr + d->size;
	mode = sop__capture_relax();
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	if (atomic_load(&pool->dead) || atomic_load(&pool->destroyed))
		goto out;
	b = sop__map_get(pool, addr);
	if (!b || atomic_load_explicit(&b->tag, memory_order_acquire) !=
			  sop__tag(addr, SOP_BLOCK_ALLOC) ||
	    __atomic_load_n(&b->gen, __ATOMIC_RELAXED) != d->gen ||
	    __atomic_load_n(&b->req, __ATOMIC_RELAXED) != d->size)
		goto out;
	/* The segment from the address, not from the descriptor: a free and reuse of the block
	 * by the exporter's threads (against the importers' order) may be rewriting it. */
	seg = segment_of(pool, addr);
	if (!seg)
		goto out;
	r = sop__pool_ctx_push(pool);
	if (r != CUDA_SUCCESS)
		goto out;
	for (i = pieces_from(seg, addr); i < seg->n_pieces && seg->pieces[i]->va < end; i++) {
		struct sop__piece *pc = seg->pieces[i];
		int fd = -1;

		if (n == cap) {
			size_t c = cap ? 2 * cap : 8;
			struct sop__wire_piece *nv = realloc(v, c * sizeof *v);
			int *nf = nv ? realloc(fds, c * sizeof *fds) : NULL;
			if (nv)
				v = nv;
			if (nf)
				fds = nf;
			if (!nv || !nf) {
				r = CUDA_ERROR_OUT_OF_MEMORY;
				break;
			}
			cap = c;
		}
		if (!had(q, pc->serial)) {
			while (pc->exporting) /* ahead_export: this thread's request is next */
				pthread_cond_wait(&bk->exported, &pool->lock);
			r = piece_fd(pool, pc, &fd);
			if (r != CUDA_SUCCESS)
				break;
		}
		memset(&v[n], 0, sizeof v[n]);
		v[n].serial = pc->serial;
		v[n].off = pc->va - pool->va_base;
		v[n].size = pc->size;
		v[n].fd = fd >= 0;
		fds[n++] = fd;
	}
	sop__pool_ctx_pop(pool);
	/* An allocation is backed throughout; pieces that do not reach its end mean a block map
	 * out of step, which the importer must not be handed. */
	if (r == CUDA_SUCCESS && (!n || seg->pieces[pieces_from(seg, addr)]->va > addr ||
				  v[n - 1].off + v[n - 1].size < d->off + d->size))
		r = CUDA_ERROR_INVALID_VALUE;
out:
	sop__mutex_drop(&pool->lock);
	sop__capture_restore(mode);
	if (r != CUDA_SUCCESS) {
		sop__wire_fds_close(fds, n);
		free(v);
		free(fds);
		return r;
	}
	*out = v;
	*fds_out = fds;
	*n_out = n;
	return CUDA_SUCCESS;
}

/* Send one answer message: pieces [at, at + k) of v, with their descriptors. */
static bool
answer_send(int conn, CUresult status, const struct sop__wire_piece *v, const int *fds,
	    size_t n, size_t at, size_t k)
{
	struct sop__wire_answer a = {0};
	int sent[SOP_WIRE_PIECES_MAX];
	size_t i, n_fd = 0;

	a.magic = SOP_WIRE_MAGIC;
	a.version = SOP_WIRE_VERSION;
	a.op = SOP_WIRE_ANSWER;
	a.status = (int32_t)status;
	a.n_total = (uint32_t)n;
	a.n_here = (uint32_t)k;
	for (i = 0; i < k; i++) {
		a.pieces[i] = v[at + i];
		if (fds[at + i] >= 0)
			sent[n_fd++] = fds[at + i];
	}
	return sop__wire_send(conn, &a, sizeof a, sent, n_fd, 0);
}

/* Serve one request on a private connection; false when the connection is done with (closed by
 * the importer, or misbehaving). */
static bool
serve(struct sop__broker *bk, int conn)
{
	struct sop__wire_request q;
	struct sop__wire_piece *v = NULL;
	int *fds = NULL;
	size_t n = 0, at = 0;
	ssize_t got = recv(conn, &q, sizeof q, MSG_DONTWAIT);
	CUresult r;
	bool ok = true;

	if (got < 0)
		return errno == EAGAIN || errno == EINTR;
	if (got != (ssize_t)sizeof q || q.magic != SOP_WIRE_MAGIC ||
	    q.version != SOP_WIRE_VERSION || q.op != SOP_WIRE_PIECES)
		return false;
	r = answer_make(bk, &q, &v, &fds, &n);
	if (r != CUDA_SUCCESS)
		return answer_send(conn, r, NULL, NULL, 0, 0, 0);
	do {
		size_t k = n - at < SOP_WIRE_PIECES_MAX ? n - at : SOP_WIRE_PIECES_MAX;
		ok = answer_send(conn, CUDA_SUCCESS, v, fds, n, at, k);
		at += k;
	} while (ok && at < n);
	sop__wire_fds_close(fds, n);
	free(v);
	free(fds);
	return ok;
}

static const struct timeval send_wait = {5, 0};

/* A message on the shared end: an importer's connection, welcomed (with the board's descriptor,
 * which the importer maps read-only); or -1. */
static int
hello(struct sop__broker *bk, const struct sop__wire_welcome *w, int board_fd)
{
	struct sop__wire_hello h;
	size_t n_fd;
	int conn;

	if (sop__wire_recv(bk->b, &h, sizeof h, &conn, 1, &n_fd, MSG_DONTWAIT) !=
		    (ssize_t)sizeof h ||
	    !n_fd)
		return -1;
	if (h.magic != SOP_WIRE_MAGIC || h.version != SOP_WIRE_VERSION || h.op != SOP_WIRE_HELLO) {
		close(conn);
		return -1;
	}
	/* An importer that stops reading cannot hold the broker (and the pool's destruction,
	 * which waits for it) for more than this: its connection is dropped. */
	setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &send_wait, sizeof send_wait);
	if (!sop__wire_send(conn, w, sizeof *w, &board_fd, board_fd >= 0, MSG_DONTWAIT)) {
		close(conn);
		return -1;
	}
	return conn;
}

/* Export the pieces marked ahead (ahead_mark), one at a time, until none is left or the pool
 * stops sharing. The export runs with the pool lock dropped, which the pool's threads would
 * otherwise wait 0.6 ms for, and on a thread of its own, so that the broker answers importers
 * meanwhile (an importer's pool import waited 0.7 ms for it on an H200, where the broker did
 * it): the piece is marked exporting, so that no release unmaps it (release.c, idle_collect),
 * and a request for it waits for the export (answer_make). */
static void
ahead_export(struct sop__broker *bk)
{
	struct sop_pool *pool = bk->pool;

	for (;;) {
		CUmemGenericAllocationHandle handle = 0;
		struct sop__piece *pc = NULL;
		struct sop__segment *seg;
		bool go = false;
		int mode, fd = -1;
		CUresult r = CUDA_ERROR_NOT_READY;
		size_t i;

		sop__mutex_take(&pool->lock, SOP_RANK_POOL);
		if (pool->broker == bk && !atomic_load(&pool->dead) &&
		    !atomic_load(&pool->destroyed))
			for (seg = pool->segments; seg && !pc; seg = seg->next)
				for (i = 0; i < seg->n_pieces && !pc; i++)
					if (seg->pieces[i]->ahead)
						pc = seg->pieces[i];
		if (pc) {
			pc->ahead = false;
			/* Never in place of a kept descriptor (fds_shed), which an importer may ask
			 * for again. */
			go = !pc->fd_plus1 && pool->fds_kept < sop__share_fds_max;
			pc->exporting = go;
			handle = pc->handle;
		}
		sop__mutex_drop(&pool->lock);
		if (!go) {
			if (!pc)
				return;
			continue;
		}
		/* A failure leaves the export to the importer's request, which reports it. */
		mode = sop__capture_relax();
		if (sop__pool_ctx_push(pool) == CUDA_SUCCESS) {
			r = piece_export(handle, &fd);
			sop__pool_ctx_pop(pool);
		}
		sop__capture_restore(mode);
		sop__mutex_take(&pool->lock, SOP_RANK_POOL);
		pc->exporting = false;
		if (r == CUDA_SUCCESS && !pc->fd_plus1)
			(void)piece_keep(pool, pc, fd);
		else if (r == CUDA_SUCCESS)
			close(fd);
		pthread_cond_broadcast(&bk->exported);
		sop__mutex_drop(&pool->lock);
	}
}

static void *
ahead_main(void *p)
{
	struct sop__broker *bk = p;
	struct pollfd pfd[2];
	char buf[64];

	for (;;) {
		pfd[0] = (struct pollfd){.fd = bk->wake[0], .events = POLLIN};
		pfd[1] = (struct pollfd){.fd = bk->hint[0], .events = POLLIN};
		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pfd[0].revents)
			break;
		while (read(bk->hint[0], buf, sizeof buf) > 0)
			;
		ahead_export(bk);
	}
	return NULL;
}

struct broker_arg {
	struct sop__broker *bk;
	struct sop__wire_welcome welcome;
	int board_fd; /* -1: none */
};

/* Room for one more connection; false without host memory. List lock held. */
static bool
conn_room(struct sop__broker *bk)
{
	int *v;
	size_t c;

	if (bk->n_conn < bk->cap_conn)
		return true;
	c = bk->cap_conn ? 2 * bk->cap_conn : 16;
	v = realloc(bk->conn, c * sizeof *v);
	if (!v)
		return false;
	bk->conn = v;
	bk->cap_conn = c;
	return true;
}

static void *
broker_main(void *p)
{
	struct broker_arg *arg = p;
	struct sop__broker *bk = arg->bk;
	struct pollfd *pfd = NULL;
	size_t cap = 0, n, i;
	bool room;

	for (;;) {
		pthread_mutex_lock(&brokers_lock);
		room = conn_room(bk);
		n = bk->n_conn;
		pthread_mutex_unlock(&brokers_lock);
		if (n + 2 > cap) {
			struct pollfd *np = realloc(pfd, (n + 2) * sizeof *pfd);
			if (np) {
				pfd = np;
				cap = n + 2;
			}
		}
		if (!pfd || n + 2 > cap) {
			/* No host memory for the table: wait and try again. */
			usleep(10000);
			continue;
		}
		pfd[0] = (struct pollfd){.fd = bk->wake[0], .events = POLLIN};
		/* No new importers while there is no room to note them. */
		pfd[1] = (struct pollfd){.fd = room ? bk->b : -1, .events = POLLIN};
		for (i = 0; i < n; i++)
			pfd[2 + i] = (struct pollfd){.fd = bk->conn[i], .events = POLLIN};
		if (poll(pfd, 2 + n, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pfd[0].revents)
			break;
		for (i = n; i-- > 0;) {
			if (!pfd[2 + i].revents)
				continue;
			if (!(pfd[2 + i].revents & POLLIN) || !serve(bk, bk->conn[i])) {
				pthread_mutex_lock(&brokers_lock);
				close(bk->conn[i]);
				bk->conn[i] = bk->conn[--bk->n_conn];
				pthread_mutex_unlock(&brokers_lock);
			}
		}
		if (pfd[1].revents & POLLIN) {
			int c = hello(bk, &arg->welcome, arg->board_fd);
			if (c >= 0) {
				pthread_mutex_lock(&brokers_lock);
				bk->conn[bk->n_conn++] = c; /* room was made above */
				pthread_mutex_unlock(&brokers_lock);
			}
		}
	}
	pthread_mutex_lock(&brokers_lock);
	for (i = 0; i < bk->n_conn; i++)
		close(bk->conn[i]);
	bk->n_conn = 0;
	pthread_mutex_unlock(&brokers_lock);
	free(pfd);
	free(arg);
	return NULL;
}

static void
broker_close(struct sop__broker *bk)
{
	free(bk->conn);
	if (bk->a >= 0)
		close(bk->a);
	if (bk->b >= 0)
		close(bk->b);
	if (bk->wake[0] >= 0)
		close(bk->wake[0]);
	if (bk->wake[1] >= 0)
		close(bk->wake[1]);
	if (bk->hint[0] >= 0)
		close(bk->hint[0]);
	if (bk->hint[1] >= 0)
		close(bk->hint[1]);
	pthread_cond_destroy(&bk->exported);
	free(bk);
}

/* Start the pool's broker. Pool lock held. */
static CUresult
broker_start(struct sop_pool *pool)
{
	struct sop__broker *bk = calloc(1, sizeof *bk);
	struct broker_arg *arg = calloc(1, sizeof *arg);
	sigset_t all, old;
	int sv[2], e;

	if (!bk || !arg) {
		free(bk);
		free(arg);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	bk->pool = pool;
	bk->a = bk->b = bk->wake[0] = bk->wake[1] = bk->hint[0] = bk->hint[1] = -1;
	pthread_cond_init(&bk->exported, NULL);
	arg->bk = bk;
	arg->welcome.magic = SOP_WIRE_MAGIC;
	arg->welcome.version = SOP_WIRE_VERSION;
	arg->welcome.op = SOP_WIRE_WELCOME;
	arg->welcome.token = pool->token;
	arg->welcome.va_size = pool->va_size;
	arg->welcome.granularity = pool->granularity;
	arg->welcome.max_size = pool->props.maxSize;
	arg->welcome.location = pool->props.location;
	arg->welcome.handle_types = (uint32_t)pool->props.handleTypes;
	if (!pool->host &&
	    SOP_DRV(cuDeviceGetUuid)(&arg->welcome.uuid, pool->device) != CUDA_SUCCESS) {
		free(arg);
		broker_close(bk);
		return CUDA_ERROR_INVALID_VALUE;
	}
	/* Without a board, importers ask the broker for every pointer. */
	arg->board_fd = board_ensure(pool) ? pool->board_fd_plus1 - 1 : -1;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		goto fail;
	bk->a = sv[0];
	bk->b = sv[1];
	if (pipe2(bk->wake, O_CLOEXEC) < 0 || pipe2(bk->hint, O_CLOEXEC | O_NONBLOCK) < 0)
		goto fail;
	/* Pointers exported before the pool: their pieces are marked, and nobody woke it. */
	{
		char c = 0;
		(void)!write(bk->hint[1], &c, 1);
	}
	pthread_once(&fork_once, fork_register);
	/* Signals are the application's threads' to take. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_mutex_lock(&brokers_lock);
	e = pthread_create(&bk->ahead_thread, NULL, ahead_main, bk);
	if (!e) {
		e = pthread_create(&bk->thread, NULL, broker_main, arg);
		if (e) {
			char c = 0;
			while (write(bk->wake[1], &c, 1) < 0 && errno == EINTR)
				;
			pthread_join(bk->ahead_thread, NULL);
		}
	}
	if (!e) {
		bk->next = brokers;
		brokers = bk;
	}
	pthread_mutex_unlock(&brokers_lock);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e)
		goto fail;
	pool->broker = bk;
	return CUDA_SUCCESS;
fail:
	free(arg);
	broker_close(bk);
	return CUDA_ERROR_OPERATING_SYSTEM;
}

CUresult
sop__share_export(struct sop_pool *pool, int *fd)
{
	CUresult r = CUDA_SUCCESS;
	int d = -1;

	if (!(pool->props.handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ||
	    pool->is_default || pool->imported)
		return CUDA_ERROR_INVALID_VALUE;
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	if (atomic_load(&pool->dead) || atomic_load(&pool->destroyed))
		r = CUDA_ERROR_INVALID_VALUE;
	else if (!pool->broker)
		r = broker_start(pool);
	if (r == CUDA_SUCCESS && (d = fcntl(pool->broker->a, F_DUPFD_CLOEXEC, 0)) < 0)
		r = errno == EMFILE || errno == ENFILE ? CUDA_ERROR_OUT_OF_MEMORY
						       : CUDA_ERROR_OPERATING_SYSTEM;
	sop__mutex_drop(&pool->lock);
	if (r == CUDA_SUCCESS)
		*fd = d;
	return r;
}

void
sop__share_stop(struct sop_pool *pool)
{
	struct sop__broker *bk, **pp;
	bool forked;

	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	bk = pool->broker;
	pool->broker = NULL;
	sop__mutex_drop(&pool->lock);
	if (!bk)
		return;
	pthread_mutex_lock(&brokers_lock);
	for (pp = &brokers; *pp; pp = &(*pp)->next)
		if (*pp == bk) {
			*pp = bk->next;
			break;
		}
	forked = bk->wake[1] < 0; /* a child's copy: no thread to stop */
	pthread_mutex_unlock(&brokers_lock);
	if (!forked) {
		char c = 0;
		while (write(bk->wake[1], &c, 1) < 0 && errno == EINTR)
			;
		pthread_join(bk->thread, NULL);
		pthread_join(bk->ahead_thread, NULL);
	}
	broker_close(bk);
}
