#!/usr/bin/env bash
# CuPy's tasks at Python's pace on the simulated driver: paced.c against a release build of the
# library as it is (base) and one with young-share.patch applied (var), ten alternating rounds
# at four and eight threads, 20 tasks a thread, 60 us of "Python" under one lock per operation,
# 20 us "kernels". Run from the tree's root after `meson setup build` (tests on).
set -u
R=bench/results/2026-11-29-sim-paced-tasks
. bench/lto-cc.sh
rm -rf /tmp/pt-var /tmp/pt-bv /tmp/pt-bb && mkdir -p /tmp/pt-var &&
	cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/pt-var/ &&
	(cd /tmp/pt-var && patch -p1 -s) <$R/young-share.patch || exit 1
meson setup --buildtype=release -Dtests=false /tmp/pt-bb . >/dev/null && ninja -C /tmp/pt-bb >/dev/null || exit 1
meson setup --buildtype=release -Dtests=false /tmp/pt-bv /tmp/pt-var >/dev/null && ninja -C /tmp/pt-bv >/dev/null || exit 1
ninja -C build test/sim/libcuda.so.1 >/dev/null || exit 1
${CC:-cc} -O2 -std=gnu11 -Iinclude $R/paced.c -o /tmp/pt-paced $(pkg-config --cflags cuda 2>/dev/null) \
	-I/usr/local/cuda/include -L/tmp/pt-bb -lsop -Lbuild/test/sim -l:libcuda.so.1 -lpthread || exit 1
export SOP_SIM_MEMORY=16G SOP_DRIVER_LIBRARY=build/test/sim/libcuda.so.1
for r in 1 2 3 4 5 6 7 8 9 10; do
	for t in 4 8; do
		for v in base var; do
			[ $v = var ] && L=/tmp/pt-bv || L=/tmp/pt-bb
			echo "$v $(LD_LIBRARY_PATH=$L:build/test/sim /tmp/pt-paced $t 20 60 20)"
		done
	done
done
