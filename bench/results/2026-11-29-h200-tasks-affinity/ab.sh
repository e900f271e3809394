#!/usr/bin/env bash
# Slow streams paced by their frees too, and no growth for affinity for them (change.patch, in
# the tree) against the library without it: CuPy tasks, then the harness's threads workload.
set -u
export NCCL_NVLS_ENABLE=0
bash bench/ab.sh $OUT/ab 0 new base:-bench/results/2026-11-29-h200-tasks-affinity/change.patch > $OUT/build.txt 2>&1 || exit 1
res=$OUT/tasks.txt; : > $res
for rep in 1 2 3; do
  for t in 8 4; do
    for m in driver new base; do
      if [ $m = driver ]; then line=$(python3 bench/clients/cupy_tasks.py --pool async --threads $t --tasks 40 2>>$OUT/err.txt | tail -1)
      else line=$(/tmp/ab-build-$m/sop-run python3 bench/clients/cupy_tasks.py --pool async --threads $t --tasks 40 2>>$OUT/err.txt | tail -1); fi
      echo "$m $t $rep $line" >> $res
    done
  done
done
python3 - $res <<'PY'
import sys, json, statistics as st
rows={}
for l in open(sys.argv[1]):
    name,t,rep,js=l.split(' ',3)
    try: d=json.loads(js)
    except Exception: d={'ratio':float('nan'),'tasks_per_s':float('nan'),'reserved_peak':0,'bad_bytes':-1}
    rows.setdefault((int(t),name),[]).append(d)
for (t,name),v in sorted(rows.items()):
    r=[x['ratio'] for x in v]; tp=[x['tasks_per_s'] for x in v]; mb=[x['reserved_peak']>>20 for x in v]
    print(f"{t} {name:7s} ratio {st.median(r):.3f} ({min(r):.3f}-{max(r):.3f}) MiB {mb} tasks/s {st.median(tp):.1f} bad {sum(x['bad_bytes'] for x in v)}")
PY
for name in new base; do
  timeout 75 /tmp/ab-build-$name/bench/sop-bench --workload threads --threads 4,8,16 --reps 2 --out $OUT/h-$name > $OUT/h-$name.log 2>&1
  echo "== $name (exit $?)"; grep -E "reserved-high|16 threads \| aggregate \(" $OUT/h-$name/results.md | grep -v "^| case |"
done
