#!/usr/bin/env python3
"""myext.py -- call a user's CUDA library on cusafe (libmyext.so) from Python.

libmyext takes cusafe handles: this script passes the handles of
cusafe.Buffer and cusafe.Stream objects, checks every element of the
result, shows cusafe's error for wrong handles, and exits with its objects
still alive (cusafe's exit handler destroys them, libmyext's kernel too).

    python3 myext.py [path/to/libmyext.so]

Default library: $MYEXT_LIBRARY, else libmyext.so in the current directory,
else next to this script, else through the dynamic linker's search path.
cusafe is found as `import cusafe` always finds it (CUSAFE_LIBRARY, ...).

x comes from CuPy where CuPy is installed: cusafe.from_dlpack wraps the
CuPy array's device memory, zero-copy, and keeps it alive.  from_dlpack
takes CUDA memory only -- a NumPy array lives in host memory, which it
refuses with INVALID_VALUE (shown below) -- so without CuPy, x is copied
from the host (NumPy or array.array) into a cusafe buffer.

Exit status: 0 when every element is right, 1 when the machine has no
CUDA driver or device (one line on stderr says which), 2 on any other
failure.
"""
import array
import ctypes
import os
import sys

import cusafe

N = 1 << 20
A = 2.5


def load_myext(argv):
    """libmyext, bound to the libcusafe that the cusafe package loaded."""
    # One process, one cusafe.  The package's library is loaded first, so
    # that libmyext's dependency libcusafe.so.0 is that library (the
    # dynamic linker takes an object already loaded under that soname, or
    # from the same file) and not a second copy with handles of its own.
    cusafe_lib = cusafe.library()
    here = os.path.dirname(os.path.abspath(__file__))
    if len(argv) > 1:
        names = [argv[1]]
    elif os.environ.get("MYEXT_LIBRARY"):
        names = [os.environ["MYEXT_LIBRARY"]]
    else:
        names = [p for p in (os.path.abspath("libmyext.so"),
                             os.path.join(here, "libmyext.so"))
                 if os.path.exists(p)] + ["libmyext.so"]
    try:
        lib = ctypes.CDLL(names[0])
    except OSError as e:
        raise OSError("cannot load %s: %s (with the cusafe package's %s)"
                      % (names[0], e, cusafe_lib.path)) from None
    # libmyext's cusafe_version_string (looked up in its own dependencies)
    # must be the package's.
    ours = ctypes.cast(cusafe_lib.cdll.cusafe_version_string, ctypes.c_void_p)
    theirs = ctypes.cast(lib.cusafe_version_string, ctypes.c_void_p)
    if ours.value != theirs.value:
        raise OSError("%s uses another libcusafe than the cusafe package (%s);"
                      " load the same file, or one of the same soname"
                      % (names[0], cusafe_lib.path))
    # Handles are 64-bit: never leave them to ctypes' default int.
    lib.myext_saxpy.argtypes = [ctypes.c_uint64, ctypes.c_uint64,
                                ctypes.c_uint64, ctypes.c_float,
                                ctypes.c_size_t]
    lib.myext_saxpy.restype = ctypes.c_int
    lib.myext_last_error_message.argtypes = []
    lib.myext_last_error_message.restype = ctypes.c_char_p
    return lib


def saxpy(lib, stream, y, x, a, n):
    """Calls myext_saxpy with raw handles; returns (status, message)."""
    status = lib.myext_saxpy(stream, y, x, a, n)
    message = lib.myext_last_error_message().decode() if status else ""
    return cusafe.Status(status), message


def expect_error(lib, what, want, *args):
    status, message = saxpy(lib, *args)
    if status != want:
        raise SystemExit("myext: %s gave %s, expected %s (%s)"
                         % (what, status.name, want.name, message))
    print("myext: %s -> %s: %s" % (what, status.name, message))


def main(argv):
    lib = load_myext(argv)
    ctx = cusafe.Context(0)
    stream = ctx.stream()

    # Values whose products and sums are exact in float: the device's
    # result must equal the host's bit for bit.
    x_values = [float(i % 1024) for i in range(N)]
    y_values = [float(i % 7) - 3.0 for i in range(N)]
    try:
        import cupy  # type: ignore[import-not-found]
    except ImportError:
        cupy = None
    if cupy is not None:
        x_array = cupy.asarray(x_values, dtype=cupy.float32)
        x = cusafe.from_dlpack(x_array, ctx, stream)
        source = "CuPy array, through cusafe.from_dlpack (zero-copy)"
    else:
        try:
            import numpy
        except ImportError:
            numpy = None
        if numpy is not None:
            host = numpy.asarray(x_values, dtype=numpy.float32)
            try:
                cusafe.from_dlpack(host, ctx)
                raise SystemExit("myext: from_dlpack took host memory")
            except cusafe.CusafeError as e:
                print("myext: cusafe.from_dlpack(numpy array) -> %s "
                      "(host memory), so x is copied" % e)
            source = "NumPy array, copied"
        else:
            host = array.array("f", x_values)
            source = "array.array, copied"
        x = cusafe.Buffer.from_host(ctx, host)
    y = cusafe.Buffer.from_host(ctx, array.array("f", y_values))

    status, message = saxpy(lib, stream.handle, y.handle, x.handle, A, N)
    if status != cusafe.Status.SUCCESS:
        lib_error = cusafe.CusafeError(status, message, 0)
        if status in (cusafe.Status.NO_DRIVER, cusafe.Status.NO_DEVICE):
            raise cusafe.NoDeviceError(status, message, 0)
        raise lib_error
    result = array.array("f", bytes(4 * N))
    y.read(result)  # cusafe orders the read after the kernel
    for i, (got, xi, yi) in enumerate(zip(result, x_values, y_values)):
        if got != A * xi + yi:
            raise SystemExit("myext: y[%d] is %r, expected %r"
                             % (i, got, A * xi + yi))
    print("myext: %d elements of y = %g * x + y verified (x: %s) on %s"
          % (N, A, source, ctx.properties.device_name))

    # Wrong handles come back as cusafe's status and message, not a crash.
    Status = cusafe.Status
    expect_error(lib, "a stream where a buffer belongs",
                 Status.INVALID_HANDLE, stream.handle, stream.handle,
                 x.handle, A, N)
    gone = ctx.alloc(4 * N)
    stale = gone.handle
    gone.close()
    expect_error(lib, "a released buffer", Status.INVALID_HANDLE,
                 stream.handle, stale, x.handle, A, N)
    expect_error(lib, "a forged handle", Status.INVALID_HANDLE,
                 stream.handle, y.handle, 0x1234567890abcdef, A, N)
    expect_error(lib, "a buffer where the stream belongs",
                 Status.INVALID_HANDLE, y.handle, y.handle, x.handle, A, N)
    expect_error(lib, "more elements than the buffers hold",
                 Status.OUT_OF_RANGE, stream.handle, y.handle, x.handle, A,
                 N + 1)
    with y.view(2, 4 * 16) as misaligned:
        expect_error(lib, "a view that starts between two floats",
                     Status.INVALID_VALUE, stream.handle, misaligned.handle,
                     x.handle, A, 8)

    # ctx, stream, x, y and libmyext's kernel stay alive: cusafe destroys
    # them at exit, in order, before the CUDA runtime's own teardown.
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except cusafe.NoDeviceError as e:
        what = "driver" if e.status == cusafe.Status.NO_DRIVER else "device"
        print("cusafe: no CUDA %s found" % what, file=sys.stderr)
        sys.exit(1)
    except (cusafe.CusafeError, cusafe.LibraryNotFoundError, OSError) as e:
        print("myext: %s" % e, file=sys.stderr)
        sys.exit(2)
