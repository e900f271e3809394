#!/bin/sh
# sop-run from the build tree: it preloads the interposer ahead of what LD_PRELOAD held, passes
# the command's exit status on, honours SOP_PRELOAD, refuses a library that is not there and a
# missing command. Usage: sop-run.sh SOP-RUN TEST-PRELOAD
set -u
run=$1
prog=$2
fail() {
	echo "sop-run: $*" >&2
	exit 1
}

"$run" "$prog" --quick || fail "the program under sop-run failed"
"$run" sh -c 'exit 3'
[ $? -eq 3 ] || fail "the command's exit status is not passed on"
got=$(LD_PRELOAD=/nonexistent/other.so "$run" sh -c 'printf %s "$LD_PRELOAD"' 2>/dev/null)
case $got in
/*/libsop-preload.so:/nonexistent/other.so) ;;
*) fail "LD_PRELOAD is '$got'" ;;
esac
SOP_PRELOAD=/nonexistent/libsop-preload.so "$run" true 2>/dev/null
[ $? -eq 127 ] || fail "a library that is not there is accepted"
"$run" 2>/dev/null
[ $? -eq 2 ] || fail "no usage error without a command"
# A memory limit that is not a size, or more than 2^64 - 1 bytes, stops it before the program runs.
for v in 12q 99999999999999999999999 18446744073709551616 18014398509481984k 17179869184g; do
	SOP_DEVICE_MEMORY_LIMIT=$v "$run" true 2>/dev/null
	[ $? -eq 2 ] || fail "SOP_DEVICE_MEMORY_LIMIT=$v is accepted"
done
SOP_DEVICE_MEMORY_LIMIT=17179869183g SOP_DEVICE_MEMORY_LIMIT_0=018446744073709551615 "$run" true ||
	fail "a size is refused"
echo "sop-run: ok"
