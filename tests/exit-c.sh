#!/bin/sh
# How C programs that use cusafe end: each scenario of tests/exit_c.c, and
# examples/c/leaky_exit.c, run in a fresh process, linked with the fake CUDA
# (tests/exit_c_fake, tests/leaky_exit_fake) and with the real runtime
# (tests/exit_c_gpu, tests/leaky_exit_gpu; skipped without a GPU), and must
# end with the expected status and nothing on stderr -- no CUDA error, no
# "fakecuda: VIOLATION", no signal.
#
# Environment (set by `make check`): top_srcdir, top_builddir, and those of
# tests/exit/common.sh.
set -u

test_name=exit-c
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
. "$top_srcdir/tests/exit/common.sh"

program=exit_c
variant_command() {
	case $1 in
	fake) cmd_prefix=$top_builddir/tests/${program}_fake ;;
	gpu) cmd_prefix=$top_builddir/tests/${program}_gpu ;;
	esac
	cmd_env=-
}

for p in exit_c_fake exit_c_gpu leaky_exit_fake leaky_exit_gpu; do
	if ! test -x "$top_builddir/tests/$p"; then
		report FAIL "setup" "$top_builddir/tests/$p not built (run through make check)"
		finish
	fi
done

# Is there a GPU?  Ask the real library once.
run - "$top_builddir/tests/exit_c_gpu" probe
case $status in
0) echo "GPU: $(cat "$out")" ;;
77) gpu_missing="no CUDA driver or device" ;;
*)
	report FAIL "probe (gpu)" "exit status $status"
	show_output
	gpu_missing="the probe failed"
	;;
esac

both="fake gpu"

#        name          variants status stderr stdout times
scenario live          "$both" 0 empty "^live: exiting with 8 live handles" 1 -- live
extra_env=CUSAFE_LEAK_REPORT=1
scenario "live, CUSAFE_LEAK_REPORT=1" "$both" 0 leaks "" 1 -- live
extra_env=
scenario exit3         "$both" 3 empty "" 1 -- exit3
scenario _exit         "$both" 0 empty "" 1 -- _exit
scenario shutdown      "$both" 0 empty "" 1 -- shutdown
scenario thread        "$both" 0 empty "" "$repeat" -- thread
scenario thread-shutdown "$both" 0 empty "" "$repeat" -- thread-shutdown
scenario fork          "$both" 0 empty "" 1 -- fork
scenario fault         "$both" 0 empty "^fault reported: " 1 -- fault
scenario atexit-before "$both" 0 empty "" 1 -- atexit-before
scenario graph-replays "$both" 0 empty \
	"^graph-replays: exiting with 100 replays queued and a capture open$" 1 -- \
	graph-replays
scenario devices       "$both" 0 empty \
	"^devices: exiting with work queued on [0-9]+ devices$" 1 -- devices

# The example examples/c/leaky_exit.c.
program=leaky_exit
scenario leaky_exit    "$both" 0 empty \
	"^leaky_exit: exiting with [0-9]+ live handles" 1 --
extra_env=CUSAFE_LEAK_REPORT=1
scenario "leaky_exit, CUSAFE_LEAK_REPORT=1" "$both" 0 leaks "" 1 --
extra_env=

# The example examples/c/dlpack_tensor.c, where the library has DLPack.
if test "${cusafe_dlpack:-no}" = yes; then
	program=dlpack_tensor
	scenario dlpack_tensor "$both" 0 empty \
		"^dlpack_tensor: 4 x 256 floats verified; matlib's memory went back 1 time$" 1 --
fi

finish
