# jax_matmul.py: a jitted matrix-product chain over 5 shapes, the anchor's JAX workload. The
# allocator is chosen from outside: XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async for the driver's pool
# (sop's under sop-run), unset for XLA's own BFC allocator. One JSON line.
import argparse, json, os, time

import jax
import jax.numpy as jnp

ap = argparse.ArgumentParser()
ap.add_argument("--iters", type=int, default=400)
args = ap.parse_args()


@jax.jit
def chain(x):
    for _ in range(4):
        x = jnp.tanh(x @ x.T) / x.shape[0]
    return x


shapes = (256, 512, 1024, 2048, 768)
xs = [jnp.ones((n, n), dtype=jnp.float32) / n for n in shapes]
for x in xs:
    chain(x).block_until_ready()
t0 = time.perf_counter()
tot = 0.0
for i in range(args.iters):
    r = chain(xs[i % len(xs)])
    if i % 50 == 49:
        tot += float(r.sum())
r.block_until_ready()
dt = time.perf_counter() - t0
print(json.dumps({
    "allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"),
    "under_sop": "libsop-preload" in os.environ.get("LD_PRELOAD", ""),
    "iters": args.iters,
    "ms_per_iter": 1e3 * dt / args.iters,
    "checksum": tot,
}))
