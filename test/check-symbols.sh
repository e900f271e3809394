#!/bin/sh
# Compare the dynamic symbols a shared library defines with the list it should export.
# Usage: check-symbols.sh LIBRARY SYMBOL-LIST
lib=$1
list=$2
case "$lib" in *.so*) ;; *) echo "skip: not a shared library"; exit 77 ;; esac
command -v nm >/dev/null || { echo "skip: no nm"; exit 77; }
got=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRW]$/ {print $3}' | sort)
want=$(grep -v '^#' "$list" | sed '/^$/d' | sort)
if [ "$got" != "$want" ]; then
	echo "exported symbols differ from $list:"
	printf '%s\n' "$want" > want.txt.$$
	printf '%s\n' "$got" > got.txt.$$
	diff want.txt.$$ got.txt.$$
	rm -f want.txt.$$ got.txt.$$
	exit 1
fi
echo "symbols: ok ($(printf '%s\n' "$got" | wc -l) exported)"
