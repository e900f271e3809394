/* import.c - the importing side of a pool shared between processes: a pool that stands for the
 * exported one, pointers imported into it, and their frees.
 *
 * The imported pool reserves as many addresses as the exporter's pool, and maps each piece of
 * the exporter at the piece's own offset, so that an allocation that spans several pieces is
 * contiguous here as there. Pieces are asked for when a pointer needs them (share.c answers),
 * mapped once however many pointers they back, and unmapped when the last of those has been
 * freed and its free has completed: an importer never pins memory the exporter has let go, and
 * a piece the exporter releases and makes again elsewhere is a new serial here.
 *
 * Locks: the import's lock, for one exchange with the broker at a time, then the pool lock.
 * Nothing waits on the socket with the pool lock held.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "internal.h"

/* How long an importer waits for an exporter's broker before it gives up on it. */
#define IMPORT_WAIT_S 5

/* Every import with a connection, so that a forked child can let go of its copies. */
static pthread_mutex_t imports_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sop__import *imports;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void
fork_prepare(void)
{
	pthread_mutex_lock(&imports_lock);
}

static void
fork_parent(void)
{
	pthread_mutex_unlock(&imports_lock);
}

/* A child shares its parent's connections: an answer could reach the wrong process. The child's
 * imports are closed (doc/differences.md). */
static void
fork_child(void)
{
	struct sop__import *im;

	for (im = imports; im; im = im->next) {
		close(im->fd);
		im->fd = -1;
	}
	imports = NULL;
	pthread_mutex_unlock(&imports_lock);
}

static void
fork_register(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void
imports_unlink(struct sop__import *im)
{
	struct sop__import **pp;

	pthread_mutex_lock(&imports_lock);
	for (pp = &imports; *pp; pp = &(*pp)->next)
		if (*pp == im) {
			*pp = im->next;
			break;
		}
	pthread_mutex_unlock(&imports_lock);
}

static void
conn_close(struct sop__import *im)
{
	if (im->fd >= 0) {
		imports_unlink(im);
		close(im->fd);
		im->fd = -1;
	}
}

/* ---- Importing a pool ------------------------------------------------------------------------ */

/* Send the hello, with the connection of our own, on the exported descriptor. Not waiting: a
 * descriptor of something else, or an exporter gone, fails here. */
static bool
hello_send(int shared, int theirs)
{
	struct sop__wire_hello h = {SOP_WIRE_MAGIC, SOP_WIRE_VERSION, SOP_WIRE_HELLO, 0};

	return sop__wire_send(shared, &h, sizeof h, &theirs, 1, MSG_DONTWAIT);
}

/* The welcome, and the exporter's board mapped read-only if it came with one (NULL if not). */
static bool
welcome_recv(int conn, struct sop__wire_welcome *w, struct sop__board_slot **board)
{
	struct stat st;
	size_t n_fd;
	void *p;
	int fd;

	*board = NULL;
	if (sop__wire_recv(conn, w, sizeof *w, &fd, 1, &n_fd, 0) != (ssize_t)sizeof *w)
		return false;
	if (!n_fd)
		return true;
	/* Of the board's size, or it is not mapped: a shorter file would fault where the board is
	 * read. */
	if (!fstat(fd, &st) && st.st_size >= (off_t)SOP_BOARD_BYTES &&
	    (p = mmap(NULL, SOP_BOARD_BYTES, PROT_READ, MAP_SHARED, fd, 0)) != MAP_FAILED)
		*board = p;
	close(fd);
	return true;
}

/* The device whose UUID this is, or -1. */
static CUdevice
device_of_uuid(const CUuuid *uuid)
{
	int n = sop__device_count(), d;

	for (d = 0; d < n; d++) {
		CUuuid u;
		if (SOP_DRV(cuDeviceGetUuid)(&u, d) == CUDA_SUCCESS &&
		    !memcmp(u.bytes, uuid->bytes, sizeof u.bytes))
			return d;
	}
	return -1;
}

CUresult
sop__import_pool(int shared, struct sop_pool **out)
{
	struct sop__wire_welcome w;
	struct timeval tv = {IMPORT_WAIT_S, 0};
	CUmemPoolProps props = {0};
	struct sop__board_slot *board = NULL;
	struct sop__import *im = NULL;
	struct sop_pool *pool;
	int sv[2];
	CUresult r = CUDA_SUCCESS;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return errno == EMFILE || errno == ENFILE ? CUDA_ERROR_OUT_OF_MEMORY
							  : CUDA_ERROR_OPERATING_SYSTEM;
	setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(sv[0], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (!hello_send(shared, sv[1])) {
		close(sv[0]);
		close(sv[1]);
		return CUDA_ERROR_INVALID_VALUE;
	}
	close(sv[1]);
	/* A socket nobody answers on (not a sop pool's) times out; a closed broker reads 0. */
	/* What an exportable pool can be, and nothing else: a device's or a NUMA node's memory,
	 * shareable as descriptors. */
	if (!welcome_recv(sv[0], &w, &board) || w.magic != SOP_WIRE_MAGIC ||
	    w.version != SOP_WIRE_VERSION || w.op != SOP_WIRE_WELCOME || w.status ||
	    !w.va_size || !w.token || w.handle_types != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
	    (w.location.type != CU_MEM_LOCATION_TYPE_DEVICE &&
	     w.location.type != CU_MEM_LOCATION_TYPE_HOST_NUMA) ||
	    w.location.id < 0) {
		if (board)
			munmap(board, SOP_BOARD_BYTES);
		close(sv[0]);
		return CUDA_ERROR_INVALID_VALUE;
	}
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location = w.location;
	props.handleTypes = (CUmemAllocationHandleType)w.handle_types;
	props.maxSize = w.max_size;
	if (w.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
	    (props.location.id = device_of_uuid(&w.uuid)) < 0)
		r = CUDA_ERROR_NOT_SUPPORTED;
	else if (!(im = calloc(1, sizeof *im)))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	if (r != CUDA_SUCCESS) {
		if (board)
			munmap(board, SOP_BOARD_BYTES);
		close(sv[0]);
		return r;
	}
	pthread_mutex_init(&im->lock, NULL);
	im->fd = sv[0];
	r = sop__pool_new(&props, false, w.va_size, &pool);
	if (r == CUDA_SUCCESS && pool->granularity != w.granularity) {
		/* Pieces could not be mapped at the exporter's offsets. */
		sop__forget_current(pool);
		sop__pool_destroy(pool);
		r = CUDA_ERROR_NOT_SUPPORTED;
	}
	if (r != CUDA_SUCCESS) {
		if (board)
			munmap(board, SOP_BOARD_BYTES);
		close(sv[0]);
		pthread_mutex_destroy(&im->lock);
		free(im);
		return r;
	}
	pool->board = board;
	pool->token = w.token;
	pool->import = im;
	pool->imported = true;
	pthread_once(&fork_once, fork_register);
	pthread_mutex_lock(&imports_lock);
	im->next = imports;
	imports = im;
	pthread_mutex_unlock(&imports_lock);
	*out = pool;
	return CUDA_SUCCESS;
}

/* ---- Pieces and imported pointers (pool lock held) -------------------------------------------- */

/* The first mapped piece that ends after va. */
static size_t
piece_index(const struct sop__import *im, CUdeviceptr va)
{
	size_t lo = 0, hi = im->n_pieces;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (im->pieces[mid]->va + im->pieces[mid]->size <= va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The first record at or after ptr. Records of one address keep the live one, if any, first: a
 * new import goes before the pending ones there. */
static size_t
ptr_index(const struct sop__import *im, CUdeviceptr ptr)
{
	size_t lo = 0, hi = im->n_ptrs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (im->ptrs[mid].ptr < ptr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Unmap and release a piece no pointer uses: the unmap's code. Context current. */
static CUresult
piece_drop(struct sop_pool *pool, size_t i)
{
	struct sop__import *im = pool->import;
	struct sop__piece *pc = im->pieces[i];
	CUresult r = SOP_DRV(cuMemUnmap)(pc->va, pc->size);

	if (r != CUDA_SUCCESS) {
		/* Still mapped: kept, and counted, rather than lost, until an unmap goes through. */
		__atomic_store_n(&im->kept, true, __ATOMIC_RELAXED);
		return r;
	}
	if (SOP_DRV(cuMemRelease)(pc->handle) != CUDA_SUCCESS)
		sop__orphan_keep(pool, pc->handle);
	atomic_store(&pool->reserved, atomic_load(&pool->reserved) - pc->size);
	memmove(&im->pieces[i], &im->pieces[i + 1], (im->n_pieces - i - 1) * sizeof *im->pieces);
	im->n_pieces--;
	free(pc);
	return CUDA_SUCCESS;
}

/* Add delta to the references of the pieces under [ptr, ptr + size); with a drop to zero, the
 * piece goes. Context current. */
static void
pieces_ref(struct sop_pool *pool, CUdeviceptr ptr, size_t size, int delta)
{
	struct sop__import *im = pool->import;
	size_t i = piece_index(im, ptr);

	while (i < im->n_pieces && im->pieces[i]->va < ptr + size) {
		struct sop__piece *pc = im->pieces[i];
		if (delta > 0) {
			pc->refs++;
		} else if (!--pc->refs) {
			size_t before = im->n_pieces;
			piece_drop(pool, i);
			if (im->n_pieces < before)
				continue;
		}
		i++;
	}
}

/* Drop the pieces that no pointer references: those mapped by a call that failed, and those
 * whose unmap the driver refused before. Context current. */
static void
pieces_unused_drop(struct sop_pool *pool)
{
	struct sop__import *im = pool->import;
	size_t i;

	__atomic_store_n(&im->kept, false, __ATOMIC_RELAXED);
	for (i = im->n_pieces; i-- > 0;)
		if (!im->pieces[i]->refs)
			piece_drop(pool, i);
}

/* Forget record i: its pointer is freed and the free has completed. Context current. */
static void
ptr_drop(struct sop_pool *pool, size_t i)
{
	struct sop__import *im = pool->import;
	struct sop__imported rec = im->ptrs[i];

	memmove(&im->ptrs[i], &im->ptrs[i + 1], (im->n_ptrs - i - 1) * sizeof *im->ptrs);
	im->n_ptrs--;
	if (rec.done) {
		SOP_DRV(cuEventDestroy)(rec.done);
		/* Peeked at without the lock (sop__import_sync). */
		__atomic_store_n(&im->n_pending, im->n_pending - 1, __ATOMIC_RELAXED);
	}
	pieces_ref(pool, rec.ptr, rec.size, -1);
}

/* Close the connection and free the tables of a destroyed import with nothing left. */
static void
import_close(struct sop_pool *pool)
{
	struct sop__import *im = pool->import;

	conn_close(im);
	if (!im->n_ptrs && !im->n_pieces) {
		free(im->ptrs);
		free(im->pieces);
		im->ptrs = NULL;
		im->pieces = NULL;
		im->cap_ptrs = im->cap_pieces = 0;
	}
}

/* Forget the pointers whose frees have completed (all of them, waiting, with wait). Pool lock
 * held; returns true if that tore the pool down (the lock is then released). */
static bool
reap(struct sop_pool *pool, bool wait)
{
	struct sop__import *im = pool->import;
	size_t i;
	int mode;

	if (im->kept && sop__pool_ctx_push(pool) == CUDA_SUCCESS) {
		pieces_unused_drop(pool);
		sop__pool_ctx_pop(pool);
	}
	if (im->n_pending && sop__pool_ctx_push(pool) == CUDA_SUCCESS) {
		mode = sop__capture_relax();
		for (i = im->n_ptrs; i-- > 0;) {
			CUevent ev = im->ptrs[i].done;
			if (!ev)
				continue;
			if ((wait ? SOP_DRV(cuEventSynchronize)(ev) : SOP_DRV(cuEventQuery)(ev)) ==
			    CUDA_SUCCESS)
				ptr_drop(pool, i);
		}
		sop__capture_restore(mode);
		sop__pool_ctx_pop(pool);
	}
	if (atomic_load(&pool->destroyed)) {
		import_close(pool);
		return sop__pool_reap(pool);
	}
	return false;
}

void
sop__import_sync(struct sop_pool *pool, bool wait)
{
	if (!__atomic_load_n(&pool->import->n_pending, __ATOMIC_RELAXED) &&
	    !__atomic_load_n(&pool->import->kept, __ATOMIC_RELAXED) &&
	    !atomic_load(&pool->destroyed))
		return;
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	if (atomic_load(&pool->dead) || !reap(pool, wait))
		sop__mutex_drop(&pool->lock);
}

/* ---- Importing a pointer --------------------------------------------------------------------- */

/* Ask the broker for the pieces under the allocation d names. The answer's pieces in *v
 * (malloc'd) and their descriptors in *fds (-1 where the importer said it had the piece). */
static CUresult
ask(struct sop__import *im, const struct sop__wire_request *q, struct sop__wire_piece **v_out,
    int **fds_out, size_t *n_out)
{
	struct sop__wire_answer a;
	struct sop__wire_piece *v = NULL;
	int *fds = NULL;
	size_t n = 0, total = 0, i;
	CUresult r = CUDA_SUCCESS;

	if (send(im->fd, q, sizeof *q, MSG_NOSIGNAL) != (ssize_t)sizeof *q)
		return CUDA_ERROR_INVALID_VALUE;
	do {
		int got_fds[SOP_WIRE_PIECES_MAX];
		size_t n_fd, k;

		if (sop__wire_recv(im->fd, &a, sizeof a, got_fds, SOP_WIRE_PIECES_MAX, &n_fd, 0) !=
		    (ssize_t)sizeof a) {
			r = CUDA_ERROR_INVALID_VALUE;
			/* The connection is out of step, or gone: no later call may use it. */
			conn_close(im);
			break;
		}
		if (a.magic != SOP_WIRE_MAGIC || a.op != SOP_WIRE_ANSWER || a.status ||
		    a.n_here > SOP_WIRE_PIECES_MAX || (total && a.n_total != total) ||
		    n + a.n_here > a.n_total) {
			r = a.magic == SOP_WIRE_MAGIC && a.status ? (CUresult)a.status
								 : CUDA_ERROR_INVALID_VALUE;
			sop__wire_fds_close(got_fds, n_fd);
			break;
		}
		total = a.n_total;
		if (!v) {
			v = calloc(total ? total : 1, sizeof *v);
			fds = calloc(total ? total : 1, sizeof *fds);
			if (!v || !fds) {
				sop__wire_fds_close(got_fds, n_fd);
				r = CUDA_ERROR_OUT_OF_MEMORY;
				break;
			}
		}
		for (k = 0, i = 0; k < a.n_here; k++) {
			v[n + k] = a.pieces[k];
			fds[n + k] = a.pieces[k].fd && i < n_fd ? got_fds[i++] : -1;
		}
		sop__wire_fds_close(got_fds + i, n_fd - i);
		n += a.n_here;
	} while (n < total);
	if (r != CUDA_SUCCESS) {
		if (fds)
			sop__wire_fds_close(fds, n);
		free(v);
		free(fds);
		return r;
	}
	*v_out = v;
	*fds_out = fds;
	*n_out = n;
	return CUDA_SUCCESS;
}

/* Room for n more pieces and one more pointer record. */
static bool
tables_reserve(struct sop__import *im, size_t n)
{
	if (im->n_pieces + n > im->cap_pieces) {
		size_t c = 2 * im->cap_pieces + n;
		struct sop__piece **v = realloc(im->pieces, c * sizeof *v);
		if (!v)
			return false;
		im->pieces = v;
		im->cap_pieces = c;
	}
	if (im->n_ptrs == im->cap_ptrs) {
		size_t c = im->cap_ptrs ? 2 * im->cap_ptrs : 16;
		struct sop__imported *v = realloc(im->ptrs, c * sizeof *v);
		if (!v)
			return false;
		im->ptrs = v;
		im->cap_ptrs = c;
	}
	return true;
}

/* Map what the answer names and is not mapped yet. CUDA_ERROR_NOT_FOUND: a piece the request
 * said we had is gone meanwhile (ask again, naming none); CUDA_ERROR_ALREADY_MAPPED: another
 * piece still holds its place. Pool lock held, context current; pieces mapped here before a
 * failure stay, unreferenced, for the caller to drop. */
static CUresult
pieces_map(struct sop_pool *pool, const struct sop__wire_piece *v, int *fds, size_t n)
{
	struct sop__import *im = pool->import;
	size_t k;

	for (k = 0; k < n; k++) {
		CUdeviceptr va = pool->va_base + v[k].off;
		size_t i = piece_index(im, va);
		struct sop__piece *pc;
		CUmemGenericAllocationHandle h;
		bool stuck = false;
		CUresult r;

		if (!v[k].serial) /* no piece's: 0 names those kept unopened */
			return CUDA_ERROR_INVALID_VALUE;
		/* A piece in the way that no pointer uses is one whose unmap the driver refused:
		 * tried again, and refused again, the driver's code. */
		while (i < im->n_pieces && im->pieces[i]->va < va + v[k].size &&
		       !im->pieces[i]->refs && im->pieces[i]->serial != v[k].serial)
			if ((r = piece_drop(pool, i)) != CUDA_SUCCESS)
				return r;
		if (i < im->n_pieces && im->pieces[i]->va < va + v[k].size) {
			if (im->pieces[i]->serial == v[k].serial && im->pieces[i]->va == va &&
			    im->pieces[i]->size == v[k].size)
				continue;
			return CUDA_ERROR_ALREADY_MAPPED;
		}
		if (fds[k] < 0)
			return CUDA_ERROR_NOT_FOUND;
		if (v[k].off % pool->granularity || v[k].size % pool->granularity || !v[k].size ||
		    v[k].off >= pool->va_size || v[k].size > pool->va_size - v[k].off)
			return CUDA_ERROR_INVALID_VALUE;
		pc = calloc(1, sizeof *pc);
		if (!pc)
			return CUDA_ERROR_OUT_OF_MEMORY;
		r = SOP_DRV(cuMemImportFromShareableHandle)(&h, (void *)(uintptr_t)fds[k],
							     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		close(fds[k]);
		fds[k] = -1;
		if (r == CUDA_SUCCESS) {
			r = sop__piece_open(pool, va, v[k].size, h, &stuck);
			if (r != CUDA_SUCCESS && !stuck && SOP_DRV(cuMemRelease)(h) != CUDA_SUCCESS)
				sop__orphan_keep(pool, h);
		}
		if (r != CUDA_SUCCESS && !stuck) {
			free(pc);
			return r;
		}
		pc->va = va;
		pc->size = v[k].size;
		pc->handle = h;
		/* Mapped but not opened, the driver refusing the unmap: kept as a piece no import
		 * may use (no serial), unreferenced, for the caller's drop to unmap. */
		pc->serial = stuck ? 0 : v[k].serial;
		memmove(&im->pieces[i + 1], &im->pieces[i], (im->n_pieces - i) * sizeof *im->pieces);
		im->pieces[i] = pc;
		im->n_pieces++;
		sop__reserved_add(pool, pc->size);
		if (stuck)
			return r;
	}
	return CUDA_SUCCESS;
}

/* Record an import of [ptr, ptr + size), whose pieces are mapped; room reserved. Pool lock
 * held. */
static void
ptr_add(struct sop_pool *pool, CUdeviceptr ptr, size_t size)
{
	struct sop__import *im = pool->import;
	size_t at = ptr_index(im, ptr);

	if (at < im->n_ptrs && im->ptrs[at].ptr == ptr && !im->ptrs[at].done &&
	    im->ptrs[at].size == size) {
		im->ptrs[at].count++;
	} else {
		memmove(&im->ptrs[at + 1], &im->ptrs[at], (im->n_ptrs - at) * sizeof *im->ptrs);
		im->ptrs[at] = (struct sop__imported){ptr, size, 1, NULL};
		im->n_ptrs++;
		pieces_ref(pool, ptr, size, 1);
	}
	im->used += size;
	if (im->used > im->used_high)
		im->used_high = im->used;
}

/* An import served here, without the broker: the exporter's board has the allocation, live, and
 * the one piece under it is mapped here already (the same piece: its serial). Pool lock held. */
static bool
import_local(struct sop_pool *pool, const struct sop__export_data *d)
{
	struct sop__import *im = pool->import;
	CUdeviceptr ptr = pool->va_base + d->off;
	uint64_t serial = 0;
	size_t h = sop__board_hash(d->off), k, i;
	struct sop__piece *pc;

	if (!pool->board)
		return false;
	for (k = 0; k < SOP_BOARD_PROBES; k++) {
		struct sop__board_slot *sl = &pool->board[(h + k) & (SOP_BOARD_SLOTS - 1)];
		uint64_t off, size;

		if (atomic_load_explicit(&sl->gen, memory_order_acquire) != d->gen)
			continue;
		off = atomic_load_explicit(&sl->off, memory_order_relaxed);
		size = atomic_load_explicit(&sl->size, memory_order_relaxed);
		serial = atomic_load_explicit(&sl->serial, memory_order_relaxed);
		/* Read as a sequence lock is: still the same export after the reads. */
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&sl->gen, memory_order_relaxed) != d->gen || off != d->off ||
		    size != d->size)
			return false;
		break;
	}
	if (k == SOP_BOARD_PROBES || !serial)
		return false;
	i = piece_index(im, ptr);
	if (i == im->n_pieces)
		return false;
	pc = im->pieces[i];
	if (pc->serial != serial || pc->va > ptr || ptr + d->size > pc->va + pc->size ||
	    !tables_reserve(im, 0))
		return false;
	ptr_add(pool, ptr, d->size);
	return true;
}

/* One attempt: ask, then map. with_have: name the pieces mapped already. */
static CUresult
import_once(struct sop_pool *pool, const struct sop__export_data *d, bool with_have,
	    bool *retry_wait)
{
	struct sop__import *im = pool->import;
	struct sop__wire_request q = {0};
	struct sop__wire_piece *v = NULL;
	CUdeviceptr ptr = pool->va_base + d->off;
	int *fds = NULL;
	size_t n = 0, i;
	CUresult r;

	q.magic = SOP_WIRE_MAGIC;
	q.version = SOP_WIRE_VERSION;
	q.op = SOP_WIRE_PIECES;
	q.data = *d;
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	if (with_have)
		for (i = piece_index(im, ptr);
		     i < im->n_pieces && im->pieces[i]->va < ptr + d->size && q.n_have < SOP_WIRE_HAVE;
		     i++)
			if (im->pieces[i]->serial)
				q.have[q.n_have++] = im->pieces[i]->serial;
	sop__mutex_drop(&pool->lock);

	r = ask(im, &q, &v, &fds, &n);
	if (r != CUDA_SUCCESS)
		return r;
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	r = sop__pool_ctx_push(pool);
	if (r == CUDA_SUCCESS) {
		if (!tables_reserve(im, n))
			r = CUDA_ERROR_OUT_OF_MEMORY;
		else
			r = pieces_map(pool, v, fds, n);
		if (r == CUDA_SUCCESS) {
			ptr_add(pool, ptr, d->size);
		} else {
			pieces_unused_drop(pool);
		}
		sop__pool_ctx_pop(pool);
	}
	/* A piece still in the way may be one whose pointers' frees are pending: worth a wait. */
	*retry_wait = r == CUDA_ERROR_ALREADY_MAPPED && im->n_pending;
	sop__mutex_drop(&pool->lock);
	sop__wire_fds_close(fds, n);
	free(v);
	free(fds);
	return r;
}

/* Whether export data is well formed for this pool: every field, the unused ones zero, and a
 * serial (gen) from 1 on: a freed slot of the board holds 0. */
static bool
data_ok(const struct sop_pool *pool, const CUmemPoolPtrExportData *data,
	const struct sop__export_data *d)
{
	size_t i;

	for (i = sizeof *d; i < sizeof data->reserved; i++)
		if (data->reserved[i])
			return false;
	return d->magic == SOP_WIRE_MAGIC && d->version == SOP_WIRE_VERSION && !d->zero &&
	       !d->pad[0] && !d->pad[1] && d->check == sop__share_check(d) &&
	       d->token == pool->token && d->gen && d->size && d->off < pool->va_size &&
	       d->size <= pool->va_size - d->off;
}

/* Whether the broker is still there: its end of the connection open. The board outlives an
 * exporter that exited or destroyed its pool, and must not answer for it. */
static bool
broker_alive(const struct sop__import *im)
{
	struct pollfd p = {.fd = im->fd, .events = POLLIN};

	if (im->fd < 0 || poll(&p, 1, 0) < 0)
		return false;
	return !(p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

CUresult
sop__import_pointer(struct sop_pool *pool, const CUmemPoolPtrExportData *data, void **out)
{
	struct sop__import *im = pool->import;
	struct sop__export_data d;
	bool retry_wait = false;
	CUresult r;
	int attempt;

	memcpy(&d, data, sizeof d);
	if (!data_ok(pool, data, &d))
		return CUDA_ERROR_INVALID_VALUE;
	sop__mutex_take(&im->lock, SOP_RANK_IMPORT);
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	if (atomic_load(&pool->destroyed) || im->fd < 0) {
		sop__mutex_drop(&pool->lock);
		sop__mutex_drop(&im->lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	reap(pool, false);
	if (broker_alive(im) && import_local(pool, &d)) {
		sop__mutex_drop(&pool->lock);
		sop__mutex_drop(&im->lock);
		*out = (void *)(uintptr_t)(pool->va_base + d.off);
		return CUDA_SUCCESS;
	}
	sop__mutex_drop(&pool->lock);
	r = import_once(pool, &d, true, &retry_wait);
	for (attempt = 0; attempt < 2 && (r == CUDA_ERROR_NOT_FOUND || retry_wait); attempt++) {
		if (retry_wait) {
			sop__mutex_take(&pool->lock, SOP_RANK_POOL);
			reap(pool, true);
			sop__mutex_drop(&pool->lock);
		}
		r = im->fd < 0 ? CUDA_ERROR_INVALID_VALUE : import_once(pool, &d, false, &retry_wait);
	}
	sop__mutex_drop(&im->lock);
	if (r == CUDA_ERROR_NOT_FOUND || r == CUDA_ERROR_ALREADY_MAPPED)
		/* What the importer still holds of memory the exporter has let go: against the
		 * driver's rule that importers free first. */
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS)
		*out = (void *)(uintptr_t)(pool->va_base + d.off);
	return r;
}

/* ---- Frees ---------------------------------------------------------------------------------- */

/* An event recorded on stream after the free, in the stream's context. */
static CUresult
free_event(CUstream stream, CUevent *out)
{
	CUcontext ctx = NULL;
	CUresult r = CUDA_SUCCESS;
	bool pushed = false;

	if (!sop__stream_special(stream)) {
		r = SOP_DRV(cuStreamGetCtx)(stream, &ctx);
		if (r == CUDA_SUCCESS)
			r = SOP_DRV(cuCtxPushCurrent)(ctx);
		pushed = r == CUDA_SUCCESS;
	}
	if (r == CUDA_SUCCESS)
		r = SOP_DRV(cuEventCreate)(out, CU_EVENT_DISABLE_TIMING);
	if (r == CUDA_SUCCESS) {
		r = SOP_DRV(cuEventRecord)(*out, stream);
		if (r != CUDA_SUCCESS)
			SOP_DRV(cuEventDestroy)(*out);
	}
	if (pushed)
		SOP_DRV(cuCtxPopCurrent)(&ctx);
	return r;
}

CUresult
sop__import_free(struct sop_pool *pool, CUdeviceptr addr, CUstream stream, bool now)
{
	struct sop__import *im = pool->import;
	CUevent ev = NULL;
	CUresult r = CUDA_SUCCESS;
	size_t i;

	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	i = ptr_index(im, addr);
	if (atomic_load(&pool->dead) || i == im->n_ptrs || im->ptrs[i].ptr != addr ||
	    im->ptrs[i].done) {
		sop__mutex_drop(&pool->lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	im->used -= im->ptrs[i].size;
	if (--im->ptrs[i].count) {
		sop__mutex_drop(&pool->lock);
		return CUDA_SUCCESS;
	}
	if (now) {
		if ((r = sop__pool_ctx_push(pool)) == CUDA_SUCCESS) {
			ptr_drop(pool, i);
			sop__pool_ctx_pop(pool);
		}
	} else if ((r = free_event(stream, &ev)) == CUDA_SUCCESS) {
		im->ptrs[i].done = ev;
		__atomic_store_n(&im->n_pending, im->n_pending + 1, __ATOMIC_RELAXED);
	}
	if (r != CUDA_SUCCESS) {
		im->ptrs[i].count++;
		im->used += im->ptrs[i].size;
	}
	if (!reap(pool, false))
		sop__mutex_drop(&pool->lock);
	return r;
}

/* ---- What the public calls read --------------------------------------------------------------- */

CUresult
sop__import_block(struct sop_pool *pool, CUdeviceptr addr, CUdeviceptr *start, size_t *size)
{
	struct sop__import *im = pool->import;
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	size_t i;

	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	/* Live imports are apart, but records of pending frees may lie over them (the exporter
	 * reused the memory since): look back past those. */
	for (i = ptr_index(im, addr + 1); i-- > 0;) {
		if (im->ptrs[i].done || addr - im->ptrs[i].ptr >= im->ptrs[i].size)
			continue;
		if (start)
			*start = im->ptrs[i].ptr;
		if (size)
			*size = im->ptrs[i].size;
		r = CUDA_SUCCESS;
		break;
	}
	sop__mutex_drop(&pool->lock);
	return r;
}

CUresult
sop__import_used(struct sop_pool *pool, CUmemPool_attribute attr, void *value, bool set)
{
	struct sop__import *im = pool->import;
	cuuint64_t v;

	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	if (set)
		im->used_high = im->used;
	v = attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT ? im->used : im->used_high;
	sop__mutex_drop(&pool->lock);
	if (!set)
		memcpy(value, &v, sizeof v);
	return CUDA_SUCCESS;
}

bool
sop__import_destroy(struct sop_pool *pool)
{
	struct sop__import *im = pool->import;

	/* No request in flight from here on: the import's lock orders it after any. */
	sop__mutex_take(&im->lock, SOP_RANK_IMPORT);
	if (!sop__forget_current(pool)) { /* marks it destroyed, unless another call did */
		sop__mutex_drop(&im->lock);
		return false;
	}
	sop__mutex_take(&pool->lock, SOP_RANK_POOL);
	if (!reap(pool, false))
		sop__mutex_drop(&pool->lock);
	sop__mutex_drop(&im->lock);
	return true;
}
