#!/bin/sh
# Builds programs of other projects against an installed cusafe and runs
# them: examples/c with its plain Makefile through `pkg-config --cflags
# --libs cusafe`, and tests/consumer through the CMake package
# (find_package(cusafe 0.1), the target cusafe::cusafe).  With a GPU each
# must verify its result; without a CUDA driver or device it must say so in
# one line and exit 1.  Both pass.  The CMake part is skipped, with a line
# that says so, where cmake is missing.
#
# make check installs cusafe into a temporary DESTDIR first, which also
# proves that the install relocates; make installcheck sets
# cusafe_installed=yes and uses the installed copy ($DESTDIR$prefix).
set -eu

top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
MAKE=${MAKE:-make}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
CMAKE=${CMAKE:-cmake}
: "${libdir:?libdir must be set (run through make check)}"
: "${pkgconfigdir:?pkgconfigdir must be set (run through make check)}"
: "${prefix:?prefix must be set (run through make check)}"

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

if test "${cusafe_installed:-no}" = yes; then
	dest=${DESTDIR:-}
	echo "install-example: using the installed cusafe under $dest$prefix"
else
	dest=$tmp/dest
	echo "install-example: installing into $dest"
	if ! $MAKE -C "$top_builddir" install DESTDIR="$dest" >"$tmp/install.log" 2>&1; then
		cat "$tmp/install.log"
		fail "make install DESTDIR=$dest failed"
	fi
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

# Runs program $1 (named $2) and judges it: with a GPU it must succeed,
# print a line matching $3 and nothing on stderr; without CUDA it must
# exit 1 with the one line "cusafe: no CUDA ...".  Sets verdict.
run_program() {
	rc=0
	"$1" >"$tmp/out" 2>"$tmp/err" || rc=$?
	echo "install-example: $2 exited with $rc"
	echo "--- stdout"; cat "$tmp/out"
	echo "--- stderr"; cat "$tmp/err"
	case $rc in
	0)
		test ! -s "$tmp/err" || fail "$2 succeeded but wrote to stderr"
		grep -q "$3" "$tmp/out" ||
			fail "$2 succeeded without its success line"
		verdict="verified on a GPU"
		;;
	1)
		test "$(wc -l <"$tmp/err")" -eq 1 ||
			fail "$2 without CUDA must write exactly one line to stderr"
		grep -q '^cusafe: no CUDA' "$tmp/err" ||
			fail "$2 exited 1 without the 'cusafe: no CUDA' line"
		test ! -s "$tmp/out" || fail "$2 without CUDA wrote to stdout"
		verdict="no CUDA device or driver on this machine"
		;;
	*)
		fail "$2 exited with $rc"
		;;
	esac
}

run_program "$tmp/example/roundtrip" roundtrip \
	'^roundtrip: 1048576 bytes verified on '
echo "install-example: PASS: pkg-config consumer (examples/c roundtrip: $verdict)"

# ---------------------------------------------------------------------------
# The CMake package
# ---------------------------------------------------------------------------
if ! command -v "$CMAKE" >/dev/null 2>&1; then
	echo "install-example: SKIP: cmake consumer -- no cmake ($CMAKE) found"
	exit 0
fi
cmake_dir=$dest$libdir/cmake/cusafe
for f in cusafeConfig.cmake cusafeConfigVersion.cmake; do
	test -f "$cmake_dir/$f" || fail "$cmake_dir/$f is not installed"
done

# Only the install under test may be found.
cmake_isolate="-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF"

# find_package with VERSION in a project of no language (quick): exit
# status of the configuration; its output in $tmp/probe.log.
probe() {
	mkdir -p "$tmp/probe"
	rm -rf "$tmp/probe/build"
	printf '%s\n' 'cmake_minimum_required(VERSION 3.11)' \
		'project(probe NONE)' "$1" >"$tmp/probe/CMakeLists.txt"
	shift
	# shellcheck disable=SC2086
	"$CMAKE" -S "$tmp/probe" -B "$tmp/probe/build" $cmake_isolate "$@" \
		>"$tmp/probe.log" 2>&1
}
version=$(sed -n 's/^set(PACKAGE_VERSION "\([^"]*\)")$/\1/p' \
	"$cmake_dir/cusafeConfigVersion.cmake")
case $version in
0.*.*) ;;
*) fail "cusafeConfigVersion.cmake gives no 0.x.y version ($version)" ;;
esac
major=${version%%.*}
minor=${version#*.}
minor=${minor%%.*}
for want in "$major.$minor" "$version" "$major.$minor...<$major.$((minor + 1))"; do
	probe "find_package(cusafe $want REQUIRED)
if(NOT cusafe_VERSION STREQUAL \"$version\" OR NOT TARGET cusafe::cusafe)
  message(FATAL_ERROR \"cusafe_VERSION \${cusafe_VERSION}\")
endif()" "-DCMAKE_PREFIX_PATH=$dest$prefix" || {
		cat "$tmp/probe.log"
		fail "find_package(cusafe $want) does not accept cusafe $version"
	}
done
for want in "$major.$((minor + 1))" "$((major + 1)).0" "$major.$minor.$((${version##*.} + 1))"; do
	if probe "find_package(cusafe $want REQUIRED)" \
		"-DCMAKE_PREFIX_PATH=$dest$prefix"; then
		cat "$tmp/probe.log"
		fail "find_package(cusafe $want) accepts cusafe $version"
	fi
	grep -q "considered but not accepted" "$tmp/probe.log" ||
		{ cat "$tmp/probe.log"; fail "find_package(cusafe $want) failed without saying why"; }
done
if test "$minor" -gt 0; then
	if probe "find_package(cusafe $major.$((minor - 1)) REQUIRED)" \
		"-DCMAKE_PREFIX_PATH=$dest$prefix"; then
		cat "$tmp/probe.log"
		fail "find_package(cusafe $major.$((minor - 1))) accepts cusafe $version"
	fi
fi
echo "install-example: PASS: cmake version rule (cusafe $version suits $major.$minor, not $major.$((minor + 1)) or $((major + 1)).0)"

# A package whose library is gone says so.
mkdir -p "$tmp/broken/lib/cmake"
cp -R "$cmake_dir" "$tmp/broken/lib/cmake/"
chmod -R u+w "$tmp/broken"
if probe "find_package(cusafe $major.$minor REQUIRED)" \
	"-Dcusafe_DIR=$tmp/broken/lib/cmake/cusafe"; then
	cat "$tmp/probe.log"
	fail "find_package(cusafe) accepts a package without its library"
fi
# (CMake wraps the message: join its lines)
missing="the library $tmp/broken/lib/$(cd "$dest$libdir" && ls libcusafe.so.*.*.*) is missing"
tr '\n' ' ' <"$tmp/probe.log" | tr -s ' ' | grep -qF "$missing" || {
	cat "$tmp/probe.log"
	fail "find_package(cusafe) without the library does not say '$missing'"
}
echo "install-example: PASS: cmake package without its library says so"

# The consumer project, built with the package found through
# CMAKE_PREFIX_PATH at the (staged) prefix.
cp -R "$top_srcdir/tests/consumer" "$tmp/consumer"
chmod -R u+w "$tmp/consumer"
# shellcheck disable=SC2086
if ! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
	"$CMAKE" -S "$tmp/consumer" -B "$tmp/consumer/build" $cmake_isolate \
	"-DCMAKE_PREFIX_PATH=$dest$prefix" >"$tmp/cmake.log" 2>&1 ||
	! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
		"$CMAKE" --build "$tmp/consumer/build" -- VERBOSE=1 \
		>>"$tmp/cmake.log" 2>&1; then
	cat "$tmp/cmake.log"
	fail "building tests/consumer with CMake failed"
fi
cat "$tmp/cmake.log"
found=$(sed -n 's/^cusafe_DIR:PATH=//p' "$tmp/consumer/build/CMakeCache.txt")
test "$found" = "$cmake_dir" ||
	fail "CMake found cusafe in '$found', not in $cmake_dir"
# The target's link line carries the CUDA runtime.
grep -q 'libcudart\.so' "$tmp/consumer/build/CMakeFiles/consumer.dir/link.txt" || {
	cat "$tmp/consumer/build/CMakeFiles/consumer.dir/link.txt"
	fail "the link line of cusafe::cusafe has no CUDA runtime"
}
ldd "$tmp/consumer/build/consumer" >"$tmp/ldd.log" 2>&1 || :
grep -q "libcusafe\.so.* => $dest$libdir/" "$tmp/ldd.log" || {
	cat "$tmp/ldd.log"
	fail "the cmake consumer does not load the installed libcusafe"
}
run_program "$tmp/consumer/build/consumer" "cmake consumer" \
	'^consumer: cusafe [0-9.]*, 1048576 floats scaled on '
echo "install-example: PASS: cmake consumer (find_package(cusafe $major.$minor), $verdict)"
exit 0
