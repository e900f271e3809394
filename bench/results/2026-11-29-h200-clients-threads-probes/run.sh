#!/usr/bin/env bash
# The change (change.patch, applied in the tree) against the library without it: the harness's
# threads workload at 4, 8 and 16 threads in two alternating rounds, then the CuPy tasks program
# on the tree with the change.
set -u
export NCCL_NVLS_ENABLE=0
P=bench/results/2026-11-29-h200-clients-threads-probes
AB_ROWS='reserved-high|16 threads \| aggregate \(' bash bench/ab.sh $OUT/ab 2 new base:-$P/change.patch -- --workload threads --threads 4,8,16 --reps 3 > $OUT/ab.txt 2>&1
(cd $OUT && tar czf ab.tgz ab && rm -rf ab)
bash bench/clients/run.sh $OUT/clients --only tasks --reps 2 > $OUT/clients.txt 2>&1
