#!/bin/bash
# The A/B of this folder: BASE (a checkout of bedcd44, the first argument) against the tree this
# runs in (70f7635), alternating which goes first, four rounds: the harness's threads workload
# at 1, 4 and 16 threads, sop and the driver's pool. Builds and outputs go under WORK.
#
#   bash run-ab.sh BASE_DIR [WORK]
set -u
base=$1; W=${2:-ab-work}; mkdir -p "$W"
for v in base new; do d=$([ $v = new ] && echo . || echo "$base")
meson setup "$W/b-$v" "$d" --buildtype=release -Dtests=false >/dev/null 2>&1 && ninja -C "$W/b-$v" >/dev/null 2>&1 || { echo build failed $v; exit 1; }
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$W/machine.txt"
t0=$(date +%s)
for round in 1 2 3 4; do if [ $((round % 2)) = 1 ]; then order="base new"; else order="new base"; fi
for v in $order; do
timeout 150 "$W/b-$v/bench/sop-bench" --workload threads --threads 1,4,16 --reps 5 --out "$W/threads-$v$round" >/dev/null 2>&1
grep -E "^\| " "$W/threads-$v$round/results.md" | grep -E "aggregate|reserved-high / live peak \(x" | awk -F'|' -v v=$v$round '{printf "%-6s %-34s %-14s %s | %s\n", v, $2, substr($3,1,14), $4, $5}' >> "$W/threads.txt"
done; echo "round $round at $(( $(date +%s) - t0 )) s" >> "$W/threads.txt"
done
