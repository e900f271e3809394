#!/bin/bash
# Run from the repository root on a GPU machine: bash bench/results/2026-11-29-h200-device-reset/run.sh OUT
# Builds sop and r.cu, then runs each mode (MODES, default all) plainly and under sop-run.
set -u
out=$1
here=$(dirname "$0")
. bench/lto-cc.sh
{ [ -d bt ] || meson setup bt --buildtype=release -Dtests=false; ninja -C bt; } > $out/build.log 2>&1 || { tail $out/build.log; exit 1; }
nvcc -O2 -o $out/r $here/r.cu -lcuda >> $out/build.log 2>&1 || { tail $out/build.log; exit 1; }
for mode in ${MODES:-0 1 2 3 4 5 6 7 8}; do
	for side in plain sop; do
		echo "== mode $mode, $side"
		if [ $side = plain ]; then timeout 60 $out/r $mode; else timeout 60 bt/sop-run $out/r $mode; fi
		echo "rc=$?"
	done
done 2>&1
