#!/bin/bash
# A stream per task on the simulated driver, each growth traced: the library as it is ("with the
# mark rule", 8afa1d4) and the same with growth for affinity back to its old bound, twice the
# live memory alone ("without"). Uses ../2026-11-28-h200-take-tail-ab/'s growth-trace.patch and
# tasks-probe.c (T threads of 300 tasks; a task makes a stream, keeps 32 blocks of 1 B..1 MiB
# live through 256 replacements, frees them, synchronizes and destroys its stream).
# Run from the repository's root: run.sh OUT
O=$1; R=$PWD; P=$R/bench/results/2026-11-28-h200-take-tail-ab
for v in with without; do
  rm -rf /tmp/tr-$v && mkdir -p /tmp/tr-$v && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/tr-$v/
  (cd /tmp/tr-$v && patch -p1 -s < $P/growth-trace.patch &&
   { [ $v = with ] || python3 -c "
p='lib/reuse.c'; s=open(p).read()
s=s.replace('<= 2 * used &&\n\t       used >= pool->used_high;', '<= 2 * used;'); open(p,'w').write(s)"; } &&
   meson setup build --buildtype=release >/dev/null 2>&1 && ninja -C build >/dev/null 2>&1 &&
   cc -O2 -o tt $P/tasks-probe.c -Ilib -Iinclude -I/usr/local/cuda/include build/libsop-core.a -lpthread -ldl) || echo "$v build failed"
done
for T in 4 8; do for r in 1 2; do for v in with without; do
  NOMON=1 SOP_TRACE_GROW=1 SOP_SIM_VMM_US=20 SOP_SIM_MEMORY=80G SOP_DRIVER_LIBRARY=/tmp/tr-$v/build/test/sim/libsopsim.so \
    /tmp/tr-$v/tt $T 300 > $O/out-$v-$T-$r.txt 2> $O/trace-$v-$T-$r.txt
done; done; done
