#!/usr/bin/env bash
# Build and run the tour (examples/tour.c): on the GPU when there is a driver and a device,
# otherwise on the simulated driver. Installs Meson and Ninja if they are missing.
set -eu
cd "$(dirname "$0")/.."
if ! command -v meson >/dev/null || ! command -v ninja >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		apt-get update -qq >/dev/null 2>&1 || true
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq meson ninja-build >/dev/null 2>&1 || true
	fi
	command -v meson >/dev/null || { python3 -m pip install --user -q meson ninja; export PATH="$HOME/.local/bin:$PATH"; }
fi
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
out=$(./build/examples/sop-tour)
echo "$out"
case "$out" in
*"no CUDA driver"*)
	echo "running on the simulated driver instead:"
	SOP_DRIVER_LIBRARY=$PWD/build/test/sim/libsopsim.so ./build/examples/sop-tour
	;;
esac
