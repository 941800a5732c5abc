#!/usr/bin/env python3
"""cupy_interop.py -- CuPy arrays and cusafe buffers, zero-copy, both ways,
with each side's lifetimes kept.

A CuPy array goes to cusafe (cusafe.from_dlpack), a cusafe kernel scales
it, and CuPy reads the result; then a cusafe buffer goes to CuPy
(cupy.asarray through the CUDA Array Interface, and cupy.from_dlpack),
CuPy adds to it on a cusafe stream (the CUDA stream protocol), and cusafe
reads it back.  The addresses are compared: nothing is copied.  The
script exits with objects of both libraries alive.

    CUSAFE_LIBRARY=/path/to/libcusafe.so python3 cupy_interop.py

Exit status: 0 when every value is right, 1 when CuPy, a GPU or cusafe's
DLPack support is missing (one line on stderr says which), 2 on any other
failure.
"""
import array
import sys

import cusafe

N = 1 << 20


def main():
    try:
        import cupy
    except ImportError:
        print("cupy_interop: CuPy is not installed", file=sys.stderr)
        return 1
    global KEEP
    ctx = cusafe.Context(cupy.cuda.Device().id)
    scale = cusafe.Module.builtin(ctx).kernel("cusafe_scale_f32")

    # CuPy -> cusafe -> CuPy.
    c = cupy.arange(N, dtype=cupy.float32)
    b = cusafe.from_dlpack(c)
    same = b.interop_pointer() == c.data.ptr
    scale.launch(N // 256, 256, b, cusafe.F32(2.0), N)
    total = float(c.sum(dtype=cupy.float64))
    if not same or total != float(N) * (N - 1):
        print("cupy_interop: array in cusafe: same memory %s, sum %g"
              % (same, total), file=sys.stderr)
        return 2

    # cusafe -> CuPy -> cusafe, CuPy working on a cusafe stream.
    stream = ctx.stream(non_blocking=True)
    buf = cusafe.Buffer.from_host(ctx, array.array("f", [1.0]) * N)
    with cupy.cuda.Stream.from_external(stream):
        x = cupy.asarray(buf.as_array("f4", stream=stream))
        y = cupy.from_dlpack(buf.as_array("f4", (N // 1024, 1024)))
        same = x.data.ptr == y.data.ptr == buf.interop_pointer()
        x += 20.0
        y += 21.0
    stream.synchronize()
    back = array.array("f", bytes(4 * N))
    buf.read(back)
    if not same or min(back) != 42.0 or max(back) != 42.0:
        print("cupy_interop: buffer in CuPy: same memory %s, values %g..%g"
              % (same, min(back), max(back)), file=sys.stderr)
        return 2

    print("cupy_interop: %d floats each way, zero-copy, on device %d"
          % (N, ctx.device))
    # Left alive at exit, on purpose.
    scale.launch(N // 256, 256, b, cusafe.F32(0.5), N)
    KEEP = (ctx, scale, stream, c, b, buf, x, y)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cusafe.NoDeviceError as e:
        print("cusafe: %s" % e, file=sys.stderr)
        sys.exit(1)
    except cusafe.CusafeError as e:
        if e.status == cusafe.Status.NOT_SUPPORTED:
            print("cupy_interop: %s" % e.message, file=sys.stderr)
            sys.exit(1)
        raise
