#!/bin/bash
# The A/B of this folder: BASE (a checkout of bb00d37, the first argument) against the tree this
# runs in (80a7905), alternating which goes first, three rounds: the harness's threads workload
# at 1, 4 and 16 threads, sop and the driver's pool; then test-crowd's workers (1 B..1 MiB,
# 256 live each, one second) at 4 and 16 threads on each side, and on the driver's pool. Builds
# and outputs go under WORK.
#
#   bash run-ab.sh BASE_DIR [WORK]
set -u
base=$1; W=${2:-ab-work}; mkdir -p "$W"
for v in base new; do d=$([ $v = new ] && echo . || echo "$base")
meson setup "$W/b-$v" "$d" --buildtype=release >/dev/null 2>&1 &&
	ninja -C "$W/b-$v" bench/sop-bench test/test-crowd >/dev/null 2>&1 || { echo build failed $v; exit 1; }
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$W/machine.txt"
t0=$(date +%s)
for round in 1 2 3; do if [ $((round % 2)) = 1 ]; then order="base new"; else order="new base"; fi
for v in $order; do
timeout 150 "$W/b-$v/bench/sop-bench" --workload threads --threads 1,4,16 --reps 3 --out "$W/threads-$v$round" >/dev/null 2>&1
grep -E "^\| " "$W/threads-$v$round/results.md" | grep -E "aggregate|reserved-high / live peak" | awk -F'|' -v v=$v$round '{printf "%-6s %-34s %-14s %s | %s\n", v, $2, substr($3,1,24), $4, $5}' >> "$W/threads.txt"
for n in 4 16; do timeout 30 "$W/b-$v/test/test-crowd" --rounds $n --seconds 1 --seed $round 2>&1 | grep round | sed "s/^/$v$round /" >> "$W/crowd.txt"; done
done
for n in 4 16; do timeout 30 "$W/b-new/test/test-crowd" --rounds $n --seconds 1 --seed $round --driver 2>&1 | grep round | sed "s/^/driver$round /" >> "$W/crowd.txt"; done
echo "round $round at $(( $(date +%s) - t0 )) s" >> "$W/threads.txt"
done
