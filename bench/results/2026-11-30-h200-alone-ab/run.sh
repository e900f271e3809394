#!/bin/bash
# On the GPU machine, from the tree's root: the GPU suite on this tree, then the library with
# and without alone.patch in alternating rounds (bench/ab.sh). Output under $OUT.
export NCCL_NVLS_ENABLE=0
. bench/lto-cc.sh
t0=$(date +%s)
(meson setup bt --buildtype=release && ninja -C bt) > $OUT/build.log 2>&1
meson test -C bt --suite gpu --num-processes 1 --print-errorlogs > $OUT/suite.txt 2>&1
cp bt/meson-logs/testlog.txt $OUT/gpu-testlog.txt
echo "suite done $(( $(date +%s) - t0 )) s" >> $OUT/times.txt
AB_ROWS='^\| (4 KiB|256 B|64 KiB|1 MiB|64 MiB|4 KiB, k|1 MiB, k|max 1 MiB)' \
	timeout $(( 560 - ($(date +%s) - t0) )) bash bench/ab.sh $OUT/ab ${ROUNDS:-2} alone base:-bench/results/2026-11-30-h200-alone-ab/alone-lib.patch \
	-- --workload pair,batch,random --max-mib 1 --reps 7 --sides sop,driver > $OUT/ab.txt 2>&1
echo "ab done $(( $(date +%s) - t0 )) s" >> $OUT/times.txt
tar czf $OUT/ab.tgz -C $OUT ab
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/machine.txt 2>&1
