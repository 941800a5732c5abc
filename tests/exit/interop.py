"""interop.py -- cusafe's memory and streams across the border with other
libraries (DLPack, the CUDA Array Interface, the CUDA stream protocol), and
how programs that mix them end.

    python3 interop.py NAME [ARG]

Run by tests/exit-python.sh as scenario.py is: in a fresh interpreter,
against the fake CUDA and the real runtime, checking the exit status and
stderr.  "protocols" checks the binding's side with cusafe alone (every
machine); the torch-* and cupy-* scenarios need a GPU and that library, and
print "SKIP: <why>" and exit 77 without them.
"""
import array
import ctypes
import gc
import sys
import weakref

import cusafe

N = 1 << 12  # floats per array


def skip(why):
    print("SKIP: %s" % why)
    sys.exit(77)


def is_fake():
    return hasattr(cusafe.library().cdll, "fake_set_sticky_error")


def context():
    try:
        return cusafe.Context(0)
    except cusafe.NoDeviceError as e:
        skip(str(e))


def need_dlpack():
    if "cusafe_buffer_to_dlpack" in cusafe.library().missing:
        skip("libcusafe was built without DLPack")


def expect(cls, text, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except cls as e:
        if text not in str(e):
            raise AssertionError("%r does not say %r" % (e, text)) from e
        return e
    raise AssertionError("%s did not raise %s" % (fn, cls.__name__))


def stale(handle):
    """Whether a handle is no longer live."""
    try:
        cusafe.handle_type(handle)
    except cusafe.CusafeError as e:
        return e.status == cusafe.Status.INVALID_HANDLE
    return False


_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


def floats(buf, n=N):
    out = array.array("f", bytes(4 * n))
    buf.read(out)
    return out


class CAIOnly:
    """An array of another library that speaks only the CUDA Array
    Interface (as Numba's do): its memory is a cusafe buffer it owns."""

    def __init__(self, ctx, n):
        self.owner = ctx.alloc(4 * n)
        self.__cuda_array_interface__ = {
            "shape": (n,), "typestr": "<f4", "version": 3, "strides": None,
            "data": (self.owner.interop_pointer(), False), "stream": None}


# ---- cusafe alone: the protocols, on every machine ------------------------

def protocols():
    need_dlpack()
    ctx = context()
    data = array.array("f", (i * 0.5 for i in range(N)))
    buf = cusafe.Buffer.from_host(ctx, data)
    ptr = buf.interop_pointer()

    # The CUDA Array Interface of an Array.
    a = buf.as_array("float32", (N // 8, 8))
    cai = a.__cuda_array_interface__
    assert cai["shape"] == (N // 8, 8), cai
    assert cai["typestr"] == "<f4", cai
    assert cai["data"] == (ptr, False), cai
    assert cai["strides"] is None and cai["version"] == 3, cai
    assert isinstance(cai["stream"], int) and cai["stream"] != 0, cai
    t = buf.as_array("i8", (2, 3), strides=(8, 16), offset=64)
    assert t.__cuda_array_interface__["strides"] == (8, 16)
    assert t.__cuda_array_interface__["data"][0] == ptr + 64
    t.close()
    assert buf.__cuda_array_interface__["shape"] == (4 * N,)
    assert buf.__cuda_array_interface__["typestr"] == "|u1"
    assert a.__dlpack_device__() == (2, 0), a.__dlpack_device__()
    assert buf.__dlpack_device__() == (2, 0)
    with ctx.alloc(64, cusafe.MEMORY_HOST_PINNED) as pinned:
        assert pinned.__dlpack_device__() == (3, 0)

    # DLPack capsules: versioned when asked for, else legacy; unconsumed
    # ones delete their tensor when collected.
    cap = a.__dlpack__(max_version=(1, 0))
    assert _capsule_name(cap) == b"dltensor_versioned", _capsule_name(cap)
    legacy = a.__dlpack__()
    assert _capsule_name(legacy) == b"dltensor", _capsule_name(legacy)
    del cap, legacy
    expect(BufferError, "not supported", a.__dlpack__, copy=True)
    expect(BufferError, "not (1, 0)", a.__dlpack__, dl_device=(1, 0))
    expect(ValueError, "exceeds buffer", buf.as_array, "f4", (N + 1,))
    expect(ValueError, "unknown dtype", buf.as_array, "q3")
    expect(ValueError, "big-endian", buf.as_array, ">f4")
    expect(ValueError, "not multiples", buf.as_array, "f4", (2,), (6,))

    # cusafe consumes its own export: the same memory, zero-copy.
    back = cusafe.from_dlpack(a)
    assert back.interop_pointer() == ptr and back.size == 4 * N
    assert floats(back) == data
    # The memory outlives every other handle while `back` lives.
    handle = buf.handle
    buf.close()
    a.close()
    assert not stale(handle)
    assert floats(back) == data
    back.close()
    del buf, a, t  # their interfaces were read: the objects hold it
    gc.collect()
    assert stale(handle), "the exported buffer outlived its last tensor"

    # A consumer of the CUDA Array Interface keeps the object it read it
    # from: the memory outlives close() until that object is gone.
    b3 = cusafe.Buffer.from_host(ctx, data)
    h3 = b3.handle
    b3.__cuda_array_interface__
    b3.close()
    gc.collect()
    assert not stale(h3), "a Buffer's interface lost its memory at close()"
    del b3
    gc.collect()
    assert stale(h3), "a Buffer's interface kept its memory after the object"
    b4 = cusafe.Buffer.from_host(ctx, data)
    h4 = b4.handle
    a4 = b4.as_array("f4")
    b4.close()
    a4.__cuda_array_interface__
    a4.close()
    assert a4.closed
    expect(ValueError, "closed", lambda: a4.__cuda_array_interface__)
    gc.collect()
    assert not stale(h4), "an Array's interface lost its memory at close()"
    del a4
    gc.collect()
    assert stale(h4), "an Array's interface kept its memory after the object"

    # An array of the CUDA Array Interface only: the buffer holds the
    # producer object until cusafe gives the memory back.
    obj = CAIOnly(ctx, N)
    obj.owner.write(data)
    alive = weakref.ref(obj)
    w = cusafe.Buffer.wrap(obj)
    assert w.interop_pointer() == obj.owner.interop_pointer()
    del obj
    gc.collect()
    assert alive() is not None, "the producer went while wrapped"
    assert floats(w) == data
    w.close()
    gc.collect()
    assert alive() is None, "the producer outlived the wrapping buffer"
    expect(TypeError, "neither __dlpack__ nor", cusafe.Buffer.wrap, object())

    # Launches take arrays of other libraries directly.
    x = cusafe.Buffer.from_host(ctx, data)
    y = CAIOnly(ctx, N)
    y.owner.write(data)
    out = ctx.alloc(4 * N)
    with cusafe.Module.builtin(ctx) as m, m.kernel("cusafe_vecadd_f32") as k:
        grid, block = k.suggest_config(N)
        k.launch(grid, block, out.as_array("f4"), x.as_array("f4"), y, N)
        got = floats(out)
        assert all(g == 2 * d for g, d in zip(got, data)), got[:4]
        k.prepare(grid, block, out, out, y.owner.as_array("f4"), N)()
    got = floats(out)
    assert all(g == 3 * d for g, d in zip(got, data)), got[:4]

    # The CUDA stream protocol, both ways.
    s = ctx.stream(non_blocking=True)
    version, raw = s.__cuda_stream__()
    assert version == 0 and raw == s.interop_handle() and raw != 0
    again = cusafe.Stream.wrap(s)
    assert again.interop_handle() == raw
    again.close()

    class TorchLike:
        cuda_stream = raw
        device = None

    assert cusafe.Stream.wrap(TorchLike(), ctx).interop_handle() == raw
    if cusafe.device_count() > 1:  # a cusafe Stream names its device
        with cusafe.Context(1) as c1, c1.stream() as s1, \
                cusafe.Stream.wrap(s1) as w1:
            assert w1.context.device == 1
    expect(TypeError, "is not a CUDA stream", cusafe.Stream.wrap, 1.5)
    print("interop checked")


def exit_alive(how="exit"):
    """Exits with every kind of crossing alive: an unconsumed capsule, an
    Array, a buffer over cusafe's own export, a buffer wrapping a CAI
    object, a launch in flight on them."""
    need_dlpack()
    global LIVE
    ctx = context()
    buf = cusafe.Buffer.from_host(ctx, array.array("f", range(N)))
    a = buf.as_array("f4")
    LIVE = [ctx, buf, a, a.__dlpack__(max_version=(1, 0)),
            cusafe.from_dlpack(a), cusafe.Buffer.wrap(CAIOnly(ctx, N))]
    m = cusafe.Module.builtin(ctx)
    k = m.kernel("cusafe_scale_f32")
    k.launch(N // 256, 256, a, cusafe.F32(2.0), N)
    LIVE += [m, k]
    if how == "del":
        del buf, a
        LIVE = LIVE[::-1]
    elif how == "sys-exit-3":
        sys.exit(3)
    elif how == "exception":
        raise RuntimeError("deliberate failure of the exception scenario")


# ---- PyTorch ----------------------------------------------------------------

def torch_or_skip():
    if is_fake():
        skip("PyTorch needs the real CUDA runtime")
    need_dlpack()
    try:
        import torch
    except ImportError:
        skip("PyTorch is not installed")
    if not torch.cuda.is_available():
        skip("PyTorch sees no GPU")
    return torch


def torch_roundtrip():
    torch = torch_or_skip()
    ctx = context()
    m = cusafe.Module.builtin(ctx)
    scale = m.kernel("cusafe_scale_f32")
    # PyTorch's tensor in cusafe: zero-copy, the producer's memory
    # outliving the producer object.
    t = torch.arange(N, dtype=torch.float32, device="cuda")
    ptr = t.data_ptr()
    b = cusafe.from_dlpack(t)
    assert b.interop_pointer() == ptr and b.size == 4 * N
    del t
    gc.collect()
    torch.cuda.empty_cache()
    scale.launch(N // 256, 256, b, cusafe.F32(3.0), N)
    got = floats(b)
    assert all(got[i] == 3.0 * i for i in range(N)), got[:4]
    b.close()
    # cusafe's buffer in PyTorch, zero-copy; the consumer outliving the
    # cusafe handle.
    buf = cusafe.Buffer.from_host(ctx, array.array("f", range(N)))
    view = torch.from_dlpack(buf.as_array("f4", (N // 4, 4)))
    assert view.data_ptr() == buf.interop_pointer()
    assert tuple(view.shape) == (N // 4, 4) and view.dtype == torch.float32
    handle = buf.handle
    buf.close()
    gc.collect()
    # The caller's handle is gone; the tensor's own reference keeps the
    # memory, which PyTorch still computes on.
    assert stale(handle)
    total = float((view * 2).sum())
    assert total == float(N * (N - 1)), total
    del view
    gc.collect()
    torch.cuda.synchronize()
    # torch.as_tensor through the CUDA Array Interface.
    buf = cusafe.Buffer.from_host(ctx, array.array("f", range(N)))
    cai = torch.as_tensor(buf.as_array("f4"), device="cuda")
    assert cai.data_ptr() == buf.interop_pointer()
    assert float(cai[N - 1]) == N - 1
    # A cusafe kernel on PyTorch's stream, after PyTorch's kernels there.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.zeros(N, device="cuda")
        for _ in range(200):  # long enough to race with a wrong order
            x += 1.0
        ws = cusafe.Stream.wrap(torch.cuda.current_stream())
        xb = cusafe.from_dlpack(x, stream=ws)
        scale.launch(N // 256, 256, xb, cusafe.F32(0.5), N, stream=ws)
        y = x * 1.0  # PyTorch after cusafe, on the same stream
    s.synchronize()
    assert float(y.min()) == 100.0 and float(y.max()) == 100.0, \
        (float(y.min()), float(y.max()))
    # A cusafe Stream as a PyTorch stream.
    cs = ctx.stream(non_blocking=True)
    ext = torch.cuda.ExternalStream(cs.interop_handle())
    with torch.cuda.stream(ext):
        z = torch.ones(N, device="cuda") * 4
    ext.synchronize()
    assert float(z.sum()) == 4.0 * N
    print("torch interop checked")


def torch_exit(how="exit"):
    """Exits with torch tensors viewing cusafe memory and cusafe buffers
    wrapping torch memory alive (or deleted in one order or the other)."""
    torch = torch_or_skip()
    global LIVE
    ctx = context()
    buf = cusafe.Buffer.from_host(ctx, array.array("f", range(N)))
    tv = torch.from_dlpack(buf.as_array("f4"))
    t = torch.ones(N, device="cuda")
    bt = cusafe.from_dlpack(t)
    m = cusafe.Module.builtin(ctx)
    k = m.kernel("cusafe_scale_f32")
    k.launch(N // 256, 256, bt, cusafe.F32(2.0), N)
    tv.mul_(3)
    LIVE = [ctx, buf, tv, t, bt, m, k]
    if how == "del-torch-first":
        del tv, t
        LIVE = [ctx, buf, bt, m, k]
    elif how == "del-cusafe-first":
        del buf, bt
        LIVE = [tv, t, ctx, m, k]
    elif how == "sys-exit-3":
        sys.exit(3)
    elif how == "exception":
        raise RuntimeError("deliberate failure of the exception scenario")


# ---- CuPy -------------------------------------------------------------------

def cupy_or_skip():
    if is_fake():
        skip("CuPy needs the real CUDA runtime")
    need_dlpack()
    try:
        import cupy
    except ImportError:
        skip("CuPy is not installed")
    return cupy


def cupy_roundtrip():
    cupy = cupy_or_skip()
    ctx = context()
    m = cusafe.Module.builtin(ctx)
    scale = m.kernel("cusafe_scale_f32")
    buf = cusafe.Buffer.from_host(ctx, array.array("f", range(N)))
    ptr = buf.interop_pointer()
    for x in (cupy.from_dlpack(buf.as_array("f4")),
              cupy.asarray(buf.as_array("f4"))):
        assert x.data.ptr == ptr and x.dtype == cupy.float32
        assert x.shape == (N,)
        assert float(x[N - 1]) == N - 1
    handle = buf.handle
    buf.close()
    assert float(x.sum()) == float(N * (N - 1) // 2)
    del x
    gc.collect()
    cupy.cuda.runtime.deviceSynchronize()
    assert stale(handle), "cusafe's buffer outlived CuPy's arrays"
    # CuPy's arrays in cusafe, both protocols.
    c = cupy.arange(N, dtype=cupy.float32)
    for b in (cusafe.from_dlpack(c), cusafe.Buffer.wrap(c)):
        assert b.interop_pointer() == c.data.ptr
        scale.launch(N // 256, 256, b, cusafe.F32(2.0), N)
        b.close()
    assert float(c[N - 1]) == 4.0 * (N - 1)
    # A cusafe Stream in CuPy (the CUDA stream protocol).
    cs = ctx.stream(non_blocking=True)
    ext = cupy.cuda.Stream.from_external(cs)
    assert ext.ptr == cs.interop_handle()
    with ext:
        d = cupy.ones(N, dtype=cupy.float32) * 5
    ext.synchronize()
    assert float(d.sum()) == 5.0 * N
    print("cupy interop checked")


def cupy_exit(how="exit"):
    cupy = cupy_or_skip()
    global LIVE
    ctx = context()
    buf = cusafe.Buffer.from_host(ctx, array.array("f", range(N)))
    cv = cupy.from_dlpack(buf.as_array("f4"))
    c = cupy.ones(N, dtype=cupy.float32)
    bc = cusafe.from_dlpack(c)
    m = cusafe.Module.builtin(ctx)
    k = m.kernel("cusafe_scale_f32")
    k.launch(N // 256, 256, bc, cusafe.F32(2.0), N)
    cv *= 3
    LIVE = [ctx, buf, cv, c, bc, m, k]
    if how == "sys-exit-3":
        sys.exit(3)


# ---- Numba -------------------------------------------------------------------

def numba_roundtrip():
    if is_fake():
        skip("Numba needs the real CUDA runtime")
    need_dlpack()
    try:
        from numba import cuda
    except ImportError:
        skip("Numba is not installed")
    ctx = context()
    buf = cusafe.Buffer.from_host(ctx, array.array("f", range(N)))
    d = cuda.as_cuda_array(buf.as_array("f4"))
    assert d.device_ctypes_pointer.value == buf.interop_pointer()
    assert d.shape == (N,) and d.copy_to_host()[N - 1] == N - 1
    w = cusafe.Buffer.wrap(d)
    assert w.interop_pointer() == buf.interop_pointer()
    print("numba interop checked")


SCENARIOS = {
    "numba-roundtrip": numba_roundtrip,
    "protocols": protocols,
    "exit-alive": exit_alive,
    "torch-roundtrip": torch_roundtrip,
    "torch-exit": torch_exit,
    "cupy-roundtrip": cupy_roundtrip,
    "cupy-exit": cupy_exit,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in SCENARIOS:
        sys.exit("usage: interop.py {%s} [ARG]" % ",".join(SCENARIOS))
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
