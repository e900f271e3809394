#!/bin/bash
# A/B/C on the harness's random and pair workloads: A the tree as it is, B with descriptor slabs
# aligned to 128 bytes (slab-align.patch), C with B and prefetches of the lines a taken or freed
# block's neighbours need (prefetch.patch). Run from the repository root on the GPU machine,
# with OUT set; three rounds, the order of the variants rotated.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$PWD
export NCCL_NVLS_ENABLE=0
for v in A B C; do
  rm -rf /tmp/v$v; mkdir -p /tmp/v$v
  git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/v$v/
  cd /tmp/v$v
  case $v in
  B) patch -p1 -s < $here/slab-align.patch ;;
  C) patch -p1 -s < $here/slab-align.patch; patch -p1 -s < $here/prefetch.patch ;;
  esac
  (meson setup build-gpu -Dbuildtype=release -Dtests=false >/dev/null 2>&1; ninja -C build-gpu >/dev/null 2>&1) &
  cd $root
done
wait
for round in 1 2 3; do
  case $round in 1) order="A B C";; 2) order="C A B";; 3) order="B C A";; esac
  for v in $order; do
    echo "=== round $round variant $v"
    timeout 120 /tmp/v$v/build-gpu/bench/sop-bench --workload random,pair --max-mib 1,64 --reps 7 --out $OUT/r${round}$v >/dev/null 2>&1
    grep -E "^\| (sizes|256 B|4 KiB|64 KiB|1 MiB|64 MiB)" $OUT/r${round}$v/results.md | grep -E "throughput|latency|reserved"
  done
done
