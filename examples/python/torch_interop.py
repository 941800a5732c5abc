#!/usr/bin/env python3
"""torch_interop.py -- PyTorch tensors and cusafe buffers, zero-copy, both
ways, with each side's lifetimes kept.

A PyTorch tensor goes to cusafe (cusafe.from_dlpack), a cusafe kernel
scales it on PyTorch's current stream, and PyTorch reads the result; then a
cusafe buffer goes to PyTorch (torch.from_dlpack of buf.as_array), PyTorch
adds to it, and cusafe reads it back.  The addresses are compared: nothing
is copied.  The script exits with objects of both libraries alive, which
is fine: each holds what it needs of the other.

    CUSAFE_LIBRARY=/path/to/libcusafe.so python3 torch_interop.py

Exit status: 0 when every value is right, 1 when PyTorch, a GPU or
cusafe's DLPack support is missing (one line on stderr says which), 2 on
any other failure.
"""
import array
import sys

import cusafe

N = 1 << 20


def main():
    try:
        import torch
    except ImportError:
        print("torch_interop: PyTorch is not installed", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("torch_interop: PyTorch sees no GPU", file=sys.stderr)
        return 1
    global KEEP
    ctx = cusafe.Context(torch.cuda.current_device())
    scale = cusafe.Module.builtin(ctx).kernel("cusafe_scale_f32")
    stream = cusafe.Stream.wrap(torch.cuda.current_stream())

    # PyTorch -> cusafe -> PyTorch: the kernel runs on PyTorch's stream,
    # after PyTorch's arange and before its sum.
    t = torch.arange(N, dtype=torch.float32, device="cuda")
    b = cusafe.from_dlpack(t, stream=stream)
    same = b.interop_pointer() == t.data_ptr()
    scale.launch(N // 256, 256, b, cusafe.F32(2.0), N, stream=stream)
    total = float(t.double().sum())
    if not same or total != float(N) * (N - 1):
        print("torch_interop: tensor in cusafe: same memory %s, sum %g"
              % (same, total), file=sys.stderr)
        return 2

    # cusafe -> PyTorch -> cusafe.
    buf = cusafe.Buffer.from_host(ctx, array.array("f", [1.0]) * N)
    u = torch.from_dlpack(buf.as_array("float32", (N // 1024, 1024)))
    same = u.data_ptr() == buf.interop_pointer()
    u += 41.0
    torch.cuda.current_stream().synchronize()
    back = array.array("f", bytes(4 * N))
    buf.read(back)
    if not same or min(back) != 42.0 or max(back) != 42.0:
        print("torch_interop: buffer in PyTorch: same memory %s, values "
              "%g..%g" % (same, min(back), max(back)), file=sys.stderr)
        return 2

    print("torch_interop: %d floats each way, zero-copy, on %s"
          % (N, torch.cuda.get_device_name()))
    # Left alive at exit, on purpose: tensors over cusafe memory, cusafe
    # buffers over PyTorch memory, and queued work.
    scale.launch(N // 256, 256, b, cusafe.F32(0.5), N, stream=stream)
    KEEP = (ctx, scale, stream, t, b, buf, u)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cusafe.NoDeviceError as e:
        print("cusafe: %s" % e, file=sys.stderr)
        sys.exit(1)
    except cusafe.CusafeError as e:
        if e.status == cusafe.Status.NOT_SUPPORTED:
            print("torch_interop: %s" % e.message, file=sys.stderr)
            sys.exit(1)
        raise
