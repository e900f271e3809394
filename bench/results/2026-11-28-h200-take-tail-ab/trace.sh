#!/bin/bash
# Each growth of a pool traced, on the real driver: the library of this tree ("base") and the
# same with change.patch applied ("new"), both with growth-trace.patch, which prints at each
# growth the request, the pool's reserved and used memory, and where its other memory lies (FREE
# in the heap, in a segment of the stream's own, of another stream's or of nobody's; cached on
# the stream or on others). tasks-probe.c runs T threads of 300 tasks each, a task as the
# harness's stream per task. Run from the repository's root: trace.sh OUT
O=$1; R=$PWD
for v in base new; do
  rm -rf /tmp/tr-$v && mkdir -p /tmp/tr-$v && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/tr-$v/
  (cd /tmp/tr-$v && { [ $v = base ] || patch -p1 -s < $R/bench/results/2026-11-28-h200-take-tail-ab/change.patch; } && patch -p1 -s < $R/bench/results/2026-11-28-h200-take-tail-ab/growth-trace.patch &&
   meson setup build --buildtype=release -Dtests=false >/dev/null 2>&1 && ninja -C build >/dev/null 2>&1 &&
   cc -O2 -o tt $R/bench/results/2026-11-28-h200-take-tail-ab/tasks-probe.c -Ilib -Iinclude -I/usr/local/cuda/include build/libsop-core.a -lpthread -ldl) || echo "$v build failed"
done
for T in 2 4 8 16; do for r in 1 2 3; do for v in base new; do
  NOMON=1 SOP_TRACE_GROW=1 SOP_DRIVER_LIBRARY=libcuda.so.1 /tmp/tr-$v/tt $T 300 > $O/out-$v-$T-$r.txt 2> $O/trace-$v-$T-$r.txt
  echo "$v $(cut -c1-80 $O/out-$v-$T-$r.txt) $(awk '/^G/{n[$2]++} END{for(k in n) printf "%s %d ", k, n[k]}' $O/trace-$v-$T-$r.txt)"
done; done; done
