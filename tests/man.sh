#!/bin/sh
# Checks the manual pages that doc/mkman writes from the public headers
# (doc/man, listed in doc/man/pages): every function that libcusafe
# exports has its page of section 3, and every such page is of a function
# that it exports; every page renders without a warning (groff -ww, and
# mandoc -T lint where mandoc is installed); every page of section 3 has
# an ERRORS and an OWNERSHIP section with text; and man -l, where man is
# installed, shows cusafe_buffer_alloc(3)'s Errors and Ownership as
# include/cusafe.h words them.  Skips only without groff.
set -eu

top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
NM=${NM:-nm}

fail() {
	echo "man: FAIL: $*"
	exit 1
}

if ! command -v groff >/dev/null 2>&1; then
	echo "man: groff not found (Debian: groff-base); skipped"
	exit 77
fi

dir=$top_builddir/doc/man
test -f "$dir/pages" || dir=$top_srcdir/doc/man
test -f "$dir/pages" || fail "no doc/man/pages in $top_builddir or $top_srcdir (run make)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cusafe-man.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The pages of this build, as make install picks them: the DLPack ones
# and cusafe.7 of both headers where the library has DLPack, else
# cusafe-core.7 (of cusafe.h alone).
while read -r page header; do
	case $page:$header in
	*:cusafe_dlpack.h | cusafe.7:*) test "${cusafe_dlpack:-no}" = yes || continue ;;
	cusafe-core.7:*) test "${cusafe_dlpack:-no}" != yes || continue ;;
	esac
	echo "$page"
done <"$dir/pages" >"$tmp/pages"
sed -n 's/\.3$//p' "$tmp/pages" | LC_ALL=C sort -u >"$tmp/documented"
test "$(grep -c '\.7$' "$tmp/pages")" -eq 1 || fail "not one cusafe(7) in $dir/pages for this build"

# (a) Pages against the library's exports (its shared library, else its
# static archive's global functions of the cusafe_ prefix).
lib=$top_builddir/.libs/libcusafe.so
if test -f "$lib"; then
	$NM -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }' | sed -e 's/@.*//' |
		grep -v -x -e '_init' -e '_fini' -e '_edata' -e '_end' -e '__bss_start' |
		LC_ALL=C sort -u >"$tmp/exported"
else
	lib=$top_builddir/.libs/libcusafe.a
	test -f "$lib" || fail "neither libcusafe.so nor libcusafe.a in $top_builddir/.libs (run make)"
	$NM -g --defined-only "$lib" | awk '$2 == "T" && $3 ~ /^cusafe_/ { print $3 }' |
		LC_ALL=C sort -u >"$tmp/exported"
fi
test -s "$tmp/exported" || fail "$lib exports nothing"
missing=$(LC_ALL=C comm -23 "$tmp/exported" "$tmp/documented")
extra=$(LC_ALL=C comm -13 "$tmp/exported" "$tmp/documented")
test -z "$missing" || fail "exported by $lib but without a page in $dir:" $missing
test -z "$extra" || fail "pages in $dir of functions that $lib does not export:" $extra

# (b) Every page renders without a warning.
lint=
if command -v mandoc >/dev/null 2>&1; then
	lint=mandoc
fi
while read -r page; do
	p=$dir/$page
	test -f "$p" || fail "$p is listed in $dir/pages but missing"
	if ! groff -man -ww -z "$p" >"$tmp/out" 2>&1 || test -s "$tmp/out"; then
		cat "$tmp/out"
		fail "groff -man -ww warns about $page"
	fi
	if test -n "$lint"; then
		if ! mandoc -T lint -W warning "$p" >"$tmp/out" 2>&1 || test -s "$tmp/out"; then
			cat "$tmp/out"
			fail "mandoc -T lint warns about $page"
		fi
	fi
done <"$tmp/pages"

# (b2) Every page that a page of this build refers to is one of this
# build: cusafe(7) of a library without DLPack names no DLPack page.
while read -r page; do
	grep -o -e '^\.BR [a-z_0-9]* (3)' -e '\\fB[a-z_0-9]*\\f[PR](3)' "$dir/$page" |
		sed -e 's/^\.BR //; s/ (3)$//; s/^\\fB//; s/\\f[PR](3)$//' |
		while read -r ref; do
			grep -x "$ref" "$tmp/documented" >/dev/null ||
				echo "$page refers to $ref(3), which this build has no page of"
		done
done <"$tmp/pages" >"$tmp/dangling"
test ! -s "$tmp/dangling" || fail "$(cat "$tmp/dangling")"

# (c) ERRORS and OWNERSHIP, each with text, on every page of section 3.
while read -r page; do
	case $page in *.3) ;; *) continue ;; esac
	for section in ERRORS OWNERSHIP; do
		if ! awk -v s="$section" '
			/^\.SH/ { in_s = ($0 == ".SH " s || $0 == ".SH \"" s "\""); next }
			in_s && !/^\./ && NF > 0 { found = 1 }
			END { exit !found }' "$dir/$page"; then
			fail "$page has no $section section with text"
		fi
	done
done <"$tmp/pages"

# (d) man shows a page's Errors and Ownership: the first line of each of
# those sections of the function's comment in include/cusafe.h.
shown=
if command -v man >/dev/null 2>&1; then
	fn=cusafe_buffer_alloc
	awk -v fn="$fn" '
		/^\/\*/ { n = 0 }
		{ c[++n] = $0 }
		$0 ~ "^CUSAFE_API .*[^A-Za-z0-9_]" fn "\\(" {
			for (i = 1; i <= n; i++)
				if (c[i] ~ /^ \* (Errors|Ownership): /) {
					t = c[i]; sub(/^ \* [A-Za-z]*: /, "", t); print t
				}
			exit
		}' "$top_srcdir/include/cusafe.h" >"$tmp/want"
	test "$(wc -l <"$tmp/want")" -eq 2 || fail "no Errors: and Ownership: lines for $fn in include/cusafe.h"
	# Not a terminal: man gives plain text.
	(unset MAN_KEEP_FORMATTING
	LC_ALL=C MANWIDTH=200 MANPAGER=cat PAGER=cat \
		man -l "$dir/$fn.3") 2>"$tmp/man.err" >"$tmp/man.out" ||
		{ cat "$tmp/man.err"; fail "man -l $dir/$fn.3 failed"; }
	# One line, with the line ends after a hyphen joined.
	sed -e :a -e '/-$/N; s/-\n */-/; ta' "$tmp/man.out" |
		tr -s ' \n' '  ' >"$tmp/shown"
	for s in ERRORS OWNERSHIP; do
		grep -F " $s " "$tmp/shown" >/dev/null || fail "man -l $fn.3 shows no $s section"
	done
	while read -r want; do
		want=$(printf '%s\n' "$want" | tr -s ' ')
		grep -F -i -e "$want" "$tmp/shown" >/dev/null ||
			fail "man -l $fn.3 does not show \"$want\""
	done <"$tmp/want"
	shown=", man -l shows Errors and Ownership"
fi

npages=$(wc -l <"$tmp/pages")
nexported=$(wc -l <"$tmp/exported")
echo "man: PASS: $npages pages ($((npages - 1)) functions and cusafe(7)), $nexported exported functions, groff -ww clean${lint:+, mandoc -T lint clean}$shown"
