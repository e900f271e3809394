#!/usr/bin/env bash
# Refills scaled by the pool lock's contention (change.patch, in the tree) against the library
# without it: the harness's threads workload in alternating rounds, then CuPy's tasks.
set -u
export NCCL_NVLS_ENABLE=0
d=bench/results/2026-11-30-h200-refill-heat
start=$SECONDS
bash bench/ab.sh $OUT/ab 0 heat base:-$d/change.patch > $OUT/build.txt 2>&1 || exit 1
for r in 1 2; do
	order="heat base"; [ $r = 2 ] && order="base heat"
	for m in $order; do
		timeout 130 /tmp/ab-build-$m/bench/sop-bench --workload threads --threads 2,4,8,16 --reps 3 \
			--out $OUT/h-$m-$r > $OUT/h-$m-$r.log 2>&1
		echo "== $m round $r (exit $?, ${SECONDS}s)"
	done
done
res=$OUT/tasks.txt; : > $res
for rep in 1 2 3; do
	for t in 8 4; do
		for m in driver heat base; do
			[ $((SECONDS - start)) -lt 560 ] || break 3
			if [ $m = driver ]; then line=$(timeout 30 python3 bench/clients/cupy_tasks.py --pool async --threads $t --tasks 40 2>>$OUT/err.txt | tail -1)
			else line=$(timeout 30 /tmp/ab-build-$m/sop-run python3 bench/clients/cupy_tasks.py --pool async --threads $t --tasks 40 2>>$OUT/err.txt | tail -1); fi
			echo "$m $t $rep $line" >> $res
		done
	done
done
echo "done at ${SECONDS}s"
