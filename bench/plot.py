#!/usr/bin/env python3
"""Draw a sop-bench run as PNG files, next to its results.

Usage: bench/plot.py DIR   (DIR is the folder given to sop-bench --out)

Reads DIR/results.csv and DIR/replay-*.csv and writes:
  latency_by_size.png   pair: ns per alloc+free pair by size, each side (log scales)
  threads.png           threads: aggregate pairs/s and per-thread latency by thread count
  threads_variants.png  threads started cold, one by one, a stream per task: aggregate pairs/s
                        and reserved-high / live peak by thread count
  streams.png           streams: wall time over the no-allocation ideal by stream count
  replay_reserved.png   replay: reserved memory as each trace goes, each side, and live bytes
  ratios.png            every ratio of the run in one chart (> 1: sop is better)
A plot whose data the run does not hold is skipped. Needs matplotlib.
"""
import csv
import glob
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"sop": "#1f77b4", "driver": "#d62728", "driver-default": "#ff7f0e",
          "no-alloc": "#7f7f7f"}
MARKERS = {"sop": "o", "driver": "s", "driver-default": "^", "no-alloc": "x"}


def load(folder):
    rows = []
    with open(os.path.join(folder, "results.csv"), newline="") as f:
        for r in csv.DictReader(f):
            for k in ("x", "median", "min", "max"):
                r[k] = float(r[k])
            r["ratio"] = float(r["ratio"]) if r["ratio"] else None
            rows.append(r)
    return rows


def device(folder):
    try:
        with open(os.path.join(folder, "results.md")) as f:
            for line in f:
                if line.startswith("- device:"):
                    return line[len("- device:"):].strip()
    except OSError:
        pass
    return ""


def by_side(rows, workload, metric, group=None):
    """{side: [(x, median, min, max), ...]} sorted by x."""
    out = {}
    for r in rows:
        if r["workload"] != workload or r["metric"] != metric:
            continue
        if group is not None and r["group"] != group:
            continue
        out.setdefault(r["side"], []).append((r["x"], r["median"], r["min"], r["max"]))
    for v in out.values():
        v.sort()
    return out


def draw_sides(ax, data):
    for side, pts in data.items():
        xs = [p[0] for p in pts]
        med = [p[1] for p in pts]
        lo = [p[1] - p[2] for p in pts]
        hi = [p[3] - p[1] for p in pts]
        base = side.split(",")[0]
        ax.errorbar(xs, med, yerr=[lo, hi], label=side, color=COLORS.get(base),
                    marker=MARKERS.get(base, "o"), capsize=3,
                    linestyle="--" if side.endswith("KiB") else "-")


def size_label(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n


def save(fig, folder, name, title, dev):
    fig.suptitle(title + ("\n" + dev if dev else ""), fontsize=11)
    fig.tight_layout()
    path = os.path.join(folder, name)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print("wrote", path)


def plot_pair(rows, folder, dev):
    data = by_side(rows, "pair", "latency")
    if not data:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw_sides(ax, data)
    xs = sorted({p[0] for pts in data.values() for p in pts})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([size_label(int(x)) for x in xs])
    ax.set_xlabel("allocation size")
    ax.set_ylabel("ns per alloc+free pair (median, min-max)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save(fig, folder, "latency_by_size.png", "Same-stream alloc+free pair: latency by size", dev)


def threads_variant_groups(rows):
    """The threads variants (cold start, arriving, a stream per task), in the run's order:
    the groups that report reserved-high / live peak."""
    out = []
    for r in rows:
        if (r["workload"] == "threads" and r["metric"] == "reserved-high / live peak"
                and r["group"] not in out):
            out.append(r["group"])
    return out


def plot_threads(rows, folder, dev):
    variants = threads_variant_groups(rows)
    groups = sorted({r["group"] for r in rows
                     if r["workload"] == "threads" and r["group"] not in variants})
    agg, lat = {}, {}
    for g in groups:
        suffix = ", " + g if g and len(groups) > 1 else ""
        for side, pts in by_side(rows, "threads", "aggregate", g).items():
            agg[side + suffix] = pts
        for side, pts in by_side(rows, "threads", "per-thread latency", g).items():
            lat[side + suffix] = pts
    if not agg:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    draw_sides(a1, agg)
    draw_sides(a2, lat)
    xs = sorted({p[0] for pts in agg.values() for p in pts})
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(int(x)) for x in xs])
        ax.set_xlabel("host threads (one stream each)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    a1.set_ylabel("M alloc+free pairs/s, all threads")
    a2.set_ylabel("ns per pair, median thread")
    save(fig, folder, "threads.png", "Scaling by threads: 256 live blocks each, one stream each",
         dev)


def plot_threads_variants(rows, folder, dev):
    variants = threads_variant_groups(rows)
    if not variants:
        return
    styles = ["-", "--", ":", "-."]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    xs = set()
    for j, g in enumerate(variants):
        for ax, metric in ((a1, "aggregate"), (a2, "reserved-high / live peak")):
            for side, pts in by_side(rows, "threads", metric, g).items():
                xs.update(p[0] for p in pts)
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                            yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                            label="%s, %s" % (side, g), color=COLORS.get(side),
                            marker=MARKERS.get(side, "o"), capsize=3,
                            linestyle=styles[j % len(styles)])
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(xs))
        ax.set_xticklabels([str(int(x)) for x in sorted(xs)])
        ax.set_xlabel("host threads")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    a1.set_yscale("log")
    a1.set_ylabel("M alloc+free pairs/s, all threads")
    a2.set_ylabel("reserved-high / live peak")
    a2.axhline(1, color="#7f7f7f", lw=0.8)
    save(fig, folder, "threads_variants.png",
         "Threads as programs start them: cold, one by one, a stream per task", dev)


def plot_streams(rows, folder, dev):
    groups = []
    for r in rows:
        if r["workload"] == "streams" and r["group"] not in groups:
            groups.append(r["group"])
    if not groups:
        return
    rel = any(r["workload"] == "streams" and r["metric"] == "wall / no-alloc wall"
              for r in rows)
    metric = "wall / no-alloc wall" if rel else "wall per iteration"
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 4.2), squeeze=False)
    for ax, g in zip(axes[0], groups):
        data = by_side(rows, "streams", metric, g)
        draw_sides(ax, data)
        xs = sorted({p[0] for pts in data.values() for p in pts})
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(int(x)) for x in xs])
        ax.set_xlabel("streams S")
        ax.set_ylabel("wall time / ideal" if rel else "ms per iteration")
        if rel:
            ax.axhline(1, color="#7f7f7f", lw=0.8)
        ax.set_title("allocations of " + g)
        ax.grid(True, alpha=0.3)
        ax.legend()
    save(fig, folder, "streams.png",
         "Independent streams: allocate, launch, free (1.0 = no false serialization)", dev)


def plot_replay(folder, dev):
    files = sorted(glob.glob(os.path.join(folder, "replay-*.csv")))
    if not files:
        return
    fig, axes = plt.subplots(len(files), 1, figsize=(9, 3.6 * len(files)), squeeze=False)
    for ax, path in zip(axes[:, 0], files):
        sides = {}
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                sides.setdefault(r["side"], []).append(
                    (int(r["op"]), float(r["reserved_mib"]), float(r["requested_mib"])))
        for side, pts in sides.items():
            ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", label=side,
                    color=COLORS.get(side))
        first = next(iter(sides.values()), [])
        ax.step([p[0] for p in first], [p[2] for p in first], where="post", label="live (requested)",
                color="#2ca02c", ls="--")
        name = os.path.basename(path)[len("replay-"):-len(".csv")]
        ax.set_title(name)
        ax.set_xlabel("operation")
        ax.set_ylabel("MiB")
        ax.grid(True, alpha=0.3)
        ax.legend()
    save(fig, folder, "replay_reserved.png", "Reserved memory over a replay", dev)


def plot_ratios(rows, folder, dev):
    items = []
    for r in rows:
        if r["ratio"] and r["side"] in ("driver", "driver-default"):
            label = "%s: %s%s, %s" % (r["workload"], r["group"] + ", " if r["group"] else "",
                                     r["case"], r["metric"])
            items.append((label, r["side"], r["ratio"]))
    if not items:
        return
    labels = []
    for label, _, _ in items:
        if label not in labels:
            labels.append(label)
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(labels) + 1.5))
    h = 0.4
    for j, side in enumerate(("driver", "driver-default")):
        ys = [labels.index(lab) + (j - 0.5) * h for lab, s, _ in items if s == side]
        vs = [v for _, s, v in items if s == side]
        if vs:
            ax.barh(ys, vs, height=h, color=COLORS[side], label="against " + side)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1, color="black", lw=0.8)
    ax.set_xlabel("ratio (> 1: sop is better; driver time / sop time, sop rate / driver rate)")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(loc="lower right")
    save(fig, folder, "ratios.png", "sop against the driver's pools, every measurement", dev)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = sys.argv[1]
    rows = load(folder)
    dev = device(folder)
    plot_pair(rows, folder, dev)
    plot_threads(rows, folder, dev)
    plot_threads_variants(rows, folder, dev)
    plot_streams(rows, folder, dev)
    plot_replay(folder, dev)
    plot_ratios(rows, folder, dev)


if __name__ == "__main__":
    main()
