#!/usr/bin/env python3
"""Random sizes up to 1 GiB (sop-bench's random workload, its untimed first run: the same
splitmix64 sequence, 10 000 allocations in 20 000 operations, live bytes capped at 10 068 MiB),
against a model of a pool whose physical memory comes in pieces of P bytes, each backing one
P-aligned unit of its address space.

An allocation takes the best fit among free ranges whose units are all backed. Failing that, the
free range (or the end of the space) whose placement needs the fewest units backed, then the
smallest; each unit it needs is backed by moving an idle piece (a backed unit no live block
touches: unmapped there, mapped here) if the mode allows and one exists, else by making one.
Nothing is given back (release threshold UINT64_MAX). Reserved memory is the pieces held.

  python3 movefloor.py [--piece-mib P ...] [--limit F ...]
"""
import argparse
import os
import sys

# The harness's generator, as bench/fragfloor.py replays it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from fragfloor import SplitMix64  # noqa: E402

MiB = 1 << 20


def run(piece, move, limit=0.0):
    free = []  # (start, length), address order
    top = 0
    backed = set()
    touch = {}  # unit -> live blocks touching it
    live = []  # (start, size)
    held = held_high = made = moved = 0
    rng = SplitMix64(20240601)
    n_allocs, max_size, cap = 10000, 1024 * MiB, 10068 * MiB
    allocs = used = peak = 0

    def units(a, n):
        return range(a // piece, (a + n - 1) // piece + 1)

    for _ in range(2 * n_allocs):
        size = 1 + rng.below(max_size)
        alloc = not live or rng.below(100) < 73
        if alloc and allocs < n_allocs and used + size < cap:
            size = (size + 511) // 512 * 512
            best = None  # (units to back, range length, index, start)
            for i, (s, n) in enumerate(free):
                if n >= size or s + n == top:
                    need = sum(1 for u in units(s, size) if u not in backed)
                    key = (need, n if n >= size else 1 << 62, i, s)
                    if best is None or key < best:
                        best = key
            if best is None:
                best = (sum(1 for u in units(top, size) if u not in backed), 1 << 62, -1, top)
            need, _, i, a = best
            if i >= 0:
                s, n = free[i]
                if n > size:
                    free[i] = (s + size, n - size)
                else:
                    del free[i]
            if a + size > top:
                if i >= 0 and free and free[-1][0] + free[-1][1] > top:
                    pass
                top = a + size
                if free and free[-1][0] + free[-1][1] > top:
                    free[-1] = (free[-1][0], top - free[-1][0])
            want = [u for u in units(a, size) if u not in backed]
            if want:
                idle = [u for u in backed if not touch.get(u) and u not in set(units(a, size))]
                for u in want:
                    if move and idle and (not limit or held + 1 > limit * (used + size) / piece):
                        backed.discard(idle.pop())
                        moved += 1
                    else:
                        made += 1
                        held += 1
                    backed.add(u)
                held_high = max(held_high, held)
            for u in units(a, size):
                touch[u] = touch.get(u, 0) + 1
            live.append((a, size))
            allocs += 1
            used += size
            peak = max(peak, used)
            continue
        if live:
            j = rng.below(n_allocs) % len(live)
            a, size = live[j]
            live[j] = live[-1]
            live.pop()
            used -= size
            for u in units(a, size):
                touch[u] -= 1
            # insert and coalesce
            k = 0
            while k < len(free) and free[k][0] < a:
                k += 1
            free.insert(k, (a, size))
            if k + 1 < len(free) and free[k][0] + free[k][1] == free[k + 1][0]:
                free[k] = (free[k][0], free[k][1] + free[k + 1][1])
                del free[k + 1]
            if k > 0 and free[k - 1][0] + free[k - 1][1] == free[k][0]:
                free[k - 1] = (free[k - 1][0], free[k - 1][1] + free[k][1])
                del free[k]
    return held_high * piece / peak, made, moved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--piece-mib", type=int, nargs="*", default=[2, 8, 32, 64, 128, 256])
    ap.add_argument("--limit", type=float, nargs="*", default=[0.0],
                    help="move only where making would hold more than this times the live bytes")
    args = ap.parse_args()
    print("| piece | mode | reserved-high / peak | pieces made | pieces moved | per operation | driver time, us per operation |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for p in args.piece_mib:
        for move, limit in [(False, 0.0)] + [(True, x) for x in args.limit]:
            r, made, moved = run(p * MiB, move, limit)
            mode = "make" if not move else "move idle" + (f" past {limit}x" if limit else "")
            # On the H100 (driver 580): a piece moved is an unmap and a map with its access,
            # 41-44 us up to 256 MiB (piece-alias/alias.txt); a piece made a create, map and
            # access, about 120 us up to 128 MiB (2026-11-24 vmm-costs, less the release).
            cost = (moved * 42 + made * 120) / 20000
            print(f"| {p} MiB | {mode} | {r:.3f} | {made} | {moved} | "
                  f"{(made + moved) / 20000:.4f} | {cost:.1f} |")


if __name__ == "__main__":
    main()
