#!/bin/bash
# warm.c's timed pass with the process's faults and switches (RUSAGE), and the machine's TLB
# shootdowns, function-call and rescheduling interrupts around each run (/proc/interrupts).
# Run from the repository's root: tlb.sh OUT
O=$1; R=$PWD; D=$R/bench/results/2026-11-29-h200-warm-threads-probes
export NCCL_NVLS_ENABLE=0; . bench/lto-cc.sh
rm -rf /tmp/kb && mkdir -p /tmp/kb && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/kb/
(cd /tmp/kb && meson setup build --buildtype=release -Dtests=false > /tmp/kb.log 2>&1 && ninja -C build >> /tmp/kb.log 2>&1 &&
 cc -O2 -o warm $D/warm.c -Iinclude -I/usr/local/cuda/include -Lbuild -lsop -Wl,-rpath,/tmp/kb/build -lpthread -ldl -lrt) || { tail -30 /tmp/kb.log; exit 1; }
irq() { awk '$1 ~ /^(TLB|CAL|RES):$/ { s = 0; for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) s += $i; printf "%s%d ", $1, s }' /proc/interrupts; }
{
for r in 1 2 3; do for m in "1 X" "16 X" "16 OWN"; do set -- $m
  a=$(irq); l=$(env $2=1 RUSAGE=1 /tmp/kb/warm $1 1000000); b=$(irq)
  echo "$l | interrupts before: $a after: $b"
done; done
} > $O/tlb.txt 2>&1
