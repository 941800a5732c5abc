# common.sh -- the runner shared by tests/exit-c.sh and tests/exit-python.sh.
#
# Sourced, not run.  A scenario runs in a fresh process, once per variant:
# "fake" (the library built with the fake CUDA) and "gpu" (the real
# runtime; skipped when the machine has no CUDA driver or device).  Each
# run must end with the expected exit status and a clean stderr.  One line
# per scenario and variant says PASS, FAIL or SKIP, with the reason.
#
# The caller sets: test_name (for messages), and for each variant a way to
# run it (see scenario()); it calls finish at the end.
#
# Environment (set by `make check`; the defaults fit a run from the build
# directory):
#   CUSAFE_EXIT_REPEAT   runs of the repeated scenarios (default 50)
#   CUSAFE_EXIT_TIMEOUT  seconds one run may take (default 120)

top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
repeat=${CUSAFE_EXIT_REPEAT:-50}
time_limit=${CUSAFE_EXIT_TIMEOUT:-120}

# What the tests set themselves must not come from the caller.
unset CUSAFE_LEAK_REPORT CUSAFE_LIBRARY

limit=
if command -v timeout >/dev/null 2>&1; then
	limit="timeout $time_limit"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cusafe-exit.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
out=$tmp/stdout
err=$tmp/stderr

npass=0
nfail=0
nskip=0
# Set to the reason when the machine has no GPU; gpu variants then skip.
gpu_missing=
# One more NAME=VALUE for the environment of the scenarios run next.
extra_env=
# Words added to the labels of the scenarios run next ("c": "name (fake,
# c)"), where the caller runs them several ways.
label_extra=

report() { # RESULT LABEL [WHY]
	if test -n "${3:-}"; then
		echo "$1: $2 -- $3"
	else
		echo "$1: $2"
	fi
	case $1 in
	PASS) npass=$((npass + 1)) ;;
	FAIL) nfail=$((nfail + 1)) ;;
	SKIP) nskip=$((nskip + 1)) ;;
	esac
}

# Shows what a failed run printed, indented, in the test's log.
show_output() {
	if test -s "$out"; then
		echo "    --- stdout"
		sed -n '1,40s/^/    /p' "$out"
	fi
	if test -s "$err"; then
		echo "    --- stderr"
		sed -n '1,60s/^/    /p' "$err"
	fi
}

# Words that no run may print: CUDA's complaints, the fake's verdicts, a
# crash.
bad_words='fakecuda|violation|cudaerror|error 4([^0-9]|$)|shutting down|unloading|segmentation fault|aborted|core dumped|dumped core|illegal instruction|bus error'

# check EXPECTED_STATUS STDERR_MODE STDOUT_PATTERN
# Judges the run whose status is in $status and whose output is in $out and
# $err.  Returns 0 (pass), 1 (fail, $why says why) or 2 (the run skipped
# itself with status 77, $why says why).  STDERR_MODE:
#   empty           stderr must be empty
#   traceback:LAST  a Python traceback alone, ending with the line LAST
#   exact:TEXT      stderr is the one line TEXT
#   leaks           only "cusafe: leak: " lines, as many as the handles that
#                   stdout says were left alive ("N live handles")
check() {
	expected=$1
	mode=$2
	pattern=$3
	why=
	if test "$status" = 77 && test "$expected" != 77; then
		why=$(sed -n 's/^SKIP: //p' "$out" | head -n 1)
		test -n "$why" || why="skipped itself (status 77)"
		return 2
	fi
	if test "$status" = 124 && test -n "$limit"; then
		why="timed out after ${time_limit}s"
		return 1
	fi
	if test "$status" != "$expected"; then
		why="exit status $status, expected $expected"
		test "$status" -gt 128 2>/dev/null &&
			why="$why (signal $((status - 128)))"
		return 1
	fi
	case $mode in
	empty)
		if test -s "$err"; then
			why="stderr is not empty"
			return 1
		fi
		;;
	traceback:*)
		last=${mode#traceback:}
		if test "$(head -n 1 "$err")" != "Traceback (most recent call last):"; then
			why="stderr does not start with a traceback"
			return 1
		fi
		if test "$(tail -n 1 "$err")" != "$last"; then
			why="the traceback does not end with '$last'"
			return 1
		fi
		# Between the first and the last line: the traceback's indented
		# frames only.
		if sed '1d;$d' "$err" | grep -v '^  ' >/dev/null; then
			why="stderr holds more than the traceback"
			return 1
		fi
		;;
	exact:*)
		if test "$(cat "$err")" != "${mode#exact:}" ||
			test "$(wc -l <"$err")" -ne 1; then
			why="stderr is not exactly '${mode#exact:}'"
			return 1
		fi
		;;
	leaks)
		n=$(sed -n 's/.* \([0-9][0-9]*\) live handles.*/\1/p' "$out" | head -n 1)
		if test -z "$n"; then
			why="stdout does not say how many handles are alive"
			return 1
		fi
		if grep -v '^cusafe: leak: ' "$err" >/dev/null; then
			why="stderr holds lines other than 'cusafe: leak: ...'"
			return 1
		fi
		got=$(grep -c '^cusafe: leak: ' "$err")
		if test "$got" -ne "$n"; then
			why="$got 'cusafe: leak:' lines for $n live handles"
			return 1
		fi
		;;
	*)
		why="unknown stderr mode $mode"
		return 1
		;;
	esac
	if test "$mode" != leaks && grep -E -i "$bad_words" "$err" >/dev/null; then
		why="stderr holds CUDA, fake or crash messages"
		return 1
	fi
	if test -n "$pattern" && ! grep -E "$pattern" "$out" >/dev/null; then
		why="stdout does not match '$pattern'"
		return 1
	fi
	return 0
}

# run ASSIGNMENT COMMAND...: runs one process with its output in $out and
# $err, its status in $status.  ASSIGNMENT is a NAME=VALUE for its
# environment (or "-"); so is $extra_env, where set.
run() {
	assignment=$1
	shift
	status=0
	test "$assignment" != - || assignment=CUSAFE_EXIT_SCENARIO=1
	# shellcheck disable=SC2086 # limit is a word list
	env "$assignment" ${extra_env:+"$extra_env"} $limit "$@" \
		>"$out" 2>"$err" </dev/null || status=$?
}

# scenario NAME VARIANTS EXPECTED_STATUS STDERR_MODE STDOUT_PATTERN TIMES -- ARGS...
# Runs the scenario TIMES times (each a fresh process) for each of VARIANTS
# ("fake", "gpu" or both), stopping at the first failure.  The caller's
# function variant_command VARIANT ARGS... must print nothing and set
# `cmd_env` (a NAME=VALUE for env, or "-") and `cmd_prefix`: the run is
# `env $cmd_env $cmd_prefix ARGS...`.
scenario() {
	name=$1
	variants=$2
	expected=$3
	mode=$4
	pattern=$5
	times=$6
	shift 7 # the "--" too
	for variant in $variants; do
		label="$name ($variant${label_extra:+, $label_extra})"
		if test "$variant" = gpu && test -n "$gpu_missing"; then
			report SKIP "$label" "$gpu_missing"
			continue
		fi
		variant_command "$variant"
		i=1
		result=PASS
		why=
		while test "$i" -le "$times"; do
			# shellcheck disable=SC2086 # cmd_prefix is a word list
			run "$cmd_env" $cmd_prefix "$@"
			check "$expected" "$mode" "$pattern"
			case $? in
			1)
				result=FAIL
				test "$times" -gt 1 && why="run $i of $times: $why"
				break
				;;
			2)
				result=SKIP
				break
				;;
			esac
			i=$((i + 1))
		done
		if test "$result" = PASS && test "$times" -gt 1; then
			why="$times runs"
		fi
		report "$result" "$label" "$why"
		test "$result" = FAIL && show_output
	done
	return 0
}

finish() {
	echo "$test_name: $npass passed, $nfail failed, $nskip skipped"
	test "$nfail" -eq 0 || exit 1
	test "$npass" -gt 0 || exit 77
	exit 0
}
