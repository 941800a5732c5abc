"""Stream capture and graphs through the package: what a graph holds,
replays, what a capture refuses, and a block that raises."""

import array

import pytest

import cusafe


def floats(buf):
    out = array.array("f", bytes(buf.size))
    buf.read(out)
    return list(out)


def fill(module, buf, value, stream):
    k = module.kernel("cusafe_fill_f32")
    k.launch(1, 256, buf, cusafe.F32(value), buf.size // 4, stream=stream)


def test_capture_and_replay_hold_what_they_use(ctx):
    s = ctx.stream(non_blocking=True)
    module = ctx.load_builtin()
    x = ctx.alloc(4 * 256)
    x.fill(0)
    with s.capture() as graph:
        assert s.capturing
        with pytest.raises(ValueError, match="has not ended"):
            graph.handle
        fill(module, x, 2.5, s)
        module.kernel("cusafe_scale_f32").launch(
            1, 256, x, cusafe.F32(2.0), 256, stream=s)
    assert not s.capturing
    assert cusafe.handle_type(graph.handle) == cusafe.HandleType.GRAPH
    assert floats(x) == [0.0] * 256  # nothing ran
    view = x.view(0, 4 * 256)
    x.close()
    module.close()
    view.fill(0)
    graph.launch(s)
    graph()  # on the default stream, after the first replay
    assert floats(view) == [5.0] * 256
    graph.close()
    assert graph.closed
    with pytest.raises(ValueError, match="closed"):
        graph.launch(s)


def test_refused_while_capturing(ctx):
    s = ctx.stream(non_blocking=True)
    b = ctx.alloc(64)
    with s.capture() as graph:
        for call, what in ((s.synchronize, "synchronizing"),
                           (ctx.synchronize, "synchronizing the context"),
                           (lambda: b.write(b"x" * 8, stream=s),
                            "a write from host memory"),
                           (lambda: cusafe.Buffer(ctx, 64, stream=s),
                            "an allocation")):
            with pytest.raises(cusafe.CusafeError) as e:
                call()
            assert e.value.status == cusafe.Status.CAPTURING
            assert e.value.message.startswith(what)
        b.fill(7, stream=s)
    graph.launch()
    assert bytes(b.read()) == b"\7" * 64
    with pytest.raises(cusafe.CusafeError) as e:
        s.end_capture()
    assert e.value.status == cusafe.Status.CAPTURING
    assert e.value.message == \
        "stream 0x%016x does not capture" % s.handle


def test_a_raising_block_discards_the_capture(ctx):
    s = ctx.stream(non_blocking=True)
    with pytest.raises(RuntimeError, match="in the block"):
        with s.capture() as graph:
            ctx.alloc(64).fill(1, stream=s)
            raise RuntimeError("in the block")
    assert not s.capturing
    assert graph.closed
    with s.capture() as again:  # the stream captures again
        pass
    again.launch(s)


def test_begin_and_end_by_hand(ctx):
    s, t = ctx.stream(), ctx.stream()
    s.begin_capture()
    with pytest.raises(cusafe.CusafeError) as e:
        s.begin_capture()
    assert e.value.status == cusafe.Status.CAPTURING
    ev = ctx.event(timing=False)
    ev.record(s)
    t.wait_event(ev)  # t joins
    assert t.capturing
    ev.record(t)
    s.wait_event(ev)
    with pytest.raises(cusafe.CusafeError) as e:
        t.end_capture()
    assert e.value.message.startswith(
        "stream 0x%016x joined a capture that began on stream" % t.handle)
    g = s.end_capture()
    assert isinstance(g, cusafe.Graph) and not t.capturing
    g.instantiate()
    g.launch(t)
    with pytest.raises(TypeError, match="Stream.capture"):
        cusafe.Graph()


def test_array_dropped_while_a_blocking_stream_captures(ctx):
    # An Array made with the defaults lends its memory on the legacy
    # default stream; dropped while a blocking stream captures (when CUDA
    # forbids any use of the legacy stream), its finalizer leaves the
    # capture unharmed, and the buffer goes once the capture has ended.
    s = ctx.stream()  # blocking
    buf = ctx.alloc(256)
    other = ctx.alloc(256)
    arr = buf.as_array("u1")
    buf.close()
    with s.capture() as graph:
        other.fill(2, stream=s)
        arr.close()
    graph.launch(s)
    s.synchronize()
    got = bytearray(256)
    other.read(got)
    assert got == b"\x02" * 256
    graph.close()
    other.close()
    s.close()
