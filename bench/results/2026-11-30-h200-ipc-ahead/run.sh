#!/usr/bin/env bash
# Pieces exported ahead of the importer's request (change.patch, in the tree) against the
# library without it: the harness's ipc workload in alternating rounds; then the GPU suite's
# IPC tests on the tree.
set -u
export NCCL_NVLS_ENABLE=0
d=bench/results/2026-11-30-h200-ipc-ahead
AB_ROWS='ipc' bash bench/ab.sh $OUT/ab 3 ahead base:-$d/change.patch -- --workload ipc --reps 7 > $OUT/ab.txt 2>&1
echo "ab exit $?"
. bench/lto-cc.sh
(meson setup bt --buildtype=release && ninja -C bt) > $OUT/build.log 2>&1
meson test -C bt --num-processes 1 --print-errorlogs gpu-ipc gpu-ipc-stale gpu-ipc-peers gpu-ipc-kernels \
	gpu-ipc-events gpu-preload-ipc gpu-preload-ipc-reset gpu-trim > $OUT/ipc-tests.txt 2>&1
echo "tests exit $?"
