#!/bin/sh
# Checks that the C sources follow the tree's one style (.clang-format):
# `clang-format --dry-run -Werror` on every .c and .h file of lib/,
# include/, tests/, bench/ and examples/.  Formatting differs between
# clang-format's major versions, so the check runs with the version the
# tree is formatted with and skips otherwise.
set -eu

top_srcdir=${top_srcdir:-.}
want=14
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}

if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
	for c in clang-format-$want; do
		command -v "$c" >/dev/null 2>&1 && CLANG_FORMAT=$c
	done
fi
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
	echo "format: clang-format not found; skipped"
	exit 77
fi
major=$("$CLANG_FORMAT" --version | sed -n 's/.*version \([0-9][0-9]*\)\..*/\1/p')
if [ "$major" != "$want" ]; then
	echo "format: $CLANG_FORMAT is version ${major:-unknown}, the tree is formatted with $want; skipped"
	exit 77
fi
if ! test -f "$top_srcdir/.clang-format"; then
	echo "format: $top_srcdir/.clang-format is missing"
	exit 1
fi

cd "$top_srcdir"
bad=0
# (tests/data/dlpack: DLPack's own headers, kept as DLPack wrote them)
for f in $(find lib include tests bench examples -path tests/data/dlpack -prune -o \
	-name '*.[ch]' -print | LC_ALL=C sort); do
	if ! "$CLANG_FORMAT" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
		echo "format: $f does not follow .clang-format (clang-format -i $f)"
		bad=1
	fi
done
if [ "$bad" -ne 0 ]; then
	exit 1
fi
echo "format: PASS: every C source follows .clang-format"
