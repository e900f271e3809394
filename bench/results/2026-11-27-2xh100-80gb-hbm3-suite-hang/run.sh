#!/bin/bash
# A run of record on one lease: the GPU suite (with two GPUs, where the machine has them, its
# peer tests run too), then the full harness. Run from the repository root with OUT set; what it
# wrote under OUT before its time ran out is this folder's gpu-suite.txt and machine-gpus.txt.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The machine's default compiler cannot link with link-time optimization; the system gcc can.
export CC=/usr/bin/gcc
t0=$(date +%s)
{ nvidia-smi -L; nvidia-smi topo -m; lscpu | grep -E "Model name|^CPU\(s\)|NUMA node"; } \
	>"$OUT/machine-gpus.txt" 2>&1
rm -rf build-t build-bench
(meson setup build-bench --buildtype=release -Dtests=false >/dev/null 2>&1 &&
	ninja -C build-bench >/dev/null 2>&1) &
meson setup build-t --buildtype=release >"$OUT/setup.log" 2>&1 && ninja -C build-t >"$OUT/build.log" 2>&1 ||
	{ tail -40 "$OUT/build.log"; exit 1; }
wait
echo "built in $(( $(date +%s) - t0 )) s"
meson test -C build-t --suite gpu --print-errorlogs >"$OUT/gpu-suite.txt" 2>&1
grep -E "^ *(Ok|Fail|Skipped|Expected|Unexpected|Timeout):" "$OUT/gpu-suite.txt"
grep -E "gpu-(peer|ipc-peers|integrity) " "$OUT/gpu-suite.txt"
echo "suite done at $(( $(date +%s) - t0 )) s"
bash bench/run.sh "$OUT/rec" --budget 240 >"$OUT/bench-out.txt" 2>&1
tail -3 "$OUT/bench-out.txt"
echo "harness done at $(( $(date +%s) - t0 )) s"
tar czf "$OUT/rec.tgz" -C "$OUT" rec && rm -rf "$OUT/rec"
