#!/usr/bin/env bash
# Where the time of sop's side goes on this host, sampled every 20 us of wall time on the main
# thread: the random workload (N = 10000, sizes up to 1 MiB) and the 4 KiB pair.
set -u
export NCCL_NVLS_ENABLE=0
. bench/lto-cc.sh
meson setup /tmp/bp --buildtype=release -Ddebug=true -Dtests=false >/dev/null && ninja -C /tmp/bp >/dev/null || exit 1
gcc -O2 -shared -fPIC -o /tmp/libsampler.so bench/results/2026-11-29-h200-random-costs/sampler.c -lrt || exit 1
which addr2line
for w in "random --max-mib 1 --reps 40 --smoke --scale 50" "pair --sizes 4K --reps 40 --smoke --scale 50"; do
  set -- $w
  PROF_OUT=$OUT/prof-$1.txt LD_PRELOAD=/tmp/libsampler.so /tmp/bp/bench/sop-bench --sides sop --workload $w --out $OUT/r-$1 >/dev/null 2>&1
  grep -E "^\| (sizes 1 B..1 MiB|4 KiB) \| (thr|lat)" $OUT/r-$1/results.md
  python3 bench/results/2026-11-29-h200-random-costs/resolve.py $OUT/prof-$1.txt libsop libcuda > $OUT/resolved-$1.txt 2>&1
  head -12 $OUT/resolved-$1.txt
  rm -f $OUT/prof-$1.txt
done
