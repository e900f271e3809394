/* preload-ipc.c - an unchanged program that shares a pool between two processes with the
 * driver's IPC pool calls (cuMemPoolExportToShareableHandle, cuMemPoolExportPointer,
 * cuMemPoolImportFromShareableHandle, cuMemPoolImportPointer), under the interposer: both sides
 * are served by sop, the data crosses both ways, the importer frees first, and memory of the
 * exportable pool works with cuMemRetainAllocationHandle at any address inside an allocation (as
 * NCCL's user-buffer registration calls it). With --reset, the importer resets its device
 * while its frees are pending instead of synchronizing (the reset waits for them, then destroys
 * the context's streams and events, sop's among them), and goes on with its imported pool. Run
 * under LD_PRELOAD on the simulated driver's libcuda.so.1, and through sop-run on a GPU.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d (%s): check failed: %s\n", __FILE__, __LINE__,      \
				role, #cond);                                                      \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)
#define OK(call)                                                                                   \
	do {                                                                                       \
		CUresult r_ = (call);                                                              \
		if (r_ != CUDA_SUCCESS) {                                                          \
			fprintf(stderr, "%s:%d (%s): %s is %d\n", __FILE__, __LINE__, role, #call,  \
				(int)r_);                                                          \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define N 4
static const size_t sizes[N] = {4096, (size_t)3 << 20, (size_t)64 << 20, 12345};
static const char *role = "parent";
static int reset; /* --reset */

struct message {
	CUmemPoolPtrExportData data[N];
};

static void
send_msg(int s, int fd, const void *buf, size_t n)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = {0};
	struct iovec iov = {(void *)buf, n};
	struct msghdr m = {0};

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
	CHECK(sendmsg(s, &m, 0) == (ssize_t)n);
}

static int
recv_msg(int s, void *buf, size_t n)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {buf, n};
	struct msghdr m = {0};
	struct cmsghdr *c;
	int fd = -1;

	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = cbuf;
	m.msg_controllen = sizeof cbuf;
	CHECK(recvmsg(s, &m, 0) == (ssize_t)n);
	c = CMSG_FIRSTHDR(&m);
	if (c && c->cmsg_type == SCM_RIGHTS)
		memcpy(&fd, CMSG_DATA(c), sizeof fd);
	return fd;
}

/* Whether sop's pointer lookup, found in the process (the interposer exports it), knows p. */
static int
sop_knows(CUdeviceptr p)
{
	CUresult (*get)(void **, const void *);
	void *sym = dlsym(RTLD_DEFAULT, "sop_pointer_get_pool");
	void *pool;

	if (!sym)
		return 0;
	memcpy(&get, &sym, sizeof sym);
	return get(&pool, (void *)(uintptr_t)p) == CUDA_SUCCESS;
}

static void
setup(CUcontext *ctx, CUstream *s)
{
	OK(cuInit(0));
	OK(cuDevicePrimaryCtxRetain(ctx, 0));
	OK(cuCtxSetCurrent(*ctx));
	OK(cuStreamCreate(s, CU_STREAM_NON_BLOCKING));
}

static unsigned int
word_at(CUdeviceptr p, size_t off)
{
	unsigned int w = 0;

	OK(cuMemcpyDtoH(&w, p + off, sizeof w));
	return w;
}

static int
importer(int sock)
{
	struct message msg;
	CUmemoryPool pool;
	CUdeviceptr p[N];
	CUcontext ctx;
	CUstream s;
	char c = 0;
	int fd, i;

	role = "importer";
	fd = recv_msg(sock, &msg, sizeof msg);
	CHECK(fd >= 0);
	setup(&ctx, &s);
	OK(cuMemPoolImportFromShareableHandle(&pool, (void *)(uintptr_t)fd,
					      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	close(fd);
	for (i = 0; i < N; i++) {
		OK(cuMemPoolImportPointer(&p[i], pool, &msg.data[i]));
		CHECK(sop_knows(p[i]));
		CHECK(word_at(p[i], 0) == 0xe0000000u + (unsigned)i);
		CHECK(word_at(p[i], (sizes[i] & ~(size_t)3) - 4) == 0xe0000000u + (unsigned)i);
		OK(cuMemsetD32Async(p[i], 0x10000000u + (unsigned)i, sizes[i] / 4, s));
	}
	/* The importer frees first, and says so once its frees have completed. */
	for (i = 0; i < N; i++)
		OK(cuMemFreeAsync(p[i], s));
	if (reset) {
		/* The stream goes with the reset; the context comes back with a retain. */
		OK(cuDevicePrimaryCtxReset(0));
		OK(cuDevicePrimaryCtxRetain(&ctx, 0));
		OK(cuCtxSetCurrent(ctx));
		OK(cuCtxSynchronize());
		CHECK(write(sock, &c, 1) == 1);
		OK(cuMemPoolDestroy(pool));
		return 0;
	}
	OK(cuStreamSynchronize(s));
	CHECK(write(sock, &c, 1) == 1);
	OK(cuMemPoolDestroy(pool));
	OK(cuStreamDestroy(s));
	return 0;
}

static int
exporter(int sock, pid_t child)
{
	CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
				.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
				.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
	CUmemGenericAllocationHandle h;
	struct message msg;
	CUmemoryPool pool;
	CUdeviceptr p[N];
	CUcontext ctx;
	CUstream s;
	char c;
	int fd = -1, shared = -1, i, status = 1;

	role = "exporter";
	setup(&ctx, &s);
	OK(cuMemPoolCreate(&pool, &props));
	OK(cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	for (i = 0; i < N; i++) {
		OK(cuMemAllocFromPoolAsync(&p[i], sizes[i], pool, s));
		CHECK(sop_knows(p[i]));
		OK(cuMemsetD32Async(p[i], 0xe0000000u + (unsigned)i, sizes[i] / 4, s));
		OK(cuMemPoolExportPointer(&msg.data[i], p[i]));
	}
	OK(cuStreamSynchronize(s));
	/* What NCCL's user-buffer registration does with a buffer: the handle under an address
	 * inside it, exported. */
	OK(cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)(p[2] + 12345)));
	OK(cuMemExportToShareableHandle(&shared, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CHECK(shared >= 0);
	close(shared);
	OK(cuMemRelease(h));

	send_msg(sock, fd, &msg, sizeof msg);
	close(fd);
	CHECK(read(sock, &c, 1) == 1);
	for (i = 0; i < N; i++) {
		CHECK(word_at(p[i], 0) == 0x10000000u + (unsigned)i);
		CHECK(word_at(p[i], (sizes[i] & ~(size_t)3) - 4) == 0x10000000u + (unsigned)i);
		OK(cuMemFreeAsync(p[i], s));
	}
	OK(cuStreamSynchronize(s));
	OK(cuMemPoolDestroy(pool));
	OK(cuStreamDestroy(s));
	CHECK(waitpid(child, &status, 0) == child);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	return 0;
}

int
main(int argc, char **argv)
{
	int sv[2], n = 0;
	pid_t pid;

	reset = argc > 1 && !strcmp(argv[1], "--reset");
	if (!dlsym(RTLD_DEFAULT, "sop_pointer_get_pool")) {
		fprintf(stderr, "not under the interposer\n");
		return 1;
	}
	/* Nothing touches the driver before the processes part (a child of a process that
	 * initialised CUDA may not use it): a first child asks whether there is a device. Without
	 * one there is nothing to share (exit 77, skipped). */
	pid = fork();
	CHECK(pid >= 0);
	if (!pid)
		_exit(cuInit(0) == CUDA_SUCCESS && cuDeviceGetCount(&n) == CUDA_SUCCESS && n ? 0
											  : 77);
	CHECK(waitpid(pid, &n, 0) == pid && WIFEXITED(n));
	if (WEXITSTATUS(n) == 77) {
		printf("skip: no device\n");
		return 77;
	}
	CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (!pid) {
		close(sv[0]);
		_exit(importer(sv[1]));
	}
	close(sv[1]);
	exporter(sv[0], pid);
	printf("IPC pools under the interposer, two processes%s: ok\n",
	       reset ? ", the importer resetting its device" : "");
	return 0;
}
