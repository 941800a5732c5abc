#!/bin/sh
# Installs cusafe into a temporary DESTDIR, builds examples/c with its plain
# Makefile through `pkg-config --cflags --libs cusafe` against that install,
# and runs it.  With a GPU the example must verify its copy; without a CUDA
# driver or device it must say so in one line and exit 1.  Both pass.
set -eu

top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
MAKE=${MAKE:-make}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
: "${libdir:?libdir must be set (run through make check)}"
: "${pkgconfigdir:?pkgconfigdir must be set (run through make check)}"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cusafe-install.XXXXXX")
cleanup() {
	chmod -R u+w "$tmp" 2>/dev/null || :
	rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
	echo "install-example: FAIL: $*"
	exit 1
}

dest=$tmp/dest
echo "install-example: installing into $dest"
if ! $MAKE -C "$top_builddir" install DESTDIR="$dest" >"$tmp/install.log" 2>&1; then
	cat "$tmp/install.log"
	fail "make install DESTDIR=$dest failed"
fi

# Only the staged install is visible to pkg-config, and its paths are
# rewritten into the staging directory.
PKG_CONFIG_LIBDIR=$dest$pkgconfigdir
PKG_CONFIG_SYSROOT_DIR=$dest
export PKG_CONFIG PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR
unset PKG_CONFIG_PATH

cflags=$($PKG_CONFIG --cflags cusafe) || fail "pkg-config does not find the installed cusafe.pc"
libs=$($PKG_CONFIG --libs cusafe) || fail "pkg-config --libs cusafe failed"
echo "install-example: pkg-config --cflags: $cflags"
echo "install-example: pkg-config --libs:   $libs"
case " $libs " in
*" -L$dest/"*) ;;
*) fail "pkg-config --libs does not point into $dest" ;;
esac
if test -n "$cflags"; then
	case " $cflags " in
	*" -I$dest/"*) ;;
	*) fail "pkg-config --cflags does not point into $dest" ;;
	esac
fi

# Build a copy: the source tree may be read-only (make distcheck).
cp -R "$top_srcdir/examples/c" "$tmp/example"
chmod -R u+w "$tmp/example"
rm -f "$tmp/example/roundtrip"
# The example's Makefile must work on its own, without variables that the
# make running this test passes down.
if ! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
	$MAKE -C "$tmp/example" >"$tmp/build.log" 2>&1; then
	cat "$tmp/build.log"
	fail "building examples/c failed"
fi
cat "$tmp/build.log"
grep -q -e "-I$dest/" "$tmp/build.log" || test -z "$cflags" ||
	fail "the compile line does not use the staged headers"
grep -q -e "-L$dest/" "$tmp/build.log" ||
	fail "the link line does not use the staged library"

LD_LIBRARY_PATH=$dest$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH

# The program must load the staged libcusafe, and libcusafe must find
# libcudart through its own run path.
ldd "$tmp/example/roundtrip" >"$tmp/ldd.log" 2>&1 || :
grep -q "libcusafe\.so.* => $dest$libdir/" "$tmp/ldd.log" || {
	cat "$tmp/ldd.log"
	fail "roundtrip does not load the staged libcusafe"
}
if grep -q "not found" "$tmp/ldd.log"; then
	cat "$tmp/ldd.log"
	fail "a library of roundtrip is not found"
fi

rc=0
"$tmp/example/roundtrip" >"$tmp/out" 2>"$tmp/err" || rc=$?
echo "install-example: roundtrip exited with $rc"
echo "--- stdout"; cat "$tmp/out"
echo "--- stderr"; cat "$tmp/err"

case $rc in
0)
	test ! -s "$tmp/err" || fail "roundtrip succeeded but wrote to stderr"
	grep -q '^roundtrip: 1048576 bytes verified on ' "$tmp/out" ||
		fail "roundtrip succeeded without its success line"
	echo "install-example: PASS (roundtrip verified on a GPU)"
	;;
1)
	test "$(wc -l <"$tmp/err")" -eq 1 ||
		fail "roundtrip without CUDA must write exactly one line to stderr"
	grep -q '^cusafe: no CUDA' "$tmp/err" ||
		fail "roundtrip exited 1 without the 'cusafe: no CUDA' line"
	test ! -s "$tmp/out" || fail "roundtrip without CUDA wrote to stdout"
	echo "install-example: PASS (no CUDA device or driver on this machine)"
	;;
*)
	fail "roundtrip exited with $rc"
	;;
esac
exit 0
