#!/bin/bash
# As it ran: the baseline alone; the two stream queries and a floating-point loop timed in the
# same process as each probe (CALLS=1), with and without address randomization.
set -u
. bench/lto-cc.sh
mkdir -p /tmp/ab && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/ab/ && cd /tmp/ab || exit 1
meson setup v-b0 --buildtype=release -Dtests=false >/dev/null 2>&1 && ninja -C v-b0 libsop.so.0.1.0 >/dev/null 2>&1 || echo "build failed"
$CC -O2 -I include -I /usr/local/cuda/include "$OLDPWD/ab-rand.c" -o rand -L v-b0 -lsop -ldl || exit 1
export LD_LIBRARY_PATH=v-b0
echo "== pair with the driver's two queries, per process"
for i in $(seq 12); do CALLS=1 ./rand sop pair 200000 256 5; done
echo "== the same, no address randomization"
for i in $(seq 8); do CALLS=1 setarch -R ./rand sop pair 200000 256 5; done
echo "== random, per process"
for i in $(seq 8); do CALLS=1 ./rand sop rand 10000 1 5; done
echo "== driver pair, per process"
for i in $(seq 6); do CALLS=1 ./rand drv pair 20000 256 5; done
