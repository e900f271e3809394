#!/usr/bin/env bash
# A/B of prefetches and descriptor alignment on the random and pair workloads.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name|L2|L3"
AB_ROWS='1 MiB \| thr|^\| (256 B|4 KiB|64 KiB) \| lat' bash bench/ab.sh $OUT/ab 4 base pf:+bench/results/2026-11-29-h200-random-costs/pf.patch pfa:+bench/results/2026-11-29-h200-random-costs/pfa.patch al:+bench/results/2026-11-29-h200-random-costs/al.patch all:+bench/results/2026-11-29-h200-random-costs/all.patch -- --quick --workload random,pair --max-mib 1 --reps 11 2>&1 | tee $OUT/ab.txt
cd $OUT && tar czf ab.tgz ab && rm -rf ab
