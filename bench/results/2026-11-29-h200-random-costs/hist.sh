#!/usr/bin/env bash
# Does what ran before in the process slow sop's random workload? random alone vs after pair,batch.
set -u
export NCCL_NVLS_ENABLE=0
. bench/lto-cc.sh
meson setup /tmp/bb --buildtype=release -Dtests=false >/dev/null && ninja -C /tmp/bb >/dev/null || exit 1
for r in 1 2 3; do
  for w in random pair,batch,random; do
    /tmp/bb/bench/sop-bench --workload $w --max-mib 1 --out $OUT/h-$w-$r >/dev/null 2>&1
    echo "== $w round $r"; grep -E "1 MiB \| thr" $OUT/h-$w-$r/results.md
  done
done
