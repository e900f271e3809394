#!/usr/bin/env python3
"""Convert a PyTorch memory snapshot to sop-bench's replay CSV.

The snapshot is the pickle that torch.cuda.memory._dump_snapshot() writes after
torch.cuda.memory._record_memory_history(): its "device_traces" hold, per device, the
allocator's events in order, each a dict with "action", "addr", "size", "stream" (and
"time_us", "frames", ...). This keeps:

  alloc            -> an "allocate" row
  free_requested   -> a "free" row: the program let go of the block here, which is the point
                      where a stream-ordered program would call cudaFreeAsync
  free_completed   -> a "free" row only if no free_requested came first (older snapshots, or
                      entries cut from the start of the ring buffer); otherwise dropped, since
                      PyTorch's caching allocator only completes the free once the block's
                      uses on other streams (record_stream) have finished

and drops everything else (segment_alloc/free/map/unmap, snapshot, oom, user_defined), frees
of blocks allocated before recording began, and allocations never freed (the replay frees
those at the end). Sizes are the caching allocator's block sizes (rounded, usually to 512 B),
not the bytes the program asked for.

Stream is written as an index (the stream-aware variant of the format): distinct stream
values become 0, 1, 2, ... in order of first appearance. --rmm writes every row on stream 0x0
instead, which is what RMM's own replay accepts. Thread is 1 (PyTorch does not record it).

Usage: torch_to_csv.py SNAPSHOT.pickle OUT.csv [--device N] [--rmm]
Only the standard library is needed (the pickle holds plain dicts and lists).
"""
import argparse
import datetime
import pickle
import sys


def time_of_day(us):
    if us is None:
        return "00:00:00.000000"
    t = datetime.datetime.fromtimestamp(us / 1e6, tz=datetime.timezone.utc)
    return t.strftime("%H:%M:%S.%f")


def pick_device(traces, device):
    if device is not None:
        if device >= len(traces):
            sys.exit("snapshot has no device %d" % device)
        return device
    # The device with the most events: a one-GPU run has one non-empty list.
    return max(range(len(traces)), key=lambda d: len(traces[d]))


def convert(snapshot, device=None, rmm=False):
    """Rows (thread, time, action, pointer, size, stream) of the replay CSV."""
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    if not traces:
        raise ValueError("no device_traces in the snapshot: was _record_memory_history on?")
    events = traces[pick_device(traces, device)]
    streams = {}
    live = {}  # addr -> [size, stream index, free emitted]
    rows = []
    stats = {"alloc": 0, "free": 0, "dropped": 0}

    def stream_index(raw):
        return streams.setdefault(raw, len(streams))

    for e in events:
        action = e.get("action")
        addr = e.get("addr")
        if action == "alloc":
            if addr in live and not live[addr][2]:
                # Allocated again without a free in the log: close the old one first.
                rows.append(("free", addr, live[addr][0], live[addr][1], e.get("time_us")))
            s = stream_index(e.get("stream", 0))
            live[addr] = [e["size"], s, False]
            rows.append(("allocate", addr, e["size"], s, e.get("time_us")))
            stats["alloc"] += 1
        elif action in ("free_requested", "free_completed"):
            block = live.get(addr)
            if block is None:
                stats["dropped"] += action == "free_requested"
                continue
            if not block[2]:
                rows.append(("free", addr, block[0], stream_index(e.get("stream", 0)),
                             e.get("time_us")))
                block[2] = True
                stats["free"] += 1
            if action == "free_completed":
                del live[addr]
    out = []
    for action, addr, size, s, us in rows:
        out.append((1, time_of_day(us), action, "0x%x" % addr, size, "0x0" if rmm else str(s)))
    return out, stats, len(streams)


def write_csv(rows, path):
    with open(path, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for r in rows:
            f.write("%d,%s,%s,%s,%d,%s\n" % r)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("snapshot")
    ap.add_argument("out")
    ap.add_argument("--device", type=int, default=None)
    ap.add_argument("--rmm", action="store_true", help="one stream, RMM's form (Stream 0x0)")
    args = ap.parse_args()
    with open(args.snapshot, "rb") as f:
        snapshot = pickle.load(f)
    rows, stats, n_streams = convert(snapshot, args.device, args.rmm)
    write_csv(rows, args.out)
    print("%s: %d allocations, %d frees, %d streams; %d frees of blocks from before the "
          "recording dropped" % (args.out, stats["alloc"], stats["free"], n_streams,
                                 stats["dropped"]))


if __name__ == "__main__":
    main()
