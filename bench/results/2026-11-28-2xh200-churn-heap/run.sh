#!/bin/bash
# test-churn six times on one lease, built as the GPU suite builds it: with the allocator's
# handed-out memory read beside the resident size at each of its readings. Run from the
# repository's root with the folder for the output as the argument.
set -u
out=${1:?output folder}
mkdir -p "$out"
. bench/lto-cc.sh
{ meson setup build-2gpu --buildtype=release && ninja -C build-2gpu test/test-churn; } >"$out/build.log" 2>&1 || {
	tail -20 "$out/build.log"
	exit 1
}
nvidia-smi --query-gpu=index,name,driver_version --format=csv >"$out/machine.txt"
for i in 1 2 3 4 5 6; do
	t0=$(date +%s)
	SOP_TEST_WATCHDOG=120 ./build-2gpu/test/test-churn >"$out/churn-$i.txt" 2>&1
	echo "run $i rc $? $(($(date +%s) - t0)) s"
done
