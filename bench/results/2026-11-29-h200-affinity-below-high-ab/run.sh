#!/usr/bin/env bash
# A/B on the threads workload: base; A, no growth for segment affinity while the pool's used
# memory is below its high-water mark; B, A and, before growing there, other streams' frees
# that their probes show complete.
set -u
export NCCL_NVLS_ENABLE=0
AB_ROWS='reserved-high|(cold start|arriving one by one|a stream per task|random sizes), 16 threads \| aggregate \(' bash bench/ab.sh $OUT/ab 2 base A:+bench/results/2026-11-29-h200-affinity-below-high-ab/affinity-below-high.patch B:+bench/results/2026-11-29-h200-affinity-below-high-ab/flushfirst.patch -- --workload threads --threads 4,8,16 --reps 5 2>&1 | tee $OUT/ab.txt
cd $OUT && tar czf ab.tgz ab && rm -rf ab
