#!/bin/bash
# One H100: build the library (release, link-time optimization), the GPU suite, then the
# integrity stress started in a session of its own for 600 s (the next call waits for it).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CC=/usr/bin/gcc
t0=$(date +%s)
echo "user: $(id -un) uid $(id -u)"
rm -rf build-t build-bench
(meson setup build-bench --buildtype=release -Dtests=false >/dev/null 2>&1 && ninja -C build-bench >/dev/null 2>&1) &
meson setup build-t --buildtype=release >"$OUT/build.log" 2>&1 && ninja -C build-t >>"$OUT/build.log" 2>&1 ||
	{ tail -40 "$OUT/build.log"; exit 1; }
wait
echo "built in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 400 meson test -C build-t --suite gpu --print-errorlogs >"$OUT/gpu-suite.txt" 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"
grep -E "^ *(Ok|Fail|Skipped|Timeout):" "$OUT/gpu-suite.txt"; grep -vE " OK |RUNNING" "$OUT/gpu-suite.txt" | grep -E "^ *[0-9]+/[0-9]+ "
cp build-t/meson-logs/testlog.txt "$OUT/gpu-testlog.txt"
grep -E "policies:|scaffold:" "$OUT/gpu-testlog.txt" | head -5
mkdir -p /tmp/integ
setsid nohup build-t/test/test-integrity --seconds 600 --threads 16 --seed 1128 >/tmp/integ/integrity.txt 2>&1 </dev/null &
echo $! >/tmp/integ/pid
date +%s >/tmp/integ/t0
echo "integrity started at $(( $(date +%s) - t0 )) s, pid $(cat /tmp/integ/pid)"
sleep 5; ps -p "$(cat /tmp/integ/pid)" -o pid,etime,cmd
# The next call, on the same machine, waited for the stress and kept its output:
#   pid=$(cat /tmp/integ/pid); while kill -0 $pid 2>/dev/null; do sleep 2; done
#   cp /tmp/integ/integrity.txt $OUT/
