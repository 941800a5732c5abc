#!/bin/sh
# The thread stress test (tests/stress/stress.c): threads that create, share
# and release handles while one of them shuts the library down, against the
# fake CUDA; with free-running and with paused streams, and with nothing
# but launches whose handles other threads release at the same time.
#   - tests/stress/stress_tsan, built with ThreadSanitizer: any data race
#     fails (halt_on_error=1, exit code 66).
#   - tests/stress/stress, a plain build, under Valgrind's memcheck: any
#     invalid access (a thread using what the shutdown destroyed) or leak
#     fails.  Fewer iterations: Valgrind runs one thread at a time.
#     (Helgrind and DRD are no use here: they do not model C11 atomics, so
#     they take the library's lock-free handle table, call marks and
#     spinlocks for races, hundreds of them.)
# Either part is skipped when it cannot run: no clang with ThreadSanitizer
# (FUZZ_CC), or Valgrind disabled or missing.  Both skipped: exit 77.
#
# Environment: top_srcdir, top_builddir, VALGRIND_ENABLED, cusafe_valgrind
# (set by make check); STRESS_THREADS and STRESS_ITERATIONS (default 8 and
# 4000 for ThreadSanitizer).
set -u

top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
tsan=$top_builddir/tests/stress/stress_tsan
plain=$top_builddir/tests/stress/stress
threads=${STRESS_THREADS:-8}
iterations=${STRESS_ITERATIONS:-4000}

out=$(mktemp "${TMPDIR:-/tmp}/cusafe-stress.XXXXXX") || exit 99
trap 'rm -f "$out"' EXIT
trap 'exit 130' INT TERM
ran=0
failed=0

# run LABEL COMMAND...: runs it, shows its output, counts the result.
run() {
	label=$1
	shift
	start=$(date +%s)
	"$@" >"$out" 2>&1
	status=$?
	secs=$(($(date +%s) - start))
	cat "$out"
	if test $status -eq 0; then
		echo "stress: PASS: $label (${secs} s)"
	else
		echo "stress: FAIL: $label: exit status $status (${secs} s)"
		failed=1
	fi
	ran=1
}

if test -x "$tsan"; then
	tsan_options="halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}"
	# ThreadSanitizer of clang 14 cannot start where the kernel randomises
	# mmap with more bits than it expects; without ASLR it can.
	prefix=
	TSAN_OPTIONS=$tsan_options "$tsan" 2 2 >"$out" 2>&1
	if grep -q 'unexpected memory mapping' "$out"; then
		if command -v setarch >/dev/null 2>&1 &&
			TSAN_OPTIONS=$tsan_options setarch "$(uname -m)" -R "$tsan" 2 2 >"$out" 2>&1; then
			prefix="setarch $(uname -m) -R"
			echo "stress: ThreadSanitizer runs without ASLR (setarch -R) on this kernel"
		else
			echo "SKIP (ThreadSanitizer): it cannot start here:"
			cat "$out"
			tsan=
		fi
	fi
	if test -n "$tsan"; then
		for mode in "" paused racy; do
			# shellcheck disable=SC2086
			run "ThreadSanitizer, $threads threads x $iterations iterations${mode:+, $mode}" \
				env TSAN_OPTIONS="$tsan_options" $prefix "$tsan" "$threads" "$iterations" $mode
		done
	fi
else
	echo "SKIP (ThreadSanitizer): $tsan is not built: configure found no clang with ThreadSanitizer (see FUZZ_CC in ./configure --help)"
fi

if test "${VALGRIND_ENABLED:-no}" = yes && test -n "${cusafe_valgrind:-}" &&
	test -x "$plain"; then
	for mode in "" paused racy; do
		# shellcheck disable=SC2086
		run "memcheck, $threads threads x 1000 iterations${mode:+, $mode}" \
			"$top_builddir/libtool" --mode=execute "$cusafe_valgrind" \
			--error-exitcode=1 --leak-check=full \
			--show-leak-kinds=definite,indirect \
			--errors-for-leak-kinds=definite,indirect \
			"$plain" "$threads" 1000 $mode
	done
else
	echo "SKIP (memcheck): Valgrind is disabled or missing (./configure --enable-valgrind)"
fi

test $ran -eq 1 || exit 77
exit $failed
