#!/bin/sh
# cusafe's own DLPack declarations (include/cusafe_dlpack_abi.h) against
# official dlpack/dlpack.h headers: those of DLPack 1.0 to 1.3 in
# tests/data/dlpack (so the check always runs), and the one configure found
# (--with-dlpack=DIR, the compiler's path, apache-tvm-ffi), if any.  For
# each header:
#   - cusafe's header alone, which declares everything itself, against the
#     official one: tests/dlpack_abi_dump.c, built with either (C11, and
#     C++11 where a C++ compiler is found), prints every struct's size and
#     alignment, every field's offset, size and type, every enumeration's
#     size and integer type, every enumerator's value and every macro's
#     value and type; the two must print the same.  The enumerators and
#     macros compared are those both headers declare; one that only
#     cusafe's declares fails unless the official header is of an older
#     minor version than cusafe transcribes (kDLTrn is 1.2's), one that
#     only the official declares unless it is of a newer one;
#   - cusafe's header after the official one, which it then adopts:
#     tests/dlpack_abi_check.c (C11, C++11) asserts the same at compile
#     time, and the include orders compile (C99, C++).
# One header must be of the minor version cusafe transcribes (1.3).
# Skipped (77) with --without-dlpack or --disable-dlpack.
#
# Environment (set by `make check`): top_srcdir, DLPACK_CHECK_CC (the C
# compiler), DLPACK_CHECK_CXX (a C++ compiler, or empty),
# DLPACK_CHECK_CPPFLAGS (-I of the official header's directory; empty:
# none found, or the compiler's own path when cusafe_dlpack_check=yes),
# cusafe_dlpack_check (yes where configure found one; off with
# --without-dlpack), cusafe_dlpack (no with --disable-dlpack).
set -u
LC_ALL=C; export LC_ALL # (sort and comm agree on the order)
top_srcdir=${top_srcdir:-.}
CC=${DLPACK_CHECK_CC:-cc}
CXX=${DLPACK_CHECK_CXX:-}
case ${cusafe_dlpack:-yes} in
no)
	echo "dlpack-abi: SKIP: the DLPack calls are left out (./configure --disable-dlpack)"
	exit 77 ;;
esac
case ${cusafe_dlpack_check:-no} in
off)
	echo "dlpack-abi: SKIP: the check is off (./configure --without-dlpack)"
	exit 77 ;;
esac
if test -n "$CXX" && command -v "${CXX%% *}" >/dev/null 2>&1; then :; else
	CXX=
	echo "dlpack-abi: SKIP: the C++ checks (no C++ compiler)"
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
passed=0
ours="-I$top_srcdir/include"
compile() { # name, then the command (stderr must stay empty)
	name=$1; shift
	if "$@" >"$tmp/log" 2>&1 && ! test -s "$tmp/log"; then
		passed=$((passed + 1)); return 0
	fi
	echo "dlpack-abi: FAIL: $name"; sed 's/^/    /' "$tmp/log"
	fail=1; hfail=1
	return 1
}
# The enumerators (of every enum) and DLPACK_ macros that the headers
# reached through $1 (compiler flags) and $2 (an #include line) declare.
enumerators() {
	# shellcheck disable=SC2086
	printf '%s\n' "$2" | $CC $1 -E -P -x c - 2>/dev/null | tr '\n' ' ' |
		grep -o 'enum[^{;]*{[^}]*}' | sed 's/^[^{]*{//; s/}$//' |
		tr ',' '\n' | sed -n 's/^ *\([A-Za-z_][A-Za-z0-9_]*\).*/\1/p' | sort -u
}
macros() {
	# shellcheck disable=SC2086
	printf '%s\n' "$2" | $CC $1 -E -dM -x c - 2>/dev/null |
		sed -n 's/^#define \(DLPACK_[A-Za-z0-9_]*\).*/\1/p' |
		grep -v '^DLPACK_DLPACK_H_$' | sort -u
}
# The version cusafe transcribes (not its DLPACK_MINOR_VERSION: checked).
# shellcheck disable=SC2086
ours_minor=$(printf '#include "cusafe_dlpack_abi.h"\nCUSAFE_DLPACK_ABI_MINOR\n' |
	$CC $ours -E -P -x c - 2>/dev/null | tail -n 1 | tr -d ' ')
{ enumerators "$ours" '#include "cusafe_dlpack_abi.h"'
  macros "$ours" '#include "cusafe_dlpack_abi.h"'; } | sort -u >"$tmp/ours.names"
if ! test -s "$tmp/ours.names" || test -z "$ours_minor"; then
	echo "dlpack-abi: FAIL: cannot read include/cusafe_dlpack_abi.h"; exit 1
fi

checked=
same_minor=no
# check_header DIR LABEL: every check against DIR/dlpack/dlpack.h (DIR
# empty: the compiler's path).
# (word splitting of $inc, $cc, $ours and $CXX wanted throughout)
# shellcheck disable=SC2086
check_header() {
	dir=$1; label=$2; inc=${dir:+-I$dir}
	minor=$(printf '#include <dlpack/dlpack.h>\nDLPACK_MAJOR_VERSION.DLPACK_MINOR_VERSION\n' |
		$CC $inc -E -P -x c - 2>/dev/null | tail -n 1 | tr -d ' ')
	case $minor in
	1.[0-9]*) minor=${minor#1.} ;;
	*) echo "dlpack-abi: FAIL: $label: not a dlpack/dlpack.h of DLPack 1.x ($minor)"
	   fail=1; hfail=1; return ;;
	esac
	v=1.$minor
	echo "dlpack-abi: DLPack $v: $label"
	test "$minor" -ne "$ours_minor" || same_minor=yes
	checked="$checked${checked:+, }$v ($label)"
	hfail=0
	{ enumerators "$inc" '#include <dlpack/dlpack.h>'
	  macros "$inc" '#include <dlpack/dlpack.h>'; } | sort -u >"$tmp/theirs.names"
	# Names of one header only: fine where the other's version is newer.
	only_ours=$(comm -23 "$tmp/ours.names" "$tmp/theirs.names" | tr '\n' ' ')
	only_theirs=$(comm -13 "$tmp/ours.names" "$tmp/theirs.names" | tr '\n' ' ')
	only_ours=${only_ours% }; only_theirs=${only_theirs% }
	if test -n "$only_ours"; then
		if test "$minor" -lt "$ours_minor"; then
			echo "dlpack-abi:   not in DLPack $v, not compared: $only_ours"
		else
			echo "dlpack-abi: FAIL: DLPack $v: cusafe declares what DLPack $v does not: $only_ours"
			fail=1; hfail=1
		fi
	fi
	if test -n "$only_theirs"; then
		if test "$minor" -gt "$ours_minor"; then
			echo "dlpack-abi:   newer than cusafe's 1.$ours_minor, not compared: $only_theirs"
		else
			echo "dlpack-abi: FAIL: DLPack $v: cusafe lacks what DLPack $v declares: $only_theirs"
			fail=1; hfail=1
		fi
	fi
	comm -12 "$tmp/ours.names" "$tmp/theirs.names" | while read -r n; do
		case $n in
		DLPACK_EXTERN_C | DLPACK_DLL) echo "TOKENS($n)" ;;
		# cusafe's version is its own: compared with its equal only
		DLPACK_MINOR_VERSION) test "$minor" -ne "$ours_minor" || echo "MACRO($n)" ;;
		DLPACK_*) echo "MACRO($n)" ;;
		*) echo "ENUMERATOR($n)" ;;
		esac
	done >"$tmp/dlpack_abi_names.h"
	dump=$top_srcdir/tests/dlpack_abi_dump.c
	for lang in C11 C++11; do
		case $lang in
		C11) cc="$CC -std=c11 -x c" ;;
		*) test -n "$CXX" || continue; cc="$CXX -std=c++11 -x c++" ;;
		esac
		compile "DLPack $v, $lang: dlpack_abi_dump.c with the official header" \
			$cc -Wall -Wextra -DDUMP_OFFICIAL -I"$tmp" $inc "$dump" -o "$tmp/theirs" ||
			continue
		compile "DLPack $v, $lang: dlpack_abi_dump.c with cusafe_dlpack_abi.h alone" \
			$cc -Wall -Wextra -I"$tmp" $ours "$dump" -o "$tmp/ours" || continue
		if ! "$tmp/theirs" >"$tmp/theirs.out" || ! "$tmp/ours" >"$tmp/ours.out"; then
			echo "dlpack-abi: FAIL: DLPack $v, $lang: a dump did not run"
			fail=1; hfail=1; continue
		fi
		if diff "$tmp/theirs.out" "$tmp/ours.out" >"$tmp/diff"; then
			passed=$((passed + 1))
		else
			echo "dlpack-abi: FAIL: DLPack $v, $lang: cusafe's own declarations differ (-official +cusafe):"
			grep '^[<>]' "$tmp/diff" | sed 's/^</    -/; s/^>/    +/'
			fail=1; hfail=1
		fi
	done
	# cusafe's header after the official one (adopting it).
	check=$top_srcdir/tests/dlpack_abi_check.c
	compile "DLPack $v, C11: dlpack_abi_check.c" \
		$CC -std=c11 -Wall -Wextra $ours $inc -c "$check" -o "$tmp/o"
	if test -n "$CXX"; then
		compile "DLPack $v, C++11: dlpack_abi_check.c" \
			$CXX -x c++ -std=c++11 -Wall -Wextra $ours $inc -c "$check" -o "$tmp/o"
	fi
	for order in alone ours-first official-first; do
		case $order in
		alone) printf '#include "cusafe_dlpack_abi.h"\n' ;;
		ours-first) printf '#include "cusafe_dlpack_abi.h"\n#include <dlpack/dlpack.h>\n' ;;
		official-first) printf '#include <dlpack/dlpack.h>\n#include "cusafe_dlpack_abi.h"\n' ;;
		esac >"$tmp/use.c"
		cat >>"$tmp/use.c" <<'EOT'
DLManagedTensorVersioned t = {{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION},
                              0, 0, DLPACK_FLAG_BITMASK_READ_ONLY,
                              {0, {kDLCUDA, 0}, 1, {kDLFloat, 32, 1}, 0, 0, 0}};
int f(void) { return (int)sizeof(DLManagedTensor) + CUSAFE_DLPACK_ABI_OFFICIAL; }
EOT
		compile "DLPack $v: header $order, C99" \
			$CC -std=c99 -Wall -Wextra -Wpedantic $ours $inc -c "$tmp/use.c" -o "$tmp/o"
		if test -n "$CXX"; then
			std=c++98; test $order = official-first && std=c++11 # DLPack's own needs C++11
				compile "DLPack $v: header $order, C++ ($std)" \
				$CXX -x c++ -std=$std -Wall -Wextra $ours $inc -c "$tmp/use.c" -o "$tmp/o"
		fi
	done
	test $hfail -ne 0 || echo "dlpack-abi: PASS: DLPack $v ($label)"
}

data=$top_srcdir/tests/data/dlpack
if test "${cusafe_dlpack_check:-no}" = yes; then
	# shellcheck disable=SC2086
	found=$(printf '#include <dlpack/dlpack.h>\n' | $CC $DLPACK_CHECK_CPPFLAGS -E -x c - 2>/dev/null |
		sed -n 's/^# *[0-9]* "\(.*dlpack\/dlpack\.h\)".*/\1/p' | head -n 1)
	check_header "${DLPACK_CHECK_CPPFLAGS#-I}" "${found:-?}, found by configure"
else
	echo "dlpack-abi: configure found no official dlpack/dlpack.h (--with-dlpack=DIR): only tests/data/dlpack's"
fi
for d in "$data"/v1.*; do
	test -f "$d/dlpack/dlpack.h" || continue
	check_header "$d" "tests/data/dlpack/${d##*/}"
done
if test $same_minor = no; then
	echo "dlpack-abi: FAIL: no header of DLPack 1.$ours_minor, the version cusafe transcribes, was checked"
	fail=1; hfail=1
fi
if test $fail -eq 0; then
	echo "dlpack-abi: PASS: cusafe's DLPack declarations match DLPack $checked ($passed checks)"
fi
exit $fail
