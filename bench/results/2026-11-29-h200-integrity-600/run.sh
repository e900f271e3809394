#!/bin/bash
# One H200: build the library and its tests (release, link-time optimization), then start the
# integrity stress in a process session of its own for 600 s, so that it runs its full ten minutes
# across two commands of the machine (one command may take at most ten minutes, build included).
# The next command waits for it:
#   pid=$(cat /tmp/integ/pid); while kill -0 $pid 2>/dev/null; do sleep 2; done; cp /tmp/integ/integrity.txt OUT/
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. bench/lto-cc.sh
t0=$(date +%s)
rm -rf build-t
meson setup build-t --buildtype=release >"$OUT/build.log" 2>&1 && ninja -C build-t >>"$OUT/build.log" 2>&1 ||
	{ tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; } > "$OUT/machine.txt"
mkdir -p /tmp/integ
setsid nohup build-t/test/test-integrity --seconds 600 --threads 16 --seed 1129 >/tmp/integ/integrity.txt 2>&1 </dev/null &
echo $! >/tmp/integ/pid
echo "integrity started at $(( $(date +%s) - t0 )) s, pid $(cat /tmp/integ/pid)"
sleep 5; ps -p "$(cat /tmp/integ/pid)" -o pid,etime,cmd
