#!/bin/bash
# A/B on one lease: the library of this tree ("base": a stream whose fit lay only in other
# streams' segments grew) against the same with change.patch applied ("new": it cuts the free
# tail of such a segment off as its own instead), both built with link-time optimization. The
# change only acts once threads have met in a pool, so only the threads workload runs: rounds of
# it at two, four, eight and sixteen threads, the two sides one after the other in each round.
# The change was not kept: as it ran, the tree had it and base was built with it taken out.
# Run from the repository's root:
#   run.sh OUT ROUNDS
set -u
out=${1:?output folder}
rounds=${2:-3}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. bench/lto-cc.sh
d=bench/results/2026-11-28-h200-take-tail-ab
if [ ! -x /tmp/tb/bench/sop-bench ] || [ ! -x /tmp/tn/bench/sop-bench ]; then
	rm -rf /tmp/new && mkdir -p /tmp/new && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/new/ &&
		(cd /tmp/new && patch -p1 -s <"$OLDPWD/$d/change.patch") || exit 1
	(meson setup --buildtype=release -Dtests=false /tmp/tn /tmp/new >/dev/null 2>&1 && ninja -C /tmp/tn >/dev/null 2>&1 || echo "new build failed") &
	(meson setup /tmp/tb --buildtype=release -Dtests=false >/dev/null 2>&1 && ninja -C /tmp/tb >/dev/null 2>&1 || echo "base build failed") &
	wait
fi
for r in $(seq 1 "$rounds"); do
	for v in base new; do
		[ -e "$out/$v-$r/results.md" ] && continue
		echo "== round $r, $v: threads ($(date +%T))"
		/tmp/t${v:0:1}/bench/sop-bench --workload threads --threads 2,4,8,16 --reps 5 \
			--out "$out/$v-$r" >"$out/$v-$r.log" 2>&1
		grep -E "^\| (cold|arriving|a stream)" "$out/$v-$r/results.md" | grep -E "aggregate|the driver's" | cut -c1-150
	done
done
