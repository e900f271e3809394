#!/bin/bash
# A/B on the H100: the library built as at efc9096, whose library is that of ddfbce0 (A), and the same tree with link-time
# optimization (L, meson -Db_lto=true), both with the system gcc 13.3 (the machine's default
# compiler, /opt/gcc, cannot run its lto-wrapper). Run from the repository root with OUT set.
set -u
export NCCL_NVLS_ENABLE=0
lscpu | grep -E "Model name"; rm -rf /tmp/bA /tmp/bL
(CC=/usr/bin/gcc meson setup /tmp/bA -Dbuildtype=release -Dtests=false >/dev/null 2>&1; ninja -C /tmp/bA >/dev/null 2>&1) &
(CC=/usr/bin/gcc meson setup /tmp/bL -Dbuildtype=release -Db_lto=true -Dtests=false >/dev/null 2>&1; ninja -C /tmp/bL >/dev/null 2>&1) &
wait
ls /tmp/bA/bench/sop-bench /tmp/bL/bench/sop-bench || exit 1
ldd /tmp/bL/bench/sop-bench | grep sop
for round in 1 2 3; do
  case $round in 2) order="L A";; *) order="A L";; esac
  for v in $order; do
    echo "=== round $round variant $v"
    timeout 150 /tmp/b$v/bench/sop-bench --workload pair,batch,random,threads --max-mib 1,64 --threads 1,16 --reps 7 --out $OUT/r${round}$v >/dev/null 2>&1
    grep -E "^\| " $OUT/r${round}$v/results.md | grep -E "throughput|latency|aggregate|reserved" | grep -vE "per-thread|driver's work|compacting" | awk -F'|' '{print $2"|"$3"|"$4"|"$6}'
  done
done
cd $OUT && tar czf all.tgz r* && rm -rf r[0-9]*
