#!/bin/bash
# Where warmed threads on one pool lose their per-thread rate, on the real driver. The library of
# this tree with knobs.patch (SOP_X_PROBE_EVERY: frees between probes by count, default 64;
# SOP_X_GAP_ALL: the lone stream's 200 us gap between probes on every stream), and warm.c.
# Run from the repository's root: run.sh OUT
O=$1; R=$PWD; D=$R/bench/results/2026-11-29-h200-warm-threads-probes
export NCCL_NVLS_ENABLE=0; . bench/lto-cc.sh
rm -rf /tmp/kb && mkdir -p /tmp/kb && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/kb/
(cd /tmp/kb && patch -p1 -s < $D/knobs.patch && meson setup build --buildtype=release -Dtests=false > /tmp/kb.log 2>&1 &&
 ninja -C build >> /tmp/kb.log 2>&1 && cc -O2 -o warm $D/warm.c -Iinclude -I/usr/local/cuda/include -Lbuild -lsop -Wl,-rpath,/tmp/kb/build -lpthread -ldl) || { tail -30 /tmp/kb.log; echo build failed; exit 1; }
W=/tmp/kb/warm
{ nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node\(s\)|L2|L3"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $O/machine.txt
for r in 1 2 3; do
 for T in 1 2 4 8 16; do
  $W $T 300000
  SOP_X_PROBE_EVERY=1000000000 $W $T 300000 | sed 's/^/no-count-probes /'
  SOP_X_GAP_ALL=1 $W $T 300000 | sed 's/^/gap-all /'
 done
 for T in 1 2 16; do
  OWN=1 $W $T 300000
  QUERIES=1 $W $T 1000000
  QUERIES=1 RECORD=64 $W $T 1000000
 done
done > $O/warm.txt 2>&1
if command -v perf >/dev/null; then
  perf record -q -g -o /tmp/p16.data $W 16 300000 > $O/perf16.txt 2>&1
  perf report -i /tmp/p16.data --no-children --stdio --sort dso,sym 2>/dev/null | grep -v "^$" | grep "%" | head -60 >> $O/perf16.txt
else echo "no perf" > $O/perf16.txt; fi
