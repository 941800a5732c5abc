"""Kernels and their launches: the built-in kernels, every argument type
as the kernel receives it, grids and blocks, streams, prepared launches,
and every error of a launch, on the fast path and on the general one."""

import array
import ctypes
import struct

import pytest

import cusafe
from conftest import fake, is_fake, last_launch_args

needs_dlpack = pytest.mark.skipif(
    "cusafe_buffer_to_dlpack" in cusafe.library().missing,
    reason="libcusafe was built without DLPack")

# A kernel that stores each of its scalar arguments into `out`, at the
# offset that parameter has in the kernel's parameter buffer, so that `out`
# reads like the arguments the kernel received (the fake CUDA runs no
# compiled code: there the test reads the arguments of the last launch).
DUMP_SOURCE = r'''
extern "C" __global__ void dump(unsigned char *out, signed char a,
    unsigned char b, short c, unsigned short d, int e, unsigned int f,
    long long g, unsigned long long h, float i, double j)
{
  *(signed char *)(out + 8) = a;
  *(unsigned char *)(out + 9) = b;
  *(short *)(out + 10) = c;
  *(unsigned short *)(out + 12) = d;
  *(int *)(out + 16) = e;
  *(unsigned int *)(out + 20) = f;
  *(long long *)(out + 24) = g;
  *(unsigned long long *)(out + 32) = h;
  *(float *)(out + 40) = i;
  *(double *)(out + 48) = j;
}

extern "C" __global__ void nothing(void) {}
'''
# The parameters' layout: the pointer, then each scalar at its alignment.
DUMP_LAYOUT = "<QbBhH2xiIqQf4xd"


def floats(buf, code="f"):
    out = array.array(code, bytes(buf.size))
    buf.read(out)
    return list(out)


@pytest.fixture
def builtin(ctx):
    with ctx.load_builtin() as m:
        yield m


@pytest.fixture
def dump(ctx):
    with ctx.compile(DUMP_SOURCE, "dump.cu") as m:
        yield m


def received(kernel, out, *args, **kwargs):
    """Launches `kernel` (dump) with `out` and args; returns the bytes of
    the parameter buffer as the kernel received them, the pointer as 0."""
    out.fill(0)
    kernel.launch(1, 1, out, *args, **kwargs)
    if kwargs.get("stream") is not None:
        kwargs["stream"].synchronize()
    if is_fake():
        got = last_launch_args()
        assert got[:8] == struct.pack("<Q", out.interop_pointer())
        return bytes(8) + got[8:]
    return bytes(out.read())


# --------------------------------------------------------------------------
# The built-in kernels.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("t, code, scalar", [("f32", "f", cusafe.F32),
                                             ("f64", "d", cusafe.F64)])
def test_builtin_kernels(ctx, builtin, t, code, scalar):
    n = 300
    size = 4 if t == "f32" else 8
    x = cusafe.Buffer.from_host(ctx, array.array(code, range(n)))
    y = cusafe.Buffer.from_host(ctx, array.array(code, [1.0] * n))
    c = ctx.alloc(size * n)
    fill = builtin.kernel("cusafe_fill_%s" % t)
    scale = builtin.kernel("cusafe_scale_%s" % t)
    axpy = builtin.kernel("cusafe_axpy_%s" % t)
    add = builtin["cusafe_vecadd_%s" % t]
    assert fill.params == scale.params == [8, size, 8]
    assert axpy.params == [8, size, 8, 8]
    assert add.params == [8, 8, 8, 8]
    assert (fill.name, add.name) == ("cusafe_fill_%s" % t,
                                     "cusafe_vecadd_%s" % t)
    grid, block = fill.suggest_config(n)
    fill.launch(grid, block, c, scalar(2.5), n)
    assert floats(c, code) == [2.5] * n
    scale(grid, block, c, scalar(-2.0), n)
    assert floats(c, code) == [-5.0] * n
    axpy.launch(grid, block, y, scalar(3.0), x, n)
    assert floats(y, code) == [3.0 * i + 1.0 for i in range(n)]
    add.launch(grid, block, c, x, y, n)
    assert floats(c, code) == [4.0 * i + 1.0 for i in range(n)]
    if t == "f64":  # a float is passed as F64
        fill.launch(grid, block, c, 0.25, n)
        assert floats(c, code) == [0.25] * n


def test_launch_on_views_streams_and_shapes(ctx, builtin):
    fill = builtin.kernel("cusafe_fill_f32")
    b = cusafe.Buffer.from_host(ctx, array.array("f", [0.0] * 64))
    v = b.view(64, 64)  # floats 16..31
    fill.launch((1, 1, 1), (16, 1, 1), v, cusafe.F32(1.0), cusafe.U64(16))
    assert floats(b) == [0.0] * 16 + [1.0] * 16 + [0.0] * 32
    s = ctx.stream(non_blocking=True)
    fill.launch([2], [8, 1], b.view(0, 32), cusafe.F32(2.0), 8, stream=s)
    s.synchronize()
    assert floats(b)[:8] == [2.0] * 8
    w = cusafe.Stream.wrap(s)
    fill(1, 32, b.view(128, 128), cusafe.F32(3.0), 32, stream=w,
         shared=1024)
    w.synchronize()
    assert floats(b) == [2.0] * 8 + [0.0] * 8 + [1.0] * 16 + [3.0] * 32


def test_suggest_config(builtin):
    fill = builtin.kernel("cusafe_fill_f32")
    warp = cusafe.device_properties(0).warp_size
    for n in (0, 1, 1000, 1 << 20):
        grid, block = fill.suggest_config(n)
        assert block % warp == 0 and 0 < block <= 1024
        assert grid >= 1 and grid * block >= n
        assert grid == max(1, -(-n // block))
    grid, block = fill.suggest_config(4096, shared=4096)
    assert grid * block >= 4096
    limit = cusafe.device_properties(0).shared_memory_per_block_optin
    with pytest.raises(cusafe.CusafeError) as e:
        fill.suggest_config(64, shared=limit + 1)
    assert e.value.status == cusafe.Status.INVALID_CONFIGURATION


# --------------------------------------------------------------------------
# Arguments as the kernel receives them.
# --------------------------------------------------------------------------


def test_every_scalar_type_at_its_limits(ctx, dump):
    k = dump.kernel("dump")
    assert k.params == [8, 1, 1, 2, 2, 4, 4, 8, 8, 4, 8]
    out = ctx.alloc(struct.calcsize(DUMP_LAYOUT))
    lows = (-2**7, 0, -2**15, 0, -2**31, 0, -2**63, 0, -1.5, -2.0**-1074)
    highs = (2**7 - 1, 2**8 - 1, 2**15 - 1, 2**16 - 1, 2**31 - 1, 2**32 - 1,
             2**63 - 1, 2**64 - 1, 3.4028234663852886e38,
             1.7976931348623157e308)
    types = (cusafe.I8, cusafe.U8, cusafe.I16, cusafe.U16, cusafe.I32,
             cusafe.U32, cusafe.I64, cusafe.U64, cusafe.F32, cusafe.F64)
    # Three launches of each: the general path, then the fast path.
    for values in (lows, highs, lows, highs, lows):
        args = [t(v) for t, v in zip(types, values)]
        assert received(k, out, *args) == \
            struct.pack(DUMP_LAYOUT, 0, *values)


def test_plain_ints_floats_and_bytes(ctx, dump):
    k = dump.kernel("dump")
    out = ctx.alloc(struct.calcsize(DUMP_LAYOUT))
    head = (cusafe.I8(1), cusafe.U8(2), cusafe.I16(3), cusafe.U16(4),
            cusafe.I32(5), cusafe.U32(6))
    want = struct.pack(DUMP_LAYOUT, 0, 1, 2, 3, 4, 5, 6, -7, 8, 0.5, 9.25)
    # int is I64, float is F64; Bytes passes any bytes-like object as is.
    for tail in ((-7, cusafe.U64(8), cusafe.F32(0.5), 9.25),
                 (cusafe.Bytes(struct.pack("<q", -7)),
                  cusafe.Bytes(ctypes.c_uint64(8)),
                  cusafe.Bytes(array.array("f", [0.5])),
                  cusafe.Bytes(memoryview(struct.pack("<d", 9.25)))),
                 (-7, cusafe.Bytes(bytearray(struct.pack("<Q", 8))),
                  cusafe.F32(0.5), cusafe.F64(9.25))):
        assert received(k, out, *(head + tail)) == want
    s = ctx.stream()
    assert received(k, out, *(head + tail), stream=s) == want
    assert cusafe.Bytes(ctypes.c_uint32(7)).data == b"\7\0\0\0"


def test_kernel_without_parameters(ctx, dump):
    k = dump["nothing"]
    assert k.params == []
    k.launch(1, 1)
    k.launch(1, 1)  # the fast path
    k.prepare(1, 1)()
    k.launch((2, 2, 2), (2, 2, 2), stream=ctx.stream())
    ctx.synchronize()
    with pytest.raises(cusafe.CusafeError) as e:
        k.launch(1, 1, 5)
    assert e.value.status == cusafe.Status.INVALID_ARGUMENTS
    assert e.value.message == "kernel nothing takes 0 arguments, 1 given"


@pytest.mark.parametrize("count", [40, 70])
def test_many_arguments(ctx, count):
    src = 'extern "C" __global__ void many(%s) {}' % ", ".join(
        "int a%d" % i for i in range(count))
    with ctx.compile(src, "many.cu") as m:
        k = m.kernel("many")
        assert k.params == [4] * count
        values = [cusafe.I32(i * 1000 - 7) for i in range(count)]
        k.launch(1, 1, *values)
        if is_fake():
            assert last_launch_args() == struct.pack(
                "<%di" % count, *[v.value for v in values])
        k.prepare(1, 1, *values)()
        with pytest.raises(cusafe.CusafeError) as e:
            k.launch(1, 1, *values[1:])
        assert e.value.status == cusafe.Status.INVALID_ARGUMENTS
        assert e.value.message == "kernel many takes %d arguments, %d " \
            "given" % (count, count - 1)
        ctx.synchronize()


def test_scalar_types():
    for name in ("I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64",
                 "F32", "F64"):
        t = getattr(cusafe, name)
        v = t(3)
        assert v.value == 3 and repr(v) == "%s(3)" % name
        assert t.kind is cusafe.ArgKind[name]
        assert t.__doc__ == "A kernel argument of type %s." % name
    assert cusafe.Bytes(b"ab").data == b"ab"


# --------------------------------------------------------------------------
# Errors of a launch: each on the general path and on the fast path.
# --------------------------------------------------------------------------


def launch_twice(k, *args):
    """Launches k with args twice: the general path, then the fast one."""
    k.launch(1, 4, *args)
    k.launch(1, 4, *args)


@pytest.mark.parametrize("t, low, high", [
    (cusafe.I8, -2**7, 2**7 - 1), (cusafe.U8, 0, 2**8 - 1),
    (cusafe.I16, -2**15, 2**15 - 1), (cusafe.U16, 0, 2**16 - 1),
    (cusafe.I32, -2**31, 2**31 - 1), (cusafe.U32, 0, 2**32 - 1),
    (cusafe.I64, -2**63, 2**63 - 1), (cusafe.U64, 0, 2**64 - 1)])
def test_integers_out_of_range(ctx, dump, t, low, high):
    k = dump.kernel("dump")
    out = ctx.alloc(64)
    args = [cusafe.I8(0), cusafe.U8(0), cusafe.I16(0), cusafe.U16(0),
            cusafe.I32(0), cusafe.U32(0), cusafe.I64(0), cusafe.U64(0),
            cusafe.F32(0), cusafe.F64(0)]
    i = [type(a) for a in args].index(t)
    launch_twice(k, out, *args)
    for bad in (low - 1, high + 1):
        args[i] = t(bad)
        for _ in range(2):
            with pytest.raises(OverflowError,
                               match="%d does not fit %s" % (bad,
                                                             t.__name__)):
                k.launch(1, 4, out, *args)
            with pytest.raises(OverflowError):
                k.prepare(1, 4, out, *args)


def test_floats_out_of_range(ctx, builtin):
    fill = builtin.kernel("cusafe_fill_f32")
    b = ctx.alloc(64)
    launch_twice(fill, b, cusafe.F32(1.0), 16)
    for bad in (1e39, -1e39, 1e300):
        with pytest.raises(OverflowError, match="does not fit F32"):
            fill.launch(1, 4, b, cusafe.F32(bad), 16)
    # Infinities and NaN are float32 values.
    fill.launch(1, 16, b, cusafe.F32(float("inf")), 16)
    assert floats(b) == [float("inf")] * 16
    with pytest.raises(OverflowError, match="does not fit I64"):
        fill.launch(1, 4, b, cusafe.F32(1.0), 2**63)
    with pytest.raises(OverflowError, match="does not fit I64"):
        fill.launch(1, 4, b, cusafe.F32(1.0), -2**63 - 1)


RAW_FILL = r"""
extern "C" __global__ void raw_fill(float *x, float v, unsigned long n) {
  for (unsigned long i = threadIdx.x; i < n; i += blockDim.x) x[i] = v;
}
"""
FILL = "cusafe_fill_f32(float*, float, size_t)"


def test_wrong_argument_counts_and_sizes(ctx, builtin):
    add = builtin.kernel("cusafe_vecadd_f32")
    fill = builtin.kernel("cusafe_fill_f32")
    raw_module = ctx.compile(RAW_FILL, "raw.cu")
    raw = raw_module.kernel("raw_fill")
    b = ctx.alloc(64)
    launch_twice(add, b, b.view(0, 16), b.view(16, 16), 4)
    launch_twice(fill, b, cusafe.F32(0), 16)
    cases = (
        (add, (b, b, 4), "kernel cusafe_vecadd_f32 takes 4 arguments, 3 "
                         "given"),
        (add, (b, b, b, 4, 4), "kernel cusafe_vecadd_f32 takes 4 "
                               "arguments, 5 given"),
        # The built-in kernels declare their types: a refusal names both.
        (fill, (b, 0.0, 16), "argument 1 of kernel %s is a double, "
                             "parameter 1 is float" % FILL),
        (fill, (b, cusafe.F32(0), cusafe.I32(16)),
         "argument 2 of kernel %s is a 32-bit integer, parameter 2 is "
         "size_t" % FILL),
        (fill, (b, cusafe.F32(0), cusafe.Bytes(b"1234")),
         "argument 2 of kernel %s is 4 bytes, parameter 2 is size_t" % FILL),
        (fill, (b, cusafe.Bytes(b""), 16),
         "argument 1 of kernel %s is 0 bytes, parameter 1 is float" % FILL),
        (fill, (b, b, 16), "argument 1 of kernel %s is a buffer, parameter "
                           "1 is float" % FILL),
        # A kernel whose types are unknown: sizes.
        (raw, (b, 0.0, 16), "argument 1 of kernel raw_fill is 8 bytes, "
                            "parameter 1 is 4 bytes"),
        (raw, (b, cusafe.F32(0), cusafe.I32(16)),
         "argument 2 of kernel raw_fill is 4 bytes, parameter 2 is 8 bytes"),
        (raw, (b, cusafe.F32(0), cusafe.Bytes(b"1234")),
         "argument 2 of kernel raw_fill is 4 bytes, parameter 2 is 8 bytes"),
        (raw, (b, cusafe.Bytes(b""), 16),
         "argument 1 of kernel raw_fill is 0 bytes, parameter 1 is 4 bytes"),
        (raw, (b, b, 16), "argument 1 of kernel raw_fill is 8 bytes, "
                          "parameter 1 is 4 bytes"),
    )
    for k, args, text in cases:
        for call in (lambda: k.launch(1, 4, *args),
                     lambda: k.prepare(1, 4, *args)()):
            with pytest.raises(cusafe.CusafeError) as e:
                call()
            assert e.value.status == cusafe.Status.INVALID_ARGUMENTS
            assert e.value.message == text
    fill.launch(1, 16, b, cusafe.F32(6.0), 16)
    assert floats(b) == [6.0] * 16
    raw.close()
    raw_module.close()


def test_arguments_that_cannot_be_passed(ctx, builtin):
    fill = builtin.kernel("cusafe_fill_f32")
    b = ctx.alloc(64)
    launch_twice(fill, b, cusafe.F32(0), 16)
    for bad, text in ((True, "argument 2: pass a bool as I32() or U8()"),
                      ("16", "argument 2: cannot pass str to a kernel"),
                      (None, "argument 2: cannot pass NoneType to a "
                             "kernel"),
                      (object(), "argument 2: cannot pass object to a "
                                 "kernel"),
                      (16j, "argument 2: cannot pass complex to a kernel")):
        for call in (fill.launch, fill.prepare):
            with pytest.raises(TypeError) as e:
                call(1, 4, b, cusafe.F32(0), bad)
            assert str(e.value) == text


def test_grids_blocks_and_shared_memory(ctx, builtin):
    fill = builtin.kernel("cusafe_fill_f32")
    b = ctx.alloc(64)
    props = cusafe.device_properties(0)
    launch_twice(fill, b, cusafe.F32(0), 16)
    for grid, block in (((), 1), ((1, 1, 1, 1), 1), (1, ()),
                        (1, [1, 1, 1, 1])):
        with pytest.raises(ValueError,
                           match="(grid|block) must be an int or 1 to 3 "
                                 "ints"):
            fill.launch(grid, block, b, cusafe.F32(0), 16)
    for grid, block, text in (
            (0, 4, "grid dimension x is 0"),
            ((1, 0), 4, "grid dimension y is 0"),
            (1, (4, 1, 0), "block dimension z is 0"),
            (1, props.max_threads_per_block * 2,
             "block dimension x of %d exceeds the device's limit of %d"
             % (props.max_threads_per_block * 2, props.max_block_dim[0]))):
        for call in (fill.launch, lambda *a: fill.prepare(*a)()):
            with pytest.raises(cusafe.CusafeError) as e:
                call(grid, block, b, cusafe.F32(0), 16)
            assert e.value.status == cusafe.Status.INVALID_CONFIGURATION
            assert e.value.message == text
    too_much = props.shared_memory_per_block_optin + 1
    with pytest.raises(cusafe.CusafeError) as e:
        fill.launch(1, 4, b, cusafe.F32(0), 16, shared=too_much)
    assert e.value.status == cusafe.Status.INVALID_CONFIGURATION
    assert e.value.message.startswith("%d bytes of shared memory exceed "
                                      % too_much)
    fill.launch(1, 16, b, cusafe.F32(4.0), 16,
                shared=props.shared_memory_per_block)
    assert floats(b) == [4.0] * 16


def test_closed_objects_on_both_paths(ctx, builtin):
    fill = builtin.kernel("cusafe_fill_f32")
    b, c = ctx.alloc(64), ctx.alloc(64)
    launch_twice(fill, b, cusafe.F32(0), 16)
    c.close()
    with pytest.raises(ValueError, match="this cusafe.Buffer is closed"):
        fill.launch(1, 4, c, cusafe.F32(0), 16)  # the fast path's types
    h = b.detach()
    with pytest.raises(ValueError, match="this cusafe.Buffer is closed"):
        fill.launch(1, 4, b, cusafe.F32(0), 16)
    cusafe.release_handle(h)
    d = ctx.alloc(64)
    launch_twice(fill, d, cusafe.F32(0), 16)
    fill.close()
    for call in (fill.launch, fill, fill.prepare):
        with pytest.raises(ValueError, match="this cusafe.Kernel is closed"):
            call(1, 4, d, cusafe.F32(0), 16)


def test_stale_arguments(ctx, builtin):
    fill = builtin.kernel("cusafe_fill_f32")
    b = ctx.alloc(64)
    launch_twice(fill, b, cusafe.F32(0), 16)
    cusafe.release_handle(b.handle)  # behind the object's back
    with pytest.raises(cusafe.CusafeError) as e:
        fill.launch(1, 4, b, cusafe.F32(0), 16)
    assert e.value.status == cusafe.Status.INVALID_HANDLE
    assert e.value.message == "argument 0 0x%016x is stale: its object " \
        "was released" % b.handle
    s = ctx.stream()
    cusafe.release_handle(s.handle)
    with pytest.raises(cusafe.CusafeError) as e:
        fill.launch(1, 4, ctx.alloc(64), cusafe.F32(0), 16, stream=s)
    assert e.value.status == cusafe.Status.INVALID_HANDLE
    assert "is stale" in e.value.message


@pytest.mark.skipif(cusafe.device_count() < 2, reason="needs two devices")
def test_objects_of_another_device(ctx, builtin):
    fill = builtin.kernel("cusafe_fill_f32")
    other = cusafe.Context(1)
    b0, b1, s1 = ctx.alloc(64), other.alloc(64), other.stream()
    launch_twice(fill, b0, cusafe.F32(0), 16)
    with pytest.raises(cusafe.CusafeError) as e:
        fill.launch(1, 4, b1, cusafe.F32(0), 16)
    assert e.value.status == cusafe.Status.CONTEXT_MISMATCH
    assert e.value.message == \
        "argument 0 belongs to device 1 but kernel belongs to device 0"
    with pytest.raises(cusafe.CusafeError) as e:
        fill.launch(1, 4, b0, cusafe.F32(0), 16, stream=s1)
    assert e.value.status == cusafe.Status.CONTEXT_MISMATCH
    assert e.value.message == \
        "stream belongs to device 1 but kernel belongs to device 0"


# --------------------------------------------------------------------------
# Prepared launches.
# --------------------------------------------------------------------------


def test_prepared_launches(ctx, builtin):
    n = 64
    x = cusafe.Buffer.from_host(ctx, array.array("f", range(n)))
    y = cusafe.Buffer.from_host(ctx, array.array("f", [0.0] * n))
    axpy = builtin.kernel("cusafe_axpy_f32")
    run = axpy.prepare(1, n, y, cusafe.F32(2.0), x, n)
    assert isinstance(run, cusafe.PreparedLaunch)
    for i in range(1, 4):
        assert run() is None
        assert floats(y) == [2.0 * i * v for v in range(n)]
    s = ctx.stream()
    on_s = axpy.prepare((1, 1), (n, 1), y, cusafe.F32(-6.0), x, n, stream=s,
                        shared=256)
    on_s()
    s.synchronize()
    assert floats(y) == [0.0] * n
    # It keeps the kernel and the arguments' objects it was given.
    del axpy, x
    run()
    assert floats(y) == [2.0 * v for v in range(n)]


def test_prepared_launch_reads_handles_once(ctx, builtin):
    fill = builtin.kernel("cusafe_fill_f32")
    b = ctx.alloc(64)
    h = b.handle
    run = fill.prepare(1, 16, b, cusafe.F32(1.0), 16)
    b.close()
    with pytest.raises(cusafe.CusafeError) as e:
        run()
    assert e.value.status == cusafe.Status.INVALID_HANDLE
    assert e.value.message == "argument 0 0x%016x is stale: its object " \
        "was released" % h
    c = ctx.alloc(64)
    run = fill.prepare(1, 16, c, cusafe.F32(1.0), 16)
    fill.close()
    with pytest.raises(cusafe.CusafeError) as e:
        run()
    assert e.value.status == cusafe.Status.INVALID_HANDLE
    assert e.value.message.startswith("kernel 0x")


# --------------------------------------------------------------------------
# Arrays of other libraries as arguments.
# --------------------------------------------------------------------------


class Foreign:
    """An array of another library, through the CUDA Array Interface
    only: a window on a cusafe buffer's memory."""

    def __init__(self, buf, offset, n):
        self.buf = buf  # keeps the memory, as a producer would
        self.__cuda_array_interface__ = {
            "shape": (n,), "typestr": "<f4",
            "data": (buf.interop_pointer() + offset, False),
            "version": 3, "strides": None, "stream": None}


def test_foreign_arrays_as_arguments(ctx, builtin):
    fill = builtin.kernel("cusafe_fill_f32")
    b = cusafe.Buffer.from_host(ctx, array.array("f", [0.0] * 32))
    fill.launch(1, 8, Foreign(b, 16, 8), cusafe.F32(5.0), 8)
    assert floats(b) == [0.0] * 4 + [5.0] * 8 + [0.0] * 20
    run = fill.prepare(1, 8, Foreign(b, 64, 8), cusafe.F32(6.0), 8)
    run()
    assert floats(b)[16:24] == [6.0] * 8


@needs_dlpack
def test_cusafe_arrays_as_arguments(ctx, builtin):
    fill = builtin.kernel("cusafe_fill_f32")
    b = cusafe.Buffer.from_host(ctx, array.array("f", [0.0] * 32))
    fill.launch(1, 8, b.as_array("f4", (8,), offset=32), cusafe.F32(7.0), 8)
    s = ctx.stream()
    fill.launch(1, 8, b.as_array("f4", (2, 4), offset=96), cusafe.F32(8.0),
                8, stream=s)
    s.synchronize()
    assert floats(b) == [0.0] * 8 + [7.0] * 8 + [0.0] * 8 + [8.0] * 8


# --------------------------------------------------------------------------
# Modules from files, images and sources.
# --------------------------------------------------------------------------

# The same two kernels as an image the fake CUDA loads and as PTX, which a
# real driver compiles for its device.
FAKE_IMAGE = (b"FAKECUBIN\nkernel scale2 maxthreads=256 p 4 8\n# a comment\n"
              b"\nkernel other p\n\0")
PTX = """.version 6.0
.target sm_50
.address_size 64

.visible .entry scale2(
	.param .u64 scale2_param_0,
	.param .u32 scale2_param_1,
	.param .u64 scale2_param_2
)
{
	ret;
}

.visible .entry other(
	.param .u64 other_param_0
)
{
	ret;
}
"""


def check_image_module(ctx, m, origin):
    assert repr(m) == "<cusafe.Module 0x%016x %s>" % (m.handle, origin)
    assert cusafe.handle_type(m.handle) == cusafe.HandleType.MODULE
    scale2, other = m.kernel("scale2"), m["other"]
    assert (scale2.params, other.params) == ([8, 4, 8], [8])
    b = ctx.alloc(64)
    scale2.launch(1, 16, b, cusafe.I32(-3), cusafe.U64(16))
    other.launch(1, 1, b)
    ctx.synchronize()
    if is_fake():
        assert last_launch_args() == struct.pack("<Q", b.interop_pointer())
        assert scale2.suggest_config(1000) == (4, 256)  # maxthreads=256
        with pytest.raises(cusafe.CusafeError) as e:
            scale2.launch(1, 512, b, cusafe.I32(1), cusafe.U64(16))
        assert e.value.status == cusafe.Status.INVALID_CONFIGURATION
    with pytest.raises(cusafe.CusafeError) as e:
        m.kernel("missing")
    assert e.value.status == cusafe.Status.NOT_FOUND


def test_module_from_data(ctx):
    image = FAKE_IMAGE if is_fake() else PTX.encode() + b"\0"
    for data in (image, bytearray(image), memoryview(image),
                 array.array("B", image)):
        with cusafe.Module.from_data(ctx, data) as m:
            check_image_module(ctx, m, "data")
    if not is_fake():  # PTX as text, with no NUL: one is added
        for data in (PTX, PTX.encode()):
            with cusafe.Module.from_data(ctx, data) as m:
                check_image_module(ctx, m, "data")


def test_module_from_file(ctx, tmp_path):
    path = tmp_path / ("kernels.img" if is_fake() else "kernels.ptx")
    path.write_bytes(FAKE_IMAGE if is_fake() else PTX.encode())
    for name in (path, str(path)):
        with cusafe.Module.from_file(ctx, name) as m:
            check_image_module(ctx, m, str(path))


def test_module_compile(ctx):
    src = 'extern "C" __global__ void k(float *x, int n) {}'
    with ctx.compile(src, "k.cu", ["-DN=4", b"-lineinfo"]) as m:
        assert repr(m) == "<cusafe.Module 0x%016x k.cu>" % m.handle
        assert m.kernel("k").params == [8, 4]
    with cusafe.Module.compile(ctx, src.encode()) as m:
        assert repr(m) == "<cusafe.Module 0x%016x source.cu>" % m.handle
        m.kernel("k").launch(1, 1, ctx.alloc(8), cusafe.I32(2))
    if is_fake():
        f = fake().fake_last_nvrtc_options
        with ctx.compile(src, options=("-DN=4", "-arch=sm_80")):
            assert f() == b"-DN=4 -arch=sm_80"  # no arch of cusafe's own
        with ctx.compile(src, options=["-DN=4"]):
            assert f() == b"-DN=4 -arch=sm_90"  # the device's
    with cusafe.Module.builtin(ctx) as m:
        assert repr(m) == "<cusafe.Module 0x%016x builtin>" % m.handle
        k = m.kernel("cusafe_axpy_f32")
        assert repr(k) == "<cusafe.Kernel 0x%016x cusafe_axpy_f32>" % k.handle
