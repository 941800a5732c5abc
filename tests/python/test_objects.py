"""The objects of the package: their methods, errors and finalizers."""

import array
import gc
import weakref

import pytest

import cusafe
from conftest import is_fake, stale


def floats(buf):
    out = array.array("f", bytes(buf.size))
    buf.read(out)
    return list(out)


def test_version_is_the_library_s():
    assert cusafe.__version__ == cusafe.version()
    assert cusafe.library().missing == [] or \
        all("dlpack" in name for name in cusafe.library().missing)


def test_device_queries(ctx):
    assert cusafe.device_count() >= 1
    props = cusafe.device_properties(0)
    assert props.total_memory > 0
    assert ctx.device == 0
    assert ctx.properties.total_memory == props.total_memory
    least, greatest = ctx.stream_priority_range()
    assert greatest <= least
    ctx.synchronize()
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.device_properties(99)
    assert e.value.status == cusafe.Status.INVALID_DEVICE
    assert "99" in e.value.message


def test_close_with_and_handles(ctx):
    s = ctx.stream(non_blocking=True)
    h = s.handle
    assert cusafe.handle_type(h) == cusafe.HandleType.STREAM
    assert not s.closed and "cusafe.Stream 0x" in repr(s)
    s.close()
    s.close()  # a no-op
    assert s.closed and repr(s) == "<cusafe.Stream closed>"
    with pytest.raises(ValueError, match="closed"):
        s.handle
    assert stale(h)
    with ctx.event() as ev:
        eh = ev.handle
    assert stale(eh)
    b = ctx.alloc(64)
    raw = b.detach()
    assert b.closed and not stale(raw)
    cusafe.release_handle(raw)
    assert stale(raw)
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.release_handle(raw)
    assert e.value.status == cusafe.Status.INVALID_HANDLE
    assert "stale" in e.value.message


def test_garbage_collection_and_cycles(ctx):
    b = ctx.alloc(64)
    h = b.handle
    gone = weakref.ref(b)
    del b
    assert gone() is None and stale(h)
    s = ctx.stream()
    cycle = [s]
    cycle.append(cycle)
    sh = s.handle
    del s, cycle
    gc.collect()
    assert stale(sh)


def test_children_keep_parents(ctx):
    b = ctx.alloc(256)
    v = b.view(64, 64)
    bh = b.handle
    b.close()
    assert stale(bh)  # the caller's handle; the view keeps the memory
    v.write(b"x" * 64)
    assert bytes(v.read()) == b"x" * 64
    assert v.context.device == 0


def test_buffers(ctx):
    data = array.array("f", range(256))
    for kind in (cusafe.Memory.DEVICE, cusafe.Memory.HOST_PINNED,
                 cusafe.Memory.MANAGED):
        with cusafe.Buffer.from_host(ctx, data, kind) as b:
            assert b.size == len(b) == 1024 and b.memory == kind
            assert floats(b) == list(data)
            with ctx.alloc(1024) as c:
                c.copy_from(b)
                assert floats(c) == list(data)
                c.fill(0, offset=4, size=4)
                assert floats(c)[1] == 0.0
    z = ctx.alloc(0)
    assert z.size == 0 and z.interop_pointer() == 0
    assert z.read() == bytearray()
    s = ctx.stream()
    a = cusafe.Buffer(ctx, 64, stream=s)
    a.write(b"\1" * 64, stream=s)
    out = bytearray(64)
    a.read(out, stream=s)
    s.synchronize()
    assert out == b"\1" * 64


def test_buffer_errors(ctx):
    b = ctx.alloc(64)
    with pytest.raises(cusafe.CusafeError) as e:
        b.write(b"x" * 65)
    assert e.value.status == cusafe.Status.OUT_OF_RANGE
    assert e.value.message == \
        "write of 65 bytes at offset 0 exceeds buffer of 64 bytes"
    with pytest.raises(TypeError, match="read-only"):
        b.read(b"\0" * 64)
    with pytest.raises(ValueError, match="device memory only"):
        cusafe.Buffer(ctx, 64, cusafe.Memory.MANAGED, stream=ctx.stream())
    with pytest.raises(cusafe.CusafeError) as e:
        b.view(60, 8)
    assert e.value.status == cusafe.Status.OUT_OF_RANGE


def test_events_and_streams(ctx):
    s, t = ctx.stream(), ctx.stream(non_blocking=True)
    start, end = ctx.event(), ctx.event(blocking_sync=True)
    b = ctx.alloc(1 << 16)
    start.record(s)
    b.fill(1, stream=s)
    end.record(s)
    t.wait_event(end)
    t.synchronize()
    assert end.query() and s.query()
    assert start.elapsed_ms(end) >= 0.0
    assert s.context.device == 0
    with pytest.raises(cusafe.CusafeError) as e:
        ctx.event(timing=False).elapsed_ms(end)
    assert e.value.status in (cusafe.Status.INVALID_VALUE,
                              cusafe.Status.CUDA)


def test_kernels(ctx):
    n = 1000
    a = cusafe.Buffer.from_host(ctx, array.array("f", range(n)))
    c = ctx.alloc(4 * n)
    with cusafe.Module.builtin(ctx) as m:
        add = m.kernel("cusafe_vecadd_f32")
        fill = m["cusafe_fill_f32"]
        assert add.name == "cusafe_vecadd_f32"
        assert add.params == [8, 8, 8, 8]
        grid, block = add.suggest_config(n)
        assert grid * block >= n
        add.launch(grid, block, c, a, a, n)
        assert floats(c) == [2.0 * i for i in range(n)]
        fill.launch(grid, block, c, cusafe.F32(3.0), n)
        assert floats(c) == [3.0] * n
        run = add.prepare(grid, block, c, a, a, n)
        run()
        assert floats(c) == [2.0 * i for i in range(n)]
        with pytest.raises(TypeError, match="cannot pass str"):
            add.launch(1, 1, c, a, a, "n")
        with pytest.raises(OverflowError):
            fill.launch(1, 1, c, cusafe.I32(2**31), n)
        with pytest.raises(cusafe.CusafeError) as e:
            add.launch(1, 1, c, a, n)
        assert e.value.status == cusafe.Status.INVALID_ARGUMENTS
        with pytest.raises(cusafe.CusafeError) as e:
            m.kernel("no_such_kernel")
        assert e.value.status == cusafe.Status.NOT_FOUND
        a.close()
        with pytest.raises(ValueError, match="closed"):
            add.launch(grid, block, c, a, a, n)
        with pytest.raises(cusafe.CusafeError) as e:
            run()
        assert e.value.status == cusafe.Status.INVALID_HANDLE


def test_compile(ctx):
    src = 'extern "C" __global__ void twice(float *x, unsigned long n) {' \
          ' unsigned long i = blockIdx.x * blockDim.x + threadIdx.x;' \
          ' if (i < n) x[i] *= 2; }'
    if is_fake():
        pytest.skip("the fake CUDA compiles no CUDA C++")
    with cusafe.Module.compile(ctx, src) as m:
        b = cusafe.Buffer.from_host(ctx, array.array("f", [1.0] * 64))
        m.kernel("twice").launch(1, 64, b, 64)
        assert floats(b) == [2.0] * 64
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.Module.compile(ctx, "this is not C++")
    assert e.value.status == cusafe.Status.COMPILE and e.value.log
