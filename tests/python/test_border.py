"""The Python border of the package: objects that own handles refuse to be
copied or pickled; protocols are probed without reading them; a Graph
whose capture failed is closed; every integer is checked before ctypes can
cut it down to another; streams of another device, and host memory
offered through DLPack, are refused up front; strings with a NUL, which C
would end early, are refused."""

import copy
import ctypes
import gc
import multiprocessing.reduction
import pickle
import sys

import pytest

import cusafe
from conftest import (fake, is_fake, live_counts, needs_dlpack, needs_fake,
                      run_python, stale)

try:
    import numpy
except ImportError:  # the tests that need it skip
    numpy = None

needs_numpy = pytest.mark.skipif(numpy is None, reason="needs NumPy")
needs_two = pytest.mark.skipif(cusafe.device_count() < 2,
                               reason="needs two devices")


def fake_counters():
    """The fake's graph counter and call counter, declared."""
    f = fake()
    f.fake_live_graphs.restype = ctypes.c_size_t
    f.fake_live_graphs.argtypes = [ctypes.c_int]
    f.fake_call_count.restype = ctypes.c_ulong
    f.fake_call_count.argtypes = []
    return f


@pytest.fixture
def baseline():
    """What the fake CUDA holds before the test (None on a GPU): the test
    must give all of it back."""
    gc.collect()
    before = None
    if is_fake():
        before = live_counts() + (fake_counters().fake_live_graphs(-1),)
    yield before
    if before is not None:
        after = live_counts() + (fake_counters().fake_live_graphs(-1),)
        # Events are cached by the contexts that made them, for ordering.
        assert (after[0], after[1], after[3], after[4]) == \
            (before[0], before[1], before[3], before[4])


class Unraisable:
    """Collects what finalizers raise (sys.unraisablehook)."""

    def __enter__(self):
        self.seen = []
        self.old = sys.unraisablehook
        sys.unraisablehook = self.seen.append
        return self

    def __exit__(self, *exc):
        gc.collect()
        sys.unraisablehook = self.old


# --------------------------------------------------------------------------
# Copies and pickles.
# --------------------------------------------------------------------------


def copiers():
    """{name: function copying an object}: pickle with every protocol (a
    round trip), copy.copy, copy.deepcopy, and the pickler of
    multiprocessing (which sends a Process's arguments)."""
    out = {"pickle %d" % p: (lambda o, p=p: pickle.loads(pickle.dumps(o, p)))
           for p in range(pickle.HIGHEST_PROTOCOL + 1)}
    out["copy.copy"] = copy.copy
    out["copy.deepcopy"] = copy.deepcopy
    out["multiprocessing"] = lambda o: pickle.loads(
        multiprocessing.reduction.ForkingPickler.dumps(o))
    return out


COPIERS = list(copiers())


def owners(ctx):
    """{kind: (make, use)}: how to make each object that owns or holds a
    handle, and a use of it that must still work after a refused copy."""
    m = ctx.load_builtin()
    k = m.kernel("cusafe_fill_f32")
    parent = ctx.alloc(64)
    stream = ctx.stream()

    def graph():
        with stream.capture() as g:
            parent.fill(1, stream=stream)
        return g

    def handle(o):
        return cusafe.handle_type(o.handle)

    return {
        "Context": (lambda: cusafe.Context(0), handle),
        "Stream": (ctx.stream, lambda s: s.synchronize()),
        "wrapped Stream": (lambda: cusafe.Stream.wrap(0, ctx),
                           lambda s: s.synchronize()),
        "Event": (ctx.event, lambda e: e.record()),
        "Buffer": (lambda: ctx.alloc(64), lambda b: b.fill(2)),
        "pinned Buffer": (lambda: ctx.alloc(64, cusafe.Memory.HOST_PINNED),
                          lambda b: b.fill(2)),
        "managed Buffer": (lambda: ctx.alloc(64, cusafe.Memory.MANAGED),
                           lambda b: b.fill(2)),
        "view": (lambda: parent.view(8, 8), lambda b: b.fill(3)),
        "Module": (ctx.load_builtin, lambda m: m.kernel("cusafe_fill_f32")),
        "Kernel": (lambda: m.kernel("cusafe_fill_f32"),
                   lambda k: k.launch(1, 16, parent, cusafe.F32(1.0), 16)),
        "Graph": (graph, lambda g: g.launch(stream)),
        "Array": (lambda: parent.as_array("f4"),
                  lambda a: a.__dlpack_device__()),
        "PreparedLaunch": (lambda: k.prepare(1, 16, parent, cusafe.F32(1.0),
                                             16), lambda p: p()),
    }


KINDS = ["Context", "Stream", "wrapped Stream", "Event", "Buffer",
         "pinned Buffer", "managed Buffer", "view", "Module", "Kernel",
         "Graph", "Array", "PreparedLaunch"]


@pytest.mark.parametrize("how", COPIERS)
@pytest.mark.parametrize("kind", KINDS)
def test_no_copies(ctx, baseline, kind, how):
    """Every object that owns or holds a handle refuses to be copied or
    pickled with a TypeError that names its type and says why; the
    original works on, and gives its references back once."""
    make, use = owners(ctx)[kind]
    copier = copiers()[how]
    with Unraisable() as u:
        obj = make()
        name = type(obj).__name__
        with pytest.raises(TypeError) as e:
            copier(obj)
        assert str(e.value).startswith(
            "cusafe.%s cannot be pickled or copied: " % name), str(e.value)
        assert "handle" in str(e.value)
        use(obj)
        h = getattr(obj, "handle", None)
        if kind != "PreparedLaunch":  # which only holds the others
            obj.close()
        if h is not None and kind != "Context":  # ctx holds the context
            assert stale(h)
        del obj
    assert u.seen == []


def test_no_copies_of_graphs_in_capture_or_closed(ctx):
    s = ctx.stream()
    with s.capture() as g:
        for how in COPIERS:
            with pytest.raises(TypeError, match="cusafe.Graph cannot be"):
                copiers()[how](g)
    g.close()
    for how in COPIERS:
        with pytest.raises(TypeError, match="cusafe.Graph cannot be"):
            copiers()[how](g)


def test_no_copies_leak_nothing():
    """Every refused copy in a fresh interpreter, every object closed:
    the leak report at exit is empty, no release fails."""
    r = run_python("""
        import copy, pickle
        import cusafe
        ctx = cusafe.Context(0)
        m = ctx.load_builtin()
        k = m.kernel("cusafe_fill_f32")
        b = ctx.alloc(64)
        s = ctx.stream()
        with s.capture() as g:
            b.fill(1, stream=s)
        objs = [ctx, m, k, b, s, g, b.view(0, 8), ctx.event(),
                cusafe.Stream.wrap(0, ctx), b.as_array(),
                k.prepare(1, 16, b, cusafe.F32(1.0), 16)]
        refused = 0
        for o in objs:
            for f in [copy.copy, copy.deepcopy] + [
                    lambda o, p=p: pickle.dumps(o, p)
                    for p in range(pickle.HIGHEST_PROTOCOL + 1)]:
                try:
                    f(o)
                except TypeError:
                    refused += 1
        objs.pop().__call__()  # the prepared launch, gone with the list
        for o in reversed(objs):
            o.close()
        print(refused)
        """, CUSAFE_LEAK_REPORT="1")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert int(r.stdout) == 11 * (pickle.HIGHEST_PROTOCOL + 3)


def test_errors_and_values_still_pickle():
    """What owns no handle travels between processes as before: errors
    (a pool worker's exception), typed scalars, Bytes, the enums."""
    e = cusafe.CusafeError(cusafe.Status.INVALID_VALUE, "bad", 3)
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), back.status, back.message, back.cuda_error) == \
        (cusafe.CusafeError, cusafe.Status.INVALID_VALUE, "bad", 3)
    assert pickle.loads(pickle.dumps(cusafe.F32(2.5))).value == 2.5
    assert copy.copy(cusafe.Bytes(b"ab")).data == b"ab"
    assert pickle.loads(pickle.dumps(cusafe.Status.SHUTDOWN)) is \
        cusafe.Status.SHUTDOWN


# --------------------------------------------------------------------------
# Protocols probed without reading them.
# --------------------------------------------------------------------------


@needs_dlpack
@pytest.mark.parametrize("op", ["launch", "prepare", "Buffer.wrap",
                                "from_dlpack"])
def test_arrays_used_by_cusafe_are_not_lent(ctx, baseline, op):
    """A cusafe Array passed to a launch (or wrapped) is not marked as
    lent to a consumer of the CUDA Array Interface: its close() gives the
    buffer and the stream back at once."""
    m = ctx.load_builtin()
    k = m.kernel("cusafe_fill_f32")
    buf = ctx.alloc(64)
    h = buf.handle
    a = buf.as_array("f4")
    if op == "launch":
        k.launch(1, 16, a, cusafe.F32(1.0), 16)
    elif op == "prepare":
        k.prepare(1, 16, a, cusafe.F32(1.0), 16)()
    elif op == "Buffer.wrap":
        cusafe.Buffer.wrap(a).close()
    else:
        cusafe.from_dlpack(a).close()
    ctx.synchronize()
    buf.close()
    a.close()
    gc.collect()
    assert a.closed
    assert stale(h)  # `a` still lives: its close() let the buffer go
    k.close()
    m.close()


@needs_dlpack
def test_launch_with_an_array_leaks_nothing():
    """An Array launched on and closed (but still referenced at exit):
    nothing in the leak report."""
    r = run_python("""
        import cusafe
        ctx = cusafe.Context(0)
        with ctx.load_builtin() as m, m.kernel("cusafe_fill_f32") as k:
            buf = ctx.alloc(64)
            a = buf.as_array("f4")
            k.launch(1, 16, a, cusafe.F32(1.0), 16)
            buf.close()
            a.close()
        ctx.close()
        """, CUSAFE_LEAK_REPORT="1")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r.stderr


class SideEffects:
    """A producer whose interface properties count their reads."""

    reads = 0

    def __init__(self, inner):
        self.inner = inner

    @property
    def __cuda_array_interface__(self):
        SideEffects.reads += 1
        return self.inner.__cuda_array_interface__


def test_wrap_reads_the_interface_once(ctx, baseline):
    """Buffer.wrap and a launch read a producer's interface once, to use
    it, never to probe it; an instance attribute is found too."""
    buf = ctx.alloc(64)
    holder = buf.as_array("f4")
    SideEffects.reads = 0
    w = cusafe.Buffer.wrap(SideEffects(holder))
    assert SideEffects.reads == 1
    w.close()
    with ctx.load_builtin() as m, m.kernel("cusafe_fill_f32") as k:
        SideEffects.reads = 0
        k.launch(1, 16, SideEffects(holder), cusafe.F32(1.0), 16)
        assert SideEffects.reads == 1

    class Instance:
        pass

    obj = Instance()
    obj.__cuda_array_interface__ = {
        "shape": (16,), "typestr": "<f4", "version": 3,
        "data": (buf.interop_pointer(), False)}
    with cusafe.Buffer.wrap(obj) as w:
        assert w.size == 64
    ctx.synchronize()
    del holder, w, obj
    buf.close()


# --------------------------------------------------------------------------
# The Graph of a capture that failed.
# --------------------------------------------------------------------------


def check_closed_graph(g, s):
    assert g.closed and repr(g) == "<cusafe.Graph closed>"
    g.close()
    g.close()
    with g as same:
        assert same is g
    assert g.closed
    with pytest.raises(ValueError) as e:
        g.detach()
    assert str(e.value) == "this cusafe.Graph is closed"
    for call in (lambda: g.handle, g.launch, lambda: g.launch(s),
                 g.instantiate, g, lambda: g.set_label("x")):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == "this cusafe.Graph is closed"
    with pytest.raises(TypeError, match="cannot be pickled"):
        copy.copy(g)


def test_graph_of_a_raising_block(ctx, baseline):
    s = ctx.stream(non_blocking=True)
    b = ctx.alloc(64)
    with Unraisable() as u:
        with pytest.raises(RuntimeError, match="in the block"):
            with s.capture() as g:
                b.fill(1, stream=s)
                raise RuntimeError("in the block")
        check_closed_graph(g, s)
        del g
    assert u.seen == []
    assert not s.capturing


def test_graph_of_a_capture_cuda_refused(ctx, baseline):
    """The capture ends with CUDA's error (a stream joined and never
    joined back): the Graph is closed, not broken."""
    s, t = ctx.stream(non_blocking=True), ctx.stream(non_blocking=True)
    ev = ctx.event(timing=False)
    b = ctx.alloc(64)
    with Unraisable() as u:
        with pytest.raises(cusafe.CusafeError) as e:
            with s.capture() as g:
                ev.record(s)
                t.wait_event(ev)
                b.fill(1, stream=t)
        assert e.value.status == cusafe.Status.CUDA
        check_closed_graph(g, s)
        del g
    assert u.seen == []
    assert not s.capturing and not t.capturing


def test_graph_closed_during_its_capture(ctx, baseline):
    """close() in the block: the capture still ends with the block, and
    its graph goes at once; detach() in the block says the capture has
    not ended."""
    s = ctx.stream(non_blocking=True)
    b = ctx.alloc(64)
    with s.capture() as g:
        with pytest.raises(ValueError) as e:
            g.detach()
        assert str(e.value) == "the capture of this cusafe.Graph has not " \
            "ended"
        b.fill(1, stream=s)
        g.close()
        assert g.closed
    assert not s.capturing
    check_closed_graph(g, s)
    with s.capture() as again:
        b.fill(2, stream=s)
    again.launch(s)
    assert bytes(b.read()) == b"\2" * 64
    again.close()


# --------------------------------------------------------------------------
# Integers: operator.index, no wrap-around.
# --------------------------------------------------------------------------


@pytest.fixture
def buf(ctx):
    with cusafe.Buffer.from_host(ctx, bytes(range(64))) as b:
        yield b


@pytest.mark.parametrize("kwargs, what", [
    ({"shape": (2.5,)}, "shape"), ({"shape": 2.0}, "shape"),
    ({"shape": "12"}, "shape"), ({"shape": b"12"}, "shape"),
    ({"shape": (4,), "strides": (4.0,)}, "strides"),
    ({"shape": (4,), "strides": "4"}, "strides"),
    ({"shape": (4,), "strides": 4}, "strides"),
    ({"offset": 1.5}, "offset"), ({"offset": "8"}, "offset"),
    ({"shape": [None]}, "shape"),
])
def test_as_array_refuses_what_is_not_an_int(buf, kwargs, what):
    with pytest.raises(TypeError) as e:
        buf.as_array("u1", **kwargs)
    assert str(e.value).startswith(what + " must be "), str(e.value)


def test_as_array_takes_index_like_ints(buf):
    i = IndexLike
    a = buf.as_array("f4", (i(2), i(2)), (i(8), i(4)), offset=i(8))
    assert (a.shape, a.strides) == ((2, 2), None)
    assert all(type(n) is int for n in a.shape)
    assert buf.as_array("f4", i(3), offset=i(4)).shape == (3,)
    rev = buf.as_array("f4", [i(4)], [i(-4)], i(12))
    assert rev.strides == (-4,)
    assert rev.__cuda_array_interface__["data"] == \
        (buf.interop_pointer() + 12, False)
    if numpy is not None:
        a = buf.as_array("f4", (numpy.int64(4),), (numpy.int32(4),),
                         numpy.uint8(16))
        assert a.shape == (4,) and type(a.shape[0]) is int
        assert buf.as_array("u1", numpy.int64(3)).shape == (3,)


def test_as_array_negatives(buf):
    for kwargs, text in (
            ({"shape": (-1,)}, "shape (-1,): at most 64 dimensions"),
            ({"shape": -2}, "shape (-2,): at most 64 dimensions"),
            ({"offset": -1}, "offset -1 is outside the buffer of 64 bytes")):
        with pytest.raises(ValueError) as e:
            buf.as_array("u1", **kwargs)
        assert text in str(e.value)


def test_array_of_something_else():
    for bad in (object(), None, 64):
        with pytest.raises(TypeError) as e:
            cusafe.Array(bad)
        assert str(e.value) == "buffer must be a cusafe.Buffer, not %s" % \
            type(bad).__name__


class IndexLike:
    """An integer of another library (numpy.int64 and the like): it has
    __index__ and nothing else of int."""

    def __init__(self, n):
        self.n = n

    def __index__(self):
        return self.n


@pytest.fixture
def fill(ctx):
    with ctx.load_builtin() as m, m.kernel("cusafe_fill_f32") as k:
        yield k


def test_kernel_integers(ctx, fill, buf):
    for call, error, text in (
            (lambda: fill.suggest_config(-1), ValueError,
             "n must not be negative: -1"),
            (lambda: fill.suggest_config(64, shared=-1), ValueError,
             "shared must not be negative: -1"),
            (lambda: fill.suggest_config(2**64), OverflowError,
             "n 18446744073709551616 does not fit 64 bits"),
            (lambda: fill.suggest_config(1.5), TypeError,
             "n must be an int, not float"),
            (lambda: fill.suggest_config(64, shared="0"), TypeError,
             "shared must be an int, not str"),
            (lambda: fill.launch(1, 16, buf, cusafe.F32(0), 16, shared=-1),
             ValueError, "shared must not be negative: -1"),
            (lambda: fill.launch(1, 16, buf, cusafe.F32(0), 16,
                                 shared=2**64), OverflowError,
             "shared 18446744073709551616 does not fit 64 bits"),
            (lambda: fill.launch(-1, 16, buf, cusafe.F32(0), 16),
             ValueError, "grid must not be negative: -1"),
            (lambda: fill.launch(2**32 + 1, 16, buf, cusafe.F32(0), 16),
             OverflowError, "grid 4294967297 does not fit 32 bits"),
            (lambda: fill.launch(1, (16, 2**32), buf, cusafe.F32(0), 16),
             OverflowError, "block 4294967296 does not fit 32 bits"),
            (lambda: fill.launch(1, (16, -1), buf, cusafe.F32(0), 16),
             ValueError, "block must not be negative: -1"),
            (lambda: fill.prepare(1, 16, buf, cusafe.F32(0), 16, shared=-8),
             ValueError, "shared must not be negative: -8"),
            (lambda: fill.prepare(2**32, 16, buf, cusafe.F32(0), 16),
             OverflowError, "grid 4294967296 does not fit 32 bits"),
            (lambda: fill.launch(1, 16, buf, cusafe.F32(0), 16,
                                 shared=1.0), TypeError,
             "shared must be an int, not float")):
        with pytest.raises(error) as e:
            call()
        assert str(e.value) == text
    # After a launch of that shape (the fast path), the same refusals.
    fill.launch(1, 16, buf, cusafe.F32(0), 16)
    fill.launch(1, 16, buf, cusafe.F32(0), 16)
    with pytest.raises(ValueError, match="shared must not be negative"):
        fill.launch(1, 16, buf, cusafe.F32(0), 16, shared=-1)
    assert fill.suggest_config(IndexLike(64), shared=IndexLike(0)) == \
        fill.suggest_config(64)
    fill.launch(IndexLike(1), (IndexLike(16),), buf, cusafe.F32(5), 16,
                shared=IndexLike(0))
    assert bytes(buf.read()) == bytes(__import__("array").array(
        "f", [5.0] * 16))


def test_buffer_integers(ctx, buf):
    """Sizes and offsets beyond 64 bits are refused, never wrapped around
    to small ones (a buffer of 64 bytes that says it has 2**64 + 64)."""
    big = 2**64
    before = bytes(buf.read())
    for call, error, text in (
            (lambda: ctx.alloc(big + 64), OverflowError,
             "size 18446744073709551680 does not fit 64 bits"),
            (lambda: cusafe.Buffer(ctx, big + 64), OverflowError,
             "size 18446744073709551680 does not fit 64 bits"),
            (lambda: ctx.alloc(-1), ValueError, "size must not be negative: "
                                                "-1"),
            (lambda: ctx.alloc(1.5), TypeError, "size must be an int, not "
                                                "float"),
            (lambda: buf.view(big, 8), OverflowError,
             "offset 18446744073709551616 does not fit 64 bits"),
            (lambda: buf.view(0, big + 8), OverflowError,
             "size 18446744073709551624 does not fit 64 bits"),
            (lambda: buf.write(b"x" * 8, big), OverflowError,
             "offset 18446744073709551616 does not fit 64 bits"),
            (lambda: buf.write(b"x" * 8, 1.0), TypeError,
             "offset must be an int, not float"),
            (lambda: buf.read(bytearray(8), big), OverflowError,
             "offset 18446744073709551616 does not fit 64 bits"),
            (lambda: buf.fill(7, big), OverflowError,
             "offset 18446744073709551616 does not fit 64 bits"),
            (lambda: buf.fill(7, 0, big + 8), OverflowError,
             "size 18446744073709551624 does not fit 64 bits"),
            (lambda: buf.fill(1.5), TypeError,
             "value must be an int, not float"),
            (lambda: buf.fill(256), ValueError,
             "fill value must be 0..255, not 256"),
            (lambda: buf.copy_from(buf, 8, big, 0), OverflowError,
             "dst_offset 18446744073709551616 does not fit 64 bits"),
            (lambda: buf.copy_from(buf, 8, 0, big + 32), OverflowError,
             "src_offset 18446744073709551648 does not fit 64 bits"),
            (lambda: buf.as_array(offset=big), ValueError,
             "offset 18446744073709551616 is outside the buffer of 64 "
             "bytes")):
        with pytest.raises(error) as e:
            call()
        assert str(e.value) == text
    assert bytes(buf.read()) == before  # nothing written at offset 0
    buf.fill(IndexLike(9), IndexLike(8), IndexLike(8))
    assert bytes(buf.read(offset=IndexLike(8), size=IndexLike(8))) == \
        b"\t" * 8
    with ctx.alloc(IndexLike(16)) as b:
        assert b.size == 16 and type(b.size) is int
    with cusafe.Buffer(ctx, IndexLike(16)) as b:
        assert b.size == 16 and type(b.size) is int


def test_object_integers(ctx):
    """Devices, flags, priorities, handles and raw streams: checked
    against their C types."""
    big = 2**64
    for call, error, text in (
            (lambda: cusafe.Context(2**32), OverflowError,
             "device 4294967296 does not fit a C int"),
            (lambda: cusafe.Context(1.0), TypeError,
             "device must be an int, not float"),
            (lambda: cusafe.device_properties(2**32), OverflowError,
             "device 4294967296 does not fit a C int"),
            (lambda: cusafe.device_properties(0.0), TypeError,
             "device must be an int, not float"),
            (lambda: ctx.stream(priority=2**32), OverflowError,
             "priority 4294967296 does not fit a C int"),
            (lambda: cusafe.Stream(ctx, flags=2**32), OverflowError,
             "flags 4294967296 does not fit 32 bits"),
            (lambda: cusafe.Stream(ctx, flags=-1), ValueError,
             "flags must not be negative: -1"),
            (lambda: cusafe.Event(ctx, flags=2**32), OverflowError,
             "flags 4294967296 does not fit 32 bits"),
            (lambda: cusafe.Event(ctx, flags=-1), ValueError,
             "flags must not be negative: -1"),
            (lambda: cusafe.handle_type(big + ctx.handle), OverflowError,
             "handle %d does not fit 64 bits" % (big + ctx.handle)),
            (lambda: cusafe.retain_handle(big + ctx.handle), OverflowError,
             "handle %d does not fit 64 bits" % (big + ctx.handle)),
            (lambda: cusafe.release_handle(big + ctx.handle), OverflowError,
             "handle %d does not fit 64 bits" % (big + ctx.handle)),
            (lambda: cusafe.release_handle(ctx.handle - big), ValueError,
             "handle must not be negative: %d" % (ctx.handle - big)),
            (lambda: cusafe.release_handle(1.0), TypeError,
             "handle must be an int, not float"),
            (lambda: cusafe.Stream.wrap(-5, ctx), ValueError,
             "stream must not be negative: -5"),
            (lambda: cusafe.Stream.wrap(big + 1, ctx), OverflowError,
             "stream 18446744073709551617 does not fit 64 bits"),
            (lambda: cusafe.Stream.wrap(StreamProtocol((0, 1.5)), ctx),
             TypeError, "__cuda_stream__ gave a stream that is not an int: "
                        "float"),
            (lambda: cusafe.Stream.wrap(StreamProtocol((0, -1)), ctx),
             ValueError, "stream must not be negative: -1")):
        with pytest.raises(error) as e:
            call()
        assert str(e.value) == text
    assert not stale(ctx.handle)  # neither released nor retained
    assert cusafe.Context(IndexLike(0)) == ctx
    assert cusafe.device_properties(IndexLike(0)).total_memory > 0
    h = ctx.handle
    cusafe.retain_handle(IndexLike(h))
    assert cusafe.handle_type(IndexLike(h)) == cusafe.HandleType.CONTEXT
    cusafe.release_handle(IndexLike(h))
    with ctx.stream(priority=IndexLike(0)) as s, \
            cusafe.Stream.wrap(IndexLike(s.interop_handle()), ctx) as w:
        assert w.interop_handle() == s.interop_handle()
    with cusafe.Event(ctx, flags=IndexLike(cusafe.EVENT_DISABLE_TIMING)):
        pass


class StreamProtocol:
    def __init__(self, value):
        self.value = value

    def __cuda_stream__(self):
        return self.value


STREAM_INTEGERS = (
    (-2, ValueError, "stream must not be negative: -2"),
    (2**64 + 1, OverflowError,
     "stream 18446744073709551617 does not fit 64 bits"),
    (1.0, TypeError, "float is not a CUDA stream"))


@needs_dlpack
def test_dlpack_stream_integers(buf):
    a = buf.as_array()
    for stream, error, text in STREAM_INTEGERS:
        with pytest.raises(error) as e:
            a.__dlpack__(stream=stream)
        assert text in str(e.value)


def test_as_array_stream_integers(buf):
    for stream, error, text in STREAM_INTEGERS:
        with pytest.raises(error) as e:
            buf.as_array(stream=stream)
        assert text in str(e.value)


def test_cuda_array_interface_integers(ctx, baseline):
    """The integers of another library's interface are checked like the
    caller's: 2**64 + p is not p."""
    b = ctx.alloc(64)
    p = b.interop_pointer()

    class Foreign:
        def __init__(self, ptr, shape=(16,), strides=None):
            self.__cuda_array_interface__ = {
                "shape": shape, "typestr": "|u1", "data": (ptr, False),
                "strides": strides, "version": 3}

    for obj, error, text in (
            (Foreign(2**64 + p), OverflowError,
             "the interface's data pointer %d does not fit 64 bits"
             % (2**64 + p)),
            (Foreign(p - 2**64), ValueError,
             "the interface's data pointer must not be negative: %d"
             % (p - 2**64)),
            (Foreign(float(p)), TypeError,
             "the interface's data pointer must be an int, not float"),
            (Foreign(p, (-1,)), ValueError,
             "the interface's shape (-1,) has a negative size"),
            (Foreign(p, (2.5,)), TypeError,
             "the interface's shape must be a sequence of ints, not (2.5,)"),
            (Foreign(p, (4,), (4.0,)), TypeError,
             "the interface's strides must be a sequence of ints, not "
             "(4.0,)")):
        with pytest.raises(error) as e:
            cusafe.Buffer.wrap(obj, ctx)
        assert str(e.value) == text
    if numpy is not None:
        with cusafe.Buffer.wrap(Foreign(numpy.uint64(p),
                                        (numpy.int64(16),)), ctx) as w:
            assert (w.interop_pointer(), w.size) == (p, 16)
    b.close()


# --------------------------------------------------------------------------
# Streams of another device.
# --------------------------------------------------------------------------


class Recording:
    """A DLPack producer that records how it was asked."""

    def __init__(self, device, inner=None):
        self.device = device
        self.inner = inner
        self.calls = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None):
        self.calls.append(stream)
        if self.inner is None:
            raise AssertionError("the producer was asked")
        return self.inner.__dlpack__(stream=stream, max_version=max_version)


@needs_two
def test_streams_of_another_device(ctx, baseline):
    """A stream of device 1 for memory of device 0 is refused where it is
    given, with nothing left behind."""
    other = cusafe.Context(1)
    s1 = other.stream()
    b = ctx.alloc(64)
    h = b.handle
    text = "stream of the context of device 1 given for %s in the " \
        "context of device 0"
    calls = [
        (lambda: b.as_array(stream=s1), "an array of a buffer"),
        (lambda: b.as_array("f4", (4,), offset=16, stream=s1),
         "an array of a buffer")]
    if "cusafe_buffer_to_dlpack" not in cusafe.library().missing:
        producer = Recording((2, 0), b)
        calls += [
            (lambda: cusafe.from_dlpack(producer, ctx, s1),
             "memory"),
            (lambda: cusafe.from_dlpack(producer, None, s1), "memory"),
            (lambda: cusafe.Buffer.wrap(producer, stream=s1), "memory")]
    foreign = type("Foreign", (), {})()
    foreign.__cuda_array_interface__ = {
        "shape": (64,), "typestr": "|u1", "version": 3,
        "data": (b.interop_pointer(), False)}
    calls.append((lambda: cusafe.Buffer.wrap(foreign, ctx, s1), "memory"))
    for call, what in calls:
        with pytest.raises(cusafe.CusafeError) as e:
            call()
        assert e.value.status == cusafe.Status.CONTEXT_MISMATCH
        assert e.value.message == text % what
    if "cusafe_buffer_to_dlpack" not in cusafe.library().missing:
        assert producer.calls == []
    b.close()
    gc.collect()
    assert stale(h)
    s1.close()
    other.close()


@needs_two
def test_dlpack_of_another_device_than_ctx(ctx, baseline):
    """Memory the producer says is on device 1, for a context of device
    0: refused before the producer is asked (with a stream of device 0)."""
    producer = Recording((2, 1))
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.from_dlpack(producer, ctx)
    assert e.value.status == cusafe.Status.CONTEXT_MISMATCH
    assert e.value.message == \
        "tensor belongs to device 1 but context belongs to device 0"
    assert producer.calls == []


# --------------------------------------------------------------------------
# Host memory through DLPack.
# --------------------------------------------------------------------------

CPU_MESSAGE = "tensor on DLPack device type 1 (CPU) is not CUDA memory"


def check_not_cuda(call, message=CPU_MESSAGE):
    with pytest.raises(cusafe.CusafeError) as e:
        call()
    assert e.value.status == cusafe.Status.INVALID_VALUE
    assert e.value.message == message
    assert str(e.value) == "invalid value: " + message


@pytest.mark.parametrize("device, text", [
    ((1, 0), CPU_MESSAGE),
    ((4, 0), "tensor on DLPack device type 4 is not CUDA memory"),
    ((10, 0), "tensor on DLPack device type 10 is not CUDA memory"),
    ((7, 1), "tensor on DLPack device type 7 is not CUDA memory")])
def test_dlpack_of_other_memory(ctx, baseline, device, text):
    """Memory that is not CUDA's is refused before the producer is asked
    for it (DLPack allows a stream for device data only)."""
    producer = Recording(device)
    check_not_cuda(lambda: cusafe.from_dlpack(producer), text)
    check_not_cuda(lambda: cusafe.from_dlpack(producer, ctx), text)
    check_not_cuda(lambda: cusafe.Buffer.wrap(producer), text)
    with ctx.load_builtin() as m, m.kernel("cusafe_fill_f32") as k:
        check_not_cuda(lambda: k.launch(1, 16, producer, cusafe.F32(0), 16),
                       text)
    assert producer.calls == []


@needs_dlpack
def test_dlpack_of_pinned_and_managed_memory(ctx, baseline):
    """CUDA's host memory (kDLCUDAHost) and managed memory
    (kDLCUDAManaged) are CUDA memory: imported, with a stream."""
    for memory, device in ((cusafe.Memory.HOST_PINNED, (3, 0)),
                           (cusafe.Memory.MANAGED, (13, 0))):
        with ctx.alloc(64, memory) as b:
            producer = Recording(device, b)
            with cusafe.from_dlpack(producer) as w:
                assert w.memory == memory and w.size == 64
            assert len(producer.calls) == 1 and producer.calls[0] is not None


@needs_numpy
def test_numpy_arrays(ctx, baseline):
    a = numpy.arange(16, dtype=numpy.float32)
    check_not_cuda(lambda: cusafe.from_dlpack(a))
    check_not_cuda(lambda: cusafe.from_dlpack(a, ctx))
    check_not_cuda(lambda: cusafe.Buffer.wrap(a))
    check_not_cuda(lambda: cusafe.Buffer.wrap(a, ctx, ctx.stream()))
    with ctx.load_builtin() as m, m.kernel("cusafe_fill_f32") as k:
        check_not_cuda(lambda: k.launch(1, 16, a, cusafe.F32(0), 16))
        check_not_cuda(lambda: k.prepare(1, 16, a, cusafe.F32(0), 16))
    # What NumPy's own memory is for: host data, copied.
    with cusafe.Buffer.from_host(ctx, a) as b:
        assert bytes(b.read()) == a.tobytes()


@needs_fake
@needs_numpy
def test_host_arrays_make_no_context():
    """Refused before a context is made for them: the fake CUDA was not
    called at all."""
    r = run_python("""
        import ctypes
        import numpy
        import cusafe
        f = cusafe.library().cdll
        f.fake_call_count.restype = ctypes.c_ulong
        f.fake_primary_ctx_refcount.argtypes = [ctypes.c_int]
        for call in (lambda: cusafe.from_dlpack(numpy.zeros(4)),
                     lambda: cusafe.Buffer.wrap(numpy.zeros(4))):
            try:
                call()
            except cusafe.CusafeError as e:
                print(e.status.name)
        print(f.fake_call_count(), f.fake_primary_ctx_refcount(0))
        """, CUSAFE_LEAK_REPORT="1")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout == "INVALID_VALUE\nINVALID_VALUE\n0 0\n"


def test_torch_cpu_tensors(ctx, baseline):
    torch = pytest.importorskip("torch")
    t = torch.arange(16, dtype=torch.float32)
    check_not_cuda(lambda: cusafe.from_dlpack(t))
    check_not_cuda(lambda: cusafe.Buffer.wrap(t, ctx))
    with ctx.load_builtin() as m, m.kernel("cusafe_fill_f32") as k:
        check_not_cuda(lambda: k.launch(1, 16, t, cusafe.F32(0), 16))


# --------------------------------------------------------------------------
# Strings: C reads them up to the first NUL.
# --------------------------------------------------------------------------


def test_strings_with_a_nul(ctx, tmp_path):
    """A str or bytes with a NUL is refused, never cut short by C to
    another name (a kernel, a file, a label) or a shorter source."""
    m = ctx.load_builtin()
    b = ctx.alloc(8)
    (tmp_path / "code.cubin").write_bytes(b"not code")
    for call, text in (
            (lambda: m.kernel("cusafe_fill_f32\0other"),
             "name contains a NUL character"),
            (lambda: m.kernel(b"cusafe_fill_f32\0"),
             "name contains a NUL character"),
            (lambda: b.set_label("weights\0more"),
             "label contains a NUL character"),
            (lambda: cusafe.Module.from_file(
                ctx, str(tmp_path / "code.cubin") + "\0.other"),
             "path contains a NUL character"),
            (lambda: ctx.compile("__global__ void f() {}\0 junk"),
             "source contains a NUL character"),
            (lambda: ctx.compile("__global__ void f() {}", "a\0.cu"),
             "name contains a NUL character"),
            (lambda: ctx.compile("__global__ void f() {}",
                                 options=["-O3\0-G"]),
             "options contains a NUL character")):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == text
    assert m.kernel("cusafe_fill_f32").name == "cusafe_fill_f32"
    b.close()
    m.close()
