#!/bin/bash
# On two GPUs: gpu-policies with scenario K's stream creation beside the test, the scaffold's
# probe of stream creation, the peer tests.
set -u
export NCCL_NVLS_ENABLE=0 CC=/usr/bin/gcc
t0=$(date +%s)
rm -rf build-t
meson setup build-t --buildtype=debugoptimized >"$OUT/build.log" 2>&1 && ninja -C build-t >>"$OUT/build.log" 2>&1 ||
	{ tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
timeout 200 meson test -C build-t --suite gpu --print-errorlogs -v gpu-policies gpu-scaffold gpu-peer gpu-ipc-peers gpu-kernels gpu-tasks >"$OUT/gpu-tests.txt" 2>&1
echo "tests rc=$? at $(( $(date +%s) - t0 )) s"
grep -E "policies:|scaffold:|peer|^ *[0-9]+/[0-9]+ |^ *(Ok|Fail|Skipped|Timeout):" "$OUT/gpu-tests.txt"
for i in 1 2 3; do timeout 60 build-t/test/test-policies 2>&1 | grep -E "stream|ok|FAIL|expected"; done
