#!/usr/bin/env python3
"""Record allocation traces of a small transformer in PyTorch, for sop-bench's replay.

Builds a small decoder-style transformer from torch.nn (nothing is downloaded; the data is
random tokens), turns on PyTorch's memory-history recorder, and runs:

  train  a few training steps (forward, backward, AdamW step) with the next batch prepared on
         a side stream, as a data loader does, so the trace uses two streams and
         record_stream; mixed precision (bf16 autocast) when the GPU supports it
  infer  batched inference at batch sizes N-1, N, N+1 (the case that makes caching
         allocators fragment: every size is a little different)

For each it writes torch-<name>.pickle (the snapshot, which pytorch.org/memory_viz shows) and
torch-<name>.csv (converted by torch_to_csv.py, stream-aware). Run it on the GPU machine:

  python3 bench/traces/record_torch.py [--out bench/traces] [--steps 6] [--small]

then replay with: sop-bench --workload replay --trace bench/traces/torch-train.csv
"""
import argparse
import os
import pickle
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_to_csv  # noqa: E402


class Model(nn.Module):
    def __init__(self, vocab, d_model, heads, layers, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq),
                             persistent=False)

    def forward(self, tokens):
        n = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:, :n]
        x = self.blocks(x, mask=self.mask[:n, :n], is_causal=True)
        return self.head(self.norm(x))


def start_recording(max_entries):
    rec = torch.cuda.memory._record_memory_history
    try:
        # No stack traces: the replay needs none, and they make the pickle huge.
        rec(enabled="all", context=None, max_entries=max_entries)
    except TypeError:
        rec(True, trace_alloc_max_entries=max_entries, trace_alloc_record_context=False)


def stop_recording():
    try:
        torch.cuda.memory._record_memory_history(enabled=None)
    except TypeError:
        torch.cuda.memory._record_memory_history(False)


def dump(out, name):
    pickle_path = os.path.join(out, "torch-%s.pickle" % name)
    csv_path = os.path.join(out, "torch-%s.csv" % name)
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(pickle_path)
    stop_recording()
    with open(pickle_path, "rb") as f:
        snapshot = pickle.load(f)
    rows, stats, n_streams = torch_to_csv.convert(snapshot)
    torch_to_csv.write_csv(rows, csv_path)
    print("%s: %d allocations, %d frees, %d streams (snapshot %s)"
          % (csv_path, stats["alloc"], stats["free"], n_streams, pickle_path))


def train(args, dev, dtype):
    model = Model(args.vocab, args.d_model, args.heads, args.layers, args.seq).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.cuda.Stream(dev)
    compute = torch.cuda.current_stream(dev)

    def next_batch():
        with torch.cuda.stream(loader):
            x = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=dev)
        return x

    batch = next_batch()
    start_recording(args.max_entries)
    for _ in range(args.steps):
        compute.wait_stream(loader)
        cur = batch
        cur.record_stream(compute)  # used on the compute stream, freed after
        batch = next_batch()  # prefetch while this step runs
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            logits = model(cur[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                               cur[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del cur, logits, loss
    dump(args.out, "train")
    del model, opt, batch
    torch.cuda.empty_cache()


def infer(args, dev, dtype):
    model = Model(args.vocab, args.d_model, args.heads, args.layers, args.seq).to(dev).eval()
    start_recording(args.max_entries)
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
        for step in range(args.steps):
            for b in (args.batch - 1, args.batch, args.batch + 1):
                n = args.seq - 16 * (step % 4)  # shorter prompts now and then
                x = torch.randint(0, args.vocab, (b, n), device=dev)
                y = model(x)
                del x, y
    dump(args.out, "infer")
    del model
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--max-entries", type=int, default=2_000_000)
    ap.add_argument("--small", action="store_true", help="a tiny model, for a quick check")
    ap.add_argument("--only", choices=("train", "infer"), default=None)
    args = ap.parse_args()
    if args.small:
        args.batch, args.seq, args.d_model, args.heads, args.layers, args.vocab = \
            4, 128, 128, 4, 2, 1024
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: nothing to record")
    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    os.makedirs(args.out, exist_ok=True)
    if args.only in (None, "train"):
        train(args, dev, dtype)
    if args.only in (None, "infer"):
        infer(args, dev, dtype)


if __name__ == "__main__":
    main()
