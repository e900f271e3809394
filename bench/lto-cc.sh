# Sourced by the scripts that build the library to measure it (record.sh, run.sh,
# clients/run.sh): CC becomes the first of the compiler CC names, the system's gcc and cc that
# links a program with link-time optimization, which the hot paths need (5-20% on the H100:
# results/2026-11-25-h100-80gb-hbm3-lto-ab/). An image may set CC to a compiler that cannot run
# its lto-wrapper while its system gcc can (the H200's: results/2026-11-28-h200-fce9098/). With
# none, CC stays as it was, and meson.build builds without it.
sop_lto_links() {
	local t
	t=$(mktemp -d) || return 1
	printf 'int main(void) { return 0; }\n' >"$t/t.c"
	"$1" -flto=auto -o "$t/t" "$t/t.c" >/dev/null 2>&1
	local rc=$?
	rm -rf "$t"
	return $rc
}
for sop_cc in "${CC:-}" /usr/bin/gcc cc; do
	if [ -n "$sop_cc" ] && command -v "$sop_cc" >/dev/null 2>&1 && sop_lto_links "$sop_cc"; then
		export CC=$sop_cc
		break
	fi
done
unset sop_cc
