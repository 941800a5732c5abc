#!/bin/sh
# examples/extension, a user's CUDA library on cusafe, built against an
# installed cusafe with its plain Makefile (pkg-config) and with CMake
# (find_package(cusafe 0.1)), and run from Python (myext.py): against the
# fake CUDA, where the fake performs the example's kernel, myext.py must
# verify every element, get cusafe's error for each wrong handle, and exit
# 0 with nothing on stderr and its objects alive; against the installed
# library, the same on a GPU, or one "cusafe: no CUDA" line and status 1
# without one.  The CMake half is skipped, with a line that says so, where
# cmake is missing; all of it without nvcc or Python.
#
# make check installs cusafe into a temporary DESTDIR first; make
# installcheck sets cusafe_installed=yes and uses the installed copy
# ($DESTDIR$prefix, the Python package in $cusafe_package).
set -eu

test_name=extension
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
MAKE=${MAKE:-make}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
CMAKE=${CMAKE:-cmake}
PYTHON=${PYTHON:-python3}
NVCC=${NVCC:-nvcc}
CUDA_ARCHS=${CUDA_ARCHS:-90}
: "${libdir:?libdir must be set (run through make check)}"
: "${pkgconfigdir:?pkgconfigdir must be set (run through make check)}"
: "${prefix:?prefix must be set (run through make check)}"
fake_library=${cusafe_fake_library:-$top_builddir/.libs/libcusafe_fake.so}

fail() {
	echo "$test_name: FAIL: $*"
	exit 1
}
if test "$PYTHON" = : || ! command -v "$PYTHON" >/dev/null 2>&1; then
	echo "$test_name: SKIP: no Python interpreter ($PYTHON) found"
	exit 77
fi
if ! command -v "$NVCC" >/dev/null 2>&1; then
	echo "$test_name: SKIP: no nvcc ($NVCC) to compile the example's kernel"
	exit 77
fi
test -f "$fake_library" || fail "$fake_library not found (run through make check)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cusafe-extension.XXXXXX")
cleanup() {
	chmod -R u+w "$tmp" 2>/dev/null || :
	rm -rf "$tmp"
}
trap cleanup EXIT

if test "${cusafe_installed:-no}" = yes; then
	dest=${DESTDIR:-}
	package=${cusafe_package:?cusafe_package must be set for an installed cusafe}
	echo "$test_name: using the installed cusafe under $dest$prefix"
else
	dest=$tmp/dest
	package=$top_srcdir/python
	echo "$test_name: installing into $dest"
	if ! $MAKE -C "$top_builddir" install DESTDIR="$dest" >"$tmp/install.log" 2>&1; then
		cat "$tmp/install.log"
		fail "make install DESTDIR=$dest failed"
	fi
fi
real_library=$dest$libdir/libcusafe.so.0
test -f "$real_library" || fail "$real_library is not installed"

# libmyext depends on libcusafe.so.0, and must use the library that the
# cusafe package loaded.  The fake's file is given that name in a
# directory searched first, so that the dynamic linker takes the fake,
# already loaded, for it.
mkdir "$tmp/fake"
ln -s "$(cd "$(dirname "$fake_library")" && pwd)/$(basename "$fake_library")" \
	"$tmp/fake/libcusafe.so.0"

PYTHONPATH=$package${PYTHONPATH:+:$PYTHONPATH}
PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH PYTHONDONTWRITEBYTECODE
unset PYTHONWARNINGS MYEXT_LIBRARY

# Runs myext.py from directory $1 with libmyext.so there, against the
# fake (with $2 = fake) or the installed library (real); judges it.
# Against the fake, CuPy (real CUDA) cannot take part: a module of that
# name that refuses to import, first on the path, makes myext.py take its
# path without CuPy.
mkdir -p "$tmp/nocupy/cupy"
echo 'raise ImportError("no CuPy with the fake CUDA")' \
	>"$tmp/nocupy/cupy/__init__.py"
run_myext() {
	rc=0
	if test "$2" = fake; then
		CUSAFE_LIBRARY=$tmp/fake/libcusafe.so.0 \
			LD_LIBRARY_PATH=$tmp/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
			PYTHONPATH=$tmp/nocupy${PYTHONPATH:+:$PYTHONPATH} \
			"$PYTHON" "$tmp/src/myext.py" "$1/libmyext.so" \
			>"$tmp/out" 2>"$tmp/err" || rc=$?
	else
		CUSAFE_LIBRARY=$real_library \
			"$PYTHON" "$tmp/src/myext.py" "$1/libmyext.so" \
			>"$tmp/out" 2>"$tmp/err" || rc=$?
	fi
	echo "$test_name: myext.py ($2) exited with $rc"
	echo "--- stdout"; cat "$tmp/out"
	echo "--- stderr"; cat "$tmp/err"
	case $2,$rc in
	*,0)
		test ! -s "$tmp/err" || fail "myext.py ($2) wrote to stderr"
		grep -q '^myext: 1048576 elements of y = 2.5 \* x + y verified' "$tmp/out" ||
			fail "myext.py ($2) did not verify the result"
		refused=$(grep -c -e '-> INVALID_HANDLE: myext_saxpy: ' -e '-> OUT_OF_RANGE: myext_saxpy: ' -e '-> INVALID_VALUE: myext_saxpy: ' "$tmp/out" || :)
		test "$refused" = 6 || fail "myext.py ($2) showed $refused of 6 refusals"
		verdict="every element verified, 6 wrong calls refused, exit with objects alive"
		;;
	real,1)
		test "$(wc -l <"$tmp/err")" -eq 1 ||
			fail "myext.py without CUDA must write exactly one line to stderr"
		grep -q '^cusafe: no CUDA' "$tmp/err" ||
			fail "myext.py exited 1 without the 'cusafe: no CUDA' line"
		verdict="no CUDA device or driver on this machine"
		;;
	*)
		fail "myext.py ($2) exited with $rc"
		;;
	esac
}

# Build copies: the source tree may be read-only (make distcheck).
cp -R "$top_srcdir/examples/extension" "$tmp/src"
chmod -R u+w "$tmp/src"

# ---------------------------------------------------------------------------
# The plain Makefile, through pkg-config
# ---------------------------------------------------------------------------
PKG_CONFIG_LIBDIR=$dest$pkgconfigdir
PKG_CONFIG_SYSROOT_DIR=$dest
export PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR
unset PKG_CONFIG_PATH
cp -R "$tmp/src" "$tmp/make"
if ! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL $MAKE -C "$tmp/make" \
	PKG_CONFIG="$PKG_CONFIG" NVCC="$NVCC" CUDA_ARCHS="$CUDA_ARCHS" \
	>"$tmp/build.log" 2>&1; then
	cat "$tmp/build.log"
	fail "building examples/extension with its Makefile failed"
fi
cat "$tmp/build.log"
grep -q -e "-L$dest$libdir" "$tmp/build.log" ||
	fail "the link line does not use the installed library"
run_myext "$tmp/make" fake
echo "$test_name: PASS: make build, myext.py against the fake CUDA ($verdict)"
run_myext "$tmp/make" real
echo "$test_name: PASS: make build, myext.py against the installed cusafe ($verdict)"

# ---------------------------------------------------------------------------
# CMake, through find_package(cusafe 0.1)
# ---------------------------------------------------------------------------
if ! command -v "$CMAKE" >/dev/null 2>&1; then
	echo "$test_name: SKIP: cmake build -- no cmake ($CMAKE) found"
	exit 0
fi
archs=$(echo $CUDA_ARCHS | tr ' ' ';')
nvcc_path=$(command -v "$NVCC")
if ! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
	"$CMAKE" -S "$tmp/src" -B "$tmp/cmake" \
	-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
	-DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
	"-DCMAKE_PREFIX_PATH=$dest$prefix" \
	"-DCUDAToolkit_ROOT=$(dirname "$(dirname "$nvcc_path")")" \
	"-DMYEXT_CUDA_ARCHS=$archs" >"$tmp/cmake.log" 2>&1 ||
	! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
		"$CMAKE" --build "$tmp/cmake" -- VERBOSE=1 >>"$tmp/cmake.log" 2>&1; then
	cat "$tmp/cmake.log"
	fail "building examples/extension with CMake failed"
fi
cat "$tmp/cmake.log"
found=$(sed -n 's/^cusafe_DIR:PATH=//p' "$tmp/cmake/CMakeCache.txt")
test "$found" = "$dest$libdir/cmake/cusafe" ||
	fail "CMake found cusafe in '$found', not in $dest$libdir/cmake/cusafe"
run_myext "$tmp/cmake" fake
echo "$test_name: PASS: cmake build, myext.py against the fake CUDA ($verdict)"
run_myext "$tmp/cmake" real
echo "$test_name: PASS: cmake build, myext.py against the installed cusafe ($verdict)"
exit 0
