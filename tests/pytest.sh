#!/bin/sh
# The pytest suite of the Python package (tests/python), run twice: against
# the library built with the fake CUDA, and against the real one (skipped
# without a GPU), each in a process of its own with the package of the
# source tree.  Skipped (77) without pytest.
#
# Environment (set by `make check`): top_srcdir, top_builddir, PYTHON;
# cusafe_package, the directory holding the package to test (default:
# $top_srcdir/python; make installcheck gives the installed one), and
# cusafe_fake_library, cusafe_real_library, the libraries to test against.
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c "import pytest" 2>/dev/null; then
	echo "pytest: SKIP: $PYTHON has no pytest (Debian, Ubuntu: apt-get install python3-pytest)"
	exit 77
fi
package_dir=${cusafe_package:-$top_srcdir/python}
# The extension of the build tree (make check sets cusafe_speedups to it):
# the package of the source tree is staged beside it, in links, since a
# package's modules are found in one directory.
if test -z "${cusafe_package:-}" && test -n "${cusafe_speedups:-}" &&
	test -f "$cusafe_speedups"; then
	stage=$top_builddir/tests/python-stage
	rm -rf "$stage" && mkdir -p "$stage/cusafe" || exit 99
	src=`cd "$top_srcdir/python/cusafe" && pwd` || exit 99
	for f in "$src"/*.py "$src"/*.pyi "$src"/py.typed; do
		test -f "$f" || continue
		case $f in */_config.py) continue ;; esac
		ln -s "$f" "$stage/cusafe/" || exit 99
	done
	ln -s "$cusafe_speedups" "$stage/cusafe/" || exit 99
	package_dir=$stage
	echo "pytest: package of $top_srcdir/python with $cusafe_speedups"
fi
PYTHONPATH=$package_dir:$top_srcdir/tests/python${PYTHONPATH:+:$PYTHONPATH}
PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH PYTHONDONTWRITEBYTECODE

status=0
for variant in fake gpu; do
	case $variant in
	fake) lib=${cusafe_fake_library:-$top_builddir/.libs/libcusafe_fake.so} ;;
	gpu) lib=${cusafe_real_library:-$top_builddir/.libs/libcusafe.so} ;;
	esac
	if test "$variant" = gpu &&
		! CUSAFE_LIBRARY=$lib "$PYTHON" -c "import cusafe; cusafe.device_count()" 2>/dev/null; then
		echo "pytest: SKIP: gpu -- no CUDA driver or device"
		continue
	fi
	echo "pytest: $variant ($lib)"
	CUSAFE_LIBRARY=$lib "$PYTHON" -m pytest -q -p no:cacheprovider \
		"$top_srcdir/tests/python"
	rc=$?
	if test $rc -ne 0; then
		echo "pytest: FAIL: $variant (pytest exited with $rc)"
		status=1
	else
		echo "pytest: PASS: $variant"
	fi
done
exit $status
