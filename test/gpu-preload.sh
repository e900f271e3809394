#!/bin/sh
# The interposer's test on the real driver, through sop-run; skips (77) where the program cannot
# load libcuda.so.1 (no driver installed). Usage: gpu-preload.sh SOP-RUN TEST-PRELOAD [ARGS...]
run=$1
shift
if ldd "$1" 2>/dev/null | grep -q 'libcuda.so.1 => not found'; then
	echo "skip: no libcuda.so.1"
	exit 77
fi
exec "$run" "$@"
