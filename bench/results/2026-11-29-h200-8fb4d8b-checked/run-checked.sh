#!/usr/bin/env bash
# The GPU suite on one H200 in the test suite's own build: lock order checked at every take
# (-Dchecks=true), the default build type. Usage: run-checked.sh OUT
set -u
out=$1
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
meson setup build-c -Dchecks=true >"$out/build-checked.log" 2>&1 && ninja -C build-c >>"$out/build-checked.log" 2>&1 || exit 1
meson test -C build-c --suite gpu --num-processes 1 >"$out/gpu-suite-checked.txt" 2>&1
cp build-c/meson-logs/testlog.txt "$out/gpu-testlog-checked.txt"
