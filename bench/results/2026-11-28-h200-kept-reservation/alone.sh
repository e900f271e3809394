#!/bin/bash
# alone.c's loop, each allocator alone in its process: sop before the change (base), sop with
# reservations kept (kept), the driver's pool, the bare calls; ROUNDS rounds, the order turned
# each round. Builds the two libraries as ab.sh does. Run from the repository's root:
#   alone.sh OUT ROUNDS
set -u
out=${1:?output folder}
rounds=${2:-3}
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
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
gcc -O2 "$here/alone.c" -Iinclude -I"$cuda/include" -L/tmp/kb-kept -lsop -lcuda -o /tmp/alone
run() {
	case $1 in
	base | kept) LD_LIBRARY_PATH=/tmp/kb-$1 /tmp/alone sop | sed "1s/^sop/sop ($1)/" ;;
	*) LD_LIBRARY_PATH=/tmp/kb-kept /tmp/alone "$1" ;;
	esac
}
for r in $(seq 1 "$rounds"); do
	vs="base kept driver bare"
	[ $((r % 2)) = 0 ] && vs="bare driver kept base"
	echo "round $r"
	for v in $vs; do run "$v"; done
done | tee "$out/alone.txt"
