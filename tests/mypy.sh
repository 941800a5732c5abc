#!/bin/sh
# mypy --strict on the Python package (python/cusafe): every public name
# annotated, the package clean (with mypy 1.0, Debian 12's, or newer).
# Skipped (77) without mypy.
#
# Environment (set by `make check`): top_srcdir, PYTHON.
set -u
top_srcdir=${top_srcdir:-.}
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -m mypy --version >/dev/null 2>&1; then
	echo "mypy: SKIP: $PYTHON has no mypy (Debian, Ubuntu: apt-get install mypy)"
	exit 77
fi
# No cache: the source tree may be read-only (make distcheck).
if "$PYTHON" -m mypy --strict --cache-dir=/dev/null \
	"$top_srcdir/python/cusafe"; then
	echo "mypy: PASS: mypy --strict finds nothing in python/cusafe"
	exit 0
fi
echo "mypy: FAIL: mypy --strict python/cusafe"
exit 1
