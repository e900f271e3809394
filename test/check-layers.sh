#!/bin/sh
# The layers of lib/, checked on the objects: each file calls only files listed above it in the
# map at the top of lib/internal.h (a line " *   name.c   what it holds" per file, in call
# order), and the map names every lib/*.c file and nothing else.
# Usage: check-layers.sh lib/internal.h ARCHIVE-OR-OBJECT...
# A call is an undefined sop__ symbol of one file's object that another file's object defines
# (functions and data alike); calls made by inline functions of the headers count for the file
# they are inlined into, which is where they run.
map=$1
shift
command -v "${NM:-nm}" >/dev/null || { echo "skip: no nm"; exit 77; }
nm=${NM:-nm}
libdir=$(dirname "$map")
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# The map: the file list in the first comment of internal.h (a file name three spaces after
# the star; other lines are headings and continuations), numbered in call order.
sed -n '1,/\*\//p' "$map" | sed -n 's/^ \*   \([a-z0-9_]*\.c\) .*/\1/p' | awk '{print $1, NR}' \
	> "$tmp/rank"
if [ ! -s "$tmp/rank" ]; then
	echo "no file list found at the top of $map"
	exit 1
fi
fail=0
for f in "$libdir"/*.c; do
	b=$(basename "$f")
	grep -q "^$b " "$tmp/rank" || { echo "$b is not in the map ($map)"; fail=1; }
done
while read -r b n; do
	[ -f "$libdir/$b" ] || { echo "the map names $b, which is not in $libdir"; fail=1; }
done < "$tmp/rank"

# Each object's source file from its name (meson: lib/heap.c -> ...lib_heap.c.o), then the
# symbols it defines and the sop__ symbols it leaves undefined.
"$nm" -A --defined-only "$@" 2>/dev/null |
	sed -n 's/^\(.*:\)\{0,1\}[^:]*_\([a-z0-9_]*\.c\)\.o:[0-9a-f]* [A-Za-z] \(sop__[A-Za-z0-9_]*\)$/\3 \2/p' |
	sort -u > "$tmp/defs"
"$nm" -A -u "$@" 2>/dev/null |
	sed -n 's/^\(.*:\)\{0,1\}[^:]*_\([a-z0-9_]*\.c\)\.o: *U \(sop__[A-Za-z0-9_]*\)$/\2 \3/p' |
	sort -u > "$tmp/uses"
if [ ! -s "$tmp/defs" ]; then
	echo "no sop__ symbols defined in $*"
	exit 1
fi
cut -d' ' -f2 "$tmp/defs" | sort -u | while read -r b; do
	grep -q "^$b " "$tmp/rank" || echo "$b is built but not in the map ($map)"
done > "$tmp/unmapped"
if [ -s "$tmp/unmapped" ]; then
	cat "$tmp/unmapped"
	fail=1
fi

# Every call against the map.
awk 'FILENAME == ARGV[1] { rank[$1] = $2; next }
     FILENAME == ARGV[2] { def[$1] = $2; next }
     {
	caller = $1; sym = $2; callee = def[sym]
	if (callee == "" || callee == caller)
		next
	n++
	if (!(caller in rank) || !(callee in rank) || rank[callee] > rank[caller]) {
		bad[caller " -> " callee] = bad[caller " -> " callee] " " sym
		nbad++
	}
     }
     END {
	for (e in bad)
		printf "%s calls a file above it:%s\n", e, bad[e] | "sort"
	close("sort")
	printf "%d calls between files, %d upward\n", n, nbad
	exit nbad != 0
     }' "$tmp/rank" "$tmp/defs" "$tmp/uses" || fail=1
if [ $fail -ne 0 ]; then
	echo "layers: FAIL (order in $map)"
	exit 1
fi
echo "layers: ok ($(wc -l < "$tmp/rank") files)"
