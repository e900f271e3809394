#!/usr/bin/env bash
# The GPU suite on one H200, built as the harness builds the library (release, link-time
# optimization), then the pair in an order that shows whether its first case runs slow.
# Usage: run.sh OUT
set -u
out=$1
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
. bench/lto-cc.sh
{
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
	"${CC:-cc}" --version | head -1
} >"$out/machine.txt" 2>&1
meson setup build-g --buildtype=release >"$out/build.log" 2>&1 && ninja -C build-g >>"$out/build.log" 2>&1 || exit 1
meson test -C build-g --suite gpu --num-processes 1 >"$out/gpu-suite.txt" 2>&1
cp build-g/meson-logs/testlog.txt "$out/gpu-testlog.txt"
# Five cases of the pair, 256 B first and again after the others.
build-g/bench/sop-bench --workload pair --sizes 256,256,4K,256,256 --reps 7 >"$out/pair-order.txt" 2>&1
