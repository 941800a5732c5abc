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
