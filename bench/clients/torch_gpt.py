# torch_gpt.py: a GPT-style training loop whose shapes change every step, as real training with
# variable sequence lengths does. It prints one JSON line: step times, memory, and the losses (so
# that runs under different allocators can be checked for the same result).
#
# Model: d_model 1024, 8 layers, 16 heads, MLP 4x, vocabulary 8192; batch 4-16 and sequence
# length 64-1024 drawn at random each step from a fixed seed; bf16 autocast; AdamW.
# The allocator is chosen from outside: PYTORCH_ALLOC_CONF=backend:cudaMallocAsync for the
# driver's pool (and, under sop-run, sop's); unset for PyTorch's own caching allocator.
import argparse, json, os, statistics, time

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=80)
ap.add_argument("--warmup", type=int, default=10)
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()

D, LAYERS, HEADS, VOCAB = 1024, 8, 16, 8192


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.ln2 = nn.LayerNorm(D)
        self.fc = nn.Linear(D, 4 * D)
        self.out = nn.Linear(4 * D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (z.view(b, t, HEADS, D // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(1024, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


torch.manual_seed(args.seed)
torch.backends.cuda.matmul.allow_tf32 = True
dev = torch.device("cuda")
model = GPT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
gen = torch.Generator().manual_seed(args.seed + 1)

times, losses, dev_used = [], [], 0
total = torch.cuda.mem_get_info()[1]
for step in range(args.steps):
    b = int(torch.randint(4, 17, (1,), generator=gen))
    t = int(torch.randint(64, 1025, (1,), generator=gen))
    x = torch.randint(0, VOCAB, (b, t), generator=gen).to(dev, non_blocking=True)
    y = torch.randint(0, VOCAB, (b, t), generator=gen).to(dev, non_blocking=True)
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x).float().view(-1, VOCAB), y.view(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    losses.append(loss.item())
    dev_used = max(dev_used, total - torch.cuda.mem_get_info()[0])

st = times[args.warmup:]
st_sorted = sorted(st)
print(json.dumps({
    "backend": torch.cuda.get_allocator_backend(),
    "under_sop": "libsop-preload" in os.environ.get("LD_PRELOAD", ""),
    "steps": args.steps,
    "median_ms": 1e3 * statistics.median(st),
    "p90_ms": 1e3 * st_sorted[int(0.9 * (len(st_sorted) - 1))],
    "total_s": sum(times),
    "peak_reserved": torch.cuda.max_memory_reserved(),
    "peak_allocated": torch.cuda.max_memory_allocated(),
    "device_used_peak": dev_used,
    "loss_first": losses[0],
    "loss_last": losses[-1],
    "loss_sum": sum(losses),
}))
