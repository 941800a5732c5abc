#!/bin/sh
# cusafe's own DLPack declarations (include/cusafe_dlpack_abi.h) against an
# official dlpack/dlpack.h (1.0 or newer), where configure found one:
# tests/dlpack_abi_check.c must compile as C11 and, with a C++ compiler, as
# C++11 -- its _Static_asserts compare every struct's size and alignment,
# every field's offset, size and type, every enumerator and every flag.
# Then the header alone (C99, C++98) and with the official one in both
# include orders.  Skipped (77) where configure found no official header.
#
# Environment (set by `make check`): top_srcdir, DLPACK_CHECK_CC (the C
# compiler), DLPACK_CHECK_CXX (a C++ compiler, or empty),
# DLPACK_CHECK_CPPFLAGS (-I of the official header's directory; empty:
# none found, or the compiler's own path when cusafe_dlpack_check=yes),
# cusafe_dlpack_check (yes where configure found one; off with
# --without-dlpack).
set -u
top_srcdir=${top_srcdir:-.}
CC=${DLPACK_CHECK_CC:-cc}
CXX=${DLPACK_CHECK_CXX:-}
case ${cusafe_dlpack_check:-no} in
yes) ;;
off)
	echo "dlpack-abi: SKIP: the check is off (./configure --without-dlpack)"
	exit 77 ;;
*)
	echo "dlpack-abi: SKIP: configure found no official dlpack/dlpack.h 1.0 or newer (--with-dlpack=DIR)"
	exit 77 ;;
esac
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
passed=0
compile() { # name, then the command (stderr must stay empty)
	name=$1; shift
	if "$@" -o "$tmp/o" >"$tmp/log" 2>&1 && ! test -s "$tmp/log"; then
		echo "dlpack-abi: PASS: $name"; passed=$((passed + 1))
	else
		echo "dlpack-abi: FAIL: $name"; sed 's/^/    /' "$tmp/log"; fail=1
	fi
}
inc="-I$top_srcdir/include $DLPACK_CHECK_CPPFLAGS"
# Which header, and which version: the log says what was checked.
# shellcheck disable=SC2086
official=$(printf '#include <dlpack/dlpack.h>\n' | $CC $inc -E - 2>/dev/null |
	sed -n 's/^# *[0-9]* "\(.*dlpack\/dlpack\.h\)".*/\1/p' | head -n 1)
# shellcheck disable=SC2086
version=$(printf '#include <dlpack/dlpack.h>\nDLPACK_MAJOR_VERSION.DLPACK_MINOR_VERSION\n' |
	$CC $inc -E -P - 2>/dev/null | tail -n 1 | tr -d ' ')
echo "dlpack-abi: the official header: ${official:-?} (DLPack ${version:-?})"
check=$top_srcdir/tests/dlpack_abi_check.c
# shellcheck disable=SC2086
compile "C11" $CC -std=c11 -Wall -Wextra $inc -c "$check"
if test -n "$CXX" && command -v "${CXX%% *}" >/dev/null 2>&1; then
	# shellcheck disable=SC2086
	compile "C++11" $CXX -x c++ -std=c++11 -Wall -Wextra $inc -c "$check"
else
	echo "dlpack-abi: SKIP: C++11 (no C++ compiler)"
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
	# shellcheck disable=SC2086
	compile "header $order, C99" $CC -std=c99 -Wall -Wextra -Wpedantic $inc -c "$tmp/use.c"
	if test -n "$CXX" && command -v "${CXX%% *}" >/dev/null 2>&1; then
		std=c++98; test $order = official-first && std=c++11 # DLPack's own needs C++11
		# shellcheck disable=SC2086
		compile "header $order, C++ ($std)" $CXX -x c++ -std=$std -Wall -Wextra $inc -c "$tmp/use.c"
	fi
done
if test $fail -eq 0; then
	echo "dlpack-abi: PASS: cusafe's DLPack declarations match DLPack ${version:-?} of $official ($passed compiles)"
fi
exit $fail
