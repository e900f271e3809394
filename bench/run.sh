#!/usr/bin/env bash
# One command for a full benchmark run: build sop-bench with Meson (release build, in
# build-bench/), run every workload into an output folder, and draw the plots.
#
#   bash bench/run.sh [OUTDIR] [sop-bench options...]
#
# OUTDIR defaults to bench/results/<date>-<gpu>; the options go to sop-bench (for instance
# --quick, or --workload pair,threads --reps 9). The folder gets results.md, results.csv,
# replay-*.csv, log.txt (progress), machine.txt and the PNG plots. A full run takes about two
# minutes on an H100. Without a GPU, sop-bench has nothing to measure and this exits 77.
set -eu
cd "$(dirname "$0")/.."

gpu=$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true) | head -n 1 |
	tr '[:upper:]' '[:lower:]' | sed -e 's/nvidia //' -e 's/[^a-z0-9]\{1,\}/-/g' -e 's/-$//')
out=bench/results/$(date -u +%Y-%m-%d)-${gpu:-gpu}
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
	out=$1
	shift
fi
build=${SOP_BENCH_BUILD:-build-bench}

if ! command -v meson >/dev/null || ! command -v ninja >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		apt-get update -qq >/dev/null 2>&1 || true
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq meson ninja-build >/dev/null 2>&1 || true
	fi
	command -v meson >/dev/null || { python3 -m pip install --user -q meson ninja; export PATH="$HOME/.local/bin:$PATH"; }
fi
# Meson may be only a Python module (pip's wheel without its script on PATH).
if ! command -v meson >/dev/null && python3 -c 'import mesonbuild' 2>/dev/null; then
	meson() { python3 -m mesonbuild.mesonmain "$@"; }
fi
if [ ! -f "$build/build.ninja" ]; then
	. bench/lto-cc.sh
	meson setup "$build" --buildtype=release -Dtests=false >/dev/null
fi
ninja -C "$build" >/dev/null

mkdir -p "$out"
{
	echo "commit: $(git describe --always --dirty 2>/dev/null || echo unknown)"
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
	echo "cpus: $(nproc)"
	uname -srm
	# How the library was built: the compiler, and whether it took link-time optimization
	# (meson.build leaves it out where the compiler cannot link with it).
	sed -n 's/^C compiler for the host machine: //p' "$build/meson-logs/meson-log.txt" 2>/dev/null | head -n 1
	if grep -q -e '-flto' "$build/build.ninja" 2>/dev/null; then
		echo "link-time optimization: on"
	else
		echo "link-time optimization: off"
	fi
} >"$out/machine.txt"

status=0
"$build/bench/sop-bench" --out "$out" "$@" 2> >(tee "$out/log.txt" >&2) || status=$?
if [ "$status" = 77 ]; then
	echo "no GPU here: nothing measured"
	exit 77
fi
[ "$status" = 0 ] || echo "sop-bench failed (exit $status): what it measured is in $out"
python3 bench/plot.py "$out" || echo "no plots (is matplotlib installed?); the numbers are in $out/results.md"
echo "results: $out/results.md"
exit "$status"
