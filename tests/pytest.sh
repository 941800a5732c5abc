#!/bin/sh
# The pytest suite of the Python package (tests/python), run against each
# implementation of the package -- "python" (ctypes alone,
# CUSAFE_PURE_PYTHON=1) and "c" (with the extension cusafe._speedups) --
# and, for each, against the library built with the fake CUDA and against
# the real one (skipped without a GPU), each in a process of its own.
# Skipped (77) without pytest.
#
# Environment (set by `make check`): top_srcdir, top_builddir, PYTHON;
# cusafe_package, the directory holding the package to test (default:
# $top_srcdir/python; make installcheck gives the installed one);
# cusafe_package_c, the directory of the package with the extension (make
# check: the build tree's stage; make installcheck: the installed one;
# unset or empty where the extension was not built: the "c" runs are
# skipped), which must run on it; and cusafe_fake_library,
# cusafe_real_library, the libraries to test against.
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c "import pytest" 2>/dev/null; then
	echo "pytest: SKIP: $PYTHON has no pytest (Debian, Ubuntu: apt-get install python3-pytest)"
	exit 77
fi
python_package=${cusafe_package:-$top_srcdir/python}
c_package=${cusafe_package_c:-}
PYTHONDONTWRITEBYTECODE=1
export PYTHONDONTWRITEBYTECODE

status=0
for impl in python c; do
	case $impl in
	python)
		package_dir=$python_package
		pure=1
		;;
	c)
		package_dir=$c_package
		pure=
		if test -z "$package_dir"; then
			echo "pytest: SKIP: c -- cusafe._speedups was not built"
			continue
		fi
		;;
	esac
	path=$package_dir:$top_srcdir/tests/python${PYTHONPATH:+:$PYTHONPATH}
	got=$(CUSAFE_PURE_PYTHON=$pure PYTHONPATH=$path "$PYTHON" -c \
		"import cusafe; print(cusafe.implementation())" 2>&1)
	if test "$got" != "$impl"; then
		echo "pytest: FAIL: $impl -- the package of $package_dir runs on: $got"
		status=1
		continue
	fi
	for variant in fake gpu; do
		case $variant in
		fake) lib=${cusafe_fake_library:-$top_builddir/.libs/libcusafe_fake.so} ;;
		gpu) lib=${cusafe_real_library:-$top_builddir/.libs/libcusafe.so} ;;
		esac
		if test "$variant" = gpu &&
			! CUSAFE_LIBRARY=$lib PYTHONPATH=$path "$PYTHON" -c "import cusafe; cusafe.device_count()" 2>/dev/null; then
			echo "pytest: SKIP: $impl, gpu -- no CUDA driver or device"
			continue
		fi
		echo "pytest: $impl, $variant ($package_dir, $lib)"
		CUSAFE_PURE_PYTHON=$pure CUSAFE_LIBRARY=$lib PYTHONPATH=$path \
			"$PYTHON" -m pytest -q -p no:cacheprovider \
			"$top_srcdir/tests/python"
		rc=$?
		if test $rc -ne 0; then
			echo "pytest: FAIL: $impl, $variant (pytest exited with $rc)"
			status=1
		else
			echo "pytest: PASS: $impl, $variant"
		fi
	done
done
exit $status
