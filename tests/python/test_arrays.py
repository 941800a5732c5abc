"""Interop in detail: Array (dtypes, shapes, strides, offsets, streams),
DLPack out and in, the CUDA Array Interface in, the CUDA stream protocol
and Stream.wrap, Stream.use_buffers."""

import ctypes
import gc
import weakref

import pytest

import cusafe
from conftest import (capsule_name as _name, fake, needs_dlpack,
                      needs_fake, run_python, stale)



@pytest.fixture
def buf(ctx):
    with cusafe.Buffer.from_host(ctx, bytes(range(64))) as b:
        yield b


# --------------------------------------------------------------------------
# Array: dtypes, shapes, strides, offsets.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, typestr", [
    ("b1", "|b1"), ("i1", "|i1"), ("u1", "|u1"), ("i2", "<i2"),
    ("u2", "<u2"), ("i4", "<i4"), ("u4", "<u4"), ("i8", "<i8"),
    ("u8", "<u8"), ("f2", "<f2"), ("f4", "<f4"), ("f8", "<f8"),
    ("c8", "<c8"), ("c16", "<c16"), ("<f4", "<f4"), ("=i4", "<i4"),
    ("|u1", "|u1"), (">u1", "|u1"), ("<u1", "|u1"),
    ("bool", "|b1"), ("int8", "|i1"), ("uint8", "|u1"), ("int16", "<i2"),
    ("uint16", "<u2"), ("int32", "<i4"), ("uint32", "<u4"),
    ("int64", "<i8"), ("uint64", "<u8"), ("float16", "<f2"),
    ("float32", "<f4"), ("float64", "<f8"), ("complex64", "<c8"),
    ("complex128", "<c16"), ("half", "<f2"), ("double", "<f8"),
    ("int", "<i8"),
])
def test_dtypes(buf, dtype, typestr):
    a = buf.as_array(dtype)
    assert a.dtype == typestr
    itemsize = int(typestr[2:])
    assert a.shape == (64 // itemsize,) and a.strides is None
    assert a.__cuda_array_interface__["typestr"] == typestr


class NumpyLikeDtype:
    """What as_array reads of a NumPy dtype: its `str`."""

    def __init__(self, text):
        self.str = text


def test_dtype_objects(buf):
    assert buf.as_array(NumpyLikeDtype("<f8")).dtype == "<f8"
    assert buf.as_array(NumpyLikeDtype("|b1")).shape == (64,)
    with pytest.raises(TypeError, match="dtype must be a type string"):
        buf.as_array(4)
    with pytest.raises(TypeError, match="dtype must be a type string"):
        buf.as_array(None)


@pytest.mark.parametrize("dtype, typestr", [
    ("float", "<f8"), ("byte", "|i1"), (float, "<f8"), (int, "<i8"),
    (bool, "|b1")], ids=["'float'", "'byte'", "float", "int", "bool"])
def test_numpy_type_names(buf, dtype, typestr):
    """Names and Python types mean what they mean to NumPy, as
    Buffer.as_array says: numpy.dtype("float") and numpy.dtype(float)
    are float64, numpy.dtype("byte") is int8."""
    assert buf.as_array(dtype).dtype == typestr


@pytest.mark.parametrize("dtype", ["q3", "f3", "i", "x4", "f32", "", "u0"])
def test_unknown_dtypes(buf, dtype):
    with pytest.raises(ValueError, match="unknown dtype"):
        buf.as_array(dtype)


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">c8"])
def test_big_endian_dtypes(buf, dtype):
    with pytest.raises(ValueError, match="is big-endian"):
        buf.as_array(dtype)


def test_shapes_strides_and_offsets(buf):
    a = buf.as_array("f4", (4, 4))
    assert (a.shape, a.strides) == ((4, 4), None)
    assert buf.as_array("u1", 8).shape == (8,)
    assert buf.as_array("f4", (2, 2), (8, 4)).strides is None  # C order
    assert buf.as_array("f4", (2, 2), (4, 8)).strides == (4, 8)
    assert buf.as_array("u1", offset=60).shape == (4,)
    assert buf.as_array("f4", offset=62).shape == (0,)
    assert buf.as_array("u1", offset=64).shape == (0,)
    assert buf.as_array("u1", ()).shape == ()
    empty = buf.as_array("f8", (0, 5))
    cai = empty.__cuda_array_interface__
    assert cai["shape"] == (0, 5) and cai["data"] == (0, False)
    base = buf.interop_pointer()
    rev = buf.as_array("u1", (4,), (-1,), offset=3)
    assert rev.__cuda_array_interface__["data"] == (base + 3, False)
    assert rev.__cuda_array_interface__["strides"] == (-1,)
    cai = buf.as_array("i2", (2, 3), offset=8).__cuda_array_interface__
    assert cai == {"shape": (2, 3), "typestr": "<i2",
                   "data": (base + 8, False), "strides": None,
                   "version": 3, "stream": 1}


def test_shape_and_stride_errors(buf):
    for shape, strides, offset, text in (
            ((17,), None, 0, "array of bytes [0, 68) at offset 0 exceeds "
                             "buffer of 64 bytes"),
            ((4,), None, 61, "array of bytes [0, 16) at offset 61 exceeds "
                             "buffer of 64 bytes"),
            ((4,), (-4,), 8, "array of bytes [-12, 4) at offset 8 exceeds "
                             "buffer of 64 bytes"),
            ((2, 2), (64, 4), 0, "array of bytes [0, 72) at offset 0 "
                                 "exceeds buffer of 64 bytes"),
            ((-1,), None, 0, "shape (-1,): at most 64 dimensions"),
            ((1,) * 65, None, 0, "at most 64 dimensions"),
            ((2,), (4, 4), 0, "2 strides for 1 dimensions"),
            ((2,), (6,), 0, "strides (6,) are not multiples of the element "
                            "size 4"),
            (None, None, 65, "offset 65 is outside the buffer of 64 bytes"),
            (None, None, -1, "offset -1 is outside the buffer of 64 "
                             "bytes")):
        with pytest.raises(ValueError) as e:
            buf.as_array("f4", shape, strides, offset)
        assert text in str(e.value)
    buf.as_array("u1", (1,) * 64)


def test_array_streams(ctx, buf):
    s = ctx.stream(non_blocking=True)
    assert buf.as_array(stream=s).__cuda_array_interface__["stream"] == \
        s.interop_handle()
    assert buf.as_array().__cuda_array_interface__["stream"] == 1
    assert buf.as_array(stream=1).__cuda_array_interface__["stream"] == 1
    assert buf.as_array(stream=2).__cuda_array_interface__["stream"] == 2
    raw = s.interop_handle()
    assert buf.as_array(stream=raw).__cuda_array_interface__["stream"] == raw
    with pytest.raises(TypeError, match="str is not a CUDA stream"):
        buf.as_array(stream="default")
    s.close()
    with pytest.raises(ValueError, match="this cusafe.Stream is closed"):
        buf.as_array(stream=s)


def test_array_repr_and_closed(buf):
    a = buf.as_array("f4", (4, 4))
    assert repr(a) == "<cusafe.Array <f4 (4, 4) of buffer 0x%016x>" % \
        buf.handle
    assert not a.closed
    a.close()
    assert a.closed and repr(a) == "<cusafe.Array closed>"
    assert (a.dtype, a.shape, a.strides) == ("<f4", (4, 4), None)
    for call in (a.__dlpack__, a.__dlpack_device__,
                 lambda: a.__cuda_array_interface__):
        with pytest.raises(ValueError, match="this cusafe.Array is closed"):
            call()


def test_arrays_of_views_and_other_memory(ctx):
    pinned = ctx.alloc(64, cusafe.Memory.HOST_PINNED)
    managed = ctx.alloc(64, cusafe.Memory.MANAGED)
    assert pinned.__dlpack_device__() == (3, 0)
    assert pinned.as_array().__dlpack_device__() == (3, 0)
    assert managed.__dlpack_device__() == (13, 0)
    assert managed.as_array("f4").__dlpack_device__() == (13, 0)
    b = ctx.alloc(64)
    v = b.view(16, 32)
    assert v.__dlpack_device__() == (2, 0)
    assert v.as_array().__cuda_array_interface__["data"] == \
        (b.interop_pointer() + 16, False)
    assert v.__cuda_array_interface__["shape"] == (32,)


# --------------------------------------------------------------------------
# DLPack out and back in.
# --------------------------------------------------------------------------


@needs_dlpack
def test_dlpack_export_options(ctx, buf):
    a = buf.as_array("f4", (4, 4))
    assert _name(a.__dlpack__()) == b"dltensor"
    assert _name(a.__dlpack__(max_version=(0, 8))) == b"dltensor"
    assert _name(a.__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"
    assert _name(a.__dlpack__(max_version=(1, 3))) == b"dltensor_versioned"
    assert _name(a.__dlpack__(stream=-1)) == b"dltensor"
    assert _name(a.__dlpack__(stream=1)) == b"dltensor"
    consumer = ctx.stream()  # must outlive the tensor
    assert _name(a.__dlpack__(stream=consumer.interop_handle())) == \
        b"dltensor"
    assert _name(a.__dlpack__(dl_device=(2, 0), copy=False)) == b"dltensor"
    with pytest.raises(BufferError, match="copy=True is not supported"):
        a.__dlpack__(copy=True)
    with pytest.raises(BufferError) as e:
        a.__dlpack__(dl_device=(1, 0))
    assert str(e.value) == "the array is on DLPack device (2, 0), not (1, 0)"
    assert _name(buf.__dlpack__()) == b"dltensor"
    assert _name(buf.__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"
    with pytest.raises(BufferError):
        buf.__dlpack__(copy=True)


@needs_dlpack
def test_dlpack_round_trips(ctx, buf):
    base = buf.interop_pointer()
    for a, lo, size in ((buf.as_array("f4", (4, 4)), 0, 64),
                        (buf.as_array("f4", (4,), (8,)), 0, 28),
                        (buf.as_array("u1", (4,), (-1,), offset=3), 0, 4),
                        (buf.as_array("i2", (3,), offset=10), 10, 6),
                        (buf.view(32, 32), 32, 32)):
        back = cusafe.from_dlpack(a)
        assert back.interop_pointer() == base + lo
        assert back.size == size and back.memory == cusafe.Memory.DEVICE
        assert bytes(back.read()) == bytes(range(lo, lo + size))
        assert back.context.device == 0
    pinned = cusafe.Buffer.from_host(ctx, b"p" * 16,
                                     cusafe.Memory.HOST_PINNED)
    assert cusafe.from_dlpack(pinned).memory == cusafe.Memory.HOST_PINNED
    managed = ctx.alloc(16, cusafe.Memory.MANAGED)
    assert cusafe.from_dlpack(managed).memory == cusafe.Memory.MANAGED
    s = ctx.stream()
    w = cusafe.from_dlpack(buf, ctx, s)
    w.fill(9, stream=s)  # ordered after the producer, on s
    s.synchronize()
    assert bytes(buf.read()) == b"\t" * 64
    assert bytes(cusafe.Buffer.wrap(buf.as_array()).read()) == b"\t" * 64


class LegacyProducer:
    """A producer older than DLPack 1.0: no max_version."""

    def __init__(self, a):
        self.a = a

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__(stream=stream)


class Producer:
    def __init__(self, result):
        self.result = result

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, max_version=None):
        return self.result


@needs_dlpack
def test_dlpack_import_errors(ctx, buf):
    back = cusafe.from_dlpack(LegacyProducer(buf.as_array("u1", (8,))))
    assert bytes(back.read()) == bytes(range(8))
    with pytest.raises(BufferError) as e:
        cusafe.from_dlpack(Producer(5))
    assert str(e.value) == "Producer.__dlpack__ returned no DLPack " \
        "capsule (or one already used)"
    capsule = buf.__dlpack__()
    assert cusafe.from_dlpack(Producer(capsule)).size == 64
    with pytest.raises(BufferError, match="one already used"):
        cusafe.from_dlpack(Producer(capsule))


def test_from_dlpack_of_a_non_producer():
    """As Buffer.wrap: an object without __dlpack__ is a TypeError."""
    with pytest.raises(TypeError, match="__dlpack__"):
        cusafe.from_dlpack(object())


@needs_dlpack
@pytest.mark.skipif(cusafe.device_count() < 2, reason="needs two devices")
def test_failed_from_dlpack_lets_the_tensor_go_at_once():
    """A tensor that from_dlpack took but could not import is deleted
    before from_dlpack returns: its deleter must not outlive the stream it
    orders the free after, which the caller may destroy right after the
    failure.  from_dlpack refuses memory of another device than ctx's
    before it asks the producer, so the producer here misnames its
    device, and the library finds out."""
    r = run_python("""
        import gc
        import cusafe
        ctx0, ctx1 = cusafe.Context(0), cusafe.Context(1)
        b0, s0 = ctx0.alloc(64), ctx0.stream()

        class Misnamed:
            def __dlpack_device__(self):
                return (2, 1)

            def __dlpack__(self, stream=None, max_version=None):
                return b0.__dlpack__(stream=s0.interop_handle(),
                                     max_version=max_version)

        for producer in (b0, Misnamed()):
            try:
                cusafe.from_dlpack(producer, ctx1)  # memory of device 0
            except cusafe.CusafeError as e:
                print(e.status.name)
        s0.close()
        gc.collect()
        b0.write(bytes(64))
        print("done")
        """)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout == "CONTEXT_MISMATCH\nCONTEXT_MISMATCH\ndone\n"


# --------------------------------------------------------------------------
# The CUDA Array Interface in.
# --------------------------------------------------------------------------


class Foreign:
    """An array of another library with the CUDA Array Interface only."""

    def __init__(self, cai, device=None):
        self.__cuda_array_interface__ = cai
        if device is not None:
            self.device = device


def cai(ptr, shape=(16,), typestr="|u1", **more):
    d = {"shape": shape, "typestr": typestr, "data": (ptr, False),
         "version": 3}
    d.update(more)
    return d


def test_wrap_cuda_array_interface(ctx, buf):
    base = buf.interop_pointer()
    w = cusafe.Buffer.wrap(Foreign(cai(base + 8, (4,), "<i4")))
    assert (w.size, w.interop_pointer()) == (16, base + 8)
    assert bytes(w.read()) == bytes(range(8, 24))
    w = cusafe.Buffer.wrap(Foreign(cai(base + 60, (4,), "|u1",
                                       strides=(-4,))), ctx)
    assert (w.size, w.interop_pointer()) == (13, base + 48)
    s = ctx.stream()
    w = cusafe.Buffer.wrap(Foreign(cai(base, (2, 2), "<f8", stream=1)),
                           stream=s)
    w.fill(0, stream=s)
    s.synchronize()
    assert bytes(buf.read(size=32)) == bytes(32)
    w = cusafe.Buffer.wrap(Foreign(cai(base, (0,))))
    assert w.size == 0
    # The buffer holds the producer's object until it lets the memory go.
    obj = Foreign(cai(base))
    alive = weakref.ref(obj)
    w = cusafe.Buffer.wrap(obj)
    del obj
    gc.collect()
    assert alive() is not None and w.context.device == 0
    w.close()
    gc.collect()
    assert alive() is None


def test_wrap_cuda_array_interface_errors(ctx, buf):
    base = buf.interop_pointer()
    with pytest.raises(ValueError, match="read-only"):
        cusafe.Buffer.wrap(Foreign(dict(cai(base), data=(base, True))))
    with pytest.raises(ValueError, match="masked arrays"):
        cusafe.Buffer.wrap(Foreign(cai(base, mask=object())))
    with pytest.raises(TypeError, match="is not a dict"):
        cusafe.Buffer.wrap(Foreign([base]))
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.Buffer.wrap(Foreign(cai(base, (100,))))
    assert e.value.status == cusafe.Status.OUT_OF_RANGE
    assert e.value.message == "wrap of 100 bytes at offset 0 exceeds the " \
        "allocation of 64 bytes at 0x%x" % base
    host = ctypes.create_string_buffer(16)
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.Buffer.wrap(Foreign(cai(ctypes.addressof(host))))
    assert e.value.status == cusafe.Status.INVALID_VALUE
    assert "host memory" in e.value.message
    with pytest.raises(TypeError) as e:
        cusafe.Buffer.wrap(42)
    assert str(e.value) == \
        "int has neither __dlpack__ nor __cuda_array_interface__"


@pytest.mark.skipif(cusafe.device_count() < 2, reason="needs two devices")
def test_wrap_memory_of_another_device(ctx):
    other = cusafe.Context(1)
    b1 = other.alloc(64)
    ptr = b1.interop_pointer()
    w = cusafe.Buffer.wrap(Foreign(cai(ptr), device=1))
    assert w.context.device == 1
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.Buffer.wrap(Foreign(cai(ptr)), ctx)
    assert e.value.status == cusafe.Status.CONTEXT_MISMATCH
    w.close()
    other.close()


# --------------------------------------------------------------------------
# Streams of other libraries.
# --------------------------------------------------------------------------


class TorchLike:
    def __init__(self, raw, device=None):
        self.cuda_stream = raw
        if device is not None:
            self.device = device


class CupyLike:
    def __init__(self, raw):
        self.ptr = raw


class ProtocolAttribute:
    def __init__(self, raw, version=0):
        self.__cuda_stream__ = (version, raw)


class ProtocolMethod:
    def __init__(self, raw, version=0):
        self.raw, self.version = raw, version

    def __cuda_stream__(self):
        return (self.version, self.raw)


def test_stream_wrap(ctx):
    s = ctx.stream(non_blocking=True)
    raw = s.interop_handle()
    assert raw != 0 and s.__cuda_stream__() == (0, raw)
    for obj in (raw, TorchLike(raw), CupyLike(raw), ProtocolAttribute(raw),
                ProtocolMethod(raw), s):
        with cusafe.Stream.wrap(obj) as w:
            assert w.interop_handle() == raw
            assert w.context.device == 0 and w.context == ctx
            assert cusafe.handle_type(w.handle) == cusafe.HandleType.STREAM
    with cusafe.Stream.wrap(0, ctx) as w:
        assert w.interop_handle() == 0
        b = ctx.alloc(64)
        b.fill(4, stream=w)
        w.synchronize()
        assert w.query() is True
        assert bytes(b.read()) == b"\4" * 64
    for version in (1, 2):
        for obj in (ProtocolAttribute(raw, version),
                    ProtocolMethod(raw, version)):
            with pytest.raises(TypeError) as e:
                cusafe.Stream.wrap(obj)
            assert str(e.value) == "__cuda_stream__ of version %d: cusafe " \
                "reads version 0" % version
    for bad in ("0", None, 1.0, TorchLike("x")):
        with pytest.raises(TypeError, match="is not a CUDA stream"):
            cusafe.Stream.wrap(bad, ctx)


def test_stream_wrap_holds_cusafe_stream(ctx):
    """A wrapper of a cusafe stream (or of its cudaStream_t, handed back
    by another library) holds it: closed first, its CUDA stream lives on
    for the wrapper's work."""
    for how in (lambda s: s, lambda s: TorchLike(s.interop_handle())):
        s = ctx.stream(non_blocking=True)
        raw, h = s.interop_handle(), s.handle
        w = cusafe.Stream.wrap(how(s))
        s.close()
        gc.collect()
        assert stale(h)
        b = ctx.alloc(64)
        b.fill(6, stream=w)
        w.synchronize()
        assert w.interop_handle() == raw
        assert bytes(b.read()) == b"\6" * 64
        b.close()
        w.close()


@needs_fake
def test_stream_wrap_of_another_device(ctx):
    f = fake()
    keep = cusafe.Context(1)  # the other library's use of device 1
    foreign = f.fake_foreign_stream(1)
    try:
        with pytest.raises(cusafe.CusafeError) as e:
            cusafe.Stream.wrap(foreign, ctx)
        assert e.value.status == cusafe.Status.CONTEXT_MISMATCH
        assert e.value.message == "stream 0x%x belongs to device 1 but " \
            "context belongs to device 0" % foreign
        w = cusafe.Stream.wrap(TorchLike(foreign, device=1))
        assert w.context.device == 1 and w.interop_handle() == foreign
        b = keep.alloc(64)
        b.fill(1, stream=w)
        w.synchronize()
        h = w.handle
        w.close()
        b.close()
        gc.collect()
        assert stale(h)
    finally:
        # A VIOLATION of the fake if cusafe had destroyed it.
        f.fake_foreign_stream_destroy(foreign)
        keep.close()


def test_use_buffers(ctx):
    s = ctx.stream()
    a, b = ctx.alloc(64), ctx.alloc(64)
    s.use_buffers()
    s.use_buffers(a, b, a, b.view(0, 8))
    a.fill(2, stream=s)
    assert bytes(a.read()) == b"\2" * 64
    with pytest.raises(TypeError) as e:
        s.use_buffers(a, s)
    assert str(e.value) == \
        "each argument must be a cusafe.Buffer, not Stream"
    w = cusafe.Stream.wrap(s)
    w.use_buffers(a)
    a.close()
    w.synchronize()
