#!/bin/sh
# The MPI example, examples/c/nccl_mpi.c (tests/nccl_mpi, built where
# configure found NCCL and MPI): an all-reduce across two processes, one
# GPU each, NCCL bootstrapped by MPI, on cusafe buffers and streams, run
# with `$MPIRUN -np 2`.  It must exit 0, rank 0 must say "0 wrong", and
# nothing may reach stderr.  Skipped without NCCL or MPI, without a CUDA
# driver or device, and with fewer than 2 GPUs (the example then exits 77
# on every rank and says why).
#
# Environment (set by `make check`): top_srcdir, top_builddir, cusafe_mpi
# (yes where configure found NCCL and MPI), MPIRUN, and those of
# tests/exit/common.sh.
set -u

test_name=nccl-mpi
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
. "$top_srcdir/tests/exit/common.sh"

name=nccl_mpi
if test "${cusafe_mpi:-no}" != yes; then
	echo "SKIP: $name: configure found no MPI and NCCL (see ./configure --help, MPICC, --with-nccl)"
	exit 77
fi
program=$top_builddir/tests/nccl_mpi
if ! test -x "$program"; then
	report FAIL "$name" "$program not built (run through make check)"
	finish
fi

# Open MPI refuses to start as root unless told (containers, CI); NVLink
# multicast stays off.
run OMPI_ALLOW_RUN_AS_ROOT=1 env OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	NCCL_NVLS_ENABLE=0 "${MPIRUN:-mpirun}" -np 2 "$program"
if test "$status" != 0 && grep -q '^SKIP: ' "$out"; then
	# mpirun reports a rank's status 77 as its own, with a notice.
	status=77
fi
check 0 empty "^$name: 2 ranks on [0-9]+ hosts?, [0-9]+ floats, 0 wrong$"
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
