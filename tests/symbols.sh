#!/bin/sh
# Checks that libcusafe.so exports exactly the functions that
# include/cusafe.h (and include/cusafe_dlpack.h, in a build with DLPack:
# cusafe_dlpack=yes) declares with CUSAFE_API: nothing internal leaks out,
# and nothing declared is missing.
set -eu

top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
NM=${NM:-nm}

lib=$top_builddir/.libs/libcusafe.so
header=$top_srcdir/include/cusafe.h
headers=$header
if test "${cusafe_dlpack:-no}" = yes; then
	headers="$headers $top_srcdir/include/cusafe_dlpack.h"
fi

if ! test -f "$lib"; then
	echo "symbols: $lib not found (shared library not built)"
	exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cusafe-symbols.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Declarations: drop comments and preprocessor lines, join the rest, cut it
# at semicolons and take the name before the first '(' of each CUSAFE_API
# declaration.
cat $headers | grep -v '^[[:space:]]*#' |
	tr '\n' ' ' |
	sed -e 's,/\*[^*]*\*\+\([^/*][^*]*\*\+\)*/, ,g' |
	tr ';' '\n' |
	sed -n 's/.*CUSAFE_API[^(]*[^A-Za-z0-9_]\([A-Za-z_][A-Za-z0-9_]*\)[[:space:]]*(.*/\1/p' |
	LC_ALL=C sort -u >"$tmp/declared"

# Exports: every defined dynamic symbol that is not the linker's own.
$NM -D --defined-only "$lib" |
	awk 'NF >= 3 { print $3 }' |
	sed -e 's/@.*//' |
	grep -v -x -e '_init' -e '_fini' -e '_edata' -e '_end' -e '__bss_start' |
	LC_ALL=C sort -u >"$tmp/exported"

if ! test -s "$tmp/declared"; then
	echo "symbols: no CUSAFE_API declarations found in $headers"
	exit 1
fi

missing=$(LC_ALL=C comm -23 "$tmp/declared" "$tmp/exported")
extra=$(LC_ALL=C comm -13 "$tmp/declared" "$tmp/exported")

status=0
if test -n "$missing"; then
	echo "symbols: declared in $headers but not exported by libcusafe.so:"
	printf '  %s\n' $missing
	status=1
fi
if test -n "$extra"; then
	echo "symbols: exported by libcusafe.so but not declared in $headers:"
	printf '  %s\n' $extra
	status=1
fi
if test "$status" -eq 0; then
	echo "symbols: $(wc -l <"$tmp/declared") functions declared and exported"
fi
exit "$status"
