#!/bin/bash
# usage: bash count.sh BUILD -> sop's own instructions per pair, inside the harness's pair loop
B=$1
rm -f ${TMPDIR:-/tmp}/cgc.out.*
SOP_DRIVER_LIBRARY=$B/test/sim/libsopsim.so LD_LIBRARY_PATH=$B/test/sim valgrind --tool=callgrind --trace-children=yes --toggle-collect=pair_run --callgrind-out-file=${TMPDIR:-/tmp}/cgc.out.%p $B/bench/sop-bench --workload pair --sizes 4K --reps 1 --sides sop --scale 2 >/dev/null 2>&1
f=$(ls -S ${TMPDIR:-/tmp}/cgc.out.* | head -1)
n=$(callgrind_annotate --inclusive=yes --tree=calling $f 2>/dev/null | grep -m1 "sop_free_async (" | sed 's/.*(\([0-9,]*\)x).*/\1/' | tr -d ,)
callgrind_annotate --auto=no --inclusive=no $f 2>/dev/null | grep "\.\./lib/" | awk -v n=$n '{gsub(",","",$1); s+=$1} END {printf "pairs %d, sop instr per pair: %.1f\n", n, s/n}'
