#!/bin/bash
# Where the time of warm.c's pairs goes at one and sixteen threads, on one pool or a pool per
# thread, and without probes by count: warm.c's own sampling (SAMPLE), resolved by sample.py. The
# library of this tree with knobs.patch, with line tables. Run from the repository's root: sample.sh OUT
O=$1; R=$PWD; D=$R/bench/results/2026-11-29-h200-warm-threads-probes
export NCCL_NVLS_ENABLE=0; . bench/lto-cc.sh
rm -rf /tmp/kb && mkdir -p /tmp/kb && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/kb/
(cd /tmp/kb && patch -s -p1 < $D/knobs.patch && meson setup build --buildtype=release -Ddebug=true -Dtests=false > /tmp/kb.log 2>&1 && ninja -C build >> /tmp/kb.log 2>&1 &&
 cc -O2 -g -o warm $D/warm.c -Iinclude -I/usr/local/cuda/include -Lbuild -lsop -Wl,-rpath,/tmp/kb/build -lpthread -ldl -lrt) || { tail -30 /tmp/kb.log; echo build failed; exit 1; }
W=/tmp/kb/warm
M="1 X|16 X|16 OWN|16 SOP_X_PROBE_EVERY"
for r in 1 2; do IFS='|'; for m in $M; do IFS=' '; set -- $m; env $2=1000000000 $W $1 1000000 | sed "s/^/$2 /"; done; done > $O/times.txt 2>&1
IFS='|'; for m in $M; do
  IFS=' '; set -- $m
  env $2=1000000000 SAMPLE=/tmp/s-$1-$2.txt $W $1 1000000 > $O/sample-$1-$2.txt 2>&1
  python3 $D/sample.py /tmp/s-$1-$2.txt 60 >> $O/sample-$1-$2.txt
done
