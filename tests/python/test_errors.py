"""Every error the objects raise: closed and detached objects, stale and
wrong-type handles, arguments of the wrong type, offsets and sizes out of
range, objects of different contexts, failures of the CUDA runtime."""

import array
import gc
import struct

import pytest

import cusafe
from conftest import fake, live_counts, needs_fake, run_python

needs_two_devices = pytest.mark.skipif(
    cusafe.device_count() < 2, reason="needs two devices")


def status_of(fn, *args, **kwargs):
    """The CusafeError that fn raises (it must raise one)."""
    with pytest.raises(cusafe.CusafeError) as e:
        fn(*args, **kwargs)
    # Without the frames of the call, which hold its objects.
    return e.value.with_traceback(None)


# --------------------------------------------------------------------------
# Closed objects: every method raises ValueError naming the class.
# --------------------------------------------------------------------------


def closed_objects(ctx):
    """{name: (closed object, [(what, call)])} for every class."""
    other = ctx.alloc(16)
    s_ok, e_ok = ctx.stream(), ctx.event()
    m = ctx.load_builtin()

    c = cusafe.Context(ctx.device)
    c.close()
    s = ctx.stream()
    s.close()
    e = ctx.event()
    e.close()
    b = ctx.alloc(16)
    b.close()
    mod = ctx.load_builtin()
    mod.close()
    k = m.kernel("cusafe_fill_f32")
    k.close()
    return {
        "Context": (c, [
            ("handle", lambda: c.handle),
            ("synchronize", c.synchronize),
            ("stream_priority_range", c.stream_priority_range),
            ("stream", c.stream),
            ("event", c.event),
            ("alloc", lambda: c.alloc(8)),
            ("Buffer", lambda: cusafe.Buffer(c, 8)),
            ("from_host", lambda: cusafe.Buffer.from_host(c, b"x")),
            ("Stream", lambda: cusafe.Stream(c)),
            ("Event", lambda: cusafe.Event(c)),
            ("load_builtin", c.load_builtin),
            ("Module.builtin", lambda: cusafe.Module.builtin(c)),
            ("from_file", lambda: cusafe.Module.from_file(c, "/dev/null")),
            ("from_data", lambda: cusafe.Module.from_data(c, b"x")),
            ("compile", lambda: c.compile("")),
            ("Stream.wrap", lambda: cusafe.Stream.wrap(0, c)),
            ("set_label", lambda: c.set_label("x")),
            ("detach", c.detach),
        ]),
        "Stream": (s, [
            ("handle", lambda: s.handle),
            ("synchronize", s.synchronize),
            ("query", s.query),
            ("wait_event", lambda: s.wait_event(e_ok)),
            ("context", lambda: s.context),
            ("interop_handle", s.interop_handle),
            ("__cuda_stream__", s.__cuda_stream__),
            ("use_buffers", lambda: s.use_buffers(other)),
            ("Stream.wrap", lambda: cusafe.Stream.wrap(s)),
            ("as stream of record", lambda: e_ok.record(s)),
            ("as stream of write", lambda: other.write(b"x", stream=s)),
            ("as stream of read", lambda: other.read(stream=s)),
            ("as stream of fill", lambda: other.fill(0, stream=s)),
            ("as stream of copy_from",
             lambda: other.copy_from(other, 8, 0, 8, stream=s)),
            ("as stream of alloc", lambda: cusafe.Buffer(ctx, 8, stream=s)),
            ("as stream of launch", lambda: m.kernel("cusafe_fill_f32")
             .launch(1, 4, other, cusafe.F32(0), 4, stream=s)),
            ("set_label", lambda: s.set_label("x")),
            ("detach", s.detach),
        ]),
        "Event": (e, [
            ("handle", lambda: e.handle),
            ("record", e.record),
            ("synchronize", e.synchronize),
            ("query", e.query),
            ("elapsed_ms", lambda: e.elapsed_ms(e_ok)),
            ("as end of elapsed_ms", lambda: e_ok.elapsed_ms(e)),
            ("as event of wait_event", lambda: s_ok.wait_event(e)),
            ("set_label", lambda: e.set_label("x")),
            ("detach", e.detach),
        ]),
        "Buffer": (b, [
            ("handle", lambda: b.handle),
            ("context", lambda: b.context),
            ("view", lambda: b.view(0, 4)),
            ("write", lambda: b.write(b"x")),
            ("write async", lambda: b.write(b"x", stream=s_ok)),
            ("read", b.read),
            ("read into", lambda: b.read(bytearray(4))),
            ("read async", lambda: b.read(stream=s_ok)),
            ("copy_from", lambda: b.copy_from(other)),
            ("as src of copy_from", lambda: other.copy_from(b, 4)),
            ("fill", lambda: b.fill(0)),
            ("interop_pointer", b.interop_pointer),
            ("as_array", b.as_array),
            ("__dlpack__", b.__dlpack__),
            ("__dlpack_device__", b.__dlpack_device__),
            ("__cuda_array_interface__",
             lambda: b.__cuda_array_interface__),
            ("use_buffers", lambda: s_ok.use_buffers(b)),
            ("launch", lambda: m.kernel("cusafe_fill_f32").launch(
                1, 4, b, cusafe.F32(0), 4)),
            ("prepare", lambda: m.kernel("cusafe_fill_f32").prepare(
                1, 4, b, cusafe.F32(0), 4)),
            ("set_label", lambda: b.set_label("x")),
            ("detach", b.detach),
        ]),
        "Module": (mod, [
            ("handle", lambda: mod.handle),
            ("kernel", lambda: mod.kernel("cusafe_fill_f32")),
            ("__getitem__", lambda: mod["cusafe_fill_f32"]),
            ("set_label", lambda: mod.set_label("x")),
            ("detach", mod.detach),
        ]),
        "Kernel": (k, [
            ("handle", lambda: k.handle),
            ("params", lambda: k.params),
            ("suggest_config", lambda: k.suggest_config(64)),
            ("launch", lambda: k.launch(1, 4, other, cusafe.F32(0), 4)),
            ("__call__", lambda: k(1, 4, other, cusafe.F32(0), 4)),
            ("prepare", lambda: k.prepare(1, 4, other, cusafe.F32(0), 4)),
            ("set_label", lambda: k.set_label("x")),
            ("detach", k.detach),
        ]),
    }


@pytest.mark.parametrize("cls", ["Context", "Stream", "Event", "Buffer",
                                 "Module", "Kernel"])
def test_closed_objects_raise_value_error(ctx, cls):
    obj, calls = closed_objects(ctx)[cls]
    assert obj.closed
    assert repr(obj) == "<cusafe.%s closed>" % cls
    obj.close()  # a no-op
    for what, call in calls:
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == "this cusafe.%s is closed" % cls, what


def test_closed_objects_keep_their_plain_attributes(ctx):
    b = ctx.alloc(24, cusafe.Memory.HOST_PINNED)
    b.close()
    assert (b.size, len(b), b.memory) == (24, 24, cusafe.Memory.HOST_PINNED)
    c = cusafe.Context(0)
    c.close()
    assert c.device == 0
    assert c.properties.total_memory == \
        cusafe.device_properties(0).total_memory
    k = ctx.load_builtin().kernel("cusafe_scale_f32")
    k.close()
    assert k.name == "cusafe_scale_f32"
    assert b != b and not (c == c)  # closed objects equal nothing


# --------------------------------------------------------------------------
# Stale handles: released behind the object's back.
# --------------------------------------------------------------------------


def test_stale_handles(ctx):
    m = ctx.load_builtin()
    # (Not a Context: each device has one context handle, which the
    # fixture's reference keeps.)
    objects = [ctx.stream(), ctx.event(), ctx.alloc(8), ctx.load_builtin(),
               m.kernel("cusafe_fill_f32")]
    for obj in objects:
        h = obj.handle
        cusafe.release_handle(h)  # the object's own reference
        assert not obj.closed
        name = type(obj).__name__.lower()
        with pytest.raises(cusafe.CusafeError) as e:
            obj.set_label("x")
        assert e.value.status == cusafe.Status.INVALID_HANDLE
        assert e.value.message == \
            "handle 0x%016x is stale: its object was released" % h
        with pytest.raises(cusafe.CusafeError) as e:
            obj.close()
        assert e.value.status == cusafe.Status.INVALID_HANDLE
        assert e.value.message == \
            "%s 0x%016x is stale: its object was released" % (name, h)
        assert obj.closed
        obj.close()  # closed now: a no-op


def test_stale_handles_in_typed_calls(ctx):
    b, s, e = ctx.alloc(8), ctx.stream(), ctx.event()
    k = ctx.load_builtin().kernel("cusafe_fill_f32")
    for obj in (b, s, e, k):
        cusafe.release_handle(obj.handle)
    for call, what, h in (
            (b.read, "buffer", b.handle),
            (lambda: b.write(b"x"), "buffer", b.handle),
            (b.interop_pointer, "buffer", b.handle),
            (s.synchronize, "stream", s.handle),
            (s.query, "stream", s.handle),
            (e.query, "event", e.handle),
            (e.record, "event", e.handle),
            (lambda: k.params, "kernel", k.handle),
            (lambda: k.suggest_config(16), "kernel", k.handle)):
        err = status_of(call)
        assert err.status == cusafe.Status.INVALID_HANDLE
        assert err.message == \
            "%s 0x%016x is stale: its object was released" % (what, h)
    ok = ctx.alloc(16)
    err = status_of(ok.copy_from, b, 4)
    assert err.message == \
        "src 0x%016x is stale: its object was released" % b.handle
    err = status_of(ok.fill, 0, stream=s)
    assert err.message == \
        "stream 0x%016x is stale: its object was released" % s.handle
    for obj in (b, s, e, k):
        with pytest.raises(cusafe.CusafeError):
            obj.close()


# --------------------------------------------------------------------------
# Handles of the wrong type: cusafe objects where another kind is expected.
# --------------------------------------------------------------------------


def test_wrong_type_handles(ctx):
    """A cusafe object of another class where one is expected raises
    TypeError naming the parameter, before any call."""
    s, e, b = ctx.stream(), ctx.event(), ctx.alloc(16)
    cases = ((lambda: s.wait_event(ctx.stream()),
              "event must be a cusafe.Event, not Stream"),
             (lambda: e.elapsed_ms(b), "end must be a cusafe.Event, not Buffer"),
             (lambda: b.copy_from(s, 4), "src must be a cusafe.Buffer, not Stream"),
             (lambda: s.use_buffers(b, e),
              "each argument must be a cusafe.Buffer, not Event"),
             (lambda: cusafe.Stream(b), "ctx must be a cusafe.Context, not Buffer"),
             (lambda: cusafe.Buffer(s, 8), "ctx must be a cusafe.Context, not Stream"),
             (lambda: cusafe.Module.builtin(e),
              "ctx must be a cusafe.Context, not Event"))
    for call, message in cases:
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == message


# --------------------------------------------------------------------------
# Arguments of the wrong Python type: TypeError, whatever the argument.
# --------------------------------------------------------------------------


def wrong_type_calls(ctx):
    """{what: call} of calls given an argument of the wrong type."""
    b, s, e = ctx.alloc(16), ctx.stream(), ctx.event()
    k = ctx.load_builtin().kernel("cusafe_fill_f32")
    return {
        "Context(str)": lambda: cusafe.Context("0"),
        "Context(None)": lambda: cusafe.Context(None),
        "alloc(str)": lambda: ctx.alloc("16"),
        "alloc(float)": lambda: ctx.alloc(16.0),
        "Buffer(str)": lambda: cusafe.Buffer("ctx", 16),
        "Stream(str)": lambda: cusafe.Stream("ctx"),
        "Event(str)": lambda: cusafe.Event("ctx"),
        "Module.builtin(None)": lambda: cusafe.Module.builtin(None),
        "from_host(str)": lambda: cusafe.Buffer.from_host(ctx, "text"),
        "write(str)": lambda: b.write("text"),
        "write(int)": lambda: b.write(4),
        "read(bytes)": lambda: b.read(b"\0" * 16),
        "fill(stream=str)": lambda: b.fill(0, stream="s"),
        "write(stream=Event)": lambda: b.write(b"x", stream=e),
        "record(Event)": lambda: e.record(ctx.event()),
        "copy_from(bytes)": lambda: b.copy_from(b"0123"),
        "copy_from(None)": lambda: b.copy_from(None, 4),
        "wait_event(None)": lambda: s.wait_event(None),
        "elapsed_ms(str)": lambda: e.elapsed_ms("end"),
        "use_buffers(str)": lambda: s.use_buffers("buf"),
        "set_label(int)": lambda: b.set_label(5),
        "kernel(int)": lambda: ctx.load_builtin().kernel(5),
        "launch(grid=str)": lambda: k.launch("1", 4, b, cusafe.F32(0), 4),
        "launch(str)": lambda: k.launch(1, 4, b, "0", 4),
        "launch(None)": lambda: k.launch(1, 4, None, cusafe.F32(0), 4),
        "launch(bool)": lambda: k.launch(1, 4, b, cusafe.F32(0), True),
        "I64(float)": lambda: k.launch(1, 4, b, cusafe.F32(0),
                                       cusafe.I64(4.0)),
        "F32(str)": lambda: k.launch(1, 4, b, cusafe.F32("0"), 4),
        "Bytes(str)": lambda: cusafe.Bytes("text"),
        "as_array(int)": lambda: b.as_array(4),
        "Stream.wrap(str)": lambda: cusafe.Stream.wrap("stream", ctx),
        "Stream.wrap(bool)": lambda: cusafe.Stream.wrap(True, ctx),
        "Buffer.wrap(object)": lambda: cusafe.Buffer.wrap(object()),
    }


WRONG_TYPES = [
    "Context(str)", "Context(None)", "alloc(str)", "alloc(float)",
    "Buffer(str)", "Stream(str)", "Event(str)", "Module.builtin(None)",
    "from_host(str)", "write(str)", "write(int)", "read(bytes)",
    "fill(stream=str)", "write(stream=Event)", "record(Event)",
    "copy_from(bytes)", "copy_from(None)", "wait_event(None)",
    "elapsed_ms(str)", "use_buffers(str)", "set_label(int)", "kernel(int)",
    "launch(grid=str)", "launch(str)", "launch(None)", "launch(bool)",
    "I64(float)", "F32(str)", "Bytes(str)", "as_array(int)",
    "Stream.wrap(str)", "Stream.wrap(bool)", "Buffer.wrap(object)"]


@pytest.mark.parametrize("what", WRONG_TYPES)
def test_wrong_types_raise_type_error(ctx, what):
    calls = wrong_type_calls(ctx)
    assert sorted(calls) == sorted(WRONG_TYPES)
    with pytest.raises(TypeError):
        calls[what]()


# --------------------------------------------------------------------------
# Offsets and sizes out of range.
# --------------------------------------------------------------------------


def test_transfers_at_and_beyond_the_end(ctx):
    b = ctx.alloc(64)
    v = b.view(16, 32)
    s = ctx.stream()
    for stream in (None, s):
        b.write(b"", offset=64, stream=stream)
        assert b.read(offset=64, stream=stream) == bytearray()
        b.write(b"z", offset=63, stream=stream)
        b.fill(7, offset=64, size=0, stream=stream)
        for call, text in (
                (lambda: b.write(b"xy", offset=63, stream=stream),
                 "write of 2 bytes at offset 63 exceeds buffer of 64 bytes"),
                (lambda: b.write(b"", offset=65, stream=stream),
                 "write of 0 bytes at offset 65 exceeds buffer of 64 bytes"),
                (lambda: b.read(size=65, stream=stream),
                 "read of 65 bytes at offset 0 exceeds buffer of 64 bytes"),
                (lambda: b.read(bytearray(2), offset=63, stream=stream),
                 "read of 2 bytes at offset 63 exceeds buffer of 64 bytes"),
                (lambda: b.read(offset=65, stream=stream),
                 "read of 0 bytes at offset 65 exceeds buffer of 64 bytes"),
                (lambda: b.fill(0, offset=60, size=5, stream=stream),
                 "fill of 5 bytes at offset 60 exceeds buffer of 64 bytes"),
                (lambda: v.write(bytes(33), stream=stream),
                 "write of 33 bytes at offset 0 exceeds buffer of 32 bytes"),
                (lambda: v.fill(0, 30, 3, stream=stream),
                 "fill of 3 bytes at offset 30 exceeds buffer of 32 bytes")):
            err = status_of(call)
            assert err.status == cusafe.Status.OUT_OF_RANGE
            assert err.message == text
    s.synchronize()
    assert bytes(b.read(offset=63)) == b"z"


def test_copies_out_of_range(ctx):
    a, b = ctx.alloc(64), ctx.alloc(32)
    b.copy_from(a, 32, 0, 32)
    b.copy_from(a, 0, 32, 64)
    err = status_of(b.copy_from, a)
    assert err.status == cusafe.Status.OUT_OF_RANGE
    assert err.message == \
        "copy of 64 bytes at offset 0 exceeds destination buffer of 32 bytes"
    err = status_of(a.copy_from, b, 16, 0, 24)
    assert err.status == cusafe.Status.OUT_OF_RANGE
    assert err.message == \
        "copy of 16 bytes at offset 24 exceeds source buffer of 32 bytes"
    err = status_of(a.copy_from, a, 16, 8, 0)
    assert err.status == cusafe.Status.INVALID_VALUE
    assert err.message == "source and destination ranges overlap"
    v = a.view(0, 32)
    err = status_of(a.copy_from, v, 16, 8, 0)  # one allocation
    assert err.status == cusafe.Status.INVALID_VALUE
    a.copy_from(v, 16, 32, 0)


def test_views_out_of_range(ctx):
    b = ctx.alloc(64)
    assert b.view(64, 0).size == 0
    assert b.view(0, 64).size == 64
    v = b.view(16, 32)
    assert v.view(32, 0).size == 0
    for parent, offset, size, limit in ((b, 60, 8, 64), (b, 65, 0, 64),
                                        (v, 16, 17, 32),
                                        (b, 8, 2**64 - 1, 64)):
        err = status_of(parent.view, offset, size)
        assert err.status == cusafe.Status.OUT_OF_RANGE
        assert err.message == "view of %d bytes at offset %d exceeds " \
            "buffer of %d bytes" % (size, offset, limit)


def negative_calls(ctx):
    """{what: call} of calls given a negative offset or size."""
    b, c = ctx.alloc(64), ctx.alloc(64)
    return {
        "Buffer(size)": lambda: cusafe.Buffer(ctx, -1),
        "alloc(size)": lambda: ctx.alloc(-1),
        "write(offset)": lambda: b.write(b"x", offset=-1),
        "read(offset)": lambda: b.read(offset=-1),
        "read(size)": lambda: b.read(size=-1),
        "fill(offset)": lambda: b.fill(0, offset=-1),
        "fill(size)": lambda: b.fill(0, size=-1),
        "view(offset)": lambda: b.view(-1, 4),
        "view(size)": lambda: b.view(0, -1),
        "copy_from(size)": lambda: c.copy_from(b, -1),
        "copy_from(dst_offset)": lambda: c.copy_from(b, 4, dst_offset=-1),
        "copy_from(src_offset)": lambda: c.copy_from(b, 4, src_offset=-1),
        "as_array(offset)": lambda: b.as_array(offset=-1),
    }


NEGATIVE = ["Buffer(size)", "alloc(size)", "write(offset)", "read(offset)",
            "read(size)", "fill(offset)", "fill(size)", "view(offset)",
            "view(size)", "copy_from(size)", "copy_from(dst_offset)",
            "copy_from(src_offset)", "as_array(offset)"]


@pytest.mark.parametrize("what", NEGATIVE)
def test_negative_offsets_and_sizes_raise_value_error(ctx, what):
    """A negative offset or size is a ValueError that names it, as in
    Context.alloc, not a number wrapped around to 2**64 - 1."""
    calls = negative_calls(ctx)
    assert sorted(calls) == sorted(NEGATIVE)
    with pytest.raises(ValueError, match=r"-1|negative"):
        calls[what]()


def test_unknown_memory_kind(ctx):
    for call in (lambda: ctx.alloc(8, 7),
                 lambda: cusafe.Buffer(ctx, 8, 7),
                 lambda: cusafe.Buffer.from_host(ctx, b"x", 7),
                 lambda: ctx.alloc(8, -1)):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value).startswith("unknown memory kind ")


@pytest.mark.parametrize("value", [-1, 256, 1000])
def test_fill_value_out_of_byte_range(ctx, value):
    """fill takes a byte, 0..255; another value must not be truncated."""
    b = ctx.alloc(8)
    b.fill(1)
    with pytest.raises(ValueError, match=str(value)):
        b.fill(value)
    assert bytes(b.read()) == b"\1" * 8


def test_fill_values_and_ranges(ctx):
    b = ctx.alloc(16)
    b.fill(0)
    b.fill(255, offset=4, size=4)
    b.fill(0x5A, offset=12)
    assert bytes(b.read()) == bytes(4) + b"\xff" * 4 + bytes(4) + b"Z" * 4


def test_alloc_too_large(ctx):
    total = ctx.properties.total_memory
    for kind in (cusafe.Memory.DEVICE, cusafe.Memory.MANAGED):
        err = status_of(ctx.alloc, 1 << 50, kind)
        assert err.status == cusafe.Status.OUT_OF_MEMORY
        assert "1125899906842624" in err.message
    err = status_of(cusafe.Buffer, ctx, total + 1)
    assert err.status == cusafe.Status.OUT_OF_MEMORY
    err = status_of(cusafe.Buffer, ctx, 1 << 50, stream=ctx.stream())
    assert err.status == cusafe.Status.OUT_OF_MEMORY


def test_host_memory_errors(ctx):
    b = ctx.alloc(16)
    with pytest.raises(ValueError, match="C-contiguous"):
        b.write(memoryview(bytes(32))[::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        b.read(memoryview(bytearray(32))[::2])
    with pytest.raises(TypeError, match="read-only"):
        b.read(memoryview(bytes(16)))
    # Any layout of contiguous host memory: cast to bytes.
    b.write(array.array("i", [1, -1, 2, -2]))
    out = array.array("i", [0] * 4)
    assert b.read(out) is out and list(out) == [1, -1, 2, -2]
    m = memoryview(bytearray(16)).cast("B", (4, 4))
    b.read(m)
    assert m.tobytes() == struct.pack("<4i", 1, -1, 2, -2)
    # out is filled whole; size is for a new bytearray only.
    assert b.read(size=4, offset=4) == bytearray(b"\xff" * 4)


# --------------------------------------------------------------------------
# Streams, events and their arguments.
# --------------------------------------------------------------------------


def test_stream_and_event_arguments(ctx):
    least, greatest = ctx.stream_priority_range()
    assert greatest <= least
    for p in (least, greatest):
        ctx.stream(priority=p).synchronize()
    for p in (least + 1, greatest - 1):
        err = status_of(ctx.stream, priority=p)
        assert err.status == cusafe.Status.INVALID_VALUE
        assert err.message == "priority %d is outside the device's range " \
            "[%d, %d]" % (p, greatest, least)
    err = status_of(cusafe.Stream, ctx, flags=8)
    assert err.status == cusafe.Status.INVALID_VALUE
    assert err.message == "unknown stream flags 0x8"
    err = status_of(cusafe.Event, ctx, flags=4)
    assert err.status == cusafe.Status.INVALID_VALUE
    assert err.message == "unknown event flags 0x4"
    cusafe.Stream(ctx, flags=cusafe.STREAM_NON_BLOCKING).synchronize()
    ev = cusafe.Event(ctx, flags=cusafe.EVENT_DISABLE_TIMING |
                      cusafe.EVENT_BLOCKING_SYNC)
    ev.record()
    ev.synchronize()
    assert ev.query() is True


def test_elapsed_time_errors(ctx):
    start, end = ctx.event(), ctx.event()
    quiet = ctx.event(timing=False)
    never = ctx.event()
    for e in (start, end, quiet):
        e.record()
    end.synchronize()
    ms = start.elapsed_ms(end)
    assert isinstance(ms, float) and ms >= 0.0
    for a, b in ((start, quiet), (quiet, end)):
        err = status_of(a.elapsed_ms, b)
        assert err.status == cusafe.Status.INVALID_VALUE
        assert err.message == \
            "event was created with CUSAFE_EVENT_DISABLE_TIMING"
    err = status_of(start.elapsed_ms, never)
    assert err.status == cusafe.Status.CUDA
    assert err.cuda_error == 400  # cudaErrorInvalidResourceHandle
    assert err.message.startswith("cudaEventElapsedTime failed: ")
    # An event never recorded counts as done.
    assert never.query() is True
    never.synchronize()


@needs_fake
def test_pending_work(ctx):
    f = fake()
    s, start, ev = ctx.stream(), ctx.event(), ctx.event()
    b = ctx.alloc(256)
    start.record(s)
    s.synchronize()
    f.fake_set_paused(1)
    try:
        b.fill(3, stream=s)
        ev.record(s)
        assert s.query() is False and ev.query() is False
        err = status_of(start.elapsed_ms, ev)
        assert err.status == cusafe.Status.NOT_READY
        assert err.cuda_error == 600  # cudaErrorNotReady
        ev.synchronize()
        assert s.query() is True and ev.query() is True
        assert start.elapsed_ms(ev) >= 0.0
    finally:
        f.fake_set_paused(0)
    assert bytes(b.read()) == b"\3" * 256


# --------------------------------------------------------------------------
# Objects of different contexts.
# --------------------------------------------------------------------------


@needs_two_devices
def test_objects_of_two_devices(ctx):
    other = cusafe.Context(1)
    s1, e1, b1 = other.stream(), other.event(), other.alloc(64)
    s0, e0, b0 = ctx.stream(), ctx.event(), ctx.alloc(64)
    e1.record(s1)
    e0.record(s0)
    for call, text in (
            (lambda: s0.wait_event(e1),
             "event belongs to device 1 but stream belongs to device 0"),
            (lambda: e0.record(s1),
             "stream belongs to device 1 but event belongs to device 0"),
            (lambda: e0.elapsed_ms(e1),
             "start belongs to device 0 but end belongs to device 1"),
            (lambda: b0.write(b"x", stream=s1),
             "stream belongs to device 1 but buffer belongs to device 0"),
            (lambda: b0.read(stream=s1),
             "stream belongs to device 1 but buffer belongs to device 0"),
            (lambda: b0.fill(0, stream=s1),
             "stream belongs to device 1 but buffer belongs to device 0"),
            (lambda: s1.use_buffers(b0),
             "buffers 0 belongs to device 0 but stream belongs to "
             "device 1"),
            (lambda: b0.copy_from(b0.view(0, 0), 0,
                                  stream=cusafe.Context(1).stream()),
             "stream belongs to device 1 but dst belongs to device 0")):
        err = status_of(call)
        assert err.status == cusafe.Status.CONTEXT_MISMATCH
        assert err.message == text
    # A copy between the devices is fine.
    b0.write(bytes(range(64)))
    b1.copy_from(b0)
    assert bytes(b1.read()) == bytes(range(64))
    other.close()


@needs_two_devices
def test_stream_ordered_alloc_checks_the_context(ctx):
    """Buffer(ctx, size, stream=s) with a stream of another context is an
    error, not a buffer of the stream's device."""
    s1 = cusafe.Context(1).stream()
    err = status_of(cusafe.Buffer, ctx, 64, stream=s1)
    assert err.status == cusafe.Status.CONTEXT_MISMATCH


# --------------------------------------------------------------------------
# Modules.
# --------------------------------------------------------------------------


def test_module_errors(ctx, tmp_path):
    err = status_of(cusafe.Module.from_file, ctx, "/nonexistent/k.cubin")
    assert err.status == cusafe.Status.INVALID_IMAGE
    assert err.message.startswith(
        "module /nonexistent/k.cubin cannot be loaded: ")
    junk = tmp_path / "junk.cubin"
    junk.write_bytes(b"junk")
    err = status_of(cusafe.Module.from_file, ctx, junk)
    assert err.status == cusafe.Status.INVALID_IMAGE
    assert err.message.startswith("module %s cannot be loaded: " % junk)
    err = status_of(cusafe.Module.from_data, ctx, b"junk")
    assert err.status == cusafe.Status.INVALID_IMAGE
    assert err.message.startswith("module <memory image> cannot be loaded: ")
    err = status_of(cusafe.Module.from_data, ctx, b"")
    assert err.status == cusafe.Status.INVALID_SIZE
    assert err.message == "image of 0 bytes"
    m = ctx.load_builtin()
    err = status_of(m.kernel, "no_such_kernel")
    assert err.status == cusafe.Status.NOT_FOUND
    assert err.message == \
        'kernel "no_such_kernel" not found in module <built-in kernels>'
    with pytest.raises(TypeError, match="Module.builtin"):
        cusafe.Module()
    with pytest.raises(TypeError, match=r"Module.kernel\(name\)"):
        cusafe.Kernel()


def test_compile_errors(ctx):
    err = status_of(cusafe.Module.compile, ctx, "#error boom\n",
                    name="boom.cu")
    assert err.status == cusafe.Status.COMPILE
    assert err.message.startswith("compilation of boom.cu failed: ")
    assert "boom.cu(1)" in err.log and "boom" in err.log
    err = status_of(ctx.compile, 'extern "C" __global__ void k() {}',
                    options=["--no-such-option"])
    assert err.status == cusafe.Status.COMPILE
    assert err.message.startswith("compilation of source.cu failed: ")
    assert "--no-such-option" in err.log


def test_failed_calls_leave_no_reference_cycles(ctx):
    """A failed call's exception, once dropped, takes the frames of the
    call with it: the objects they hold (host memory exports, DLPack
    tensors, wrapped buffers) go at once, not at some later collection."""
    b = ctx.alloc(8)
    k = ctx.load_builtin().kernel("cusafe_fill_f32")
    failing = (lambda: cusafe.handle_type(cusafe.NULL_HANDLE),
               lambda: b.write(bytes(9)),
               lambda: b.view(4, 8),
               lambda: cusafe.Context(99),
               lambda: k.launch(0, 1, b, cusafe.F32(0), 2))
    gc.collect()
    gc.disable()
    try:
        raised = 0
        for call in failing:
            try:
                call()
            except cusafe.CusafeError:
                raised += 1
        found = gc.collect()
    finally:
        gc.enable()
    assert (raised, found) == (len(failing), 0)


# --------------------------------------------------------------------------
# Failures of the CUDA runtime (the fake's fault injection).
# --------------------------------------------------------------------------


@needs_fake
@pytest.mark.parametrize("function, inject, call, status, cuda_error", [
    ("cudaStreamCreateWithPriority", 999, lambda c: c.stream(),
     cusafe.Status.CUDA, 999),
    ("cudaEventCreateWithFlags", 2, lambda c: c.event(),
     cusafe.Status.OUT_OF_MEMORY, 2),
    ("cudaMallocAsync", 2, lambda c: c.alloc(64),
     cusafe.Status.OUT_OF_MEMORY, 2),
    ("cudaMallocHost", 2, lambda c: c.alloc(64, cusafe.Memory.HOST_PINNED),
     cusafe.Status.OUT_OF_MEMORY, 2),
    ("cudaMallocManaged", 801, lambda c: c.alloc(64, cusafe.Memory.MANAGED),
     cusafe.Status.NOT_SUPPORTED, 801),
    ("cudaMemcpyAsync", 999, lambda c: cusafe.Buffer.from_host(c, b"x" * 64),
     cusafe.Status.CUDA, 999),
    ("cudaLibraryLoadData", 200, lambda c: c.load_builtin(),
     cusafe.Status.INVALID_IMAGE, 200),
    ("cudaLaunchKernel", 719, lambda c: c.load_builtin().kernel(
        "cusafe_fill_f32").launch(1, 4, c.alloc(16), cusafe.F32(1), 4),
     cusafe.Status.CUDA, 719),
    ("nvrtcCompileProgram", 999, lambda c: c.compile(
        'extern "C" __global__ void k() {}'), cusafe.Status.COMPILE, 0),
])
def test_cuda_failures(ctx, function, inject, call, status, cuda_error):
    f = fake()
    before = live_counts()
    f.fake_fail_function(function.encode(), inject)
    # A launch that the driver's call refuses is made through the runtime.
    if function == "cudaLaunchKernel":
        f.fake_fail_function(b"cuLaunchKernel", inject)
    try:
        err = status_of(call, ctx)
    finally:
        f.fake_fail_clear()
    assert err.status == status
    assert err.cuda_error == cuda_error
    if status == cusafe.Status.INVALID_IMAGE:
        assert err.message.startswith(
            "module <built-in kernels> cannot be loaded: ")
    elif status != cusafe.Status.COMPILE:
        assert err.message.startswith(function + " failed: ")
    assert live_counts()[:2] == before[:2] and \
        live_counts()[3] == before[3]
    call(ctx)  # works again


@needs_fake
def test_managed_memory_not_supported(ctx):
    f = fake()
    f.fake_set_managed_supported(0, 0)
    try:
        err = status_of(ctx.alloc, 64, cusafe.Memory.MANAGED)
    finally:
        f.fake_set_managed_supported(0, 1)
    assert err.status == cusafe.Status.NOT_SUPPORTED
    assert ctx.alloc(64, cusafe.Memory.MANAGED).memory == \
        cusafe.Memory.MANAGED


@needs_fake
def test_sticky_error(ctx):
    """After a kernel fault every call on the device fails with CUDA and
    the fault's error; releases still work."""
    f = fake()
    b, s, e = ctx.alloc(64), ctx.stream(), ctx.event()
    doomed = ctx.alloc(64)
    f.fake_set_sticky_error(0, 700)
    try:
        for call in (ctx.synchronize, s.synchronize, b.read,
                     lambda: b.write(b"x"), lambda: ctx.alloc(8),
                     lambda: e.record(s), ctx.stream):
            err = status_of(call)
            assert err.status == cusafe.Status.CUDA
            assert err.cuda_error == 700
            assert err.message.endswith(
                "failed: an illegal memory access was encountered")
        doomed.close()
        assert doomed.closed
    finally:
        f.fake_set_sticky_error(0, 0)
    ctx.synchronize()
    b.write(b"y" * 64)
    assert bytes(b.read()) == b"y" * 64


# --------------------------------------------------------------------------
# Every CUDA call of an operation failing in turn (the fake's fault
# injection), each operation in an interpreter of its own.
# --------------------------------------------------------------------------

FAULT_LOOP = r'''
import ctypes, gc, sys
import cusafe

f = cusafe.library().cdll
f.fake_log_length.restype = ctypes.c_size_t
f.fake_log_entry.restype = ctypes.c_char_p
f.fake_log_entry.argtypes = [ctypes.c_size_t]
f.fake_fail_after.argtypes = [ctypes.c_ulong, ctypes.c_int, ctypes.c_int]
for name in ("fake_live_allocations", "fake_live_streams",
             "fake_live_events", "fake_live_libraries"):
    getattr(f, name).restype = ctypes.c_size_t
    getattr(f, name).argtypes = [ctypes.c_int]
# A failed free or destroy leaks what it should have freed (the library
# does not retry them): those calls are not failed here.
CLEANUP = {b"cudaFree", b"cudaFreeAsync", b"cudaFreeHost",
           b"cudaStreamDestroy", b"cudaEventDestroy", b"cudaLibraryUnload",
           b"cuDevicePrimaryCtxRelease", b"nvrtcDestroyProgram"}
IMAGE = b"FAKECUBIN\nkernel k p 4 8\n\0"

class Foreign:
    def __init__(self, b):
        self.b = b
        self.__cuda_array_interface__ = {
            "shape": (16,), "typestr": "<f4", "version": 3, "stream": 1,
            "data": (b.interop_pointer(), False)}

class TorchLike:
    def __init__(self, raw):
        self.cuda_stream, self.device = raw, 0

def lent(a):
    a.__cuda_array_interface__
    return a

def setup():
    ctx = cusafe.Context(0)
    o = {"ctx": ctx, "b": ctx.alloc(64), "s": ctx.stream(),
         "m": ctx.load_builtin()}
    o["k"] = o["m"].kernel("cusafe_fill_f32")
    return o

# Each returns everything it makes, released after the failure is cleared.
OPS = {
    "Context": lambda o: cusafe.Context(1),
    "alloc": lambda o: o["ctx"].alloc(64),
    "pinned": lambda o: o["ctx"].alloc(64, cusafe.Memory.HOST_PINNED),
    "from_host": lambda o: cusafe.Buffer.from_host(o["ctx"], bytes(64)),
    "alloc_async": lambda o: cusafe.Buffer(o["ctx"], 64, stream=o["s"]),
    "stream": lambda o: o["ctx"].stream(),
    "event": lambda o: o["ctx"].event(),
    "Stream.wrap": lambda o: cusafe.Stream.wrap(0, o["ctx"]),
    "Stream.wrap(object)": lambda o: cusafe.Stream.wrap(
        TorchLike(o["s"].interop_handle())),
    "as_array": lambda o: lent(o["b"].as_array("f4", stream=o["s"])),
    "__dlpack__": lambda o: (lambda a: (a, a.__dlpack__(stream=1)))(
        o["b"].as_array("f4")),
    "from_dlpack": lambda o: cusafe.from_dlpack(o["b"], stream=o["s"]),
    "Buffer.wrap": lambda o: cusafe.Buffer.wrap(Foreign(o["b"])),
    "launch": lambda o: o["k"].launch(1, 16, o["b"], cusafe.F32(1), 16,
                                      stream=o["s"]),
    "launch(foreign)": lambda o: o["k"].launch(1, 16, Foreign(o["b"]),
                                               cusafe.F32(1), 16),
    "prepare(foreign)": lambda o: o["k"].prepare(
        1, 16, Foreign(o["b"]), cusafe.F32(1), 16),
    "from_data": lambda o: cusafe.Module.from_data(o["ctx"], IMAGE),
    "builtin": lambda o: o["ctx"].load_builtin(),
    "kernel": lambda o: o["m"]["cusafe_axpy_f32"],
    "compile": lambda o: o["ctx"].compile(
        'extern "C" __global__ void k(int n) {}'),
    "suggest_config": lambda o: o["k"].suggest_config(100),
    "copy_from": lambda o: o["b"].copy_from(o["b"], 16, 0, 32,
                                            stream=o["s"]),
    "read": lambda o: o["b"].read(),
    "write(stream)": lambda o: o["b"].write(bytes(64), stream=o["s"]),
    "synchronize": lambda o: (o["ctx"].synchronize(), o["s"].synchronize(),
                              o["s"].query()),
}
op = OPS[sys.argv[1]]

o = setup()
first = f.fake_log_length()
r = op(o)
calls = [f.fake_log_entry(i) for i in range(first, f.fake_log_length())]
calls = [c for c in calls if not c.startswith(b"exec:")]
del r, o
failures = 0
for n, call in enumerate(calls, 1):
    if call in CLEANUP:
        continue
    o, r = setup(), None
    f.fake_fail_after(n, 2, 0)  # cudaErrorMemoryAllocation, once
    try:
        r = op(o)
    except cusafe.CusafeError as e:
        failures += 1
        assert (e.status, e.message.split(" failed: ")[0]) == \
            (cusafe.Status.OUT_OF_MEMORY, call.decode()), (n, call, e)
    finally:
        f.fake_fail_clear()
    del r, o
    gc.collect()
assert failures > 0, calls
live = [getattr(f, name)(-1) for name in (
    "fake_live_allocations", "fake_live_streams", "fake_live_events",
    "fake_live_libraries")]
assert live == [0, 0, 0, 0], live
cusafe.shutdown()
print(failures)
'''

FAULT_OPS = ["Context", "alloc", "pinned", "from_host", "alloc_async",
             "stream", "event", "Stream.wrap", "Stream.wrap(object)",
             "as_array", "__dlpack__", "from_dlpack", "Buffer.wrap",
             "launch", "launch(foreign)", "prepare(foreign)", "from_data",
             "builtin", "kernel", "compile", "suggest_config", "copy_from",
             "read", "write(stream)", "synchronize"]


@needs_fake
@pytest.mark.parametrize("op", FAULT_OPS)
def test_every_cuda_call_failing(op):
    """Call N of the operation fails, for every N: each failure raises
    CusafeError with the failed call's status and name, and once all is
    released nothing is left (no handle in the leak report, no CUDA
    object in the fake)."""
    if op in ("__dlpack__", "from_dlpack") and \
            "cusafe_buffer_to_dlpack" in cusafe.library().missing:
        pytest.skip("libcusafe was built without DLPack")
    code = FAULT_LOOP.replace("op = OPS[sys.argv[1]]", "op = OPS[%r]" % op)
    r = run_python(code, CUSAFE_LEAK_REPORT="1")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert int(r.stdout) > 0
