# cupy_streams.py: variable-shape elementwise work, reductions and matrix products on 4 streams,
# as CuPy programs with several streams run. One JSON line: time per iteration and memory.
# --pool default | async | none chooses CuPy's MemoryPool, MemoryAsyncPool (the driver's
# stream-ordered pool; sop's under sop-run) or no pool.
import argparse, json, os, time

import cupy as cp

ap = argparse.ArgumentParser()
ap.add_argument("--pool", choices=["default", "async", "none"], default="async")
ap.add_argument("--iters", type=int, default=3000)
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()

if args.pool == "default":
    pool = cp.cuda.MemoryPool()
elif args.pool == "async":
    pool = cp.cuda.MemoryAsyncPool()
else:
    pool = None
cp.cuda.set_allocator(pool.malloc if pool else None)

streams = [cp.cuda.Stream(non_blocking=True) for _ in range(4)]
rs = [cp.random.RandomState(args.seed + i) for i in range(4)]
free0, total = cp.cuda.runtime.memGetInfo()


def one(i):
    k = i % 4
    with streams[k]:
        n = 1 << (12 + (i * 7919) % 9)          # 4 Ki to 1 Mi elements
        a = rs[k].standard_normal(n, dtype=cp.float32)
        b = cp.tanh(a) * 2 + a * a
        s = b.sum()
        m = 64 * (1 + (i * 31) % 16)           # 64..1024 square matrices
        x = rs[k].standard_normal((m, m), dtype=cp.float32)
        y = x @ x.T
        return s + y.trace()


for i in range(200):                            # warm-up
    one(i)
for s in streams:
    s.synchronize()
used_peak, reserved_peak, acc, checksum = 0, 0, [], 0.0
t0 = time.perf_counter()
for i in range(args.iters):
    acc.append(one(i))
    if i % 100 == 99:
        for s in streams:
            s.synchronize()
        used_peak = max(used_peak, total - cp.cuda.runtime.memGetInfo()[0])
        if pool is not None:
            reserved_peak = max(reserved_peak, pool.total_bytes())
        checksum += sum(float(v) for v in acc)
        acc = []
for s in streams:
    s.synchronize()
dt = time.perf_counter() - t0
print(json.dumps({
    "pool": args.pool,
    "under_sop": "libsop-preload" in os.environ.get("LD_PRELOAD", ""),
    "iters": args.iters,
    "ms_per_iter": 1e3 * dt / args.iters,
    "reserved_peak": reserved_peak if pool is not None else None,
    "device_used_peak": used_peak,
    "checksum": checksum + sum(float(v) for v in acc),
}))
