#!/bin/bash
# On two GPUs: where gpu-policies waits, then the peer tests, then the whole GPU suite.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CC=/usr/bin/gcc
t0=$(date +%s)
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv; command -v gdb; nproc; } >"$OUT/build.log" 2>&1
cat "$OUT/build.log"
rm -rf build-t
meson setup build-t --buildtype=debugoptimized >>"$OUT/build.log" 2>&1 && ninja -C build-t >>"$OUT/build.log" 2>&1 ||
	{ tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
for t in policies peer ipc-peers policies policies; do
	SOP_TEST_WATCHDOG=100 build-t/test/test-$t >>"$OUT/$t.txt" 2>&1 &
	pid=$!
	for i in $(seq 1 45); do kill -0 $pid 2>/dev/null || break; sleep 1; done
	if kill -0 $pid 2>/dev/null; then
		echo "== $t still running after 45 s; stacks:"
		gdb -p $pid -batch -ex "thread apply all bt" >"$OUT/st.tmp" 2>&1; cat "$OUT/st.tmp" >>"$OUT/stacks.txt"; rm "$OUT/st.tmp"
		grep -E "^#|^Thread" "$OUT/stacks.txt" | head -80
		kill -9 $pid
	fi
	wait $pid; echo "== $t rc=$? at $(( $(date +%s) - t0 )) s"; tail -8 "$OUT/$t.txt"
done
timeout 300 meson test -C build-t --suite gpu --print-errorlogs >"$OUT/gpu-suite.txt" 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"
grep -E "^ *[0-9]+/[0-9]+ |^ *(Ok|Fail|Skipped|Timeout):" "$OUT/gpu-suite.txt" | grep -v " OK " 
