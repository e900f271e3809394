#!/bin/sh
# sop's thread-local data is reached without a call: each variable has the initial-exec model
# (a pointer to heap memory where it is more than a few words, lib/stream.c says why), so a
# shared library of sop imports no __tls_get_addr, which a variable of the default model costs at
# each access (the id memo behind every allocation under the interposer did, until 2026-11-30).
# Usage: check-tls.sh LIBRARY...
command -v nm >/dev/null || { echo "skip: no nm"; exit 77; }
fail=0
for lib in "$@"; do
	if nm -D --undefined-only "$lib" | grep -q '__tls_get_addr'; then
		echo "$lib: imports __tls_get_addr: a thread-local variable without the initial-exec model"
		fail=1
	fi
done
[ "$fail" = 0 ] && echo "tls: $# libraries, no __tls_get_addr"
exit $fail
