#!/usr/bin/env bash
# A/B of prefetches and descriptor alignment on the random workload at its full size (N = 10000).
set -u
export NCCL_NVLS_ENABLE=0
AB_ROWS='1 MiB \| thr' bash bench/ab.sh $OUT/ab 3 base pf:+bench/results/2026-11-29-h200-random-costs/pf.patch al:+bench/results/2026-11-29-h200-random-costs/al.patch all:+bench/results/2026-11-29-h200-random-costs/all.patch -- --workload random --max-mib 1 2>&1 | tee $OUT/ab2.txt
cd $OUT && tar czf ab2.tgz ab && rm -rf ab
