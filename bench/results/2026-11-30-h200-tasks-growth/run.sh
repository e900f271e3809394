#!/usr/bin/env bash
# Growth traces of the threads workload's variants (SOP_TRACE_GROW, knobs.patch), then the
# knobs against the library as it is, in alternating rounds: X_KNOWN (before growth, other
# streams' frees already known complete go to the heap), X_STEP4=2 (before growth, other
# streams' probes are asked, for every stream, as step 4 does for slow ones), both.
set -u
export NCCL_NVLS_ENABLE=0
d=bench/results/2026-11-30-h200-tasks-growth
bash bench/ab.sh $OUT/ab 0 kn:+$d/knobs.patch > $OUT/build.txt 2>&1 || exit 1
b=/tmp/ab-build-kn/bench/sop-bench
SOP_TRACE_GROW=1 timeout 100 $b --workload threads --threads 4,8 --reps 2 --out /tmp/tr > /tmp/t/trace.out 2> /tmp/t/trace.txt
echo "trace exit $?"
modes=("base|" "known|X_KNOWN=1" "step4|X_STEP4=2" "both|X_KNOWN=1 X_STEP4=2")
for r in 1 2; do
	for m in "${modes[@]}"; do
		name=${m%%|*} envs=${m#*|}
		env $envs timeout 100 $b --workload threads --threads 4,8,16 --reps 3 --out /tmp/h-$name-$r > /tmp/t/h-$name-$r.log 2>&1
		echo "== $name round $r (exit $?, ${SECONDS}s)"
	done
done
