"""Buffers shared between processes: Context.alloc_shareable,
Buffer.export / from_export, send_buffer / recv_buffer over Unix sockets,
and Buffers through multiprocessing (spawn and forkserver), with the
sender gone before the receiver uses what it got.  On the fake CUDA the
memory is a memfd, so it really crosses processes, as on a GPU."""

import copy
import fcntl
import gc
import multiprocessing
import os
import pickle
import signal
import socket
import time

import pytest

import cusafe
from conftest import fake, is_fake, run_python

COUNT = 100  # buffers each way
SIZE = 4096


def pattern(i, salt=0):
    """The bytes buffer i holds: different for every buffer and salt."""
    return bytes((i * 7 + j + salt) & 0xff for j in range(256)) * (SIZE // 256)


def wait_for_parent_exit(parent, timeout=60):
    """Waits until the process `parent` (this one's parent) is gone: this
    process is reparented when it exits."""
    end = time.monotonic() + timeout
    while os.getppid() == parent:
        if time.monotonic() > end:
            raise AssertionError("parent %d still alive" % parent)
        time.sleep(0.01)


# ---- the processes' code (module level: spawn imports it) -----------------


def receive_args(buffers, results, sender):
    """Gets COUNT Buffers among its arguments, waits for their sender to be
    gone, then reads, checks and rewrites each."""
    wait_for_parent_exit(sender)
    wrong = []
    for i, b in enumerate(buffers):
        if b.read() != pattern(i):
            wrong.append(i)
        b.write(pattern(i, 1))
        if b.read() != pattern(i, 1):
            wrong.append(-i)
    results.put((os.getpid(), len(buffers), wrong))


def patterned(ctx, put=None):
    """COUNT shareable Buffers, buffer i holding pattern(i); each given to
    put() as it is made."""
    buffers = []
    for i in range(COUNT):
        b = ctx.alloc_shareable(SIZE)
        b.write(pattern(i))
        buffers.append(b)
        if put is not None:
            put(b)
    return buffers


def send_as_args(method, results):
    """Allocates COUNT shareable Buffers, starts a receiver with them among
    its arguments, releases its own and exits without waiting for it."""
    mp = multiprocessing.get_context(method)
    with cusafe.Context(0) as ctx:
        buffers = patterned(ctx)
        p = mp.Process(target=receive_args,
                       args=(buffers, results, os.getpid()))
        p.start()
        for b in buffers:
            b.close()
    results.put(("started", p.pid))
    results.close()
    results.join_thread()
    cusafe.shutdown()
    os._exit(0)  # no join of the receiver: it outlives this process


def send_on_queue(queue, received, end):
    """Puts COUNT shareable Buffers on a queue; once the receiver has them
    all, releases its own and ends as `end` says."""
    with cusafe.Context(0) as ctx:
        buffers = patterned(ctx, queue.put)
        if not received.wait(120):
            raise SystemExit(3)
        for b in buffers:
            b.close()
    if end == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


def send_and_exit(queue):
    """Puts one shareable Buffer on a queue and exits at once."""
    with cusafe.Context(0) as ctx:
        queue.put(ctx.alloc_shareable(SIZE))
    queue.close()
    queue.join_thread()


def send_on_socket(sock, ready):
    """Sends COUNT shareable Buffers (the odd ones as views) on a socket,
    releases them and exits before the receiver reads any."""
    with cusafe.Context(0) as ctx:
        for i in range(COUNT):
            if i % 2:
                with ctx.alloc_shareable(SIZE + 512) as b:
                    b.write(pattern(i), offset=512)
                    with b.view(512, SIZE) as v:
                        cusafe.send_buffer(sock, v)
            else:
                with ctx.alloc_shareable(SIZE) as b:
                    b.write(pattern(i))
                    cusafe.send_buffer(sock.fileno(), b)
    sock.close()
    ready.set()


class MyBuffer(cusafe.Buffer):
    """A subclass: it travels as Buffer does."""


def import_from_bytes(sock, results):
    """Rebuilds an export from its bytes and descriptor (socket.recv_fds),
    imports it as a MyBuffer, and tries multiprocessing's pickler on it."""
    from multiprocessing.reduction import ForkingPickler
    msg, fds, _, _ = socket.recv_fds(sock, 1024, 4)
    e = cusafe.BufferExport.from_bytes(msg, fds[0])
    b = MyBuffer.from_export(e)
    e.close()
    out = [type(b).__name__, b.size, bytes(b.read(size=4))]
    b.fill(0x44)
    try:  # exported here: a copy in this very process is refused
        ForkingPickler.loads(ForkingPickler.dumps(b))
    except cusafe.CusafeError as err:
        out.append(err.message)
    results.put(out)


def read_first_bytes(buffers, results):
    """The first byte of each Buffer it was given."""
    results.put([b.read(size=1) for b in buffers])


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def receive_in_other_context(sock, results):
    """recv_buffer in the context of another device than the memory's."""
    try:
        with cusafe.Context(1) as other:
            cusafe.recv_buffer(sock, other)
    except cusafe.CusafeError as e:
        results.put((e.status, str(e)))
    else:
        results.put(None)


# A name the receiver finds, but not as a Buffer subclass: the sender sets
# its own to one (monkeypatch); a child sees this.
Shadow = None


def receive_and_report(conn, count, results):
    """Receives count objects on conn; reports each outcome (the class's
    name, or the error's type and message) and this process's open
    descriptors after the first (CUDA's own are open then) and after the
    last."""
    out = []
    for i in range(count):
        if i == 1:
            before = open_fds()
        try:
            b = conn.recv()
        except Exception as e:
            out.append((type(e).__name__, str(e)))
        else:
            out.append(type(b).__name__)
            b.close()
    results.put((out, before, open_fds()))


def inheritable_fds():
    """The descriptors of this process that are not close-on-exec."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.get_inheritable(int(name)):
                out.add(int(name))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return out


def receive_lazy_subclass(conn, results):
    """Receives a Buffer of a class whose module it imports meanwhile;
    reports the class, and the descriptors that were inheritable at that
    import (where a module may start a process) and not before."""
    before = inheritable_fds()
    b = conn.recv()
    import ipc_subclass
    results.put((type(b).__name__, sorted(ipc_subclass.AT_IMPORT - before)))
    b.close()


def start_peer(mp, target, *args):
    """Starts target(sock, *args) in a child of the multiprocessing
    context mp, sock being one end of a Unix socket pair; returns the
    child and the other end."""
    mine, theirs = socket.socketpair()
    p = mp.Process(target=target, args=(theirs,) + args)
    p.start()
    theirs.close()
    return p, mine


# ---- one process ----------------------------------------------------------


def test_export_describes(ctx):
    b = ctx.alloc_shareable(1000)
    assert (b.size, b.memory) == (1000, cusafe.Memory.DEVICE)
    b.write(b"\x5a" * 1000)
    v = b.view(100, 50)
    with b.export() as e, v.export() as ev:
        assert (e.size, e.offset) == (1000, 0)
        assert (ev.size, ev.offset) == (50, 100)
        assert e.allocation % (2 << 20) == 0 and e.allocation >= 1000
        assert ev.allocation == e.allocation
        assert e.process_id == ev.process_id == os.getpid()
        assert e.device_uuid == ev.device_uuid
        assert e.device_uuid.startswith("GPU-") and len(e.device_uuid) == 40
        assert e.fd >= 0 and e.fd != ev.fd
        assert fcntl.fcntl(e.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert not e.closed
        assert repr(e) == (
            "<cusafe.BufferExport 1000 bytes at offset 0 of %d on %s, fd %d>"
            % (e.allocation, e.device_uuid, e.fd))
        fd = e.detach()
        assert e.closed
        with pytest.raises(ValueError, match="BufferExport is closed"):
            e.fd
        with pytest.raises(ValueError, match="BufferExport is closed"):
            e.detach()
        os.close(fd)
        e.close()  # closed already: nothing
        assert repr(e).endswith(", closed>")
    assert ev.closed
    v.close()
    b.close()


def test_refusals(ctx):
    with pytest.raises(cusafe.CusafeError) as err:
        ctx.alloc_shareable(0)
    assert err.value.status == cusafe.Status.INVALID_SIZE
    with pytest.raises(ValueError):
        ctx.alloc_shareable(-1)
    with pytest.raises(TypeError):
        ctx.alloc_shareable(2.5)
    plain = ctx.alloc(64)
    with pytest.raises(cusafe.CusafeError) as err:
        plain.export()
    assert err.value.status == cusafe.Status.INVALID_VALUE
    assert err.value.message == (
        "buffer 0x%x is not shareable: allocate it with "
        "Context.alloc_shareable" % plain.handle)
    b = ctx.alloc_shareable(64)
    with b.export() as e:
        with pytest.raises(cusafe.CusafeError) as err:
            cusafe.Buffer.from_export(e)
        assert err.value.status == cusafe.Status.INVALID_VALUE
        assert err.value.message == (
            "buffer exported by this process: use the buffer itself")
        for bad in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match="it owns a file descriptor"):
                bad(e)
    with pytest.raises(ValueError, match="BufferExport is closed"):
        cusafe.Buffer.from_export(e)
    with pytest.raises(TypeError, match="export must be a "
                       "cusafe.BufferExport, not int"):
        cusafe.Buffer.from_export(3)
    with pytest.raises(TypeError, match="made by Buffer.export"):
        cusafe.BufferExport()
    # Plain pickle still refuses every Buffer; multiprocessing's pickler
    # refuses memory that is not shareable, with the way out.
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        pickle.dumps(b)
    from multiprocessing.reduction import ForkingPickler
    with pytest.raises(TypeError) as err:
        ForkingPickler.dumps(plain)
    assert str(err.value) == (
        "cusafe.Buffer cannot be pickled or copied: its memory (64 bytes "
        "device) is not shareable, and its handle means nothing in another "
        "process; allocate it with Context.alloc_shareable(size) to send it")
    b.close()
    with pytest.raises(ValueError):
        b.export()
    with pytest.raises(ValueError):
        ForkingPickler.dumps(b)
    ctx2 = cusafe.Context(0)
    ctx2.close()
    with pytest.raises(ValueError):
        ctx2.alloc_shareable(64)
    plain.close()


def test_socket_refusals(ctx):
    b = ctx.alloc_shareable(64)
    r, w = os.pipe()
    try:
        with pytest.raises(cusafe.CusafeError) as err:
            cusafe.send_buffer(w, b)
        assert err.value.status == cusafe.Status.INVALID_VALUE
        with pytest.raises(TypeError):
            cusafe.send_buffer(object(), b)
        with pytest.raises(TypeError):
            cusafe.recv_buffer("x")
        for sock in (True, False):  # not stdout's or stdin's number
            with pytest.raises(TypeError, match="^sock must be a socket or "
                               "an int, not bool$"):
                cusafe.send_buffer(sock, b)
            with pytest.raises(TypeError, match="^sock must be a socket or "
                               "an int, not bool$"):
                cusafe.recv_buffer(sock)
    finally:
        os.close(r)
        os.close(w)
    a, c = socket.socketpair()
    cusafe.send_buffer(a, b)  # to this very process: refused at import
    with pytest.raises(cusafe.CusafeError) as err:
        cusafe.recv_buffer(c)
    assert err.value.message == (
        "buffer exported by this process: use the buffer itself")
    a.close()
    with pytest.raises(cusafe.CusafeError) as err:
        cusafe.recv_buffer(c)
    assert err.value.status == cusafe.Status.INVALID_VALUE
    assert err.value.message == "socket %d closed by its peer" % c.fileno()
    c.close()
    with pytest.raises(cusafe.CusafeError) as err:
        cusafe.send_buffer(a.fileno() if a.fileno() >= 0 else 10**6, b)
    assert err.value.status == cusafe.Status.INVALID_VALUE
    b.close()


# ---- between processes ----------------------------------------------------

METHODS = [m for m in ("spawn", "forkserver")
           if m in multiprocessing.get_all_start_methods()]


@pytest.mark.parametrize("method", METHODS)
def test_args_to_child_sender_gone(method):
    """COUNT Buffers among a Process's arguments: the sender exits right
    after start(); the receiver then reads and writes every one."""
    mp = multiprocessing.get_context(method)
    results = mp.Queue()
    s = mp.Process(target=send_as_args, args=(method, results))
    s.start()
    started, pid = results.get(timeout=120)
    s.join(60)
    assert s.exitcode == 0 and started == "started"
    got = results.get(timeout=120)
    assert got == (pid, COUNT, [])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("end", ["exit", "kill"])
def test_queue_from_child_sender_gone(method, end):
    """COUNT Buffers through a Queue from a child, which then releases its
    own and exits (or is killed); this process reads and writes them all
    afterwards, and its releases free nothing of anyone else's."""
    mp = multiprocessing.get_context(method)
    queue, received = mp.Queue(), mp.Event()
    s = mp.Process(target=send_on_queue, args=(queue, received, end))
    s.start()
    buffers = [queue.get(timeout=120) for _ in range(COUNT)]
    received.set()
    s.join(60)
    assert s.exitcode == (-signal.SIGKILL if end == "kill" else 0)
    for i, b in enumerate(buffers):
        assert isinstance(b, cusafe.Buffer) and b.size == SIZE
        assert b.read() == pattern(i), i
        b.write(pattern(i, 2))
    for i, b in enumerate(buffers):
        assert b.read() == pattern(i, 2), i
        b.close()


def test_queue_sender_gone_before_receipt():
    """A Buffer on a Queue is fetched from its sender when received: a
    sender gone by then is a clear ConnectionError, not a hang."""
    mp = multiprocessing.get_context(METHODS[0])
    queue = mp.Queue()
    s = mp.Process(target=send_and_exit, args=(queue,))
    s.start()
    s.join(60)
    assert s.exitcode == 0
    with pytest.raises(ConnectionError) as err:
        queue.get(timeout=60)
    assert str(err.value).startswith(
        "a cusafe.Buffer sent by process %d could not be received: its "
        "sender is gone (" % s.pid)


@pytest.mark.parametrize("method", METHODS)
def test_socket_sender_gone_before_receipt(method):
    """send_buffer puts the descriptor in the socket: the sender may exit
    before the receiver calls recv_buffer."""
    mp = multiprocessing.get_context(method)
    ready = mp.Event()
    s, c = start_peer(mp, send_on_socket, ready)
    assert ready.wait(120)
    s.join(60)
    assert s.exitcode == 0
    with cusafe.Context(0) as ctx:
        for i in range(COUNT):
            with cusafe.recv_buffer(c, ctx if i % 3 else None) as b:
                assert b.size == SIZE
                assert b.read() == pattern(i), i
    c.close()


def test_recv_in_other_device_context():
    if cusafe.device_count() < 2:
        pytest.skip("needs 2 devices")
    mp = multiprocessing.get_context(METHODS[0])
    results = mp.Queue()
    r, a = start_peer(mp, receive_in_other_context, results)
    with cusafe.Context(0) as ctx, ctx.alloc_shareable(64) as b:
        cusafe.send_buffer(a, b)
        status, message = results.get(timeout=120)
    r.join(60)
    assert status == cusafe.Status.CONTEXT_MISMATCH
    assert "the memory is on device GPU-" in message
    a.close()


def share_rounds(ctx, mp):
    """Buffers to a child among its arguments, and from another over a
    socket: every Python object of the round is gone when it returns."""
    results, sent = mp.Queue(), mp.Event()
    buffers = [ctx.alloc_shareable(64) for _ in range(10)]
    for i, b in enumerate(buffers):
        b.fill(i)
    p = mp.Process(target=read_first_bytes, args=(buffers, results))
    p.start()
    assert results.get(timeout=120) == [bytes([i]) for i in range(10)]
    p.join(60)
    assert p.exitcode == 0
    for b in buffers:
        b.close()
    s, c = start_peer(mp, send_on_socket, sent)
    for i in range(COUNT):
        cusafe.recv_buffer(c).close()
    s.join(60)
    assert s.exitcode == 0
    c.close()
    results.close()
    results.join_thread()


@pytest.mark.parametrize("method", METHODS)
def test_nothing_left_behind(ctx, method):
    """Every descriptor an export opened is closed once the child has
    started and its Process object is gone, or once a Buffer is received;
    the fake's memory handles are all given back."""
    mp = multiprocessing.get_context(method)
    share_rounds(ctx, mp)  # multiprocessing's own descriptors opened
    gc.collect()
    before = open_fds()
    for _ in range(3):
        share_rounds(ctx, mp)
    gc.collect()
    assert open_fds() == before
    if is_fake():
        assert fake().fake_live_vmm_handles(-1) == 0


@pytest.mark.skipif(not hasattr(socket, "send_fds"), reason="Python 3.9+")
def test_export_bytes_by_a_transport_of_ones_own(ctx):
    """to_bytes() and the descriptor, sent by the program's own means;
    from_bytes() and Buffer.from_export() in the other process, as a
    subclass; which multiprocessing's pickler takes as it takes Buffer."""
    mp = multiprocessing.get_context(METHODS[0])
    results = mp.Queue()
    p, a = start_peer(mp, import_from_bytes, results)
    b = ctx.alloc_shareable(1000)
    b.fill(9)
    v = b.view(100, 200)
    with v.export() as e:
        data = e.to_bytes()
        assert len(data) == 80
        socket.send_fds(a, [data], [e.fd])
    assert results.get(timeout=120) == [
        "MyBuffer", 200, b"\x09" * 4,
        "buffer exported by this process: use the buffer itself"]
    p.join(60)
    assert p.exitcode == 0
    assert bytes(b.read(size=4, offset=96)) == b"\x09\x09\x09\x09"
    assert bytes(b.read(size=4, offset=100)) == b"\x44" * 4
    e2 = b.export()
    assert e2.to_bytes() != data  # another view
    e2.close()
    assert len(e2.to_bytes()) == 80  # closed: still described
    fd = os.dup(0)
    with pytest.raises(ValueError, match="a BufferExport is 80 bytes "
                       "\\(to_bytes\\(\\)\\), not 79"):
        cusafe.BufferExport.from_bytes(data[:79], fd)
    with pytest.raises(OSError):  # closed by from_bytes
        os.fstat(fd)
    fd = os.dup(0)
    with pytest.raises(TypeError):
        cusafe.BufferExport.from_bytes(3, fd)
    with pytest.raises(OSError):
        os.fstat(fd)
    # A subclass that is not shareable: the refusal names the way out.
    from multiprocessing.reduction import ForkingPickler
    mine = MyBuffer(ctx, 64)
    with pytest.raises(TypeError, match="cusafe.MyBuffer cannot be pickled "
                       "or copied: its memory \\(64 bytes device\\) is "
                       "not shareable"):
        ForkingPickler.dumps(mine)
    mine.close()
    v.close()
    b.close()
    a.close()


def test_recv_checks_ctx_before_taking_a_message(ctx):
    mp = multiprocessing.get_context(METHODS[0])
    sent = mp.Event()
    s, c = start_peer(mp, send_on_socket, sent)
    closed = cusafe.Context(0)
    closed.close()
    with pytest.raises(ValueError):
        cusafe.recv_buffer(c, closed)
    with pytest.raises(TypeError):
        cusafe.recv_buffer(c, "ctx")
    for i in range(COUNT):  # none was lost
        with cusafe.recv_buffer(c, ctx) as b:
            assert b.read() == pattern(i), i
    s.join(60)
    assert s.exitcode == 0
    c.close()


def test_connection_between_unrelated_programs(ctx, tmp_path):
    """A Connection of Listener and Client between programs that are not
    one multiprocessing family: the receiver is told why and what to use."""
    from multiprocessing.connection import Listener
    address = str(tmp_path / "listener")
    b = ctx.alloc_shareable(64)
    with Listener(address, authkey=b"key") as listener:
        import threading
        result = []
        t = threading.Thread(target=lambda: result.append(run_python("""
            from multiprocessing.connection import Client
            import cusafe
            with Client(%r, authkey=b"key") as conn:
                try:
                    conn.recv()
                except ConnectionError as e:
                    print(e)
            """ % address)))
        t.start()
        with listener.accept() as conn:
            conn.send(b)
            t.join(120)
    r = result[0]
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(
        "a cusafe.Buffer sent by process %d could not be received: its "
        "sender's multiprocessing refused this process (" % os.getpid())
    assert r.stdout.rstrip().endswith(
        "a Buffer on a Queue or Connection travels only between processes "
        "of one multiprocessing family; use send_buffer() between others")
    b.close()


def test_subclass_pickle_cannot_name_refused_before_export(ctx):
    """A subclass local to a function: refused as pickle refuses it, before
    an export opens a descriptor for multiprocessing to keep."""
    from multiprocessing.reduction import ForkingPickler

    class Local(cusafe.Buffer):
        pass

    a, b = multiprocessing.Pipe()
    w = ctx.alloc_shareable(64)
    a.send(w)  # the resource sharer started; the descriptor fetched
    with pytest.raises(cusafe.CusafeError, match="exported by this process"):
        b.recv()
    w.close()
    buf = Local._adopt(ctx.alloc_shareable(4096).detach())
    before = open_fds()
    name = Local.__qualname__
    for _ in range(5):
        with pytest.raises(pickle.PicklingError) as info:
            a.send(buf)
        assert str(info.value) == (
            "cusafe.Buffer subclass %s.%s cannot be sent: pickle cannot name "
            "it (it is local to a function); define it at the top level of "
            "a module" % (__name__, name))
        with pytest.raises(pickle.PicklingError):
            ForkingPickler.dumps(buf)
    assert open_fds() == before
    assert not b.poll()
    buf.close()
    a.close()
    b.close()


@pytest.mark.parametrize("method", METHODS)
def test_subclass_receiver_cannot_find(ctx, method, monkeypatch):
    """Subclasses that the receiving process cannot find (a module only the
    sender has; a name that is no Buffer subclass there): the receiver is
    told which and why, and neither process keeps a descriptor."""
    import sys
    import types
    mp = multiprocessing.get_context(method)
    mod = types.ModuleType("cusafe_sender_only")
    exec("import cusafe\nclass Mine(cusafe.Buffer): pass\n", mod.__dict__)
    monkeypatch.setitem(sys.modules, "cusafe_sender_only", mod)
    shadow = type("Shadow", (cusafe.Buffer,), {"__module__": __name__})
    monkeypatch.setattr(sys.modules[__name__], "Shadow", shadow)
    results = mp.Queue()
    a, b = mp.Pipe()
    p = mp.Process(target=receive_and_report, args=(b, 5, results))
    p.start()
    b.close()
    w = ctx.alloc_shareable(64)
    a.send(w)  # the resource sharer started; it holds w's descriptor
    w.close()
    before = open_fds() - 1
    for cls in (mod.Mine, shadow, MyBuffer, cusafe.Buffer):
        buf = cls._adopt(ctx.alloc_shareable(4096).detach())
        a.send(buf)
        buf.close()
    out, child_before, child_after = results.get(timeout=120)
    p.join(60)
    assert p.exitcode == 0
    sender = os.getpid()
    assert out == [
        "Buffer",
        ("UnpicklingError",
         "a cusafe.Buffer sent by process %d could not be received: its "
         "class cusafe_sender_only.Mine is not a cusafe.Buffer subclass in "
         "this process (No module named 'cusafe_sender_only'); define the "
         "subclass at the top level of a module that both processes import"
         % sender),
        ("UnpicklingError",
         "a cusafe.Buffer sent by process %d could not be received: its "
         "class %s.Shadow is not a cusafe.Buffer subclass in this process "
         "(that name is NoneType); define the subclass at the top level of "
         "a module that both processes import" % (sender, __name__)),
        "MyBuffer", "Buffer"]
    assert child_after == child_before
    assert open_fds() == before  # every descriptor was fetched
    a.close()
    results.close()
    results.join_thread()
    if is_fake():
        gc.collect()
        assert fake().fake_live_vmm_handles(-1) == 0


def test_from_bytes_refusals(ctx):
    """from_bytes refuses an fd that is not one, closing nothing, and closes
    a real one when it refuses the data."""
    with ctx.alloc_shareable(64).export() as e:
        data = e.to_bytes()
    with pytest.raises(TypeError, match="^fd must be an int, not bool$"):
        cusafe.BufferExport.from_bytes(data, True)
    os.fstat(1)  # stdout is not closed
    for fd in (-1, -5):
        with pytest.raises(ValueError,
                           match="^fd %d is not a file descriptor$" % fd):
            cusafe.BufferExport.from_bytes(data, fd)
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(ValueError, match="^fd %d is not an open file "
                       "descriptor$" % w):
        cusafe.BufferExport.from_bytes(data, w)
    with pytest.raises(ValueError, match="^fd %d is not an open file "
                       "descriptor$" % w):
        cusafe.BufferExport.from_bytes(b"short", w)
    with pytest.raises(TypeError, match="^fd must be an int, not str$"):
        cusafe.BufferExport.from_bytes(data, "3")
    with pytest.raises(OverflowError, match="^fd 4294967296 does not fit "
                       "a C int$"):
        cusafe.BufferExport.from_bytes(data, 2**32)
    with pytest.raises(ValueError, match="^a BufferExport is 80 bytes "
                       "\\(to_bytes\\(\\)\\), not 5$"):
        cusafe.BufferExport.from_bytes(b"short", r)
    with pytest.raises(OSError):  # the data was refused: r is closed
        os.fstat(r)
    fd = os.dup(0)
    with pytest.raises(TypeError):  # not C-contiguous: fd closed too
        cusafe.BufferExport.from_bytes(memoryview(data * 2)[::2], fd)
    with pytest.raises(OSError):
        os.fstat(fd)
    fd = os.dup(0)
    os.set_inheritable(fd, True)  # as socket.recv_fds hands them over
    e = cusafe.BufferExport.from_bytes(bytearray(data), fd)
    assert (e.fd, e.size) == (fd, 64)
    assert fcntl.fcntl(fd, fcntl.F_GETFD) == fcntl.FD_CLOEXEC
    e.close()
    with pytest.raises(OSError):
        os.fstat(fd)


@pytest.mark.parametrize("method", METHODS)
def test_received_descriptor_not_inherited(ctx, method):
    """The descriptor a receiver is handed is close-on-exec before the
    receiver imports the class's module: a process started there does not
    keep the memory."""
    import ipc_subclass
    mp = multiprocessing.get_context(method)
    results = mp.Queue()
    a, b = mp.Pipe()
    p = mp.Process(target=receive_lazy_subclass, args=(b, results))
    p.start()
    b.close()
    buf = ipc_subclass.Lazy._adopt(ctx.alloc_shareable(4096).detach())
    a.send(buf)
    assert results.get(timeout=120) == ("Lazy", [])
    p.join(60)
    assert p.exitcode == 0
    buf.close()
    a.close()
