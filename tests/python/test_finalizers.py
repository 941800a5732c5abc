"""How objects give their references back: close(), `with`, the garbage
collector (also of reference cycles), detach(), other threads, the
library's shutdown, a forked child and the interpreter's exit (each of
those in a fresh interpreter, which must end with the expected status and
nothing on stderr)."""

import array
import gc
import sys
import textwrap
import threading
import weakref

import pytest

import cusafe
from conftest import fake, is_fake, live_counts, run_python, stale

needs_dlpack = pytest.mark.skipif(
    "cusafe_buffer_to_dlpack" in cusafe.library().missing,
    reason="libcusafe was built without DLPack")


@pytest.fixture
def baseline():
    """What the fake CUDA holds before the test (None on a GPU); the test
    must give it all back."""
    gc.collect()
    before = live_counts() if is_fake() else None
    yield before
    if before is not None:
        after = live_counts()
        # Events are cached by the contexts that made them for ordering;
        # allocations, streams and libraries must all be gone.
        assert (after[0], after[1], after[3]) == \
            (before[0], before[1], before[3])


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


def makers(ctx):
    """{name: function making one object of ctx}."""
    m = ctx.load_builtin()
    parent = ctx.alloc(64)
    return {
        "Stream": ctx.stream,
        "wrapped Stream": lambda: cusafe.Stream.wrap(0, ctx),
        "Event": ctx.event,
        "Buffer": lambda: ctx.alloc(64),
        "pinned Buffer": lambda: ctx.alloc(64, cusafe.Memory.HOST_PINNED),
        "managed Buffer": lambda: ctx.alloc(64, cusafe.Memory.MANAGED),
        "view": lambda: parent.view(8, 8),
        "Module": ctx.load_builtin,
        "Kernel": lambda: m.kernel("cusafe_scale_f32"),
    }


KINDS = ["Stream", "wrapped Stream", "Event", "Buffer", "pinned Buffer",
         "managed Buffer", "view", "Module", "Kernel"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_way_to_let_go(ctx, baseline, kind):
    make = makers(ctx)[kind]
    with Unraisable() as u:
        # close(), twice
        obj = make()
        h = obj.handle
        assert not obj.closed and not stale(h)
        obj.close()
        assert obj.closed and stale(h)
        obj.close()
        # with
        with make() as obj:
            h = obj.handle
            assert not obj.closed
        assert obj.closed and stale(h)
        # with, left by an exception
        with pytest.raises(KeyError):
            with make() as obj:
                h = obj.handle
                raise KeyError("out")
        assert obj.closed and stale(h)
        # the garbage collector
        obj = make()
        h, gone = obj.handle, weakref.ref(obj)
        del obj
        assert gone() is None and stale(h)
        # a reference cycle: the collector's cycle detection
        obj = make()
        h = obj.handle
        cycle = {"obj": obj}
        cycle["self"] = cycle
        gc.disable()
        try:
            del obj, cycle
            assert not stale(h)
            gc.collect()
        finally:
            gc.enable()
        assert stale(h)
        # detach(): the handle is the caller's
        obj = make()
        raw = obj.detach()
        assert obj.closed and not stale(raw)
        assert cusafe.handle_type(raw) is not cusafe.HandleType.INVALID
        with pytest.raises(ValueError, match="is closed"):
            obj.detach()
        obj.close()  # a no-op
        del obj
        gc.collect()
        assert not stale(raw)
        cusafe.release_handle(raw)
        assert stale(raw)
    assert u.seen == []


def test_contexts_let_go(baseline):
    """A Context object's reference: the handle is stale once the last
    reference of the device's context is gone."""
    gc.collect()
    c = cusafe.Context(0)
    h = c.handle
    d = cusafe.Context(0)
    assert d.handle == h and d == c and hash(d) == hash(c)
    c.close()
    assert not stale(h)
    b = d.alloc(16)
    d.close()
    # The caller's references are gone: the handle is stale, although the
    # buffer keeps the context itself alive.
    assert stale(h)
    bc = b.context  # a new reference, which this object owns
    assert bc.handle == h and bc.device == 0 and not stale(h)
    bc.close()
    assert stale(h)
    b.close()
    with cusafe.Context(0) as c:
        h = c.handle
    assert stale(h)
    c = cusafe.Context(0)
    h = c.handle
    del c
    assert stale(h)
    c = cusafe.Context(0)
    raw = c.detach()
    assert not stale(raw)
    cusafe.release_handle(raw)
    assert stale(raw)


def test_children_keep_their_parents(ctx, baseline):
    c = cusafe.Context(0)
    s, e = c.stream(), c.event()
    b = cusafe.Buffer.from_host(c, array.array("f", [1.0] * 16))
    m = c.load_builtin()
    k = m.kernel("cusafe_scale_f32")
    c.close()
    m.close()
    k.launch(1, 16, b, cusafe.F32(3.0), 16, stream=s)
    e.record(s)
    e.synchronize()
    out = array.array("f", bytes(64))
    b.read(out)
    assert list(out) == [3.0] * 16
    v = b.view(0, 32)
    b.close()
    assert bytes(v.read()) == array.array("f", [3.0] * 8).tobytes()
    bc = v.context
    bc.close()
    assert v.context.device == 0
    for obj in (s, e, k, v):
        obj.close()


def test_queued_work_keeps_buffers(ctx, baseline):
    data = bytes(range(256)) * 64
    dst = ctx.alloc(len(data))
    s = ctx.stream()
    f = fake() if is_fake() else None
    if f:
        f.fake_set_paused(1)
    try:
        src = cusafe.Buffer.from_host(ctx, data)
        dst.copy_from(src, stream=s)
        counted = live_counts() if f else None
        src.close()
        s.close()
        if f:
            # the copy has not run: src's memory and the stream stay
            assert live_counts() == counted
    finally:
        if f:
            f.fake_set_paused(0)
    assert bytes(dst.read()) == data
    dst.close()


def test_finalizers_stay_quiet(ctx, baseline):
    """Objects collected after their handle went stale behind their back,
    or after detach(), raise nothing (not even as unraisable)."""
    with Unraisable() as u:
        for make in makers(ctx).values():
            obj = make()
            cusafe.release_handle(obj.handle)
            del obj
            obj = make()
            raw = obj.detach()
            del obj
            cusafe.release_handle(raw)
        gc.collect()
    assert u.seen == []


def test_threads(ctx, baseline):
    """Objects made, used and released from several threads at once, and
    one object closed by many threads at the same moment."""
    errors = []
    m = ctx.load_builtin()
    k = m.kernel("cusafe_fill_f32")

    def work(i):
        try:
            for j in range(50):
                with ctx.alloc(64) as b, ctx.stream() as s:
                    k.launch(1, 16, b, cusafe.F32(i), 16, stream=s)
                    out = array.array("f", bytes(64))
                    b.read(out, stream=s)
                    s.synchronize()
                    assert list(out) == [float(i)] * 16
                ctx.event().record()
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    for _ in range(20):
        b = ctx.alloc(64)
        h = b.handle
        start = threading.Barrier(8)

        def close():
            start.wait()
            b.close()

        closers = [threading.Thread(target=close) for _ in range(8)]
        for t in closers:
            t.start()
        for t in closers:
            t.join(60)
        assert b.closed and stale(h)
    # An object made in one thread and collected in another.
    box = [ctx.alloc(64)]
    h = box[0].handle
    t = threading.Thread(target=box.clear)
    t.start()
    t.join(60)
    assert stale(h)


# --------------------------------------------------------------------------
# Arrays and DLPack tensors.
# --------------------------------------------------------------------------


def test_arrays_let_go(ctx, baseline):
    for end in ("close", "with", "del", "cycle"):
        b = ctx.alloc(64)
        h = b.handle
        a = b.as_array("f4", (4, 4))
        b.close()
        assert not stale(h)  # the Array's reference
        if end == "close":
            a.close()
            a.close()
            assert a.closed and repr(a) == "<cusafe.Array closed>"
        elif end == "with":
            with a as same:
                assert same is a
            assert a.closed
        elif end == "del":
            del a
        else:
            cycle = [a]
            cycle.append(cycle)
            del a, cycle
            gc.collect()
        assert stale(h)


def test_lent_arrays_wait_for_the_collector(ctx, baseline):
    b = ctx.alloc(64)
    h = b.handle
    a = b.as_array()
    consumer = a.__cuda_array_interface__
    assert consumer["data"] == (b.interop_pointer(), False)
    b.close()
    a.close()
    assert a.closed and not stale(h)
    with pytest.raises(ValueError, match="this cusafe.Array is closed"):
        a.__cuda_array_interface__
    del a
    gc.collect()
    assert stale(h)
    # A Buffer's own interface: its memory lives with the Buffer object.
    b = ctx.alloc(64)
    h = b.handle
    b.__cuda_array_interface__
    b.close()
    assert b.closed and not stale(h)  # the consumer holds the object
    del b
    gc.collect()
    assert stale(h)


@needs_dlpack
def test_dlpack_tensors_let_go(ctx, baseline):
    b = ctx.alloc(64)
    h = b.handle
    capsule = b.__dlpack__()
    versioned = b.as_array().__dlpack__(max_version=(1, 0))
    b.close()
    del capsule, versioned  # never consumed: their deleters run
    gc.collect()
    assert stale(h)
    b = cusafe.Buffer.from_host(ctx, bytes(range(64)))
    w = cusafe.from_dlpack(b)
    assert w.handle != b.handle
    b.close()
    assert bytes(w.read()) == bytes(range(64))  # the tensor keeps it
    hw = w.handle
    w.close()
    assert stale(hw)


# --------------------------------------------------------------------------
# Shutdown, fork and the interpreter's exit, each in a fresh interpreter.
# --------------------------------------------------------------------------

PRELUDE = """
import array, gc, os, sys, threading, warnings
import cusafe
warnings.filterwarnings("ignore", category=DeprecationWarning,
                        message=".*fork.*")

def live():
    ctx = cusafe.Context(0)
    o = {"ctx": ctx, "stream": ctx.stream(non_blocking=True),
         "event": ctx.event(), "module": ctx.load_builtin()}
    o["a"] = cusafe.Buffer.from_host(ctx, array.array("f", range(4096)))
    o["pinned"] = ctx.alloc(4 * 4096, cusafe.MEMORY_HOST_PINNED)
    o["managed"] = ctx.alloc(4 * 4096, cusafe.MEMORY_MANAGED)
    o["view"] = o["a"].view(4096, 4096)
    o["kernel"] = o["module"].kernel("cusafe_fill_f32")
    o["wrapped"] = cusafe.Stream.wrap(o["stream"])
    o["array"] = o["a"].as_array("f4", (64, 64))
    o["lent"] = o["a"].as_array("u1")
    o["lent"].__cuda_array_interface__
    o["prepared"] = o["kernel"].prepare(4, 256, o["view"], cusafe.F32(2.0),
                                        1024, stream=o["stream"])
    if "cusafe_buffer_to_dlpack" not in cusafe.library().missing:
        o["capsule"] = o["a"].__dlpack__()
        o["imported"] = cusafe.from_dlpack(o["pinned"])
    # Work queued and never waited for.
    s = o["stream"]
    o["pinned"].copy_from(o["a"], stream=s)
    o["kernel"].launch(4, 256, o["view"], cusafe.F32(3.0), 1024, stream=s)
    o["prepared"]()
    o["event"].record(s)
    o["managed"].fill(1, stream=o["wrapped"])
    return o

def expect(status, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except cusafe.CusafeError as e:
        assert e.status == status, (fn, e)
        assert e.message, fn
        return e
    raise AssertionError("%r raised nothing" % (fn,))
"""


def run(body, **env):
    return run_python(PRELUDE + textwrap.dedent(body), **env)


def test_exit_with_live_objects():
    r = run("""
        LIVE = live()
        print("exiting")
        """)
    assert (r.returncode, r.stderr, r.stdout) == \
        (0, "", "exiting\n"), r.stderr


def test_exit_with_objects_in_cycles():
    r = run("""
        gc.disable()
        class Node:
            pass
        for _ in range(3):
            n = Node()
            n.me, n.objects = n, live()
        del n
        print("exiting")
        """)
    assert (r.returncode, r.stderr, r.stdout) == \
        (0, "", "exiting\n"), r.stderr


def test_exit_with_daemon_threads_at_work():
    r = run("""
        o = live()
        started = threading.Barrier(4)

        def launches():
            s = o["ctx"].stream()
            k = o["kernel"]
            started.wait()
            while True:
                k.launch(4, 256, o["view"], cusafe.F32(1.0), 1024, stream=s)

        def copies():
            b = o["ctx"].alloc(1 << 20)
            data = bytes(1 << 20)
            started.wait()
            while True:
                b.write(data)
                assert b.read(size=16) == bytearray(16)

        def objects():
            started.wait()
            while True:
                with o["ctx"].alloc(64) as b, o["ctx"].stream() as s:
                    b.fill(0, stream=s)

        for work in (launches, copies, objects):
            threading.Thread(target=work, daemon=True).start()
        started.wait()
        print("exiting")
        """)
    assert (r.returncode, r.stderr, r.stdout) == \
        (0, "", "exiting\n"), r.stderr


def test_exit_with_objects_held_by_a_blocked_daemon_thread():
    r = run("""
        ready, never = threading.Event(), threading.Event()

        def hold():
            o = live()
            ready.set()
            never.wait()
            print(o)  # not reached

        threading.Thread(target=hold, daemon=True).start()
        ready.wait()
        print("exiting")
        """)
    assert (r.returncode, r.stderr, r.stdout) == \
        (0, "", "exiting\n"), r.stderr


def test_exit_status_is_kept():
    r = run("""
        LIVE = live()
        sys.exit(3)
        """)
    assert (r.returncode, r.stderr, r.stdout) == \
        (3, "", ""), r.stderr


def test_leak_report_names_labels():
    r = run("""
        ctx = cusafe.Context(0)
        weights = ctx.alloc(256).set_label("weights")
        assert weights.set_label(b"weights") is weights
        s = ctx.stream().set_label("first").set_label(None)
        done = ctx.alloc(8).set_label("gone")
        done.close()
        """, CUSAFE_LEAK_REPORT="1")
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 3, r.stderr
    assert lines[0].startswith("cusafe: leak: context 0x")
    assert lines[0].endswith(" (device 0)")
    assert lines[1].startswith("cusafe: leak: stream 0x")
    assert lines[1].endswith(" (device 0)")
    assert lines[2].startswith("cusafe: leak: buffer 0x")
    assert lines[2].endswith(" (256 bytes of device memory on device 0) "
                             '"weights"')


def test_shutdown():
    """After shutdown() every call raises SHUTDOWN; closing, `with`, the
    collector and release_handle are no-ops; the interpreter exits
    cleanly."""
    r = run("""
        o = live()
        ctx, a, s, e, k, m = (o["ctx"], o["a"], o["stream"], o["event"],
                              o["kernel"], o["module"])
        k.launch(4, 256, o["view"], cusafe.F32(1.0), 1024)
        k.launch(4, 256, o["view"], cusafe.F32(1.0), 1024)  # fast path
        h = a.handle
        cusafe.shutdown()
        cusafe.shutdown()  # idempotent
        SHUTDOWN = cusafe.Status.SHUTDOWN
        calls = [
            cusafe.device_count, lambda: cusafe.device_properties(0),
            lambda: cusafe.Context(0), lambda: cusafe.handle_type(h),
            lambda: cusafe.retain_handle(h),
            ctx.synchronize, ctx.stream_priority_range, ctx.stream,
            ctx.event, lambda: ctx.alloc(64), lambda: cusafe.Buffer(ctx, 64),
            ctx.load_builtin, lambda: ctx.compile("x"),
            lambda: cusafe.Module.from_data(ctx, b"x"),
            lambda: cusafe.Stream.wrap(0, ctx),
            s.synchronize, s.query, lambda: s.wait_event(e),
            lambda: s.context, s.interop_handle, lambda: s.use_buffers(a),
            e.record, e.synchronize, e.query, lambda: e.elapsed_ms(e),
            lambda: a.write(b"x"), a.read, lambda: a.fill(0),
            lambda: a.copy_from(o["pinned"]), lambda: a.view(0, 4),
            a.interop_pointer, lambda: a.context, a.as_array,
            lambda: a.set_label("x"),
            lambda: o["array"].__cuda_array_interface__,
            lambda: o["array"].__dlpack_device__(),
            lambda: m.kernel("cusafe_fill_f32"), lambda: k.params,
            lambda: k.suggest_config(64),
            lambda: k.launch(4, 256, o["view"], cusafe.F32(1.0), 1024),
            lambda: k.launch(4, 256, o["view"], 1.0, 1024),
            lambda: k.prepare(4, 256, o["view"], cusafe.F32(1.0), 1024)(),
            o["prepared"],
        ]
        for call in calls:
            expect(SHUTDOWN, call)
        assert cusafe.version() == cusafe.__version__
        assert cusafe.status_string(SHUTDOWN)
        cusafe.release_handle(h)  # a no-op
        for name in ("view", "kernel", "array", "lent", "wrapped"):
            o.pop(name).close()
        with o.pop("event"):
            pass
        raw = o.pop("stream").detach()
        cusafe.release_handle(raw)
        del e, s
        o.pop("a")
        gc.collect()
        LIVE = o
        print("checked")
        """)
    assert (r.returncode, r.stderr, r.stdout) == \
        (0, "", "checked\n"), r.stderr


def test_fork():
    """In a child forked after CUDA was used every call raises FORKED,
    releases are no-ops, and both processes exit cleanly."""
    r = run("""
        o = live()
        o["stream"].synchronize()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            FORKED = cusafe.Status.FORKED
            a = o["a"]
            for call in (cusafe.device_count, lambda: cusafe.Context(0),
                         lambda: o["ctx"].alloc(64), a.read,
                         lambda: a.write(b"x"), o["stream"].synchronize,
                         o["event"].query,
                         lambda: cusafe.handle_type(a.handle),
                         lambda: o["module"].kernel("cusafe_fill_f32"),
                         lambda: o["kernel"].launch(1, 4, o["view"],
                                                    cusafe.F32(0), 4),
                         o["prepared"]):
                expect(FORKED, call)
            for name in ("view", "kernel", "array", "event"):
                o.pop(name).close()
            cusafe.release_handle(o["a"].handle)  # a no-op
            cusafe.shutdown()  # a no-op too
            del a
            gc.collect()
            print("child checked")
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        o["a"].write(bytes(16))
        assert o["a"].read(size=16) == bytearray(16)
        LIVE = o
        print("parent checked")
        """)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout == "child checked\nparent checked\n"
