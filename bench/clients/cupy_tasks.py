# cupy_tasks.py: worker threads whose tasks each bring a CUDA stream, in CuPy. Each task makes a
# non-blocking stream (cupy.cuda.Stream: created with the task, destroyed when the task drops it),
# keeps --live arrays of 1 B..--max-size bytes live through --steps replacements, fills each with
# a byte of its own and checks it with a kernel just before freeing it, then frees the rest,
# synchronizes its stream and drops it. The sizes come from the task's number, so that every
# allocator runs the same tasks.
#
# --pool async is MemoryAsyncPool on the device's current pool (the driver's, or sop's under
# sop-run), its release threshold set to UINT64_MAX as a server keeping its memory would; the
# pool's reserved-high is read at the end. --pool default is CuPy's MemoryPool, its total bytes
# read after every task. One JSON line: tasks a second, reserved-high, the live peak counted
# exactly (the arrays' bytes), and the bytes found wrong by the checks (0, or memory was handed
# to a task while another stream's work still wrote it).
import argparse, json, os, random, threading, time

import cupy as cp

ap = argparse.ArgumentParser()
ap.add_argument("--pool", choices=["async", "default"], default="async")
ap.add_argument("--threads", type=int, default=4)
ap.add_argument("--tasks", type=int, default=100, help="tasks per thread")
ap.add_argument("--live", type=int, default=32)
ap.add_argument("--steps", type=int, default=256)
ap.add_argument("--max-size", type=int, default=1 << 20)
args = ap.parse_args()

if args.pool == "async":
    pool = cp.cuda.MemoryAsyncPool()
    handle = cp.cuda.runtime.deviceGetMemPool(cp.cuda.Device().id)
    cp.cuda.runtime.memPoolSetAttribute(handle, 4, (1 << 64) - 1)  # release threshold
else:
    pool = cp.cuda.MemoryPool()
    handle = None
cp.cuda.set_allocator(pool.malloc)

check = cp.RawKernel(r'''
extern "C" __global__ void check(const unsigned char *a, unsigned long long n, unsigned int v,
                                 unsigned long long *bad)
{
    unsigned long long c = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        c += a[i] != (unsigned char)v;
    if (c)
        atomicAdd(bad, c);
}
''', "check")

lock = threading.Lock()
live = peak = reserved_peak = 0
next_task = 0


def note(delta):
    global live, peak, reserved_peak
    with lock:
        live += delta
        if live > peak:
            peak = live


def one_task(t, bad):
    s = cp.cuda.Stream(non_blocking=True)
    rng = random.Random(0x7a5c0000 + t)
    arrs, vals = [], []
    with s:
        def put(k):
            n = 1 + rng.randrange(args.max_size)
            v = (t * 131 + k * 7 + rng.randrange(256)) & 0xFF or 1
            a = cp.empty(n, dtype=cp.uint8)
            note(n)
            a.fill(v)
            return a, v

        def drop(a, v):
            n = a.size
            check((min(1024, (n + 255) // 256),), (256,), (a, cp.uint64(n), cp.uint32(v), bad))
            note(-n)

        for k in range(args.live):
            a, v = put(k)
            arrs.append(a)
            vals.append(v)
        for step in range(args.steps):
            k = rng.randrange(args.live)
            drop(arrs[k], vals[k])
            arrs[k] = None  # freed here, on the task's stream
            arrs[k], vals[k] = put(k)
        for k in range(args.live):
            drop(arrs[k], vals[k])
            arrs[k] = None
    s.synchronize()
    del s


def worker(bad):
    global next_task, reserved_peak
    with cp.cuda.Device(0):
        while True:
            with lock:
                t = next_task
                next_task += 1
            if t >= args.tasks * args.threads:
                return
            one_task(t, bad)
            if handle is None:
                with lock:
                    reserved_peak = max(reserved_peak, pool.total_bytes())


bads = [cp.zeros(1, dtype=cp.uint64) for _ in range(args.threads)]
cp.cuda.Device().synchronize()
threads = [threading.Thread(target=worker, args=(bads[i],)) for i in range(args.threads)]
t0 = time.perf_counter()
for th in threads:
    th.start()
for th in threads:
    th.join()
cp.cuda.Device().synchronize()
dt = time.perf_counter() - t0
if handle is not None:
    reserved_peak = cp.cuda.runtime.memPoolGetAttribute(handle, 6)  # RESERVED_MEM_HIGH
print(json.dumps({
    "pool": args.pool,
    "under_sop": "libsop-preload" in os.environ.get("LD_PRELOAD", ""),
    "threads": args.threads,
    "tasks": args.tasks * args.threads,
    "tasks_per_s": args.tasks * args.threads / dt,
    "reserved_peak": reserved_peak,
    "live_peak": peak,
    "ratio": reserved_peak / peak if peak else None,
    "bad_bytes": int(sum(int(b.get()[0]) for b in bads)),
}))
