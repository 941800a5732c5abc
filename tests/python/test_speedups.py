"""The C extension cusafe._speedups next to the ctypes path: the same
retain and release, the same statuses and errors, whichever runs (each
implementation in a process of its own: CUSAFE_PURE_PYTHON is read at
import); and what both promise beyond the rest of the suite: the GIL left
to other threads by the calls that can block, the exception being raised
kept by a collection, no reference leaks."""

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc

import pytest

import cusafe
from conftest import fake, needs_fake, stale

SCRIPT = textwrap.dedent("""
    import sys
    import cusafe
    ctx = cusafe.Context(0)
    h = ctx.handle
    cusafe.retain_handle(h)          # a second reference, the caller's
    cusafe.release_handle(h)         # ... dropped
    cusafe.release_handle(0)         # NULL: a no-op
    results = []
    for bad in ("1", 1.0, None, -1, 2**64, 2**64 + h):
        for f in (cusafe.retain_handle, cusafe.release_handle):
            try:
                f(bad)
            except Exception as e:
                results.append("%s %s" % (type(e).__name__, e))
    ctx.close()
    try:
        cusafe.release_handle(h)     # a double release: caught
    except cusafe.CusafeError as e:
        results.append(e.status.name)
    try:
        cusafe.retain_handle(h)
    except cusafe.CusafeError as e:
        results.append(e.status.name)
    print(cusafe.implementation())
    print("\\n".join(results))
""")


def run(pure, script=SCRIPT):
    env = dict(os.environ)
    env.pop("CUSAFE_PURE_PYTHON", None)
    if pure:
        env["CUSAFE_PURE_PYTHON"] = "1"
    p = subprocess.run([sys.executable, "-c", script], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def test_retain_release_both_implementations():
    pure = run(pure=True)
    assert pure[0] == "python"
    assert pure[-2:] == ["INVALID_HANDLE", "INVALID_HANDLE"]
    assert "TypeError handle must be an int, not str" in pure
    assert "ValueError handle must not be negative: -1" in pure
    try:
        import cusafe._speedups  # noqa: F401
    except ImportError:
        pytest.skip("cusafe._speedups not built: only the ctypes path ran")
    c = run(pure=False)
    assert c[0] == "c"
    assert c[1:] == pure[1:]


def test_speedups_arguments():
    if cusafe.implementation() != "c":
        pytest.skip("the package runs on ctypes: cusafe._speedups has not "
                    "been given the library")
    sp = pytest.importorskip("cusafe._speedups")
    with pytest.raises(TypeError, match="handle must be an int, not float"):
        sp.release(1.0)
    with pytest.raises(OverflowError, match="must not be negative: -1"):
        sp.release(-1)
    with pytest.raises(OverflowError, match="does not fit 64 bits"):
        sp.retain(2**64)
    with pytest.raises(TypeError, match="dict"):
        sp.init([])
    with pytest.raises(KeyError):
        sp.init({})
    assert sp.release(0) == 0
    assert cusafe.implementation() in ("c", "python")


def test_handle_functions_take_exact_ints_themselves(ctx):
    """cusafe.retain_handle and release_handle are the extension's: an
    exact int of 64 bits is one C call; every other value goes to the
    ctypes twins, which convert or explain it."""
    if cusafe.implementation() != "c":
        pytest.skip("the package runs on ctypes")
    from cusafe import _capi, _speedups
    assert cusafe.retain_handle is _speedups.retain_handle
    assert cusafe.release_handle is _speedups.release_handle
    reached = []

    def spy(name, fn):
        def twin(handle):
            reached.append((name, handle))
            return fn(handle)
        return twin

    class IndexLike:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    h = ctx.alloc(16).detach()
    _speedups.handle_functions(spy("retain", _capi._retain_handle_py),
                               spy("release", _capi._release_handle_py))
    try:
        cusafe.retain_handle(h)
        cusafe.release_handle(h)
        assert reached == []
        like = IndexLike(h)
        cusafe.retain_handle(like)
        cusafe.release_handle(like)
        assert reached == [("retain", like), ("release", like)]
        del reached[:]
        for call, value, error in (
                (cusafe.retain_handle, -1, ValueError),
                (cusafe.release_handle, 2**64 + h, OverflowError),
                (cusafe.release_handle, True, cusafe.CusafeError),
                (cusafe.retain_handle, "x", TypeError)):
            with pytest.raises(error):
                call(value)
        assert [v for _, v in reached] == [-1, 2**64 + h, True, "x"]
        del reached[:]
        cusafe.retain_handle(handle=h)  # keywords: the twin's to take
        cusafe.release_handle(handle=h)
        assert reached == [("retain", h), ("release", h)]
    finally:
        _speedups.handle_functions(_capi._retain_handle_py,
                                   _capi._release_handle_py)
    cusafe.release_handle(h)
    with pytest.raises(cusafe.CusafeError) as e:  # stale: the C call's
        cusafe.release_handle(h)
    assert e.value.status == cusafe.Status.INVALID_HANDLE
    for bad in ((), (len,), (len, 1), (len, len, len)):
        with pytest.raises(TypeError, match="takes two callables"):
            _speedups.handle_functions(*bad)


def test_handle_functions_replaced_during_their_call(ctx):
    """A twin that replaces the twins while it runs (its caller's last
    reference gone) is held through its call: no use after free."""
    if cusafe.implementation() != "c":
        pytest.skip("the package runs on ctypes")
    import functools
    from cusafe import _capi, _speedups

    def twin(handle):
        _speedups.handle_functions(_capi._retain_handle_py,
                                   _capi._release_handle_py)
        junk = [bytearray(200) for _ in range(2000)]  # reuses freed memory
        del junk
        return "twin's"

    try:
        for which in (0, 1):
            cached = functools.lru_cache(maxsize=128)(twin)
            twins = [_capi._retain_handle_py, _capi._release_handle_py]
            twins[which] = cached
            _speedups.handle_functions(*twins)
            del cached, twins
            call = (cusafe.retain_handle, cusafe.release_handle)[which]
            assert call(1.5) == "twin's"
            with pytest.raises(TypeError):  # the restored twin's answer
                call(1.5)
    finally:
        _speedups.handle_functions(_capi._retain_handle_py,
                                   _capi._release_handle_py)


def test_handle_functions_take_keywords_both_ways(ctx):
    """handle= is taken as the ctypes functions take it."""
    import inspect
    h = ctx.alloc(16).detach()
    cusafe.retain_handle(handle=h)
    cusafe.release_handle(handle=h)
    assert list(inspect.signature(cusafe.retain_handle).parameters) == \
        ["handle"]
    assert cusafe.retain_handle.__name__ == "retain_handle"
    assert cusafe.release_handle.__name__ == "release_handle"
    with pytest.raises(TypeError):
        cusafe.retain_handle(h, handle=h)
    with pytest.raises(TypeError):
        cusafe.release_handle()
    cusafe.release_handle(h)
    assert stale(h)


# --------------------------------------------------------------------------
# What both implementations promise, tested in the run of each
# (tests/pytest.sh runs this suite with CUSAFE_PURE_PYTHON=1 and without).
# --------------------------------------------------------------------------


def test_the_objects_are_the_implementation_s(ctx):
    """The run tests what it says: with "c" every owning object is a
    _speedups.Object, released by its deallocation (no Python
    finalizer); with "python" none is, and each class has __del__."""
    objects = [ctx, ctx.alloc(16), ctx.stream(), ctx.event(),
               ctx.load_builtin()]
    objects.append(objects[-1].kernel("cusafe_fill_f32"))
    objects.append(objects[1].view(0, 8))
    if cusafe.implementation() == "c":
        from cusafe import _speedups
        for obj in objects:
            assert isinstance(obj, _speedups.Object), obj
            assert not hasattr(type(obj), "__del__"), obj
        assert isinstance(objects[1], _speedups.BufferObject)
        assert isinstance(ctx, _speedups.ContextObject)
    else:
        assert cusafe.implementation() == "python"
        for obj in objects:
            assert hasattr(type(obj), "__del__"), obj
            assert not any(t.__module__ == "cusafe._speedups"
                           for t in type(obj).__mro__), obj
    for obj in objects[1:]:
        obj.close()


class Counter:
    """A thread that counts as fast as it can, to see whether another
    thread holds the GIL: counted(fn) is how far it got while fn ran,
    rate(seconds) how far it gets in that time with the GIL free."""

    def __enter__(self):
        self.n = 0
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        while self.n == 0:
            time.sleep(0.001)
        return self

    def run(self):
        while not self.stop:
            self.n += 1

    def counted(self, fn):
        start = self.n
        fn()
        return self.n - start

    def rate(self, seconds):
        return self.counted(lambda: time.sleep(seconds))

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join(10)


SLEEP_US = 400000


def block_in(name):
    """Makes the next call of the fake's `name` sleep SLEEP_US
    microseconds after it answered, in C, holding no lock: usleep is the
    hook, its microseconds the hook's argument."""
    f = fake()
    f.fake_set_call_hook.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                     ctypes.c_void_p]
    usleep = ctypes.cast(ctypes.CDLL(None).usleep, ctypes.c_void_p)
    name = name.encode()
    block_in.kept = name  # the fake keeps the pointer
    f.fake_set_call_hook(name, usleep, SLEEP_US)
    return lambda: fake().fake_log_count(name)


@needs_fake
def test_blocking_calls_let_other_threads_run(ctx):
    """A release that frees pinned memory (cudaFreeHost waits for the
    device), and a pinned allocation, leave the GIL to other threads, by
    close(), by the collector and by release_handle() alike: a thread that
    counts meanwhile gets far more than in a tenth of the sleep."""
    fake().fake_log_count.restype = ctypes.c_size_t
    fake().fake_log_count.argtypes = [ctypes.c_char_p]

    def free_by_close():
        b = ctx.alloc(64, cusafe.Memory.HOST_PINNED)
        block_in("cudaFreeHost")
        return b.close

    def free_by_collector():
        box = [ctx.alloc(64, cusafe.Memory.HOST_PINNED)]
        block_in("cudaFreeHost")
        return box.clear

    def free_by_release_handle():
        raw = ctx.alloc(64, cusafe.Memory.HOST_PINNED).detach()
        block_in("cudaFreeHost")
        return lambda: cusafe.release_handle(raw)

    def pinned_alloc():
        block_in("cudaMallocHost")
        return lambda: ctx.alloc(64, cusafe.Memory.HOST_PINNED).close()

    with Counter() as c:
        tenth = c.rate(SLEEP_US / 1e7)
        for how in (free_by_close, free_by_collector, free_by_release_handle,
                    pinned_alloc):
            fn = how()
            t = time.monotonic()
            n = c.counted(fn)
            assert time.monotonic() - t >= SLEEP_US / 1e6, \
                "%s: the hook did not run" % how.__name__
            assert n > 3 * tenth, (how.__name__, n, tenth)


def test_collection_keeps_the_exception_being_raised(ctx):
    """An object collected while an exception propagates, whose release
    runs Python code (the last reference of a wrapped array gives the
    producer back, whose finalizer raises and catches an exception of its
    own), releases at once and leaves the exception as it was."""
    b = ctx.alloc(64)
    deleted = []

    class Producer:
        def __init__(self):
            self.__cuda_array_interface__ = {
                "shape": (64,), "typestr": "|u1",
                "data": (b.interop_pointer(), False), "version": 3}

        def __del__(self):
            try:  # an exception raised and caught here ...
                int("x")
            except ValueError:  # ... must not clear the TypeError
                pass
            deleted.append(True)

    def fail():
        # The dict fails on its unhashable key with the Buffer as its
        # value: the Buffer goes while the TypeError is being raised.
        return {"w": cusafe.Buffer.wrap(Producer(), ctx), ((),): None,
                (): None, ([],): None}

    with pytest.raises(TypeError, match="unhashable"):
        fail()
    assert deleted == [True]  # at once, not by the collector
    b.close()


def test_no_reference_leaks(ctx):
    """Neither the objects nor their failures keep what they were given:
    the reference counts of the arguments are unchanged after many calls,
    and the memory Python allocates stays flat."""
    size = int("1000003")  # an int of its own, not a cached small one
    pinned = cusafe.Memory.HOST_PINNED
    closed = cusafe.Context(0)
    closed.close()
    bad = [("size", -1), ("size", 2.5), ("memory", 7)]

    def calls(n):
        for _ in range(n):
            ctx.alloc(size).close()
            with ctx.alloc(size, pinned) as b:
                b.handle
            b = ctx.alloc(size)
            del b
            s = ctx.stream()
            raw = s.detach()
            cusafe.retain_handle(raw)
            cusafe.release_handle(raw)
            cusafe.release_handle(raw)
            for call, value in ((cusafe.retain_handle, raw),
                                (cusafe.release_handle, raw),
                                (cusafe.release_handle, -1),
                                (cusafe.retain_handle, 2**64),
                                (cusafe.retain_handle, 1.0)):
                try:  # a stale handle; values refused by the ctypes twin
                    call(value)
                except (cusafe.CusafeError, ValueError, OverflowError,
                        TypeError):
                    pass
            for what, value in bad:
                try:
                    if what == "size":
                        ctx.alloc(value)
                    else:
                        ctx.alloc(size, value)
                except (ValueError, TypeError):
                    pass
            try:
                closed.alloc(size)
            except ValueError:
                pass

    m = ctx.load_builtin()
    fill = m.kernel("cusafe_fill_f32")
    scale = m.kernel("cusafe_scale_f32")
    buf = ctx.alloc(64)
    value = float("2.5")
    prepared = fill.prepare(1, 16, buf, cusafe.F32(value), 16)
    stream = ctx.stream()
    args = (buf, cusafe.F32(value), 16)
    foreign = Foreign(buf)
    try:  # host memory with __dlpack__: refused by the wrap
        import numpy
        host = numpy.zeros(4, "f4")
    except ImportError:  # not an array: refused before any wrap
        host = memoryview(bytearray(16))

    def launches(n):
        for _ in range(n):
            fill.launch(1, 16, *args)
            fill(1, (16,), buf, cusafe.F32(value), 16, stream=stream)
            prepared()
            fill.launch(2, 16, *args, cluster=(2,), cooperative=True,
                        priority=-1)
            fill.launch(1, 4, foreign, cusafe.F32(value), 4)
            for bad in ((foreign, value, 4), (foreign, cusafe.F32(value),
                                              True), (foreign, host)):
                try:
                    fill.launch(1, 4, *bad)
                except (cusafe.CusafeError, TypeError):
                    pass
            for kwargs in ({"priority": True}, {"priority": -6}):
                try:
                    fill.launch(2, 16, *args, **kwargs)
                except (cusafe.CusafeError, TypeError):
                    pass
            for bad in ((buf, value, 16), (buf, cusafe.F32(value),
                                           cusafe.I8(size)),
                        (buf, cusafe.F32(value), 2**64), (buf,),
                        (buf, cusafe.F32(value), "x")):
                try:
                    scale.launch(1, 16, *bad)
                except (cusafe.CusafeError, TypeError, OverflowError):
                    pass

    before_calls = calls

    def calls(n):  # noqa: F811
        before_calls(n)
        launches(n)

    calls(200)  # warm: caches filled
    watched = (size, pinned, ctx, closed, fill, buf, value, stream, args,
               foreign)
    before = [sys.getrefcount(o) for o in watched]
    tracemalloc.start()
    try:
        calls(100)
        first, _ = tracemalloc.get_traced_memory()
        calls(2000)
        gc.collect()
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    after = [sys.getrefcount(o) for o in watched]
    assert after == before
    # 2000 rounds of some 20 calls: a leak of one object a call would be
    # hundreds of kilobytes.
    assert second - first < 16384, (first, second)


class Foreign:
    """An array of another library, through the CUDA Array Interface: a
    window on the first 16 bytes of a cusafe buffer."""

    def __init__(self, buf):
        self.buf = buf
        self.__cuda_array_interface__ = {
            "shape": (4,), "typestr": "<f4",
            "data": (buf.interop_pointer(), False), "version": 3,
            "strides": None, "stream": None}


def test_launches_of_the_common_cases_stay_in_c(ctx, monkeypatch):
    """With "c", a launch of Buffers, ints, floats, typed scalars, Bytes
    and other libraries' arrays, with grids as ints, tuples or lists, on
    the default stream or a Stream, with or without Hopper's attributes,
    never reaches the ctypes path; other arguments, and values that must
    be converted or refused, do."""
    if cusafe.implementation() != "c":
        pytest.skip("the package runs on ctypes")
    from cusafe import _launch, _objects, _speedups
    reached = []

    def ctypes_path(*args, **kwargs):
        reached.append(args[3:])
        return _launch._launch_py(*args, **kwargs)

    def register(launch):
        _speedups.setup(
            check=_objects._check_status, count=_objects._count,
            kinds=_objects._MEMORY_KINDS, buffer=cusafe.Buffer,
            stream=cusafe.Stream,
            scalars=(cusafe.I8, cusafe.U8, cusafe.I16, cusafe.U16,
                     cusafe.I32, cusafe.U32, cusafe.I64, cusafe.U64,
                     cusafe.F32, cusafe.F64),
            bytes=cusafe.Bytes, launch=launch, foreign=_launch._foreign,
            wrap=_launch._wrap_arg)

    m = ctx.load_builtin()
    fill = m.kernel("cusafe_fill_f32")
    b = ctx.alloc(64)
    s = ctx.stream()
    register(ctypes_path)
    try:
        fill.launch(1, 16, b, cusafe.F32(1.0), 16)
        fill.launch((1,), [16, 1], b, cusafe.F32(-1e38), 16, shared=0,
                    stream=s)
        fill(1, (16, 1, 1), b, cusafe.F32(1.0), cusafe.U64(16))
        # Converted here and refused by the library (kind for parameter
        # 1, a float): the edges of each type's range.
        for value in (cusafe.F64(1.0), cusafe.I8(-128), cusafe.U8(255),
                      cusafe.I16(-3), cusafe.U16(3), cusafe.I32(-2**31),
                      cusafe.U32(2**32 - 1), cusafe.I64(-2**63),
                      cusafe.U64(2**64 - 1), cusafe.Bytes(bytes(8)), 1.5,
                      -2**63):
            with pytest.raises(cusafe.CusafeError) as e:
                fill.launch(1, 16, b, value, 16)
            assert e.value.status == cusafe.Status.INVALID_ARGUMENTS
        # Hopper's attributes, given or left as their defaults; refused
        # by the library, not by the conversion.
        fill.launch(1, 16, b, cusafe.F32(1.0), 16, cooperative=False,
                    programmatic_serialization=False, cluster=None,
                    priority=None)
        fill.launch(4, 16, b, cusafe.F32(1.0), 16, cluster=[2, 1],
                    cooperative=True, programmatic_serialization=True,
                    priority=0, stream=s)
        fill.launch(16, 16, b, cusafe.F32(1.0), 16, cluster=(16,))
        for kwargs in ({"cluster": 0}, {"cluster": (2**32 - 1, 2**32 - 1,
                                                    2**32 - 1)},
                       {"priority": -2**31}, {"priority": 2**31 - 1}):
            with pytest.raises(cusafe.CusafeError):
                fill.launch(2, 16, b, cusafe.F32(1.0), 16, **kwargs)
        # Arrays of other libraries: wrapped for the launch (a DLPack
        # export of cusafe's own needs the library's DLPack calls).
        if "cusafe_buffer_to_dlpack" not in cusafe.library().missing:
            fill.launch(1, 16, b.as_array(), cusafe.F32(1.0), 16)
        fill.launch(1, 4, Foreign(b), cusafe.F32(1.0), 4, stream=s,
                    cluster=1)
        assert reached == []
        for args, kwargs in (
                ((1, 16, object(), cusafe.F32(1.0), 16), {}),
                ((1, 16, Foreign(b), cusafe.F32(1.0), True), {}),
                ((1, 16, b, 2.0, 16), {"cooperative": 0}),
                ((1, 16, b, 2.0, 16), {"programmatic_serialization": 1}),
                ((1, 16, b, 2.0, 16), {"priority": True}),
                ((1, 16, b, 2.0, 16), {"priority": 2**31}),
                ((1, 16, b, 2.0, 16), {"cluster": -1}),
                ((1, 16, b, 2.0, 16), {"cluster": (1, 1, 1, 1)}),
                ((1, 16, b, 2.0, 16), {"cluster": 2.0}),
                ((1, 16, b, cusafe.F32(2), 16), {}),       # converted
                ((1, 16, b, cusafe.F32(1e39), 16), {}),    # refused
                ((1, 16, b, cusafe.I32(2**31), 16), {}),   # refused
                ((1, 16, b, cusafe.F32(1.0), True), {}),   # refused
                ((1, 16, b, cusafe.F32(1.0), 2**63), {}),  # refused
                (((1, 1, 1, 1), 16, b, cusafe.F32(1.0), 16), {}),
                ((1.0, 16, b, cusafe.F32(1.0), 16), {}),
                ((1, 16, b, cusafe.F32(1.0), 16), {"shared": -1}),
                ((1, 16, b, cusafe.F32(1.0), 16), {"stream": 0})):
            try:
                fill.launch(*args, **kwargs)
            except (TypeError, ValueError, OverflowError,
                    cusafe.CusafeError):
                pass
        assert len(reached) == 18, reached
    finally:
        register(_launch._launch_py)
    b.close()
    s.close()


@needs_fake
def test_bytes_kept_while_arrays_are_wrapped(ctx):
    """Python code that runs while a later argument, another library's
    array, is wrapped may replace a Bytes argument's data: the launch still
    passes the bytes it was given."""
    import array
    import struct
    from conftest import last_launch_args

    class Swapper:
        def __init__(self, buf, victim):
            self.buf, self.victim = buf, victim
            self.junk = []

        @property
        def __cuda_array_interface__(self):
            self.victim.data = b"\0" * 8  # frees the bytes given
            self.junk = [bytes([0x41]) * 8 for _ in range(1000)]
            return {"shape": (8,), "typestr": "<f4",
                    "data": (self.buf.interop_pointer(), False),
                    "version": 3, "strides": None, "stream": None}

    m = ctx.compile('extern "C" __global__ void k(long long a, float *p) {}',
                    "k.cu")
    k = m.kernel("k")
    buf = cusafe.Buffer.from_host(ctx, array.array("f", [0.0] * 8))
    b = cusafe.Bytes(struct.pack("<q", 0x1122334455667788))
    k.launch(1, 1, b, Swapper(buf, b))
    assert last_launch_args()[:8] == struct.pack("<q", 0x1122334455667788)
    ctx.synchronize()


CALLS = textwrap.dedent("""
    import cusafe
    ctx = cusafe.Context(0)
    k = ctx.compile('extern "C" __global__ void k(int a) {}', "k.cu").kernel("k")
    p = k.prepare(1, 1, cusafe.I32(1))
    calls = [lambda: ctx.alloc(), lambda: ctx.alloc(1, 0, 3),
             lambda: ctx.alloc(1, foo=2), lambda: ctx.alloc(1, size=2),
             lambda: ctx.alloc(memory=0), lambda: p(1), lambda: p(x=1)]
    for call in calls:
        try:
            call()
            print("no error")
        except TypeError as e:
            print(e)
    print(cusafe.implementation())
""")


def test_call_shape_errors_alike():
    """Calls of the wrong shape say the same both ways."""
    try:
        import cusafe._speedups  # noqa: F401
    except ImportError:
        pytest.skip("cusafe._speedups not built: only the ctypes path ran")
    pure, c = run(True, CALLS), run(False, CALLS)
    assert pure[-1] == "python" and c[-1] == "c"
    assert pure[:-1] == c[:-1]
    assert pure[1] == ("Context.alloc() takes from 2 to 3 positional "
                       "arguments but 4 were given")
    assert pure[5] == "PreparedLaunch() takes no arguments"
