# torch_serve.py: an inference server's worker threads, each on a CUDA stream of its own, in
# PyTorch. A small transformer encoder (d_model 512, 4 layers, 8 heads, MLP 4x) in inference
# mode; request i has a batch of 1-32 sequences of 16-512 tokens drawn from i, is served by worker
# i % --threads, and its answer (the last position's first 8 features of each sequence) is copied
# to the host, as a server answers. The allocator is chosen from outside, as in torch_gpt.py:
# PYTORCH_ALLOC_CONF=backend:cudaMallocAsync for the driver's pool (sop's under sop-run; PyTorch
# sets that pool's release threshold to UINT64_MAX), unset for PyTorch's own caching allocator.
# One JSON line: requests a second, peak reserved and peak allocated memory, and a checksum of
# every answer (the same requests under every allocator: the sums should agree).
import argparse, json, os, random, threading, time

import torch
import torch.nn as nn

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=4)
ap.add_argument("--requests", type=int, default=400)
ap.add_argument("--warmup", type=int, default=16)
args = ap.parse_args()

D = 512
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
layer = nn.TransformerEncoderLayer(D, 8, 4 * D, batch_first=True)
model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).cuda().eval()


def serve(i):
    r = random.Random(i)
    b, t = r.randint(1, 32), r.randint(16, 512)
    g = torch.Generator(device="cuda").manual_seed(i)
    x = torch.randn(b, t, D, device="cuda", generator=g)
    with torch.inference_mode():
        y = model(x)
    return float(y[:, -1, :8].double().sum().cpu())  # synchronizes the worker's stream


sums = [0.0] * args.threads


def worker(w):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for i in range(w, args.requests, args.threads):
            sums[w] += serve(i)
    s.synchronize()


for i in range(args.warmup):  # kernels and libraries loaded, on the main thread
    serve(args.requests + i)
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
threads = [threading.Thread(target=worker, args=(w,)) for w in range(args.threads)]
t0 = time.perf_counter()
for th in threads:
    th.start()
for th in threads:
    th.join()
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(json.dumps({
    "backend": torch.cuda.get_allocator_backend(),
    "under_sop": "libsop-preload" in os.environ.get("LD_PRELOAD", ""),
    "threads": args.threads,
    "requests": args.requests,
    "requests_per_s": args.requests / dt,
    "peak_reserved": torch.cuda.max_memory_reserved(),
    "peak_allocated": torch.cuda.max_memory_allocated(),
    "checksum": sum(sums),
}))
