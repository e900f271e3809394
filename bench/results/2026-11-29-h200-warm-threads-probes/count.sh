#!/bin/bash
# warm.c on the library with count.patch: per free, how often a pair crossed what another thread
# touches (a descriptor last handed out or freed by another thread, a segment lock of a segment
# not the stream's own, a neighbour block of another stream's), and the paths taken.
# Run from the repository's root: count.sh OUT
O=$1; R=$PWD; D=$R/bench/results/2026-11-29-h200-warm-threads-probes
export NCCL_NVLS_ENABLE=0; . bench/lto-cc.sh
rm -rf /tmp/kc && mkdir -p /tmp/kc && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/kc/
(cd /tmp/kc && patch -s -p1 < $D/count.patch && meson setup build --buildtype=release -Dtests=false > /tmp/kc.log 2>&1 && ninja -C build >> /tmp/kc.log 2>&1 &&
 cc -O2 -o warm $D/warm.c -Iinclude -I/usr/local/cuda/include -Lbuild -lsop -Wl,-rpath,/tmp/kc/build -lpthread -ldl -lrt) || { tail -30 /tmp/kc.log; echo build failed; exit 1; }
for m in "1 X" "2 X" "4 X" "16 X" "16 X" "16 OWN"; do set -- $m; env $2=1 SOP_X_COUNT=1 /tmp/kc/warm $1 1000000 2>&1; echo; done > $O/count.txt
