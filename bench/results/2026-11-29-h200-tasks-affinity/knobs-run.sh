#!/usr/bin/env bash
# CuPy tasks under sop-run with the experiment's knobs (knobs.patch, applied in the tree; its
# first round lacked X_NOAFF), modes interleaved, three runs a mode at 8 and 4 threads, 40 tasks
# a thread; then one run at 8 threads of two modes with the growth trace (SOP_TRACE_GROW).
# Round 1: ROUND=1; round 2: ROUND=2.
set -u
export NCCL_NVLS_ENABLE=0
. bench/lto-cc.sh
meson setup bb --buildtype=release -Dtests=false >/dev/null && ninja -C bb >/dev/null || exit 1
res=$OUT/runs.txt; : > $res
if [ "${ROUND:-1}" = 1 ]; then
	modes=("driver|" "base|" "s1|X_STEP4=1" "s1r|X_STEP4=1 X_REST=1" "norefill|X_NOREFILL=1" "knob|X_PROBE_GAP_US=500 X_STEP4=2")
	traced=("base|" "s1r|X_STEP4=1 X_REST=1")
else
	modes=("driver|" "base|" "noaff|X_NOAFF=1" "knob|X_PROBE_GAP_US=500 X_STEP4=2" "knobnoaff|X_PROBE_GAP_US=500 X_STEP4=2 X_NOAFF=1" "knobr|X_PROBE_GAP_US=500 X_STEP4=2 X_REST=1")
	traced=("noaff|X_NOAFF=1" "knob|X_PROBE_GAP_US=500 X_STEP4=2")
fi
task() { python3 bench/clients/cupy_tasks.py --pool async --threads $1 --tasks 40; }
for rep in 1 2 3; do
	for t in 8 4; do
		for m in "${modes[@]}"; do
			name=${m%%|*} envs=${m#*|}
			if [ $name = driver ]; then line=$(task $t 2>>$OUT/err.txt | tail -1)
			else line=$(env $envs bb/sop-run python3 bench/clients/cupy_tasks.py --pool async --threads $t --tasks 40 2>>$OUT/err.txt | tail -1); fi
			echo "$name $t $rep $line" >>$res
		done
	done
done
for m in "${traced[@]}"; do
	name=${m%%|*} envs=${m#*|}
	env $envs SOP_TRACE_GROW=1 bb/sop-run python3 bench/clients/cupy_tasks.py --pool async --threads 8 --tasks 40 >$OUT/trace-$name.out 2>$OUT/trace-$name.txt
done
