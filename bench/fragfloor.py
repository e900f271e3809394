#!/usr/bin/env python3
"""The floor of the fragmentation workload: how little memory any placement of the kind sop
uses could reserve for it, by release granularity.

It replays sop-bench's fragmentation workload exactly (same splitmix64 sequence, seeds
1000 + repetition, 512 slots, sizes 2^e + U[0, 2^e) for e in 0..26, live bytes capped, blocks
rounded to 512 bytes) against an idealised allocator: address-ordered best fit with immediate
coalescing, on an unbounded address space that grows at its end. It prints, per seed:

  extent      highest address used / peak live bytes: best fit that never gives memory back
  G MiB       a lower bound for best fit that gives back, at every moment, every aligned unit
              of G bytes that no live block touches: the most units live blocks touch at once,
              times G, over peak live (physical memory handed out in units of G)
  split       blocks of at least 32 MiB on pieces of their own (rounded to 2 MiB), the others
              placed by best fit and counted as in '32 MiB'
  growth      a pool like sop's: best fit over memory mapped in pieces at the end of the space
              (at least 32 MiB, or what a request needs beyond the free block there), every
              piece that free blocks cover whole given back at each growth; reserved memory
              is the pieces mapped
  split-gr.   the same with blocks of at least 32 MiB in a space of their own, whose pieces
              are what they need (in 2 MiB units), the smaller blocks as in 'growth'

With --others it prints, instead, placements sop does not use, with how many times each grew:

  apart 4M    requests under 4 MiB and the others in two pools of the 'growth' kind, whose
              growth maps what it needs as separate physical allocations of at most 32 MiB,
              each given back on its own
  alloc 8M    one pool of the 'growth' kind whose growth maps what it needs as separate
              physical allocations of at most 8 MiB
  alloc 2M    the same with 2 MiB allocations
  8M, need    8 MiB allocations as in 'alloc 8M', but idle ones are given back at a growth
              only when they add up to what it maps, largest first (sop's rule), with how
              many physical allocations were made and given back

Usage: python3 bench/fragfloor.py [--seeds N] [--cap-gib G] [--others]
"""
import argparse
import bisect

MASK = (1 << 64) - 1
MiB = 1 << 20
ALIGN = 512


class SplitMix64:
    def __init__(self, seed):
        self.s = seed

    def below(self, n):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return (z ^ (z >> 31)) % n


class BestFit:
    """Address-ordered best fit with coalescing; grows at the end of the address space."""

    def __init__(self):
        self.free = []  # (addr, size), address order
        self.top = 0

    def alloc(self, n):
        best = -1
        for i, (a, s) in enumerate(self.free):
            if s >= n and (best < 0 or s < self.free[best][1]):
                best = i
        if best < 0:
            if self.free and sum(self.free[-1]) == self.top:
                a, _ = self.free.pop()
            else:
                a = self.top
            self.top = a + n
            return a
        a, s = self.free[best]
        if s == n:
            self.free.pop(best)
        else:
            self.free[best] = (a + n, s - n)
        return a

    def release(self, a, n):
        i = bisect.bisect(self.free, (a, 0))
        if i < len(self.free) and self.free[i][0] == a + n:
            n += self.free[i][1]
            self.free.pop(i)
        if i > 0 and sum(self.free[i - 1]) == a:
            a = self.free[i - 1][0]
            n += self.free[i - 1][1]
            self.free.pop(i - 1)
            i -= 1
        self.free.insert(i, (a, n))


class Pieces:
    """Best fit over memory mapped in pieces at the end of an address space: a request that
    fits nowhere first gives back every piece that free blocks cover whole (its range leaves
    the space), then maps what it needs beyond the free block at the end, at least step, in
    units of unit. With need, idle pieces are given back only when they add up to what the
    growth maps, largest first, until they do."""

    def __init__(self, step, unit, need=False):
        self.bf = BestFit()
        self.step = step
        self.unit = unit
        self.need = need
        self.pieces = []  # (addr, size), address order
        self.mapped = 0
        self.grown = 0
        self.made = self.given = 0

    def tail_size(self, n):
        free = self.bf.free
        tail = free[-1][1] if free and sum(free[-1]) == self.bf.top else 0
        return max(-(-(n - tail) // self.unit) * self.unit, self.step)

    def alloc(self, n):
        if any(s >= n for _, s in self.bf.free):
            return self.bf.alloc(n)
        self.release_idle(self.tail_size(n) if self.need else 0)
        size = self.tail_size(n)
        self.map(self.bf.top, size)
        self.mapped += size
        self.grown += 1
        self.bf.release(self.bf.top, size)
        self.bf.top += size
        return self.bf.alloc(n)

    def release(self, a, n):
        self.bf.release(a, n)

    def map(self, a, size):
        self.pieces.append((a, size))
        self.made += 1

    def idle(self, a, size):
        free = self.bf.free
        i = bisect.bisect(free, (a, 1 << 62)) - 1
        return i >= 0 and free[i][0] <= a and sum(free[i]) >= a + size

    def give_back(self, a, size):
        free = self.bf.free
        i = bisect.bisect(free, (a, 1 << 62)) - 1
        fa, fs = free.pop(i)
        if fa < a:
            free.insert(i, (fa, a - fa))
            i += 1
        if fa + fs > a + size:
            free.insert(i, (a + size, fa + fs - a - size))
        self.mapped -= size
        self.given += 1

    def release_idle(self, need=0):
        """Give back every idle piece, or with need, the largest ones until they add up to
        need, and none if all of them do not."""
        idle = [p for p in self.pieces if self.idle(*p)]
        if need:
            if sum(size for _, size in idle) < need:
                return
            idle.sort(key=lambda p: -p[1])
            got, picked = 0, []
            for p in idle:
                if got >= need:
                    break
                picked.append(p)
                got += p[1]
            idle = picked
        gone = set(idle)
        for a, size in idle:
            self.give_back(a, size)
        self.pieces = [p for p in self.pieces if p not in gone]


class Allocations(Pieces):
    """Pieces whose growth maps what it needs as separate physical allocations of at most
    size bytes, each given back on its own."""

    def __init__(self, step, unit, size, need=False):
        super().__init__(step, unit, need)
        self.size = size

    def map(self, a, size):
        for at in range(a, a + size, self.size):
            self.pieces.append((at, min(self.size, a + size - at)))
            self.made += 1


class Units:
    """How many aligned units of g bytes live blocks touch."""

    def __init__(self, g):
        self.g = g
        self.count = {}
        self.touched = 0

    def add(self, a, n, d):
        for u in range(a // self.g, (a + n - 1) // self.g + 1):
            c = self.count.get(u, 0)
            if c == 0:
                self.touched += 1
            c += d
            if c == 0:
                self.touched -= 1
                del self.count[u]
            else:
                self.count[u] = c


def workload(seed, cap, iters=200000, slots=512):
    """sop-bench's fragmentation sequence: (slot, bytes, request) for an allocation into an
    empty slot, (slot, 0, 0) for the free of a full one; used bytes capped at cap."""
    rng = SplitMix64(seed)
    live = [0] * slots
    used = 0
    for _ in range(iters):
        k = rng.below(slots)
        if live[k]:
            used -= live[k]
            live[k] = 0
            yield k, 0, 0
            continue
        e = rng.below(27)
        req = (1 << e) + rng.below(1 << e)
        if used + req > cap:
            continue
        used += req
        live[k] = req
        yield k, -(-req // ALIGN) * ALIGN, req


def run(seed, cap, slots=512, big=32 * MiB):
    live = [None] * slots
    heap, small = BestFit(), BestFit()
    u2, u32, usplit = Units(2 * MiB), Units(32 * MiB), Units(32 * MiB)
    one = Pieces(32 * MiB, 2 * MiB)
    psmall, plarge = Pieces(32 * MiB, 2 * MiB), Pieces(2 * MiB, 2 * MiB)
    used = peak = high = high2 = high32 = highsplit = highgr = highsgr = 0
    big_bytes = 0
    for k, n, req in workload(seed, cap, slots=slots):
        if not n:
            a, sa, n, req, oa, pa = live[k]
            one.release(oa, n)
            (plarge if req >= big else psmall).release(pa, n)
            heap.release(a, n)
            u2.add(a, n, -1)
            u32.add(a, n, -1)
            if sa is None:
                big_bytes -= -(-n // (2 * MiB)) * 2 * MiB
            else:
                small.release(sa, n)
                usplit.add(sa, n, -1)
            used -= req
            live[k] = None
            continue
        a = heap.alloc(n)
        u2.add(a, n, 1)
        u32.add(a, n, 1)
        if req >= big:
            sa = None
            big_bytes += -(-n // (2 * MiB)) * 2 * MiB
        else:
            sa = small.alloc(n)
            usplit.add(sa, n, 1)
        oa = one.alloc(n)
        pa = (plarge if req >= big else psmall).alloc(n)
        live[k] = (a, sa, n, req, oa, pa)
        used += req
        peak = max(peak, used)
        high = max(high, heap.top)
        high2 = max(high2, u2.touched * 2 * MiB)
        high32 = max(high32, u32.touched * 32 * MiB)
        highsplit = max(highsplit, usplit.touched * 32 * MiB + big_bytes)
        highgr = max(highgr, one.mapped)
        highsgr = max(highsgr, psmall.mapped + plarge.mapped)
    return [x / peak for x in (high, high32, high2, highsplit, highgr, highsgr)], peak


def others(seed, cap, slots=512, apart=4 * MiB):
    """apart, alloc 8M, alloc 2M: (reserved-high / peak, growths) each; then 8M, need:
    (reserved-high / peak, allocations made, allocations given back)."""
    live = [None] * slots
    small = Allocations(32 * MiB, 2 * MiB, 32 * MiB)
    large = Allocations(32 * MiB, 2 * MiB, 32 * MiB)
    a8, a2 = Allocations(32 * MiB, 2 * MiB, 8 * MiB), Allocations(32 * MiB, 2 * MiB, 2 * MiB)
    n8 = Allocations(32 * MiB, 2 * MiB, 8 * MiB, need=True)
    used = peak = 0
    high = [0, 0, 0, 0]
    for k, n, req in workload(seed, cap, slots=slots):
        if not n:
            n, req, side, addrs = live[k]
            for p, a in zip((side, a8, a2, n8), addrs):
                p.release(a, n)
            used -= req
            live[k] = None
            continue
        side = large if req >= apart else small
        live[k] = (n, req, side, [p.alloc(n) for p in (side, a8, a2, n8)])
        used += req
        peak = max(peak, used)
        for i, m in enumerate((small.mapped + large.mapped, a8.mapped, a2.mapped, n8.mapped)):
            high[i] = max(high[i], m)
    grown = (small.grown + large.grown, a8.grown, a2.grown)
    return [(h / peak, g) for h, g in zip(high, grown)], (high[3] / peak, n8.made, n8.given)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--cap-gib", type=float, default=8.0)
    ap.add_argument("--others", action="store_true")
    args = ap.parse_args()
    cap = int(args.cap_gib * 1024) * MiB
    if args.others:
        print("seed  apart 4M (grew)  alloc 8M (grew)  alloc 2M (grew)  8M, need (made/given)")
        for r in range(args.seeds):
            cols, (x8, made, given) = others(1000 + r, cap)
            print(f"{1000 + r}" + "".join(f"  {x:8.3f} ({g:4d})" for x, g in cols) +
                  f"  {x8:8.3f} ({made}/{given})")
        return
    print("seed  peak MiB  extent  32 MiB  2 MiB  split  growth  split-gr.")
    for r in range(args.seeds):
        (ext, g32, g2, split, gr, sgr), peak = run(1000 + r, cap)
        print(f"{1000 + r}  {peak // MiB:8d}  {ext:6.3f}  {g32:6.3f}  {g2:5.3f}  {split:5.3f}"
              f"  {gr:6.3f}  {sgr:9.3f}")


if __name__ == "__main__":
    main()
