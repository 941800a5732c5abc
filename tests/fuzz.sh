#!/bin/sh
# A bounded run of the API fuzzer (tests/fuzz/fuzz_api.c: libFuzzer with
# AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer, against
# the fake CUDA), started from a copy of the seed corpus tests/fuzz/corpus.
# Any crash, sanitizer report, leak, fake CUDA violation or failed check of
# the harness fails the test; the input that caused it is kept as
# tests/fuzz/crash-* (or leak-*, timeout-*, oom-*) in the build directory.
#
# Environment:
#   top_srcdir, top_builddir  set by make check
#   FUZZ_TIME     seconds to fuzz (default 60; make fuzz: 600)
#   FUZZ_CORPUS   a directory that keeps the corpus the run grows (default:
#                 a temporary copy of the seeds, removed afterwards)
#   FUZZ_ARGS     more libFuzzer options, such as "-jobs=4 -workers=4"
#   FUZZ_SEED     libFuzzer's random seed (default 1: make check's short run
#                 mutates the same way every time, so that it fails only for
#                 a change; campaigns pass 0, a new seed each run)
# Skipped (77) when configure found no clang with libFuzzer (FUZZ_CC), and
# under make check-valgrind, whose Valgrind cannot run a sanitized program.
set -u

top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
fuzzer=$top_builddir/tests/fuzz/fuzz_api
seeds=$top_srcdir/tests/fuzz/corpus

if ! test -x "$fuzzer"; then
	echo "SKIP: $fuzzer is not built: configure found no clang with libFuzzer (see FUZZ_CC in ./configure --help)"
	exit 77
fi
if test -n "${VALGRIND:-}"; then
	echo "SKIP: make check-valgrind; the fuzzer runs under its own sanitizers in make check"
	exit 77
fi

time=${FUZZ_TIME:-60}
case $time in
'' | *[!0-9]*)
	echo "FAIL: FUZZ_TIME=$time is not a number of seconds"
	exit 1
	;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/cusafe-fuzz.XXXXXX") || exit 99
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
if test -n "${FUZZ_CORPUS:-}"; then
	corpus=$FUZZ_CORPUS
else
	corpus=$work/corpus
fi
mkdir -p "$corpus" || exit 99
cp "$seeds"/* "$corpus"/ || exit 99
artifacts=$top_builddir/tests/fuzz/

echo "fuzz: $fuzzer for $time s from $(find "$seeds" -type f | wc -l | tr -d ' ') seeds into $corpus"
# -timeout: one input never takes a second; -rss_limit_mb: the default.
# shellcheck disable=SC2086
"$fuzzer" -max_total_time="$time" -seed="${FUZZ_SEED:-1}" -detect_leaks=1 -timeout=30 \
	-rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
	-artifact_prefix="$artifacts" ${FUZZ_ARGS:-} "$corpus" >"$work/log" 2>&1
status=$?

runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 runs in \2 s/p' "$work/log" | tail -n 1)
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -n 1)
cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$work/log" | tail -n 1)
units=$(find "$corpus" -type f | wc -l | tr -d ' ')
bytes=$(find "$corpus" -type f -exec cat {} + | wc -c | tr -d ' ')

if test $status -ne 0; then
	echo "FAIL: the fuzzer exited with status $status; the end of its output:"
	grep -v '^#[0-9]' "$work/log" | tail -n 150
	echo "fuzz: FAIL after ${runs:-an unknown number of runs}"
	for a in "$artifacts"crash-* "$artifacts"leak-* "$artifacts"timeout-* "$artifacts"oom-*; do
		test -f "$a" || continue
		echo "fuzz: reproduce with: $fuzzer $a"
		echo "      (CUSAFE_FUZZ_TRACE=1 prints every call)"
	done
	exit 1
fi
echo "fuzz: PASS: ${runs:-? runs} (${rate:-?} exec/s); corpus $units inputs, $bytes bytes; ${cov:-no coverage line}"
exit 0
