#!/bin/bash
# On the GPU machine, from the tree's root (trim.patch applied): the library with and without
# trim.patch in alternating rounds (bench/ab.sh). Output under $OUT.
export NCCL_NVLS_ENABLE=0
. bench/lto-cc.sh
t0=$(date +%s)
AB_ROWS='^\| (4 KiB|256 B|64 KiB|1 MiB|64 MiB|4 KiB, k|1 MiB, k|sizes 1 B..1 MiB \|)' \
	timeout 500 bash bench/ab.sh $OUT/ab ${ROUNDS:-4} trim base:-bench/results/2026-11-30-h200-trim-ab/trim.patch \
	-- --workload pair,batch,random --max-mib 1 --reps 7 --sides sop,driver > $OUT/ab.txt 2>&1
tar czf $OUT/ab.tgz -C $OUT ab && rm -rf $OUT/ab
echo "ab done $(( $(date +%s) - t0 )) s" >> $OUT/times.txt
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/machine.txt 2>&1
