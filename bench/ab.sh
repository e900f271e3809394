#!/usr/bin/env bash
# bash bench/ab.sh OUTDIR ROUNDS VARIANT... [-- SOP-BENCH ARGUMENTS]: builds of the library
# measured against each other on one machine, in alternating rounds, as a change needs before
# it is kept: the machine's speed moves from one minute to the next (doc/design.md, Measured),
# so each round runs every variant once, in the order given in odd rounds and reversed in even
# ones, and the rounds' figures are what compare.
#
# A VARIANT is NAME (this tree as it is), NAME:+PATCH (this tree with PATCH applied) or
# NAME:-PATCH (this tree with PATCH taken back), PATCH a file of `git diff` or `diff -u` from
# the tree's root. Each is built in its own copy under /tmp with link-time optimization
# (bench/lto-cc.sh) and without tests. The harness's arguments default to the growth workload;
# each run writes OUTDIR/NAME-ROUND/ (results.md, results.csv) and OUTDIR/NAME-ROUND.log, and
# after each run the rows of results.md that match $AB_ROWS (an extended regular expression,
# default every row of a table) are printed under the run's name.
#   bash bench/ab.sh out 3 base kept:-change.patch -- --workload pair,random --reps 7
# Without a GPU, sop-bench needs the simulated driver (SOP_DRIVER_LIBRARY), as it always does.
set -u
cd "$(dirname "$0")/.."

usage() {
	echo "usage: bash bench/ab.sh OUTDIR ROUNDS VARIANT... [-- SOP-BENCH ARGUMENTS]" >&2
	exit 2
}
[ $# -ge 3 ] || usage
out=$1
rounds=$2
shift 2
case $rounds in '' | *[!0-9]*) usage ;; esac
variants=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
	variants+=("$1")
	shift
done
[ $# -gt 0 ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--workload growth --reps 15)
[ ${#variants[@]} -gt 0 ] || usage
rows=${AB_ROWS:-^\| [^-]}
root=$PWD
mkdir -p "$out"
. bench/lto-cc.sh

# One copy of the tree per variant, with its patch applied or taken back, and its build.
build() {
	local name=$1 patch=$2 dir=/tmp/ab-src-$1 bdir=/tmp/ab-build-$1 file
	rm -rf "$dir" "$bdir" && mkdir -p "$dir" || return 1
	cp -r lib include meson.build meson_options.txt test bench tools examples "$dir/" || return 1
	file=${patch#?}
	[ "${file#/}" != "$file" ] || file=$root/$file
	case $patch in
	+*) (cd "$dir" && patch -p1 -s <"$file") || return 1 ;;
	-*) (cd "$dir" && patch -R -p1 -s <"$file") || return 1 ;;
	esac
	meson setup --buildtype=release -Dtests=false "$bdir" "$dir" >"$out/$name-build.log" 2>&1 &&
		ninja -C "$bdir" >>"$out/$name-build.log" 2>&1
}
names=()
for v in "${variants[@]}"; do
	name=${v%%:*}
	patch=
	[ "$name" = "$v" ] || patch=${v#*:}
	case $name in '' | *[!A-Za-z0-9_.-]*) echo "ab: bad variant name '$name'" >&2; exit 2 ;; esac
	case $patch in '' | [+-]?*) ;; *) echo "ab: '$v': the patch needs + or -" >&2; exit 2 ;; esac
	if ! build "$name" "$patch"; then
		echo "ab: $name did not build (see $out/$name-build.log)" >&2
		exit 1
	fi
	names+=("$name")
done

for r in $(seq 1 "$rounds"); do
	order=("${names[@]}")
	if [ $((r % 2)) = 0 ]; then
		order=()
		for ((i = ${#names[@]} - 1; i >= 0; i--)); do order+=("${names[i]}"); done
	fi
	for name in "${order[@]}"; do
		/tmp/ab-build-$name/bench/sop-bench "${args[@]}" --out "$out/$name-$r" \
			>"$out/$name-$r.log" 2>&1
		echo "== $name, round $r (exit $?)"
		grep -E "$rows" "$out/$name-$r/results.md" 2>/dev/null | grep -v "^| case |"
	done
done
