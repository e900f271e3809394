#!/usr/bin/env bash
# Slow streams paced at their pools' slow paths (change.patch, applied in the tree) against the
# library without it: the GPU tests that exercise threads and placement, the harness's threads
# workload at 4, 8 and 16 threads in two alternating rounds, then the CuPy tasks program.
set -u
export NCCL_NVLS_ENABLE=0
P=bench/results/2026-11-29-h200-slow-streams-ab
. bench/lto-cc.sh
(meson setup bt --buildtype=release && ninja -C bt) > $OUT/build.log 2>&1
meson test -C bt --num-processes 1 gpu-placement gpu-tasks gpu-threads gpu-churn gpu-crowd gpu-integrity gpu-kernels gpu-preload > $OUT/tests.txt 2>&1
grep -E "^ *[0-9]+/|^(integrity|frameworks):" $OUT/tests.txt bt/meson-logs/testlog.txt | sed 's#.*testlog.txt:##' | sort -u | tail -12
AB_ROWS='reserved-high|16 threads \| aggregate \(' bash bench/ab.sh $OUT/ab 2 new base:-$P/change.patch -- --workload threads --threads 4,8,16 --reps 3 > $OUT/ab.txt 2>&1
(cd $OUT && tar czf ab.tgz ab && rm -rf ab)
bash bench/clients/run.sh $OUT/clients --only tasks --reps 2 > $OUT/clients.txt 2>&1
