# report.py OUTDIR: medians of bench/clients/run.sh's runs (clients.jsonl) into summary.md and
# clients.png (when matplotlib is there).
import json, os, statistics, sys

out = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(out, "clients.jsonl")) if l.strip()]
by = {}
for r in rows:
    by.setdefault(r["label"], []).append(r)
GiB, MiB = float(1 << 30), float(1 << 20)


def med(label, key):
    v = [r[key] for r in by.get(label, []) if not r.get("failed") and r.get(key) is not None]
    return statistics.median(v) if v else None


def rng(label, key, scale=1.0, fmt="%.1f"):
    v = [r[key] / scale for r in by.get(label, []) if not r.get("failed") and r.get(key) is not None]
    if not v:
        return "-"
    m = statistics.median(v)
    return (fmt % m) + (" (" + fmt % min(v) + "-" + fmt % max(v) + ")" if len(v) > 1 else "")


def over(label, num, den):
    """The medians' ratio num / den of a label's runs, or "-"."""
    a, b = med(label, num), med(label, den)
    return "%.3f" % (a / b) if a and b else "-"


def by_run(num, den, key):
    """num's runs over den's, paired by repetition (the modes of a round run one after the
    other): " (run by run a-b)", or "" without two pairs. A median's ratio whose runs fall on
    both sides of 1 shows no difference, however far the medians are apart."""
    a = {r["rep"]: r[key] for r in by.get(num, []) if not r.get("failed") and r.get(key)}
    b = {r["rep"]: r[key] for r in by.get(den, []) if not r.get("failed") and r.get(key)}
    v = [a[k] / b[k] for k in a if k in b]
    return " (run by run %.2f-%.2f)" % (min(v), max(v)) if len(v) > 1 else ""


def pytorch_modes(prefix):
    """PyTorch's three modes of a program whose labels start with prefix."""
    return {prefix + "-native": "native caching allocator", prefix + "-driver": "cudaMallocAsync, driver's pool",
            prefix + "-sop": "cudaMallocAsync under sop-run"}


def failed(label):
    return sum(1 for r in by.get(label, []) if r.get("failed"))


lines = ["# Real programs under sop-run, beside their other allocators", ""]
lines += ["Medians over runs (range in parentheses), each run a fresh process, modes interleaved.",
          "`machine.txt` names the commit, GPU, driver and framework versions.", ""]

if any(k.startswith("torch-") for k in by):
    lines += ["## PyTorch: GPT-style training, shapes changing every step (torch_gpt.py)", "",
              "| allocator | median step ms | p90 step ms | peak reserved GiB | peak allocated GiB | reserved / allocated | device used GiB | final loss | failed runs |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k, name in pytorch_modes("torch").items():
        if k not in by:
            continue
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %d |" % (
            name, rng(k, "median_ms"), rng(k, "p90_ms"), rng(k, "peak_reserved", GiB, "%.2f"),
            rng(k, "peak_allocated", GiB, "%.2f"), over(k, "peak_reserved", "peak_allocated"),
            rng(k, "device_used_peak", GiB, "%.2f"),
            rng(k, "loss_last", 1.0, "%.4f"), failed(k)))
    d, s, n = med("torch-driver", "median_ms"), med("torch-sop", "median_ms"), med("torch-native", "median_ms")
    rd, rs = med("torch-driver", "peak_reserved"), med("torch-sop", "peak_reserved")
    lines.append("")
    if d and s:
        lines.append("sop step time / driver pool's: %.3f%s; / native's: %s. sop peak reserved / driver pool's: %s." % (
            s / d, by_run("torch-sop", "torch-driver", "median_ms"), "%.3f" % (s / n) if n else "-",
            "%.3f" % (rs / rd) if rs and rd else "-"))
        ls = {k: [round(r["loss_sum"], 3) for r in by[k] if not r.get("failed")] for k in ("torch-driver", "torch-sop")}
        lines.append("Sum of the losses of every step, per run: driver pool %s, sop %s." % (ls["torch-driver"], ls["torch-sop"]))
    lines.append("")

if any(k.startswith("cupy-") for k in by):
    lines += ["## CuPy: variable shapes on 4 streams (cupy_streams.py)", "",
              "| pool | ms / iteration | peak reserved MiB | device used MiB | failed runs |",
              "| --- | --- | --- | --- | --- |"]
    names = {"cupy-default": "MemoryPool (default)", "cupy-driver": "MemoryAsyncPool, driver's pool",
             "cupy-sop": "MemoryAsyncPool under sop-run", "cupy-none": "no pool"}
    for k, name in names.items():
        if k in by:
            lines.append("| %s | %s | %s | %s | %d |" % (name, rng(k, "ms_per_iter", 1.0, "%.3f"),
                         rng(k, "reserved_peak", MiB, "%.0f"), rng(k, "device_used_peak", MiB, "%.0f"), failed(k)))
    d, s = med("cupy-driver", "ms_per_iter"), med("cupy-sop", "ms_per_iter")
    if d and s:
        lines += ["", "sop time / driver pool's: %.3f%s; / default pool's: %.3f." % (
            s / d, by_run("cupy-sop", "cupy-driver", "ms_per_iter"), s / med("cupy-default", "ms_per_iter"))]
    lines.append("")

if any(k.startswith("jax-") for k in by):
    lines += ["## JAX: a jitted matrix-product chain over 5 shapes (jax_matmul.py)", "",
              "| allocator | ms / iteration | failed runs |", "| --- | --- | --- |"]
    names = {"jax-bfc": "BFC (default)", "jax-driver": "cuda_async, driver's pool", "jax-sop": "cuda_async under sop-run"}
    for k, name in names.items():
        if k in by:
            lines.append("| %s | %s | %d |" % (name, rng(k, "ms_per_iter", 1.0, "%.3f"), failed(k)))
    d, s = med("jax-driver", "ms_per_iter"), med("jax-sop", "ms_per_iter")
    if d and s:
        lines += ["", "sop time / driver pool's: %.3f%s." % (s / d, by_run("jax-sop", "jax-driver", "ms_per_iter"))]
    lines.append("")

if any(k.startswith("serve-") for k in by):
    lines += ["## PyTorch: an inference server's 4 worker threads on streams of their own (torch_serve.py)", "",
              "| allocator | requests / s | peak reserved MiB | peak allocated MiB | reserved / allocated | checksum | failed runs |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for k, name in pytorch_modes("serve").items():
        if k not in by:
            continue
        lines.append("| %s | %s | %s | %s | %s | %s | %d |" % (
            name, rng(k, "requests_per_s"), rng(k, "peak_reserved", MiB, "%.0f"),
            rng(k, "peak_allocated", MiB, "%.0f"), over(k, "peak_reserved", "peak_allocated"),
            rng(k, "checksum", 1.0, "%.4f"), failed(k)))
    d, s_ = med("serve-driver", "requests_per_s"), med("serve-sop", "requests_per_s")
    rd, rs = med("serve-driver", "peak_reserved"), med("serve-sop", "peak_reserved")
    if d and s_:
        lines += ["", "sop requests a second / driver pool's: %.3f%s; sop peak reserved / driver pool's: %.3f." % (
            s_ / d, by_run("serve-sop", "serve-driver", "requests_per_s"), rs / rd)]
    lines.append("")

tasks_keys = sorted({k.rsplit("-", 1)[1] for k in by if k.startswith("tasks-")}, key=int)
if tasks_keys:
    lines += ["## CuPy: threads whose tasks each make and drop a stream (cupy_tasks.py)", "",
              "| threads | pool | tasks / s | reserved-high MiB | live peak MiB | reserved-high / live peak | bad bytes | failed runs |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    names = {"default": "MemoryPool (default)", "driver": "MemoryAsyncPool, driver's pool",
             "sop": "MemoryAsyncPool under sop-run"}
    for t in tasks_keys:
        for kind, name in names.items():
            k = "tasks-%s-%s" % (kind, t)
            if k not in by:
                continue
            bad = sum(r.get("bad_bytes", 0) for r in by[k] if not r.get("failed"))
            lines.append("| %s | %s | %s | %s | %s | %s | %d | %d |" % (
                t, name, rng(k, "tasks_per_s"), rng(k, "reserved_peak", MiB, "%.0f"),
                rng(k, "live_peak", MiB, "%.1f"), rng(k, "ratio", 1.0, "%.3f"), bad, failed(k)))
    lines.append("")

if "passthrough-driver" in by:
    lines += ["## What the interposer adds to calls it passes on (bench/passthrough.c)", "",
              "| call | without sop, ns | under sop-run, ns | added, ns |", "| --- | --- | --- | --- |"]
    keys = ["ctx_get_device", "mem_get_info", "pointer_attribute", "event_record",
            "stream_wait_event", "stream_synchronize", "event_synchronize"]
    for key in keys:
        a, b = med("passthrough-driver", key), med("passthrough-sop", key)
        if a is not None and b is not None:
            lines.append("| %s | %.1f | %.1f | %+.1f |" % (key, a, b, b - a))
    lines.append("")
    pairs = [(key, med("passthrough-driver", key), med("passthrough-sop", key))
             for key in ("pair_4k", "pair_1m")]
    pairs = [(k, a, b) for k, a, b in pairs if a is not None and b is not None]
    if pairs:
        lines += ["## The pair it serves: cuMemAllocAsync and cuMemFreeAsync on one stream", "",
                  "Ratio: the driver's pool's time over sop's, of the medians, then within each "
                  "repetition (the two modes run one after the other).", "",
                  "| size | the driver's pool, ns | sop under sop-run, ns | ratio | in each repetition |",
                  "| --- | --- | --- | --- | --- |"]
        for key, a, b in pairs:
            sop_by_rep = {r["rep"]: r[key] for r in by["passthrough-sop"]
                          if not r.get("failed") and r.get(key)}
            each = sorted(r[key] / sop_by_rep[r["rep"]] for r in by["passthrough-driver"]
                          if not r.get("failed") and r.get(key) and r["rep"] in sop_by_rep)
            lines.append("| %s | %.1f | %.1f | %.2fx | %s |" % (
                {"pair_4k": "4 KiB", "pair_1m": "1 MiB"}[key], a, b, a / b,
                "%.2f-%.2fx" % (each[0], each[-1]) if each else "-"))
        lines.append("")

open(os.path.join(out, "summary.md"), "w").write("\n".join(lines))
print("\n".join(lines))

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
panels = [("torch", "median_ms", "PyTorch median step (ms)", "peak_reserved", "peak reserved (GiB)", GiB),
          ("cupy", "ms_per_iter", "CuPy ms / iteration", "device_used_peak", "device used (MiB)", MiB),
          ("jax", "ms_per_iter", "JAX ms / iteration", None, None, 1)]
panels = [p for p in panels if any(k.startswith(p[0] + "-") for k in by)]
if not panels:
    sys.exit(0)
fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.2 * len(panels)), squeeze=False)
for row, (fw, tkey, ttitle, mkey, mtitle, scale) in zip(axes, panels):
    labels = [k for k in by if k.startswith(fw + "-")]
    short = [k.split("-", 1)[1] for k in labels]
    row[0].bar(short, [med(k, tkey) or 0 for k in labels], color="tab:blue")
    row[0].set_title(ttitle)
    if mkey:
        row[1].bar(short, [(med(k, mkey) or 0) / scale for k in labels], color="tab:orange")
        row[1].set_title(mtitle)
    else:
        row[1].axis("off")
fig.tight_layout()
fig.savefig(os.path.join(out, "clients.png"), dpi=110)
