#!/usr/bin/env bash
# CuPy tasks under sop-run: the library with slow streams paced again at their last probe
# (change.patch applied: new) against the tree as it is (base), three alternating rounds at four
# and eight threads, the driver's pool once for reference. Run from the tree's root.
set -u
export NCCL_NVLS_ENABLE=0
R=bench/results/2026-11-29-h200-slow-repace-ab
. bench/lto-cc.sh
rm -rf /tmp/new-src /tmp/b-new /tmp/b-base && mkdir -p /tmp/new-src &&
	cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/new-src/ &&
	(cd /tmp/new-src && patch -p1 -s) <$R/change.patch || exit 1
(meson setup --buildtype=release -Dtests=false /tmp/b-new /tmp/new-src >/dev/null && ninja -C /tmp/b-new >/dev/null) &
(meson setup --buildtype=release -Dtests=false /tmp/b-base . >/dev/null && ninja -C /tmp/b-base >/dev/null) &
wait
ls /tmp/b-new/sop-run /tmp/b-base/sop-run || exit 1
py=bench/clients/cupy_tasks.py
one() { local label=$1; shift; echo "$label $("$@" 2>>$OUT/err.txt | tail -n 1)"; }
for t in 4 8; do one "driver-$t-r0" python3 $py --pool async --threads $t --tasks 40; done
for r in 1 2 3; do
	if [ $((r % 2)) = 1 ]; then order="new base"; else order="base new"; fi
	for t in 4 8; do
		for v in $order; do one "$v-$t-r$r" /tmp/b-$v/sop-run python3 $py --pool async --threads $t --tasks 40; done
	done
done
