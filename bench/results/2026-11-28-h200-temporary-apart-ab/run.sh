#!/bin/bash
# A/B on one lease: the library of this tree ("new") against the same with base.patch applied
# ("base": lib/ before a block freed right after it was handed out stayed apart), both built
# with link-time optimization. Rounds of the harness's single-stream workloads, sides
# interleaved inside each run and the two sides one after the other; the threads workload at
# sixteen; then ../2026-11-28-h200-random-variants/mix.c, three processes a side (a pool that
# served random sizes, then pairs). Run from the repository's root:
#   run.sh OUT ROUNDS [threads] [mix]
set -u
out=${1:?output folder}
rounds=${2:-2}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. bench/lto-cc.sh
d=bench/results/2026-11-28-h200-temporary-apart-ab
if [ ! -x /tmp/bb/bench/sop-bench ] || [ ! -x /tmp/bn/bench/sop-bench ]; then
	rm -rf /tmp/base && mkdir -p /tmp/base && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/base/ &&
		(cd /tmp/base && patch -p1 -s <"$OLDPWD/$d/base.patch") || exit 1
	(meson setup --buildtype=release -Dtests=false /tmp/bb /tmp/base >/dev/null 2>&1 && ninja -C /tmp/bb >/dev/null 2>&1 || echo "base build failed") &
	(meson setup /tmp/bn --buildtype=release -Dtests=false >/dev/null 2>&1 && ninja -C /tmp/bn >/dev/null 2>&1 || echo "new build failed") &
	wait
	for v in base new; do
		$CC -O2 -I include -I /usr/local/cuda/include bench/results/2026-11-28-h200-random-variants/mix.c -o /tmp/mix-$v -L /tmp/b${v:0:1} -lsop -ldl -Wl,-rpath,/tmp/b${v:0:1} || exit 1
	done
fi
for r in $(seq 1 "$rounds"); do
	for v in base new; do
		[ -e "$out/$v-$r/results.md" ] && continue
		echo "== round $r, $v: single-stream workloads ($(date +%T))"
		/tmp/b${v:0:1}/bench/sop-bench --workload pair,batch,random,fragmentation,replay --reps 5 \
			--out "$out/$v-$r" >"$out/$v-$r.log" 2>&1
		grep -E "^\| (256|4 KiB|64 KiB|1 MiB|64 MiB|sizes|<=|torch|synthetic)" "$out/$v-$r/results.md" | cut -c1-160
	done
done
shift 2
for what in "$@"; do
	case $what in
	threads)
		for v in base new; do
			echo "== $v: threads at sixteen ($(date +%T))"
			/tmp/b${v:0:1}/bench/sop-bench --workload threads --threads 16 --reps 5 --out "$out/$v-threads" >"$out/$v-threads.log" 2>&1
			grep -E "^\| " "$out/$v-threads/results.md" | grep -E "aggregate|reserved" | cut -c1-160
		done ;;
	mix)
		for p in 1 2 3; do
			for v in base new; do echo "== mix, $v, process $p"; /tmp/mix-$v 15; done
		done >"$out/mix.txt" 2>&1
		awk '/==/{h=$0} /^ +[0-9]+ /{print h": "$0}' "$out/mix.txt" | awk 'NR%3==0' ;;
	esac
done
