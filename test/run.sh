#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs Meson and Ninja if they are missing, then
# builds and runs
#   build/        warnings as errors, lock order checked (-Dchecks=true); every test (the gpu
#                 suite runs on a GPU, skips without)
#   build-asan/   AddressSanitizer + UndefinedBehaviorSanitizer, the unit suite
#   build-tsan/   ThreadSanitizer, the unit suite
#   an install into a staging folder, an example compiled against the installed sop.pc, and the
#   installed sop-run running a program with the installed interposer
# and ends with one line: N passed, N failed, N skipped.
# Set SOP_TEST_QUICK=1 to skip the sanitizer builds.
set -u
cd "$(dirname "$0")/.."
top=$PWD

need_tools() {
	command -v meson >/dev/null && command -v ninja >/dev/null && command -v pkg-config >/dev/null
}
if ! need_tools; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		apt-get update -qq >/dev/null 2>&1
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq meson ninja-build pkg-config \
			>/dev/null 2>&1
	fi
fi
if ! command -v meson >/dev/null || ! command -v ninja >/dev/null; then
	python3 -m pip install --user -q meson ninja && export PATH="$HOME/.local/bin:$PATH"
fi
need_tools || { echo "cannot install meson, ninja and pkg-config"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }

passed=0 failed=0 skipped=0
status=0

# Add one build's results to the totals, from Meson's JSON test log.
count() {
	local log=$1/meson-logs/testlog.json
	[ -f "$log" ] || return
	read -r p f s < <(python3 - "$log" <<'PY'
import json, sys
p = f = s = 0
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    if r in ("OK", "EXPECTEDFAIL"): p += 1
    elif r == "SKIP": s += 1
    else: f += 1
print(p, f, s)
PY
)
	passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
}

# setup DIR [meson options...]; then run the given meson test arguments.
run_build() {
	local dir=$1; shift
	local test_args=$1; shift
	echo "== $dir: meson setup $*"
	if ! meson setup --wipe "$dir" "$@" >"$dir.setup.log" 2>&1 &&
	   ! meson setup "$dir" "$@" >"$dir.setup.log" 2>&1; then
		cat "$dir.setup.log"; failed=$((failed + 1)); status=1; return
	fi
	if ! ninja -C "$dir" >"$dir.build.log" 2>&1; then
		tail -50 "$dir.build.log"; failed=$((failed + 1)); status=1; return
	fi
	# shellcheck disable=SC2086
	meson test -C "$dir" --print-errorlogs $test_args || status=1
	count "$dir"
}

# Every build checks the order locks are taken in (-Dchecks=true, lib/locks.c).
run_build build "" -Dwerror=true -Dchecks=true
if [ "${SOP_TEST_QUICK:-0}" != 1 ]; then
	run_build build-asan "--suite unit" -Dwerror=true -Dchecks=true \
		-Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug
	run_build build-tsan "--suite unit" -Dwerror=true -Dchecks=true -Db_sanitize=thread \
		-Db_lundef=false -Dbuildtype=debug
fi

# Installable: install into a staging folder, build the tour against the installed sop.pc.
stage=$top/build/stage
rm -rf "$stage"
if DESTDIR="$stage" meson install -C build --quiet >build/install.log 2>&1; then
	pc=$(dirname "$(find "$stage" -name sop.pc | head -1)")
	prefix=$(sed -n 's/^prefix=//p' "$pc/sop.pc")
	cflags=$(PKG_CONFIG_PATH=$pc PKG_CONFIG_SYSROOT_DIR=$stage pkg-config --cflags sop)
	libs=$(PKG_CONFIG_PATH=$pc PKG_CONFIG_SYSROOT_DIR=$stage pkg-config --libs sop)
	if cc -std=c11 -Wall -Werror $cflags -o build/tour-installed examples/tour.c $libs -ldl &&
	   LD_LIBRARY_PATH=$(dirname "$(find "$stage" -name 'libsop.so' | head -1)") \
		SOP_DRIVER_LIBRARY=$top/build/test/sim/libsopsim.so ./build/tour-installed \
		>build/tour-installed.log 2>&1; then
		echo "installed-consumer: OK (prefix $prefix)"
		passed=$((passed + 1))
	else
		echo "installed-consumer: FAIL"; cat build/tour-installed.log 2>/dev/null
		failed=$((failed + 1)); status=1
	fi
	# The installed sop-run finds the installed interposer (relative to itself, as the staging
	# folder moved both), and a program under it allocates from sop.
	run=$(find "$stage" -name sop-run -type f | head -1)
	pre=$(find "$stage" -name libsop-preload.so -type f | head -1)
	got=
	[ -x "$run" ] && [ -f "$pre" ] && got=$("$run" sh -c 'printf %s "$LD_PRELOAD"')
	if [ -n "$got" ] && [ "$(realpath "$got")" = "$(realpath "$pre")" ] &&
	   LD_LIBRARY_PATH=$top/build/test/sim SOP_DRIVER_LIBRARY=$top/build/test/sim/libcuda.so.1 \
		"$run" ./build/test/test-preload --quick >build/sop-run-installed.log 2>&1; then
		echo "installed-sop-run: OK (${run#"$stage"}, ${pre#"$stage"})"
		passed=$((passed + 1))
	else
		echo "installed-sop-run: FAIL (sop-run '$run', preload '$pre', LD_PRELOAD '$got')"
		cat build/sop-run-installed.log 2>/dev/null
		failed=$((failed + 1)); status=1
	fi
else
	cat build/install.log; echo "install: FAIL"; failed=$((failed + 1)); status=1
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ] || status=1
exit $status
