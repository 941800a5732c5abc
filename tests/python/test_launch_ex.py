"""Launches with attributes (Kernel.launch and Kernel.prepare with
cluster, cooperative, programmatic_serialization, priority): what reaches
CUDA, every refusal's status and message, and the keyword arguments'
own checks."""

import ctypes
import struct

import pytest

import cusafe
from conftest import fake, needs_fake

# cudaLaunchAttribute: the id, padding, then a union of 64 bytes.
ATTR_SIZE = 72
CLUSTER, COOPERATIVE, PRIORITY, PDL = 4, 2, 8, 6  # cudaLaunchAttributeID


def last_attrs():
    """(id, first int, second, third) of each attribute of the fake's last
    launch."""
    f = fake()
    f.fake_last_launch_attrs.restype = ctypes.c_size_t
    f.fake_last_launch_attrs.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    n = f.fake_last_launch_attrs(None, 0)
    out = ctypes.create_string_buffer(ATTR_SIZE * max(n, 1))
    f.fake_last_launch_attrs(out, n)
    return [struct.unpack_from("<I4xiii", out.raw, i * ATTR_SIZE)
            for i in range(n)]


@pytest.fixture
def fill(ctx):
    with ctx.load_builtin() as m:
        with m.kernel("cusafe_fill_f32") as k:
            yield k


def refused(status, message, fn, *args, **kwargs):
    with pytest.raises(cusafe.CusafeError) as e:
        fn(*args, **kwargs)
    assert e.value.status == status
    assert e.value.message == message


def test_struct_layout():
    assert ctypes.sizeof(cusafe._capi.LaunchAttr) == 24
    assert cusafe._capi.LaunchAttr.value.offset == 8


@needs_fake
def test_attributes_reach_cuda(ctx, fill):
    with ctx.alloc(64 * 4) as x:
        fill.launch(4, 32, x, cusafe.F32(2.0), 64, cluster=2,
                    programmatic_serialization=True, priority=-2)
        assert last_attrs() == [(CLUSTER, 2, 1, 1), (PDL, 1, 0, 0),
                                (PRIORITY, -2, 0, 0)]
        fill.launch((4, 2), 32, x, cusafe.F32(3.0), 64, cluster=(2, 2))
        assert last_attrs() == [(CLUSTER, 2, 2, 1)]
        fill.launch(8, 32, x, cusafe.F32(4.0), 64, cooperative=True)
        assert last_attrs() == [(COOPERATIVE, 1, 0, 0)]
        # More than 8 blocks: non-portable clusters, a kernel attribute.
        fill.launch(16, 32, x, cusafe.F32(5.0), 64, cluster=16)
        assert last_attrs() == [(CLUSTER, 16, 1, 1)]
        # Without them: the plain launch.
        fill.launch(1, 32, x, cusafe.F32(6.0), 64)
        assert last_attrs() == []
        out = (ctypes.c_float * 64)()
        x.read(out)
        assert list(out) == [6.0] * 64


@needs_fake
def test_prepared(ctx, fill):
    with ctx.alloc(64 * 4) as x:
        p = fill.prepare(4, 32, x, cusafe.F32(1.5), 64, cluster=2,
                         cooperative=True)
        for _ in range(2):
            p()
            assert last_attrs() == [(CLUSTER, 2, 1, 1), (COOPERATIVE, 1, 0, 0)]
        q = fill.prepare(5, 32, x, cusafe.F32(1.5), 64, cluster=2)
        refused(cusafe.Status.INVALID_CONFIGURATION,
                "grid dimension x of 5 is not a multiple of cluster "
                "dimension x of 2", q)
        del p, q


@needs_fake
def test_refusals(ctx, fill):
    IC, IV = cusafe.Status.INVALID_CONFIGURATION, cusafe.Status.INVALID_VALUE
    fake().fake_log_clear()
    with ctx.alloc(64 * 4) as x:
        args = (x, cusafe.F32(1.0), 64)
        refused(IC, "grid dimension x of 5 is not a multiple of cluster "
                "dimension x of 2", fill.launch, 5, 32, *args, cluster=2)
        refused(IC, "a cluster of 32 blocks exceeds the limit of 16",
                fill.launch, 32, 32, *args, cluster=32)
        refused(IC, "a cooperative grid of 265 blocks exceeds the 264 that "
                "can be co-resident (2 per SM x 132 SMs)", fill.launch, 265,
                1024, *args, cooperative=True)
        refused(IC, "a cooperative grid of 258 blocks exceeds the 256 that "
                "can be co-resident (128 clusters of 2 blocks)", fill.launch,
                258, 1024, *args, cooperative=True, cluster=2)
        refused(IV, "launch attribute 0 (PRIORITY) of -6 is outside the "
                "device's stream priority range 0 (least) to -5 (greatest)",
                fill.launch, 1, 32, *args, priority=-6)
        refused(IV, "launch attribute 0 (PRIORITY) of 1 is outside the "
                "device's stream priority range 0 (least) to -5 (greatest)",
                fill.prepare(1, 32, *args, priority=1))
        refused(IC, "cluster dimension x is 0", fill.launch, 1, 32, *args,
                cluster=0)
        with pytest.raises(ValueError):
            fill.launch(1, 32, *args, cluster=-1)
        with pytest.raises(OverflowError):
            fill.launch(1, 32, *args, cluster=2**32)
        with pytest.raises(ValueError):
            fill.launch(1, 32, *args, cluster=(1, 1, 1, 1))
        with pytest.raises(TypeError, match="cooperative must be a bool"):
            fill.launch(1, 32, *args, cooperative=1)
        with pytest.raises(TypeError,
                           match="programmatic_serialization must be a bool"):
            fill.launch(1, 32, *args, programmatic_serialization="yes")
        with pytest.raises(TypeError, match="priority must be an int"):
            fill.launch(1, 32, *args, priority=1.0)
        with pytest.raises(TypeError, match="priority must be an int"):
            fill.launch(1, 32, *args, priority=True)
        with pytest.raises(OverflowError):
            fill.launch(1, 32, *args, priority=2**31)
    f = fake()
    f.fake_log_count.restype = ctypes.c_size_t
    f.fake_log_count.argtypes = [ctypes.c_char_p]
    assert f.fake_log_count(b"cuLaunchKernelEx") == 0
    assert f.fake_log_count(b"cudaLaunchKernelExC") == 0


@needs_fake
def test_raw_refusals(ctx, fill):
    """The attributes that Python cannot build wrong, built by hand."""
    from cusafe._capi import LaunchAttr, LaunchConfig
    IV = cusafe.Status.INVALID_VALUE
    with ctx.alloc(64 * 4) as x:
        config = LaunchConfig((2, 1, 1), (32, 1, 1), 0, 0)
        args = (cusafe._capi.Arg * 3)()
        args[0].kind, args[0].value.buffer = 1, x.handle
        args[1].kind, args[1].value.f32 = 10, 1.0
        args[2].kind, args[2].value.u = 9, 64
        lib = cusafe.library()

        def ex(*attrs):
            a = (LaunchAttr * len(attrs))(*attrs)
            st = lib.raw.cusafe_kernel_launch_ex(
                ctypes.c_uint64(fill.handle), ctypes.byref(config), a,
                ctypes.c_size_t(len(attrs)), args, ctypes.c_size_t(3))
            lib.check(st)

        refused(IV, "launch attribute 0 has unknown id 9", ex,
                LaunchAttr(9, 0))
        refused(IV, "launch attribute 0 (COOPERATIVE) has reserved 1; it "
                "must be 0", ex, LaunchAttr(3, 1))
        a = LaunchAttr(3, 0)
        a.value.flag = 2
        refused(IV, "launch attribute 0 (COOPERATIVE) has flag 2; 0 or 1",
                ex, a)
        refused(IV, "launch attribute 1 (PRIORITY) repeats launch "
                "attribute 0", ex, LaunchAttr(5, 0), LaunchAttr(5, 0))
        refused(cusafe.Status.INVALID_CONFIGURATION,
                "NON_PORTABLE_CLUSTER without a CLUSTER attribute", ex,
                _flag(LaunchAttr, 2, 1))
        ex()  # no attributes: a plain launch


def _flag(cls, ident, flag):
    a = cls(ident, 0)
    a.value.flag = flag
    return a


@needs_fake
def test_device_without_support(fill):
    f = fake()
    f.fake_set_launch_support.argtypes = [ctypes.c_int] * 3
    f.fake_set_compute_capability.argtypes = [ctypes.c_int] * 3
    f.fake_set_launch_support(1, 0, 0)
    f.fake_set_compute_capability(1, 8, 0)
    NS = cusafe.Status.NOT_SUPPORTED
    with cusafe.Context(1) as ctx1, ctx1.load_builtin() as m, \
            m.kernel("cusafe_fill_f32") as k, ctx1.alloc(256) as x:
        args = (x, cusafe.F32(1.0), 64)
        refused(NS, "device 1 does not support thread block clusters "
                "(cudaDevAttrClusterLaunch is 0)", k.launch, 2, 32, *args,
                cluster=2)
        refused(NS, "device 1 does not support cooperative launches "
                "(cudaDevAttrCooperativeLaunch is 0)", k.launch, 2, 32,
                *args, cooperative=True)
        refused(NS, "programmatic serialization needs compute capability "
                "9.0; device 1 has 8.0", k.launch, 2, 32, *args,
                programmatic_serialization=True)
        k.launch(2, 32, *args, priority=0)
    f.fake_set_launch_support(1, 1, 1)
    f.fake_set_compute_capability(1, 9, 0)


@needs_fake
def test_capture(ctx, fill):
    with ctx.stream() as s, ctx.alloc(64 * 4) as x:
        with s.capture() as g:
            fill.launch(4, 32, x, cusafe.F32(2.0), 64, stream=s, cluster=2)
            fill.launch(4, 32, x, cusafe.F32(3.0), 64, stream=s,
                        programmatic_serialization=True)
        g.launch(s)
        s.synchronize()
        out = (ctypes.c_float * 64)()
        x.read(out)
        assert list(out) == [3.0] * 64
        g.close()
