#!/usr/bin/env bash
# bash bench/record.sh OUTDIR [--integrity SEC] [--seed N]: a run of record in one command, as
# the docs' figures need one: on one machine and one tree, the GPU suite (gpu-suite.txt, its log
# gpu-testlog.txt), then the full harness (bench/run.sh: results.md and the rest), then the
# data-integrity stress with sixteen threads for SEC seconds (integrity.txt; default 300, 0 for
# none), all into OUTDIR.
# The library is built with link-time optimization, by the first compiler that can link with it
# (bench/lto-cc.sh: the one CC names, the system gcc, cc). Each step prints the seconds
# it ended at, so that a caller with a time limit can size --integrity: the suite takes about
# four minutes on an H100 and the harness three. Without a GPU this exits 77.
set -u
cd "$(dirname "$0")/.."

[ $# -gt 0 ] && [ "${1#-}" = "$1" ] || { echo "usage: bash bench/record.sh OUTDIR [--integrity SEC] [--seed N]" >&2; exit 2; }
out=$1
shift
integrity=300 seed=$(date +%s)
while [ $# -gt 0 ]; do
	case $1 in
	--integrity) integrity=$2; shift ;;
	--seed) seed=$2; shift ;;
	*) echo "unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
nvidia-smi >/dev/null 2>&1 || { echo "no GPU here: nothing measured"; exit 77; }
# NVLink multicast stays off for the frameworks the suite runs.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. bench/lto-cc.sh
t0=$(date +%s)
mark() { echo "record: $1 at $(($(date +%s) - t0)) s"; }
mkdir -p "$out"

tests=build-record
rm -rf "$tests" build-bench
(meson setup build-bench --buildtype=release -Dtests=false >/dev/null 2>&1 &&
	ninja -C build-bench >/dev/null 2>&1) &
bench_build=$!
if ! { meson setup "$tests" --buildtype=release && ninja -C "$tests"; } >"$out/build.log" 2>&1; then
	tail -40 "$out/build.log"
	exit 1
fi
wait $bench_build || { echo "the harness did not build"; exit 1; }
mark "built"

meson test -C "$tests" --suite gpu --print-errorlogs >"$out/gpu-suite.txt" 2>&1
suite=$?
# The tests' own output (the pressure model's misses, the integrity counts) is only in the log.
cp "$tests/meson-logs/testlog.txt" "$out/gpu-testlog.txt" 2>/dev/null
grep -E "^ *(Ok|Fail|Skipped|Timeout):" "$out/gpu-suite.txt"
grep -E "^ *[0-9]+/[0-9]+ " "$out/gpu-suite.txt" | grep -vE " (OK|SKIP) "
mark "GPU suite done (exit $suite)"

SOP_BENCH_BUILD=build-bench bash bench/run.sh "$out" >"$out/bench-out.txt" 2>&1
harness=$?
tail -n 2 "$out/bench-out.txt"
mark "harness done (exit $harness)"

status=0
if [ "$integrity" -gt 0 ]; then
	"$tests/test/test-integrity" --seconds "$integrity" --threads 16 --seed "$seed" \
		>"$out/integrity.txt" 2>&1 || status=$?
	tail -n 1 "$out/integrity.txt"
	mark "integrity stress done (exit $status)"
fi
[ "$suite" = 0 ] && [ "$harness" = 0 ] && [ "$status" = 0 ]
