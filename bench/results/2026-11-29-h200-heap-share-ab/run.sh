#!/usr/bin/env bash
# The library against itself with heap-share.patch (growth for segment affinity not affordable
# while the heap holds an eighth of the pool), threads workload, two alternating rounds.
# Usage (from the tree's root): bash bench/results/2026-11-29-h200-heap-share-ab/run.sh OUT
set -u
AB_ROWS='(cold start|arriving|stream per task|random sizes), (4|8|16) thread.*(aggregate \(|reserved-high)' \
	bash bench/ab.sh "$1" 2 base share:+bench/results/2026-11-29-h200-heap-share-ab/heap-share.patch \
	-- --workload threads --threads 4,8,16 --reps 5
