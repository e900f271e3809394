/* ipc-stale.c - an exported pool's data and teardown, where they meet: export data that names a
 * freed block is refused however it was exported or altered, an export racing the block's free
 * leaves nothing on the board, a pool destroyed while another thread exports it leaves no broker
 * to answer for it, and of destroys that race, one succeeds.
 * In one process: the pool imported into the process that exports it, as a second process would.
 */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

#define POSIX_FD CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR

static bool sim; /* the simulated driver: more rounds, and live objects counted */

static sop_pool_t
fd_pool(void)
{
	CUmemPoolProps props = {0};
	sop_pool_t pool;

	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.handleTypes = POSIX_FD;
	TH_OK(sop_pool_create(&pool, &props));
	return pool;
}

static sop_pool_t
import_pool(sop_pool_t pool)
{
	sop_pool_t ipool;
	int fd;

	TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, POSIX_FD, 0));
	TH_OK(sop_pool_import_from_shareable_handle(&ipool, (void *)(intptr_t)fd, POSIX_FD, 0));
	close(fd);
	return ipool;
}

static int
board_entries(sop_pool_t pool, const CUmemPoolPtrExportData *data)
{
	struct sop__board_slot *board = TH_POOL(pool)->board;
	struct sop__export_data d;
	int k, n = 0;

	memcpy(&d, data, sizeof d);
	for (k = 0; k < SOP_BOARD_SLOTS; k++)
		n += atomic_load(&board[k].gen) == d.gen;
	return n;
}

/* Exported, freed, exported again: a block whose probe sequence had an earlier slot freed in
 * between is put on the board once, so that its free takes it off and its data is refused where
 * the importer still maps the piece (another import keeps it mapped). */
static void
export_again(void)
{
	enum { N = 8000 };
	static void *blk[N];
	CUmemPoolPtrExportData da, dx, dx2, db;
	CUdeviceptr base;
	CUstream st = th_stream();
	sop_pool_t pool = fd_pool(), ipool;
	void *ib, *ix = NULL;
	int i, j, a = -1, x = -1, b;

	for (i = 0; i < N; i++)
		TH_OK(sop_malloc_from_pool_async(&blk[i], 512, pool, st));
	TH_OK(sop_stream_synchronize(st));
	/* Two blocks whose probes start at the same slot of the board. */
	base = TH_POOL(pool)->va_base;
	for (i = 0; i < N && a < 0; i++)
		for (j = i + 1; j < N; j++)
			if (sop__board_hash((CUdeviceptr)blk[i] - base) ==
			    sop__board_hash((CUdeviceptr)blk[j] - base)) {
				a = i;
				x = j;
				break;
			}
	TH_ASSERT(a >= 0);
	b = x - 1 != a ? x - 1 : x + 1; /* X's neighbour, on the same piece */
	ipool = import_pool(pool);
	TH_OK(sop_pool_export_pointer(&db, blk[b]));
	TH_OK(sop_pool_import_pointer(&ib, ipool, &db)); /* maps the piece in the importer */
	TH_OK(sop_pool_export_pointer(&da, blk[a]));    /* A takes the first slot */
	TH_OK(sop_pool_export_pointer(&dx, blk[x]));    /* X the next */
	TH_OK(sop_free(blk[a]));                         /* the first slot is free again */
	TH_OK(sop_pool_export_pointer(&dx2, blk[x]));   /* X again: the same data */
	TH_ASSERT(!memcmp(&dx, &dx2, sizeof dx));
	TH_EQ(board_entries(pool, &dx), 1);
	TH_OK(sop_free(blk[x]));
	TH_EQ(board_entries(pool, &dx), 0);
	TH_EQ(sop_pool_import_pointer(&ix, ipool, &dx), CUDA_ERROR_INVALID_VALUE);
	TH_ASSERT(ix == NULL);
	TH_CHECK(pool);

	TH_OK(sop_free(ib));
	TH_OK(sop_pool_destroy(ipool));
	for (i = 0; i < N; i++)
		if (i != a && i != x)
			TH_OK(sop_free(blk[i]));
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(st);
}

/* The data of a freed block with its serial made 0 and its check made again: a freed slot of the
 * board holds 0, and must not be taken for the block. */
static void
serial_zero(void)
{
	CUmemPoolPtrExportData d1, d2, forged;
	struct sop__export_data e;
	CUstream st = th_stream();
	sop_pool_t pool = fd_pool(), ipool;
	void *p1, *p2, *i1, *i2, *x = NULL;

	TH_OK(sop_malloc_from_pool_async(&p1, 4096, pool, st));
	TH_OK(sop_malloc_from_pool_async(&p2, 4096, pool, st));
	TH_OK(sop_stream_synchronize(st));
	TH_OK(sop_pool_export_pointer(&d1, p1));
	TH_OK(sop_pool_export_pointer(&d2, p2));
	ipool = import_pool(pool);
	TH_OK(sop_pool_import_pointer(&i1, ipool, &d1)); /* keeps the piece mapped */
	TH_OK(sop_pool_import_pointer(&i2, ipool, &d2));
	TH_OK(sop_free(i2));
	TH_OK(sop_free(p2));
	TH_EQ(sop_pool_import_pointer(&x, ipool, &d2), CUDA_ERROR_INVALID_VALUE);
	memcpy(&e, &d2, sizeof e);
	e.gen = 0;
	e.check = sop__share_check(&e);
	memset(&forged, 0, sizeof forged);
	memcpy(&forged, &e, sizeof e);
	TH_EQ(sop_pool_import_pointer(&x, ipool, &forged), CUDA_ERROR_INVALID_VALUE);
	TH_ASSERT(x == NULL);

	TH_OK(sop_free(i1));
	TH_OK(sop_pool_destroy(ipool));
	TH_OK(sop_free(p1));
	TH_OK(sop_pool_destroy(pool));
	th_stream_destroy(st);
}

struct exporting {
	sop_pool_t pool;
	atomic_bool stop;
	int last_fd; /* the last descriptor an export gave, or -1 */
	long exports;
};

static void *
export_loop(void *arg)
{
	struct exporting *x = arg;
	int fd;

	while (!atomic_load(&x->stop))
		if (sop_pool_export_to_shareable_handle(&fd, x->pool, POSIX_FD, 0) ==
		    CUDA_SUCCESS) {
			if (x->last_fd >= 0)
				close(x->last_fd);
			x->last_fd = fd;
			x->exports++;
		}
	return NULL;
}

/* A pool destroyed while another thread exports it: an export that comes after the destroy's
 * broker was stopped must not start another, which nothing would stop, and which would answer
 * importers from the freed pool (under ASan, a use after free). An import through the last
 * descriptor an export gave must fail: the broker behind it is gone. */
static void
destroy_while_exporting(void)
{
	int rounds = sim ? 200 : 40, i;

	for (i = 0; i < rounds; i++) {
		struct exporting x = {.pool = fd_pool(), .last_fd = -1};
		sop_pool_t ipool;
		pthread_t t;
		int fd;

		TH_OK(sop_pool_export_to_shareable_handle(&fd, x.pool, POSIX_FD, 0)); /* a broker */
		close(fd);
		TH_ASSERT(pthread_create(&t, NULL, export_loop, &x) == 0);
		usleep(50 + (i % 8) * 25);
		TH_OK(sop_pool_destroy(x.pool));
		usleep(500);
		atomic_store(&x.stop, true);
		pthread_join(t, NULL);
		if (x.last_fd >= 0) {
			TH_EQ(sop_pool_import_from_shareable_handle(&ipool, (void *)(intptr_t)x.last_fd,
								    POSIX_FD, 0),
			      CUDA_ERROR_INVALID_VALUE);
			close(x.last_fd);
		}
	}
}

struct racing {
	sop_pool_t pool;
	pthread_barrier_t bar;
	void *p;     /* the block of the round; NULL: stop */
	CUresult r;  /* the export's answer */
	CUmemPoolPtrExportData data;
};

static void *
export_each_round(void *arg)
{
	struct racing *x = arg;

	for (;;) {
		pthread_barrier_wait(&x->bar);
		if (!x->p)
			return NULL;
		x->r = sop_pool_export_pointer(&x->data, x->p);
		pthread_barrier_wait(&x->bar);
	}
}

/* An export racing a free of the same block, round after round (a program's race, but every
 * call must stay safe): where the export succeeds, the block's entry on the board goes with
 * its free, so that its data names nothing once the block is handed out again. */
static void
export_racing_free(void)
{
	int rounds = sim ? 50000 : 5000, i, exported = 0;
	struct racing x = {.pool = fd_pool()};
	CUstream st = th_stream();
	pthread_t t;

	pthread_barrier_init(&x.bar, NULL, 2);
	TH_ASSERT(pthread_create(&t, NULL, export_each_round, &x) == 0);
	for (i = 0; i < rounds; i++) {
		volatile int spin;

		TH_OK(sop_malloc_from_pool_async(&x.p, 4096 + (size_t)(i % 7) * 512, x.pool, st));
		pthread_barrier_wait(&x.bar);
		/* Odd rounds free at once or nearly, where the race is; even ones also wait past
		 * an export's few microseconds, so that some exports win (on an H200 none of 5000
		 * did with the short waits alone). */
		for (spin = 0; spin < (i % 64) * (i % 2 ? 3 : 300); spin++)
			;
		TH_OK(sop_free_async(x.p, st));
		pthread_barrier_wait(&x.bar);
		TH_ASSERT(x.r == CUDA_SUCCESS || x.r == CUDA_ERROR_INVALID_VALUE);
		if (x.r == CUDA_SUCCESS) {
			exported++;
			TH_EQ(board_entries(x.pool, &x.data), 0);
		}
	}
	x.p = NULL;
	pthread_barrier_wait(&x.bar);
	pthread_join(t, NULL);
	pthread_barrier_destroy(&x.bar);
	TH_ASSERT(exported > 0);
	TH_OK(sop_stream_synchronize(st));
	TH_OK(sop_pool_destroy(x.pool));
	th_stream_destroy(st);
}

struct destroying {
	sop_pool_t pool;
	pthread_barrier_t *bar;
	CUresult r;
};

static void *
destroy_one(void *arg)
{
	struct destroying *d = arg;

	pthread_barrier_wait(d->bar);
	d->r = sop_pool_destroy(d->pool);
	return NULL;
}

/* Two threads destroy one pool (a live block keeps it from being torn down): one is told it
 * worked, the other CUDA_ERROR_INVALID_VALUE, as a destroy after a destroy is. */
static void
destroy_twice(void)
{
	int rounds = sim ? 2000 : 200, i, k;
	CUstream st = th_stream();
	pthread_barrier_t bar;

	pthread_barrier_init(&bar, NULL, 2);
	for (i = 0; i < rounds; i++) {
		struct destroying d[2];
		sop_pool_t pool = i % 2 ? fd_pool() : th_pool(0, 0);
		pthread_t t[2];
		void *p;
		int ok = 0;

		if (i % 2) { /* an exported pool: its broker stopped once */
			int fd;
			TH_OK(sop_pool_export_to_shareable_handle(&fd, pool, POSIX_FD, 0));
			close(fd);
		}
		TH_OK(sop_malloc_from_pool_async(&p, 4096, pool, st));
		for (k = 0; k < 2; k++) {
			d[k] = (struct destroying){.pool = pool, .bar = &bar};
			TH_ASSERT(pthread_create(&t[k], NULL, destroy_one, &d[k]) == 0);
		}
		for (k = 0; k < 2; k++) {
			pthread_join(t[k], NULL);
			ok += d[k].r == CUDA_SUCCESS;
			TH_ASSERT(d[k].r == CUDA_SUCCESS || d[k].r == CUDA_ERROR_INVALID_VALUE);
		}
		TH_EQ(ok, 1);
		TH_OK(sop_free_async(p, st));
		TH_OK(sop_stream_synchronize(st)); /* the pool goes with its last block */
		TH_ASSERT(TH_POOL(pool) == NULL);
	}
	pthread_barrier_destroy(&bar);
	th_stream_destroy(st);
}

int
main(void)
{
	struct sim_live live0;

	sim = th_init();
	live0 = th_live();
	export_again();
	serial_zero();
	destroy_while_exporting();
	export_racing_free();
	destroy_twice();
	if (sim) {
		struct sim_live l = th_live();
		TH_EQ(l.reservations, live0.reservations);
		TH_EQ(l.handles, live0.handles);
		TH_EQ(l.mappings, live0.mappings);
	}
	printf("ipc-stale: ok\n");
	return 0;
}
