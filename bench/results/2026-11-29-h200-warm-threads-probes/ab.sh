#!/bin/bash
# warm.c on the library of this tree ("base") and with a patch ("new"), alternating runs.
# Run from the repository's root: ab.sh OUT PATCH [THREADS...]
O=$1; P=$(realpath $2); shift 2; T=${*:-1 16}; R=$PWD; D=$R/bench/results/2026-11-29-h200-warm-threads-probes
export NCCL_NVLS_ENABLE=0; . bench/lto-cc.sh
for v in base new; do
  rm -rf /tmp/ab-$v && mkdir -p /tmp/ab-$v && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/ab-$v/
  (cd /tmp/ab-$v && { [ $v = base ] || patch -s -p1 < $P; } && meson setup build --buildtype=release -Dtests=false > /tmp/ab-$v.log 2>&1 &&
   ninja -C build >> /tmp/ab-$v.log 2>&1 && cc -O2 -o warm $D/warm.c -Iinclude -I/usr/local/cuda/include -Lbuild -lsop -Wl,-rpath,/tmp/ab-$v/build -lpthread -ldl -lrt) ||
   { tail -30 /tmp/ab-$v.log; echo "$v: build failed"; exit 1; }
done
for r in 1 2 3 4 5; do for t in $T; do for v in base new; do
  echo "$v $(/tmp/ab-$v/warm $t 1000000)"
done; done; done > $O/ab.txt 2>&1
python3 - $O/ab.txt <<'PY' | tee $O/ab-summary.txt
import re, statistics, sys, collections
v = collections.defaultdict(list)
for l in open(sys.argv[1]):
    m = re.match(r'(\w+) (\d+) threads.*: ([0-9.]+) ns', l)
    if m: v[(int(m.group(2)), m.group(1))].append(float(m.group(3)))
for k in sorted(v): print(k, 'median %.1f' % statistics.median(v[k]), ' '.join('%.1f' % x for x in v[k]))
PY
