#!/bin/sh
# The NCCL example, examples/c/nccl_allreduce.c (tests/nccl_allreduce,
# built where configure found NCCL): an all-reduce over every GPU, one
# thread each, on cusafe buffers and streams.  It must exit 0, say
# "0 wrong" in its summary line and print nothing on stderr.  Skipped
# without NCCL, without a CUDA driver or device, and with fewer than
# 2 GPUs (the example then exits 77 and says why).
#
# Environment (set by `make check`): top_srcdir, top_builddir, cusafe_nccl
# (yes where configure found NCCL), and those of tests/exit/common.sh.
set -u

test_name=nccl
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
. "$top_srcdir/tests/exit/common.sh"

name=nccl_allreduce
if test "${cusafe_nccl:-no}" != yes; then
	echo "SKIP: $name: configure found no NCCL (see ./configure --help, --with-nccl)"
	exit 77
fi
program=$top_builddir/tests/nccl_allreduce
if ! test -x "$program"; then
	report FAIL "$name" "$program not built (run through make check)"
	finish
fi

# NVLink multicast stays off here whatever the caller's environment says.
run NCCL_NVLS_ENABLE=0 "$program"
check 0 empty "^$name: [0-9]+ GPUs, [0-9]+ floats, 0 wrong$"
case $? in
0)
	sed 's/^/    /' "$out"
	report PASS "$name"
	;;
2)
	echo "SKIP: $name: $why"
	exit 77
	;;
*)
	report FAIL "$name" "$why"
	show_output
	;;
esac
finish
