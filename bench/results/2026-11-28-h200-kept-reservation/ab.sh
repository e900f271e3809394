#!/bin/bash
# The library with reservations kept for the next pool (the tree) against the library before
# it (the tree with change.patch taken back), on one lease, both built with link-time
# optimization: rounds of the harness (by default its growth workload, 15 repetitions; else
# the sop-bench arguments given), the two libraries one after the other, in alternating order.
# Run from the repository's root:
#   ab.sh OUT ROUNDS [SOP-BENCH ARGUMENTS]
set -u
out=${1:?output folder}
rounds=${2:-4}
shift 2
args=("$@")
[ ${#args[@]} = 0 ] && args=(--workload growth --reps 15)
here=bench/results/2026-11-28-h200-kept-reservation
mkdir -p "$out"
. bench/lto-cc.sh
build() { # variant, take the change back?
	rm -rf "/tmp/ks-$1" && mkdir -p "/tmp/ks-$1" &&
		cp -r lib include meson.build meson_options.txt test bench tools examples "/tmp/ks-$1/" &&
		{ [ "$2" = no ] || (cd "/tmp/ks-$1" && patch -R -p1 -s <"$OLDPWD/$here/change.patch"); } &&
		meson setup --buildtype=release -Dtests=false "/tmp/kb-$1" "/tmp/ks-$1" >/dev/null 2>&1 &&
		ninja -C "/tmp/kb-$1" >/dev/null 2>&1 || echo "$1 build failed"
}
build base yes &
build kept no &
wait
for r in $(seq 1 "$rounds"); do
	vs="base kept"
	[ $((r % 2)) = 0 ] && vs="kept base"
	for v in $vs; do
		/tmp/kb-$v/bench/sop-bench "${args[@]}" --out "$out/$v-$r" >"$out/$v-$r.log" 2>&1
		echo "$v-$r"
		grep -E "^\| (fresh pool|threshold 0|[0-9]+ [KM]?i?B \| lat|sizes 1 B..(1|64) MiB \| thr)" \
			"$out/$v-$r/results.md"
	done
done
