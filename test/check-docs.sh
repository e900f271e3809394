#!/bin/sh
# The docs name files of the tree in backquotes (`lib/reuse.c`, `bench/results/DIR/summary.md`,
# `results/DIR/` in bench/README.md): every one of them must exist, so that a result quoted is
# one that is committed, and a file renamed or removed takes its mentions with it.
# Usage: check-docs.sh ROOT
# Names with a wildcard or an ellipsis (`...-c9e0236/`, short for the result named before it)
# are not checked.
root=$1
cd "$root" || exit 1
fail=0
n=0
for doc in README.md doc/*.md bench/README.md test/sim/README.md include/sop.h; do
	[ -f "$doc" ] || { echo "$doc: missing"; fail=1; continue; }
	base=
	[ "$doc" = bench/README.md ] && base=bench/
	for p in $(grep -o '`\(bench\|lib\|test\|doc\|tools\|examples\|include\|results\)/[A-Za-z0-9._/+-]*`' "$doc" |
		tr -d '`' | sort -u); do
		case $p in *...*) continue ;; results/*) p=$base$p ;; esac
		n=$((n + 1))
		[ -e "$p" ] || { echo "$doc: \`$p\` is not in the tree"; fail=1; }
	done
done
[ "$fail" = 0 ] && echo "docs: $n names of files, all in the tree"
exit $fail
