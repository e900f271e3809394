#!/bin/bash
# As it ran: the same builds; first every CPU in turn (baseline), then the variants pinned to one.
set -u
. bench/lto-cc.sh
mkdir -p /tmp/ab && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/ab/ && cd /tmp/ab && patch -p1 -s < "$OLDPWD/ab.patch" || exit 1
V="b0: bpf:-DSOP_AB_PF2,-DSOP_AB_PFN bc1:-DSOP_AB_CLOSE=1 bc2:-DSOP_AB_CLOSE=2 ba:-DSOP_AB_A128"
for v in $V; do n=${v%%:*}; f=${v#*:}; f=${f//,/ }
  (meson setup v-$n --buildtype=release -Dtests=false "-Dc_args=$f" >/dev/null 2>&1 && ninja -C v-$n libsop.so.0.1.0 >/dev/null 2>&1 || echo "build $n failed") &
done; wait
$CC -O2 -I include -I /usr/local/cuda/include "$OLDPWD/ab-rand.c" -o rand -L v-b0 -lsop -ldl || exit 1
export LD_LIBRARY_PATH=v-b0
echo "== cpu scan, b0 pair 256 and rand 10000"
for c in $(seq 0 15); do echo -n "cpu$c "; taskset -c $c ./rand sop pair 200000 256 5; echo -n "cpu$c "; taskset -c $c ./rand sop rand 10000 1 5; done
nproc; cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null; lscpu | grep -i "thread\|socket\|numa\|MHz"
echo "== pinned A/B on cpu 5"
for r in 1 2 3; do
  for v in $V; do n=${v%%:*}; for w in "rand 10000 1 9" "rand 10000 64 5" "pair 200000 256 7" "pair 200000 65536 7"; do echo -n "$n "; LD_LIBRARY_PATH=v-$n taskset -c 5 ./rand sop $w; done; done
  taskset -c 5 ./rand drv rand 10000 1 7; taskset -c 5 ./rand drv pair 20000 256 7
done
