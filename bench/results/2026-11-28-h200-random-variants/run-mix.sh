#!/bin/bash
# mix.c in six processes one after the other, forty rounds each: does a process keep its speed,
# and do both pools change together? Run from the repository's root; output on stdout.
set -u
. bench/lto-cc.sh
d=bench/results/2026-11-28-h200-random-variants
meson setup /tmp/mixb --buildtype=release -Dtests=false >/dev/null 2>&1 && ninja -C /tmp/mixb libsop.so.0.1.0 >/dev/null 2>&1 || { echo "build failed"; exit 1; }
$CC -O2 -I include -I /usr/local/cuda/include $d/mix.c -o /tmp/mix -L /tmp/mixb -lsop -ldl || exit 1
for p in 1 2 3 4 5 6; do echo "== process $p"; LD_LIBRARY_PATH=/tmp/mixb /tmp/mix 40; done
