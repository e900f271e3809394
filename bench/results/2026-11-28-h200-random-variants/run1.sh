#!/bin/bash
# As it ran (the probe then named ab-rand.c, the patch ab.patch): library variants built with
# link-time optimization, each probe a process of its own, five rounds.
set -u
. bench/lto-cc.sh
echo "CC=$CC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -i "model name\|L2\|L3"
mkdir -p /tmp/ab && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/ab/ && cd /tmp/ab && patch -p1 -s < "$OLDPWD/ab.patch" || exit 1
V="b0: bpf:-DSOP_AB_PF2,-DSOP_AB_PFN bc1:-DSOP_AB_CLOSE=1 bc2:-DSOP_AB_CLOSE=2 ba:-DSOP_AB_A128 ball:-DSOP_AB_PF2,-DSOP_AB_PFN,-DSOP_AB_A128,-DSOP_AB_CLOSE=1"
for v in $V; do n=${v%%:*}; f=${v#*:}; f=${f//,/ }
  (meson setup v-$n --buildtype=release -Dtests=false "-Dc_args=$f" >/dev/null 2>&1 && ninja -C v-$n libsop.so.0.1.0 >/dev/null 2>&1 || echo "build $n failed") &
done; wait
$CC -O2 -I include -I /usr/local/cuda/include "$OLDPWD/ab-rand.c" -o rand -L v-b0 -lsop -ldl || exit 1
for r in 1 2 3 4 5; do
  ./rand drv rand 10000 1 7; ./rand drv pair 20000 256 7
  for v in $V; do n=${v%%:*}; echo -n "$n "; LD_LIBRARY_PATH=v-$n ./rand sop rand 10000 1 7; echo -n "$n "; LD_LIBRARY_PATH=v-$n ./rand sop rand 2000 1 7; echo -n "$n "; LD_LIBRARY_PATH=v-$n ./rand sop pair 200000 256 7; echo -n "$n "; LD_LIBRARY_PATH=v-$n ./rand sop pair 200000 65536 7; done
done
