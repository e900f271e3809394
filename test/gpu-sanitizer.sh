#!/bin/sh
# gpu-sanitizer.sh SOP-RUN KERNELS HOST INTEGRITY [PROGRAM...]: sop's memory under NVIDIA's
# compute-sanitizer (memcheck), where it is installed: the tests whose kernels write and check
# patterns in memory sop hands out (KERNELS, test-gpu-kernels: eight streams handing blocks to
# each other; HOST, test-gpu-host: host pools under kernels and copies; INTEGRITY,
# test-integrity: threads, streams that come and go, trims), and programs built with nvcc, each
# under sop-run. Every access a kernel makes must fall in memory mapped with access for its
# device: the tool reports any that does not, and this fails. API errors are not counted: the
# tests make some on purpose. Skips (77) without the tool or a GPU.
run=$1
kernels=$2
host=$3
integrity=$4
shift 4
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null) ||
	{ echo "skip: no compute-sanitizer"; exit 77; }
nvidia-smi -L >/dev/null 2>&1 || { echo "skip: no GPU"; exit 77; }
fail=0
check() {
	name=$1
	shift
	out=$("$cs" --tool memcheck --report-api-errors no --error-exitcode 99 "$@" 2>&1)
	rc=$?
	summary=$(echo "$out" | grep "ERROR SUMMARY" | tail -1)
	if [ $rc = 77 ]; then
		echo "$name: skipped by the test"
	elif [ $rc != 0 ]; then
		echo "$out" | tail -40
		echo "$name: exit $rc under memcheck ($summary)"
		fail=1
	else
		echo "$name: ok (${summary#========= })"
	fi
}
check kernels "$kernels"
check host-kernels "$host"
check integrity "$integrity" --seconds 5 --threads 4 --seed 7
for p in "$@"; do
	check "$(basename "$p") under sop-run" "$run" "$p"
done
[ $fail = 0 ] && echo "sanitizer: ok"
exit $fail
