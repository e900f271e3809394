#!/usr/bin/env bash
# The GPU suite on the tree (with affinity-below-high applied), then base vs A on the threads workload.
set -u
export NCCL_NVLS_ENABLE=0
bash bench/results/2026-11-29-h200-a58f5ed-suite/run.sh $OUT/suite
tail -5 $OUT/suite/gpu-suite.txt
AB_ROWS='reserved-high|16 threads \| aggregate \(' bash bench/ab.sh $OUT/ab 2 A base:-bench/results/2026-11-29-h200-affinity-below-high-ab/affinity-below-high.patch -- --workload threads --threads 4,8,16 --reps 5 > $OUT/ab.txt 2>&1
cd $OUT && tar czf ab.tgz ab && rm -rf ab
