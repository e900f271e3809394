#!/usr/bin/env python3
"""Write the two small synthetic traces that ship with sop-bench until real ones are recorded.

Both imitate a few steps of training a small model: parameters, gradients and optimizer state
allocated once; per step an input batch, forward activations kept for backward (with jittered
sizes, as dynamic shapes give), short-lived temporaries, and a backward pass that frees the
activations in reverse order.

  synthetic.csv          RMM's format, everything on one stream (Stream 0x0), as RMM logs it
  synthetic-streams.csv  the stream-aware variant (Stream is an index): the next batch is
                         allocated on a loader stream (1) and freed on the compute stream (0)
                         after use; gradient buckets are allocated and freed on a
                         communication stream (2)

Deterministic (fixed seed, standard library only): rerunning it rewrites identical files.
Usage: gen_synthetic.py [OUTDIR]   (default: the folder of this script)
"""
import os
import random
import sys

MiB = 1 << 20
KiB = 1 << 10


class Writer:
    def __init__(self, path, stream_aware):
        self.f = open(path, "w")
        self.f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        self.aware = stream_aware
        self.us = 0
        self.next_addr = 0x7F0000000000
        self.live = {}

    def _row(self, action, addr, size, stream):
        self.us += 3
        t = self.us
        stamp = "%02d:%02d:%02d.%06d" % (t // 3600000000 % 24, t // 60000000 % 60,
                                         t // 1000000 % 60, t % 1000000)
        s = str(stream) if self.aware else "0x0"
        self.f.write("1,%s,%s,0x%x,%d,%s\n" % (stamp, action, addr, size, s))

    def alloc(self, size, stream=0):
        # Fake but distinct addresses: the replay only uses them to pair frees with allocations.
        addr = self.next_addr
        self.next_addr += (size + 511) // 512 * 512
        self.live[addr] = size
        self._row("allocate", addr, size, stream)
        return addr

    def free(self, addr, stream=0):
        self._row("free", addr, self.live.pop(addr), stream)

    def close(self):
        self.f.close()


def training(w, rng, steps=8, layers=12, aware=False):
    loader, compute, comm = (1, 0, 2) if aware else (0, 0, 0)
    hidden = 256 * KiB
    params = [w.alloc(rng.choice([1, 2, 4]) * MiB + rng.randrange(0, 64) * KiB, compute)
              for _ in range(layers * 2)]
    grads = [w.alloc(w.live[p], compute) for p in params]
    state = [w.alloc(w.live[p] * 2, compute) for p in params]
    batch = w.alloc(rng.randrange(2, 6) * MiB, loader)
    for _ in range(steps):
        cur, batch = batch, None
        seq = rng.choice([384, 448, 512, 576])  # dynamic shapes: sizes move a little
        acts = []
        for _layer in range(layers):
            acts.append(w.alloc(seq * hidden // 64 + rng.randrange(0, 4096), compute))
            tmp = [w.alloc(rng.choice([4, 16, 64, 256]) * KiB + rng.randrange(1, 512), compute)
                   for _ in range(rng.randrange(2, 6))]
            big = w.alloc(seq * hidden // 16, compute)  # attention scores, freed at once
            for t in reversed(tmp):
                w.free(t, compute)
            w.free(big, compute)
        batch = w.alloc(rng.randrange(2, 6) * MiB, loader)  # prefetch the next input
        loss = w.alloc(4 * KiB, compute)
        w.free(cur, compute)
        buckets = []
        for layer in reversed(range(layers)):
            g = w.alloc(w.live[acts[layer]], compute)
            tmp = w.alloc(rng.choice([16, 64]) * KiB, compute)
            w.free(tmp, compute)
            w.free(acts[layer], compute)
            w.free(g, compute)
            if layer % 4 == 0:
                buckets.append(w.alloc(25 * MiB, comm))
        for b in buckets:
            w.free(b, comm)
        w.free(loss, compute)
        for _ in range(rng.randrange(4, 10)):  # optimizer step temporaries
            t = w.alloc(rng.choice([1, 2]) * MiB, compute)
            w.free(t, compute)
    w.free(batch, compute)
    for a in state + grads + params:
        w.free(a, compute)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for name, aware in (("synthetic.csv", False), ("synthetic-streams.csv", True)):
        w = Writer(os.path.join(out, name), aware)
        training(w, random.Random(1234), aware=aware)
        w.close()


if __name__ == "__main__":
    main()
