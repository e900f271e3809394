#!/bin/bash
# A/B on one lease: the library of this tree ("new") against the same with change.patch taken
# out ("base": a stream adopted a segment of nobody's whole), both built with link-time
# optimization. The change only acts once threads have met in a pool, so only the threads
# workload runs: rounds of it at four, eight and sixteen threads, the two sides one after the
# other in each round. Run from the repository's root:
#   run.sh OUT ROUNDS
set -u
out=${1:?output folder}
rounds=${2:-3}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. bench/lto-cc.sh
d=bench/results/2026-11-28-h200-adopt-part-ab
if [ ! -x /tmp/bb/bench/sop-bench ] || [ ! -x /tmp/bn/bench/sop-bench ]; then
	rm -rf /tmp/base && mkdir -p /tmp/base && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/base/ &&
		(cd /tmp/base && patch -R -p1 -s <"$OLDPWD/$d/change.patch") || exit 1
	(meson setup --buildtype=release -Dtests=false /tmp/bb /tmp/base >/dev/null 2>&1 && ninja -C /tmp/bb >/dev/null 2>&1 || echo "base build failed") &
	(meson setup /tmp/bn --buildtype=release -Dtests=false >/dev/null 2>&1 && ninja -C /tmp/bn >/dev/null 2>&1 || echo "new build failed") &
	wait
fi
for r in $(seq 1 "$rounds"); do
	for v in base new; do
		[ -e "$out/$v-$r/results.md" ] && continue
		echo "== round $r, $v: threads ($(date +%T))"
		/tmp/b${v:0:1}/bench/sop-bench --workload threads --threads 4,8,16 --reps 5 \
			--out "$out/$v-$r" >"$out/$v-$r.log" 2>&1
		grep -E "^\| (cold|arriving|a stream)" "$out/$v-$r/results.md" | grep -E "16 threads" | grep -E "aggregate|reserved" | cut -c1-150
	done
done
