#!/bin/sh
# How Python programs that use cusafe through ctypes (the package in
# python/cusafe) end: each scenario of tests/exit/scenario.py, and the examples
# in examples/python, run in a fresh interpreter against the library built
# with the fake CUDA and against the real one (skipped without a GPU), and
# must end with the expected status and nothing on stderr -- no CUDA error,
# no "fakecuda: VIOLATION", no signal.  All of it runs against both
# implementations of the package: "python" (ctypes alone,
# CUSAFE_PURE_PYTHON=1; labels "name (fake)") and "c" (with the extension
# cusafe._speedups; labels "name (fake, c)").
#
# Environment (set by `make check`):
#   top_srcdir, top_builddir  the source and build trees
#   cusafe_fake_library       the library built with the fake CUDA
#                             (default: $top_builddir/.libs/libcusafe_fake.so)
#   cusafe_real_library       the library built with the CUDA runtime
#                             (default: $top_builddir/.libs/libcusafe.so)
#   PYTHON                    the interpreter (default: python3); without
#                             one the test is skipped (status 77)
#   cusafe_package            the directory holding the package to test
#                             (default: $top_srcdir/python; make
#                             installcheck gives the installed one)
#   cusafe_package_c          the directory of the package with the
#                             extension (make check: the build tree's
#                             stage; make installcheck: the installed
#                             one); unset or empty where it was not built:
#                             the "c" runs are skipped
# and those of tests/exit/common.sh.  Each run gets the library to test in
# CUSAFE_LIBRARY, and the package's directory in PYTHONPATH.
set -u

test_name=exit-python
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
. "$top_srcdir/tests/exit/common.sh"

fake_library=${cusafe_fake_library:-$top_builddir/.libs/libcusafe_fake.so}
real_library=${cusafe_real_library:-$top_builddir/.libs/libcusafe.so}
PYTHON=${PYTHON:-python3}
if ! command -v "$PYTHON" >/dev/null 2>&1; then
	echo "SKIP: all -- no Python interpreter ($PYTHON) found"
	exit 77
fi

python_package=${cusafe_package:-$top_srcdir/python}
c_package=${cusafe_package_c:-}
outer_path=${PYTHONPATH:-}
# No __pycache__ in the source tree (read-only under make distcheck).
PYTHONDONTWRITEBYTECODE=1
export PYTHONDONTWRITEBYTECODE
unset PYTHONWARNINGS

# use_implementation IMPL: the package and environment of "python" or "c".
use_implementation() {
	case $1 in
	python)
		package_dir=$python_package
		CUSAFE_PURE_PYTHON=1
		label_extra=
		;;
	c)
		package_dir=$c_package
		CUSAFE_PURE_PYTHON=
		label_extra=c
		;;
	esac
	PYTHONPATH=$package_dir${outer_path:+:$outer_path}
	export PYTHONPATH CUSAFE_PURE_PYTHON
}
use_implementation python

scen=$top_srcdir/tests/exit/scenario.py
examples=$top_srcdir/examples/python

variant_command() {
	case $1 in
	fake) cmd_env=CUSAFE_LIBRARY=$fake_library ;;
	gpu) cmd_env=CUSAFE_LIBRARY=$real_library ;;
	esac
	cmd_prefix=$PYTHON
}

for f in "$fake_library" "$real_library"; do
	if ! test -f "$f"; then
		report FAIL "setup" "$f not found (run through make check)"
		finish
	fi
done

# The package imported is the one under test, and runs on the
# implementation under test.
check_package() {
	impl=$1
	run "CUSAFE_LIBRARY=$fake_library" "$PYTHON" -c \
		'import cusafe, os; print(os.path.dirname(os.path.dirname(os.path.realpath(cusafe.__file__)))); print(cusafe.implementation())'
	if test "$status" = 0 &&
		test "$(sed -n 1p "$out")" = "$(cd "$package_dir" && pwd -P)" &&
		test "$(sed -n 2p "$out")" = "$impl"; then
		report PASS "package ($package_dir, $impl)"
		return 0
	fi
	report FAIL "package ($impl)" "cusafe was not imported from $package_dir, or does not run on $impl"
	show_output
	return 1
}
check_package python || finish

# Is there a GPU?  Ask the real library once.
run "CUSAFE_LIBRARY=$real_library" "$PYTHON" "$scen" probe
case $status in
0) echo "GPU: $(cat "$out")" ;;
77) gpu_missing=$(sed -n 's/^SKIP: //p' "$out") ;;
*)
	report FAIL "probe (gpu)" "exit status $status"
	show_output
	gpu_missing="the probe failed"
	;;
esac

# Every scenario, against the implementation in use (use_implementation).
scenarios() {
# The binding's structs have the C compiler's layout.
layout_c=$top_builddir/tests/exit_c_fake
if test -x "$layout_c"; then
	run - "$layout_c" layout
	cp "$out" "$tmp/layout-c"
	run "CUSAFE_LIBRARY=$fake_library" "$PYTHON" "$scen" layout
	if test "$status" = 0 && test -s "$tmp/layout-c" &&
		diff "$tmp/layout-c" "$out" >"$tmp/layout-diff" 2>&1; then
		report PASS "layout"
	else
		report FAIL "layout" "the ctypes structs differ from cusafe.h's"
		sed 's/^/    /' "$tmp/layout-diff"
		show_output
	fi
else
	report SKIP "layout" "$layout_c not built"
fi

both="fake gpu"
header=$top_srcdir/include/cusafe.h

#        name               variants status stderr  stdout  times
scenario binding            "$both" 0 empty "functions bound" 1 -- "$scen" binding "$header" \
	"$top_srcdir/include/cusafe_dlpack.h" "${cusafe_dlpack:-no}"
scenario errors             "$both" 0 empty "" 1 -- "$scen" errors
scenario launches           "$both" 0 empty "launches checked" 1 -- "$scen" launches
scenario global             "$both" 0 empty "" 1 -- "$scen" global
scenario cycle              "$both" 0 empty "" 1 -- "$scen" cycle
scenario closure            "$both" 0 empty "" 1 -- "$scen" closure
scenario sys-exit-3         "$both" 3 empty "" 1 -- "$scen" sys-exit-3
scenario exception          "$both" 1 \
	"traceback:RuntimeError: deliberate failure of the exception scenario" \
	"" 1 -- "$scen" exception
# Python ends an uncaught KeyboardInterrupt by killing itself with SIGINT
# (which the shell reports as 130; killed-by-sigint checks the signal).
scenario keyboard-interrupt "$both" 0 traceback:KeyboardInterrupt \
	"^killed by SIGINT$" 1 -- "$scen" killed-by-sigint keyboard-interrupt
scenario sigint             "$both" 0 traceback:KeyboardInterrupt \
	"^killed by SIGINT$" 1 -- "$scen" killed-by-sigint sigint
scenario "sigint, status"   "$both" 130 traceback:KeyboardInterrupt "" 1 -- "$scen" sigint
scenario os-exit            "$both" 0 empty "" 1 -- "$scen" os-exit
scenario shutdown           "$both" 0 empty "" 1 -- "$scen" shutdown
scenario thread             "$both" 0 empty "" "$repeat" -- "$scen" thread
scenario thread-shutdown    "$both" 0 empty "" "$repeat" -- "$scen" thread-shutdown
scenario fork               "$both" 0 empty "" 1 -- "$scen" fork
scenario mp-fork            "$both" 0 empty "" 1 -- "$scen" mp-fork
scenario mp-spawn           "$both" 0 empty "" 1 -- "$scen" mp-spawn
scenario "mp-shared, spawn" "$both" 0 empty "" 1 -- "$scen" mp-shared spawn
scenario "mp-shared, forkserver" "$both" 0 empty "" 1 -- "$scen" mp-shared \
	forkserver
scenario fault              "$both" 0 empty "^fault reported: " 1 -- "$scen" fault
scenario graph-replays      "$both" 0 empty "" 1 -- "$scen" graph-replays
scenario "graph-replays, sys.exit" "$both" 3 empty "" 1 -- \
	"$scen" graph-replays sys-exit-3
# Skipped on a GPU machine of one device.
scenario multi-device       "$both" 0 empty "" 1 -- "$scen" multi-device
scenario cupy-first         gpu     0 empty "" 1 -- "$scen" cupy-first
scenario cusafe-first       gpu     0 empty "" 1 -- "$scen" cusafe-first

# Interop: DLPack, the CUDA Array Interface and the CUDA stream protocol,
# with cusafe alone and with PyTorch and CuPy (where installed), and exits
# with objects of both sides alive.
inter=$top_srcdir/tests/exit/interop.py
failure="traceback:RuntimeError: deliberate failure of the exception scenario"
scenario "interop protocols" "$both" 0 empty "^interop checked$" 1 -- \
	"$inter" protocols
scenario "interop exit"      "$both" 0 empty "" 1 -- "$inter" exit-alive
scenario "interop exit, del" "$both" 0 empty "" 1 -- "$inter" exit-alive del
scenario "interop sys.exit"  "$both" 3 empty "" 1 -- \
	"$inter" exit-alive sys-exit-3
scenario "interop exception" "$both" 1 "$failure" "" 1 -- \
	"$inter" exit-alive exception
scenario "torch roundtrip"   gpu 0 empty "^torch interop checked$" 1 -- \
	"$inter" torch-roundtrip
for how in exit del-torch-first del-cusafe-first; do
	scenario "torch exit, $how" gpu 0 empty "" 1 -- "$inter" torch-exit "$how"
done
scenario "torch sys.exit"    gpu 3 empty "" 1 -- "$inter" torch-exit sys-exit-3
scenario "torch exception"   gpu 1 "$failure" "" 1 -- \
	"$inter" torch-exit exception
scenario "cupy roundtrip"    gpu 0 empty "^cupy interop checked$" 1 -- \
	"$inter" cupy-roundtrip
scenario "numba roundtrip"   gpu 0 empty "^numba interop checked$" 1 -- \
	"$inter" numba-roundtrip
scenario "cupy exit"         gpu 0 empty "" 1 -- "$inter" cupy-exit
scenario "cupy sys.exit"     gpu 3 empty "" 1 -- "$inter" cupy-exit sys-exit-3

# The examples.
scenario vecadd.py          "$both" 0 empty \
	"^vecadd: 1000000 floats, max error 0 on " 1 -- "$examples/vecadd.py"
scenario graph_replay.py    "$both" 0 empty \
	"^graph_replay: 100 replays of 3 kernels over 1048576 floats, 0 wrong, on " \
	1 -- "$examples/graph_replay.py"
scenario leaky_exit.py      "$both" 0 empty \
	"^leaky_exit: exiting with [0-9]+ live handles" 1 -- "$examples/leaky_exit.py"
extra_env=CUSAFE_LEAK_REPORT=1
scenario "leaky_exit.py, CUSAFE_LEAK_REPORT=1" "$both" 0 leaks "" 1 -- \
	"$examples/leaky_exit.py"
extra_env=

scenario torch_interop.py    gpu 0 empty \
	"^torch_interop: 1048576 floats each way, zero-copy, on " 1 -- \
	"$examples/torch_interop.py"
scenario cupy_interop.py     gpu 0 empty \
	"^cupy_interop: 1048576 floats each way, zero-copy, on " 1 -- \
	"$examples/cupy_interop.py"
# One process per GPU; it skips itself (77, "SKIP: <why>") with fewer than
# 2 GPUs, without PyTorch, its NCCL backend or cusafe's DLPack support.
scenario nccl_allreduce.py   gpu 0 empty \
	"^nccl_allreduce: [0-9]+ ranks, 1048576 floats, 0 wrong$" 1 -- \
	"$examples/nccl_allreduce.py"

# Without a driver or device the examples say so in one line.  The fake
# plays the machine: its driver state is set before the first call.
nodriver='import cusafe, runpy, sys
cusafe.library().cdll.fake_set_driver(int(sys.argv[1]))
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")'
for example in vecadd leaky_exit; do
	scenario "$example.py, no driver" fake 1 \
		"exact:cusafe: no CUDA driver found" "" 1 -- \
		-c "$nodriver" 1 "$examples/$example.py"
	scenario "$example.py, no device" fake 1 \
		"exact:cusafe: no CUDA device found" "" 1 -- \
		-c "$nodriver" 2 "$examples/$example.py"
done
}

scenarios
if test -z "$c_package"; then
	report SKIP "all (c)" "cusafe._speedups was not built"
else
	use_implementation c
	check_package c && scenarios
fi

finish
