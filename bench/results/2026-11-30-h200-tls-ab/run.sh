#!/usr/bin/env bash
# bash run.sh OUT ROUNDS: the interposer's costs (bench/passthrough.c) with and without the
# change of tls.patch, and plainly on the driver, in alternating rounds on one machine.
set -u
cd "$(dirname "$0")/../../.."
out=$1 rounds=$2
d=bench/results/2026-11-30-h200-tls-ab
bash bench/ab.sh "$out/ab" 0 new base:-$d/tls.patch || exit 1
for r in $(seq 1 "$rounds"); do
	order="plain new base"
	[ $((r % 2)) = 0 ] && order="base new plain"
	for v in $order; do
		if [ $v = plain ]; then
			line=$(/tmp/ab-build-new/bench/sop-passthrough)
		else
			line=$(LD_PRELOAD=/tmp/ab-build-$v/libsop-preload.so /tmp/ab-build-new/bench/sop-passthrough)
		fi
		echo "{\"variant\": \"$v\", \"round\": $r, ${line#\{}"
	done
done | tee "$out/passthrough.jsonl"
