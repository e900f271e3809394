#!/bin/bash
# As it ran, from the repository's root with ranges.c beside it, on one H200: ranges.c, then random sizes up to 1 GiB
# (sop alone, 3 repetitions, each setting a fresh process, twice) with the library built with
# pieces of at most P MiB moved past T tenths of the live memory (types.h's SOP_PIECE_MAX and
# SOP_MOVE_PAST_TENTHS, given to the compiler for the run: the library holds 256 and 13), then
# the library as it is beside the driver's pool.
set -u
o=$OUT/r; mkdir -p $o
nvidia-smi -L > $o/gpu.txt 2>&1
gcc -O2 -o ./ranges-bin ranges.c -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda &&
	./ranges-bin > $o/ranges.txt 2>&1
for v in "256 13" "128 13" "64 13" "64 12" "32 13"; do
	set -- $v
	d=b-$1-$2
	(meson setup $d --buildtype=release -Dtests=false \
		-Dc_args="-DSOP_PIECE_MAX_MIB=$1 -DSOP_MOVE_PAST_TENTHS=$2" >/dev/null 2>&1 &&
		ninja -C $d >/dev/null 2>&1) &
done
wait
for rep in 1 2; do
	for v in "256 13" "128 13" "64 13" "64 12" "32 13"; do
		set -- $v
		echo "== piece $1 tenths $2 rep $rep" >> $o/random.txt
		timeout 120 b-$1-$2/bench/sop-bench --workload random --max-mib 1024 --sides sop --reps 3 2>&1 |
			grep -E "^\| sizes|calls" >> $o/random.txt
	done
done
timeout 100 b-256-13/bench/sop-bench --workload random --max-mib 1024 --sides sop,driver --reps 2 2>&1 |
	grep -E "^\| sizes" >> $o/random-driver.txt
