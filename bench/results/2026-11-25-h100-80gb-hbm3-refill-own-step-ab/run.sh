#!/bin/bash
# A/B of own step and refill sizes (temporary environment knobs) on the threads workload.
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
(meson setup build-gpu -Dbuildtype=release -Dtests=false >/dev/null 2>&1 || true; ninja -C build-gpu >/dev/null) || { echo build failed; exit 1; }
for round in 1 2; do
for cfg in "8 8" "2 2" "4 2"; do
  set -- $cfg
  echo "=== round $round own_step=${1}MiB refill=${2}MiB"
  SOP_X_OWN_STEP=$1 SOP_X_REFILL=$2 timeout 150 build-gpu/bench/sop-bench --workload threads --threads 16 --reps 5 --out $OUT/r${round}_${1}_${2} 2>&1 | grep -E "16 threads" | grep -v "^|"
done; done
