#!/bin/bash
# The GPU suite on two GPUs: the peer tests first, then the whole suite. Run from the
# repository's root with the folder for the output as the argument.
set -u
out=${1:?output folder}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. bench/lto-cc.sh
{
	git rev-parse --short HEAD 2>/dev/null || echo "commit: unknown"
	nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
	nvidia-smi topo -m
	echo "cpus: $(nproc)"; echo "CC: $CC"
} >"$out/machine.txt" 2>&1
if ! { meson setup build-2gpu --buildtype=release && ninja -C build-2gpu; } >"$out/build.log" 2>&1; then
	tail -30 "$out/build.log"
	exit 1
fi
t0=$(date +%s)
meson test -C build-2gpu --suite gpu --print-errorlogs gpu-peer gpu-ipc-peers >"$out/peer-tests.txt" 2>&1
echo "peer tests: rc $? in $(($(date +%s) - t0)) s"
t0=$(date +%s)
meson test -C build-2gpu --suite gpu --print-errorlogs >"$out/gpu-suite.txt" 2>&1
echo "suite: rc $? in $(($(date +%s) - t0)) s"
cp build-2gpu/meson-logs/testlog.txt "$out/testlog.txt" 2>/dev/null
grep -E "^ *[0-9]+/[0-9]+ |^Ok:|^Fail:|^Skipped:|^Timeout:" "$out/gpu-suite.txt" | tail -60
