#!/bin/bash
# Two knobs of the library measured against it on one lease, each variant made by editing
# lib/reuse.c of a copy of this tree and built with link-time optimization:
#   base   the tree as it is;
#   r2     SOP_REFILL 2 MiB instead of 8: what a small request served from the heap takes for
#          its stream's cache;
#   a15    affinity_affordable with 1.5 times the pool's live memory instead of 2: how far a
#          stream grows a segment of its own rather than share free memory in another's;
#   r2a15  both.
# Rounds of the threads workload at two, four, eight and sixteen threads, the variants one after
# the other in each round, in the order VARIANTS gives (odd rounds) and reversed (even rounds).
# Then the same-stream pair of the tree at 4 KiB and 256 B, twice each, and 64 MiB.
# Run from the repository's root:
#   run.sh OUT FIRST_ROUND LAST_ROUND [VARIANTS]
set -u
out=${1:?output folder}
first=${2:-1}
last=${3:-2}
variants=${4:-base r2 a15 r2a15}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. bench/lto-cc.sh
refill2='s/#define SOP_REFILL ((size_t)8 << 20)/#define SOP_REFILL ((size_t)2 << 20)/'
afford15='s/\t       2 \* sop__pool_used(pool, SOP_FOLD_NONE);/\t       3 * sop__pool_used(pool, SOP_FOLD_NONE) \/ 2;/'
build() { # variant, sed script
	rm -rf "/tmp/ks-$1" && mkdir -p "/tmp/ks-$1" &&
		cp -r lib include meson.build meson_options.txt test bench tools examples "/tmp/ks-$1/" &&
		{ [ -z "$2" ] || sed -i "$2" "/tmp/ks-$1/lib/reuse.c"; } &&
		meson setup --buildtype=release -Dtests=false "/tmp/kb-$1" "/tmp/ks-$1" >/dev/null 2>&1 &&
		ninja -C "/tmp/kb-$1" >/dev/null 2>&1 || echo "$1 build failed"
}
for v in $variants; do
	case $v in
	base) build base "" & ;;
	r2) build r2 "$refill2" & ;;
	a15) build a15 "$afford15" & ;;
	r2a15) build r2a15 "$refill2; $afford15" & ;;
	esac
done
wait
row() { # results.md, variant row pattern, metric pattern: sop/driver medians
	grep -E "^\| $2 \| $3" "$1" | awk -F'|' '{printf "%s/%s ", substr($4,2,5), substr($5,2,5)}'
}
for r in $(seq "$first" "$last"); do
	vs=$variants
	[ $((r % 2)) = 0 ] && vs=$(echo "$variants" | tr ' ' '\n' | tac | tr '\n' ' ')
	for v in $vs; do
		/tmp/kb-$v/bench/sop-bench --workload threads --threads 2,4,8,16 --reps 5 \
			--out "$out/$v-$r" >"$out/$v-$r.log" 2>&1
		f=$out/$v-$r/results.md
		echo "$v-$r tasks mem: $(row "$f" "a stream per task, [0-9]+ threads?" "reserved-high / live peak, the driver's")" \
			"rate: $(row "$f" "a stream per task, [0-9]+ threads?" "aggregate \(")" \
			"| cold 16: $(row "$f" "cold start, 16 threads" "(aggregate, all|reserved-high / live peak, the driver's)")" \
			"| arriving 16: $(row "$f" "arriving one by one, 16 threads" "(aggregate, all|reserved-high / live peak, the driver's)")"
	done
done
/tmp/kb-base/bench/sop-bench --workload pair --sizes 4K,256,4K,256,64M --reps 7 --sides sop,driver \
	--out "$out/pair" >"$out/pair.log" 2>&1
grep latency "$out/pair.log"
