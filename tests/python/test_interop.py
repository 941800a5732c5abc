"""The package's interop: DLPack and the CUDA Array Interface with cusafe
alone (tests/exit/interop.py runs them with PyTorch, CuPy and Numba)."""

import array
import gc

import pytest

import cusafe
from conftest import capsule_name as _name, needs_dlpack, stale



@needs_dlpack
def test_array_protocols(ctx):
    buf = cusafe.Buffer.from_host(ctx, array.array("f", range(64)))
    a = buf.as_array("float32", (8, 8))
    cai = a.__cuda_array_interface__
    assert cai["shape"] == (8, 8) and cai["typestr"] == "<f4"
    assert cai["data"] == (buf.interop_pointer(), False)
    assert cai["version"] == 3 and cai["stream"] != 0
    assert a.__dlpack_device__() == (2, 0)
    assert _name(a.__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"
    assert _name(a.__dlpack__()) == b"dltensor"
    with pytest.raises(BufferError):
        a.__dlpack__(copy=True)
    back = cusafe.from_dlpack(a)
    assert back.interop_pointer() == buf.interop_pointer()
    assert back.read() == buf.read()


@needs_dlpack
def test_array_errors(ctx):
    buf = ctx.alloc(64)
    with pytest.raises(ValueError, match="exceeds buffer"):
        buf.as_array("f4", (17,))
    with pytest.raises(ValueError, match="unknown dtype"):
        buf.as_array("q3")
    with pytest.raises(ValueError, match="big-endian"):
        buf.as_array(">f8")
    with pytest.raises(ValueError, match="strides"):
        buf.as_array("f4", (2,), (4, 4))
    with pytest.raises(TypeError, match="neither"):
        cusafe.Buffer.wrap(object())


@needs_dlpack
def test_lent_array_outlives_close(ctx):
    buf = ctx.alloc(64)
    a = buf.as_array("u1")
    h = buf.handle
    a.__cuda_array_interface__
    buf.close()
    a.close()
    gc.collect()
    assert a.closed
    with pytest.raises(ValueError, match="closed"):
        a.__dlpack__()
    del a
    gc.collect()
    assert stale(h)


def test_stream_protocol(ctx):
    s = ctx.stream(non_blocking=True)
    version, raw = s.__cuda_stream__()
    assert version == 0 and raw == s.interop_handle()
    with cusafe.Stream.wrap(s) as w:
        assert w.interop_handle() == raw
    with pytest.raises(TypeError, match="not a CUDA stream"):
        cusafe.Stream.wrap("stream")
