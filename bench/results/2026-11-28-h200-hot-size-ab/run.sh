#!/bin/bash
# A/B on one lease: the library of this tree ("new") against the same with base.patch applied
# ("base": lib/ as it was before the change), each built with link-time optimization; the
# harness's single-stream workloads and the threads workload at sixteen, twice each, sides
# interleaved inside each run; then ../2026-11-28-h200-random-variants/mix.c (a pool that served
# random sizes, then pairs; it ran from an identical copy in this folder).
# Run from the repository's root with the output folder as the argument.
set -u
out=${1:?output folder}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. bench/lto-cc.sh
d=bench/results/2026-11-28-h200-hot-size-ab
rm -rf /tmp/base && mkdir -p /tmp/base && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/base/ &&
	(cd /tmp/base && patch -p1 -s <"$OLDPWD/$d/base.patch") || exit 1
(meson setup --buildtype=release -Dtests=false /tmp/bb /tmp/base >/dev/null 2>&1 && ninja -C /tmp/bb >/dev/null 2>&1 || echo "base build failed") &
(meson setup /tmp/bn --buildtype=release -Dtests=false >/dev/null 2>&1 && ninja -C /tmp/bn >/dev/null 2>&1 || echo "new build failed") &
wait
for v in base new; do
	$CC -O2 -I include -I /usr/local/cuda/include bench/results/2026-11-28-h200-random-variants/mix.c -o /tmp/mix-$v -L /tmp/b${v:0:1} -lsop -ldl -Wl,-rpath,/tmp/b${v:0:1} || exit 1
done
for r in 1 2; do
	for v in base new; do
		echo "== round $r, $v: single-stream workloads"
		/tmp/b${v:0:1}/bench/sop-bench --workload pair,batch,random,fragmentation,replay --reps 5 \
			--out "$out/$v-$r" >"$out/$v-$r.log" 2>&1
		grep -E "^\| (256|4 KiB|64 KiB|1 MiB|64 MiB|sizes|<=|torch|synthetic)" "$out/$v-$r/results.md" | cut -c1-160
	done
done
for v in base new; do
	echo "== $v: threads at sixteen"
	/tmp/b${v:0:1}/bench/sop-bench --workload threads --threads 16 --reps 5 --out "$out/$v-threads" >"$out/$v-threads.log" 2>&1
	grep -E "^\| " "$out/$v-threads/results.md" | grep -E "aggregate|reserved" | cut -c1-160
done
for v in base new; do
	for p in 1 2 3; do echo "== mix, $v, process $p"; /tmp/mix-$v 15; done
done >"$out/mix.txt" 2>&1
awk '/==/{h=$0} /^ +[0-9]+ /{print h": "$0}' "$out/mix.txt" | awk 'NR%3==0'
