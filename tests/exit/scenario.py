"""scenario.py -- how a Python program that uses cusafe ends.

    python3 scenario.py NAME [ARG]

Each scenario runs in a fresh interpreter; tests/exit-python.sh runs them,
against the fake CUDA and against the real runtime (CUSAFE_LIBRARY names the
library), and checks the exit status and stderr.  A scenario that cannot run
here prints "SKIP: <why>" on stdout and exits with 77.  Anything unexpected
raises, so that the traceback shows on stderr and the status is 1.

The scenarios are listed in SCENARIOS at the end.
"""
import array
import ctypes
import gc
import os
import re
import signal
import sys
import threading
import time
import warnings

import cusafe

# The message of CUSAFE_ERROR_FORKED, as the library words it.
FORKED_MESSAGE = ("cusafe cannot be used in a process forked after CUDA was "
                  "initialised")

N = 1 << 16  # floats per buffer

# A forked child of a process with threads (the CUDA runtime starts some)
# makes Python 3.12+ warn about fork(); that is not what is tested here.
warnings.filterwarnings("ignore", category=DeprecationWarning,
                        message=".*fork.*")


def skip(why):
    print("SKIP: %s" % why)
    sys.exit(77)


def is_fake():
    """Whether the loaded library is the test build with the fake CUDA."""
    return hasattr(cusafe.library().cdll, "fake_set_sticky_error")


def expect_error(status, fn, *args, **kwargs):
    """Calls fn, which must raise CusafeError with `status`; returns it."""
    try:
        fn(*args, **kwargs)
    except cusafe.CusafeError as e:
        if e.status != status:
            raise AssertionError("%s raised %r, expected status %s"
                                 % (getattr(fn, "__name__", fn), e,
                                    status.name)) from e
        return e
    raise AssertionError("%s did not raise CusafeError %s"
                         % (getattr(fn, "__name__", fn), status.name))


def make_live():
    """Objects of every type, with work queued on them and never waited
    for.  Returns them in a dict."""
    try:
        ctx = cusafe.Context(0)
    except cusafe.NoDeviceError as e:
        skip(str(e))
    o = {"ctx": ctx}
    o["stream"] = ctx.stream(non_blocking=True)
    o["event"] = ctx.event()
    o["a"] = cusafe.Buffer.from_host(ctx, array.array("f", range(N)))
    o["b"] = ctx.alloc(4 * N, cusafe.MEMORY_HOST_PINNED)
    o["view"] = o["a"].view(2 * N, 2 * N)
    o["module"] = cusafe.Module.builtin(ctx)
    o["fill"] = o["module"].kernel("cusafe_fill_f32")
    s = o["stream"]
    o["a"].fill(0, size=2 * N, stream=s)
    o["fill"].launch((N // 2 + 255) // 256, 256, o["view"], cusafe.F32(3.0),
                     N // 2, stream=s)
    o["b"].copy_from(o["a"], stream=s)
    o["event"].record(s)
    return o


# ---- scenarios -------------------------------------------------------------

def probe():
    """Exit 0 if a device is there, 77 if not."""
    try:
        print("%d device(s)" % cusafe.device_count())
    except cusafe.NoDeviceError as e:
        skip(str(e))


def layout():
    """Prints the layout of the binding's structs, in the format of
    `exit_c layout`, to be compared with the C compiler's."""
    def fields(cname, cls, prefix="", base=0):
        for name, ctype in cls._fields_:
            f = getattr(cls, name)
            print("%s.%s%s %d %d" % (cname, prefix, name, base + f.offset,
                                     f.size))
            if name == "value" and cls is cusafe.Arg:
                fields(cname, ctype, "value.", f.offset)

    print("cusafe_device_properties %d"
          % ctypes.sizeof(cusafe.DeviceProperties))
    fields("cusafe_device_properties", cusafe.DeviceProperties)
    print("cusafe_arg %d" % ctypes.sizeof(cusafe.Arg))
    fields("cusafe_arg", cusafe.Arg)
    print("cusafe_launch_config %d" % ctypes.sizeof(cusafe.LaunchConfig))
    fields("cusafe_launch_config", cusafe.LaunchConfig)
    print("cusafe_handle %d" % ctypes.sizeof(cusafe.c_handle))
    print("cusafe_status %d" % ctypes.sizeof(cusafe.c_status))
    print("cusafe_memory %d" % ctypes.sizeof(cusafe.c_enum))
    print("cusafe_handle_type %d" % ctypes.sizeof(cusafe.c_enum))


def binding(header, dlpack_header, with_dlpack):
    """The binding declares every function of cusafe.h and cusafe_dlpack.h,
    with as many arguments, and the library exports them all (those of
    cusafe_dlpack.h only if it was built with DLPack: with_dlpack "yes")."""
    text = open(header).read() + open(dlpack_header).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"^\s*#.*?(?<!\\)$", " ", text, flags=re.S | re.M)
    declared = {}
    for m in re.finditer(r"CUSAFE_API\s+[^;()]*?\b(cusafe_\w+)\s*\(([^)]*)\)",
                         text):
        params = m.group(2).strip()
        declared[m.group(1)] = 0 if params in ("", "void") \
            else params.count(",") + 1
    bound = cusafe._PROTOTYPES
    problems = []
    for name in sorted(set(declared) - set(bound)):
        problems.append("%s is declared in cusafe.h but not bound" % name)
    for name in sorted(set(bound) - set(declared)):
        problems.append("%s is bound but not declared in cusafe.h" % name)
    for name in sorted(set(bound) & set(declared)):
        if len(bound[name][1]) != declared[name]:
            problems.append("%s takes %d arguments in cusafe.h, %d in the "
                            "binding" % (name, declared[name],
                                         len(bound[name][1])))
    lib = cusafe.library()
    optional = set()
    if with_dlpack != "yes":
        optional = set(re.findall(r"\b(cusafe_\w+)\s*\(",
                                  open(dlpack_header).read()))
    for name in lib.missing:
        if name not in optional:
            problems.append("%s is not exported by %s" % (name, lib.path))
    if len(declared) < 40:
        problems.append("only %d functions found in %s" % (len(declared),
                                                           header))
    if problems:
        raise AssertionError("\n".join(problems))
    print("%d functions bound" % len(declared))


def errors():
    """Errors raise CusafeError with the status, the message and the CUDA
    error; str() is "<status string>: <message>"."""
    try:
        ctx = cusafe.Context(0)
    except cusafe.NoDeviceError as e:
        skip(str(e))
    with ctx, ctx.alloc(64) as buf:
        e = expect_error(cusafe.Status.OUT_OF_RANGE, buf.write, bytes(100))
        assert "100" in e.message and "64" in e.message, e.message
        assert str(e) == "%s: %s" % (cusafe.status_string(e.status),
                                     e.message), str(e)
        assert e.cuda_error == 0
        assert isinstance(e.status, cusafe.Status)
        data = bytes(range(64))
        buf.write(data)
        assert bytes(buf.read()) == data
        out = bytearray(16)
        buf.read(out, offset=8)
        assert out == data[8:24]
        a = array.array("B", bytes(64))
        buf.read(a)
        assert a.tobytes() == data
        view = buf.view(32, 32)
        assert view.size == 32 and len(view) == 32
        assert bytes(view.read()) == data[32:]
        view.close()
        view.close()  # twice: a no-op
        try:
            view.handle
        except ValueError:
            pass
        else:
            raise AssertionError("a closed object's handle is usable")
        h = buf.handle
        assert cusafe.handle_type(h) == cusafe.HandleType.BUFFER
        assert "closed" in repr(view) and "64 bytes" in repr(buf)
    expect_error(cusafe.Status.INVALID_HANDLE, cusafe.release_handle, h)
    print("errors checked")


def expect_raise(cls, text, fn, *args, **kwargs):
    """Calls fn, which must raise exactly `cls` with `text` in its message."""
    try:
        fn(*args, **kwargs)
    except Exception as e:
        if type(e) is not cls or text not in str(e):
            raise AssertionError("raised %r, expected %s(%r)"
                                 % (e, cls.__name__, text)) from e
        return e
    raise AssertionError("did not raise %s(%r)" % (cls.__name__, text))


def launches():
    """Kernel.launch on its fast path (the arguments' types and the shape
    of the previous launch, default stream) and its general path give the
    same results and the same errors; prepared launches too."""
    try:
        ctx = cusafe.Context(0)
    except cusafe.NoDeviceError as e:
        skip(str(e))
    n = 1000
    a = cusafe.Buffer.from_host(ctx, array.array("f", range(n)))
    b = cusafe.Buffer.from_host(ctx, array.array("f", [0.5] * n))
    c = ctx.alloc(4 * n)
    module = cusafe.Module.builtin(ctx)
    add = module.kernel("cusafe_vecadd_f32")
    fill = module.kernel("cusafe_fill_f32")

    def values(buf):
        out = array.array("f", bytes(buf.size))
        buf.read(out)
        return list(out)

    want = [i + 0.5 for i in range(n)]
    for i in range(3):  # general, then fast, then fast again
        c.fill(0)
        add.launch(4, 256, c, a, b, n)
        assert values(c) == want, "launch %d" % i
    # Another signature, a typed scalar, a stream, a list for the grid.
    for value in (1.5, -2.0):
        fill.launch((4,), [256], c, cusafe.F32(value), n)
        assert values(c) == [value] * n
    s = ctx.stream()
    fill.launch(4, 256, c, cusafe.F32(7.0), n, stream=s)
    s.synchronize()
    assert values(c) == [7.0] * n
    prepared = add.prepare(4, 256, c, a, b, n)
    c.fill(0)
    prepared()
    assert values(c) == want

    # Bad arguments, each on a kernel whose fast path is set up.
    for k, args in ((add, (c, a, b, n)), (fill, (c, cusafe.F32(1.0), n))):
        k.launch(4, 256, *args)
        k.launch(4, 256, *args)
    e = expect_error(cusafe.Status.INVALID_ARGUMENTS, add.launch, 4, 256, c,
                     a, b)
    assert e.message == "kernel cusafe_vecadd_f32 takes 4 arguments, 3 " \
        "given", e.message
    e = expect_error(cusafe.Status.INVALID_ARGUMENTS, fill.launch, 4, 256, c,
                     cusafe.F32(1.0), cusafe.I32(n))
    assert e.message == "argument 2 of kernel cusafe_fill_f32(float*, " \
        "float, size_t) is a 32-bit integer, parameter 2 is size_t", e.message
    expect_raise(OverflowError, "does not fit F32", fill.launch, 4, 256, c,
                 cusafe.F32(1e300), n)
    expect_raise(OverflowError, "does not fit I64", add.launch, 4, 256, c, a,
                 b, 2**63)
    expect_raise(OverflowError, "-1 does not fit U64", add.launch, 4, 256, c,
                 a, b, cusafe.U64(-1))
    expect_raise(TypeError, "pass a bool", add.launch, 4, 256, c, a, b, True)
    expect_raise(TypeError, "cannot pass str", add.launch, 4, 256, c, a, b,
                 "1000")
    e = expect_error(cusafe.Status.INVALID_CONFIGURATION, add.launch, 0, 256,
                     c, a, b, n)
    assert e.message == "grid dimension x is 0", e.message
    # Closed and detached objects: ValueError, also on the fast path.
    add.launch(4, 256, c, a, b, n)
    b.close()
    expect_raise(ValueError, "this cusafe.Buffer is closed", add.launch, 4,
                 256, c, a, b, n)
    # A prepared launch read its handles when it was prepared.
    e = expect_error(cusafe.Status.INVALID_HANDLE, prepared)
    assert e.message.startswith("argument 2 0x") and \
        e.message.endswith(" is stale: its object was released"), e.message
    h = a.detach()
    expect_raise(ValueError, "this cusafe.Buffer is closed", add.launch, 4,
                 256, c, a, a, n)
    cusafe.release_handle(h)
    fill.launch(4, 256, c, cusafe.F32(1.0), n)
    fill.close()
    expect_raise(ValueError, "this cusafe.Kernel is closed", fill.launch, 4,
                 256, c, cusafe.F32(1.0), n)
    assert values(c) == [1.0] * n
    print("launches checked")


def global_objects():
    """Live objects held by module globals; normal exit."""
    global LIVE
    LIVE = make_live()


class Node:
    def __init__(self, objects):
        self.objects = objects
        self.me = self  # a reference cycle


def cycle():
    """Live objects reachable only from a reference cycle; normal exit."""
    gc.disable()  # the cycle stays alive until the interpreter exits
    Node(make_live())
    Node(make_live())


def closure():
    """Live objects held by a closure; normal exit."""
    global use
    objects = make_live()

    def use():
        return objects["a"].size

    assert use() == 4 * N


def sys_exit3():
    global LIVE
    LIVE = make_live()
    sys.exit(3)


def exception():
    """An uncaught exception: status 1, the traceback alone on stderr."""
    global LIVE
    LIVE = make_live()
    raise RuntimeError("deliberate failure of the exception scenario")


def keyboard_interrupt():
    global LIVE
    LIVE = make_live()
    raise KeyboardInterrupt


def sigint():
    """SIGINT sent to the process itself, as a user's Ctrl-C."""
    global LIVE
    LIVE = make_live()
    # As in an interactive program, also where the test's shell ignores
    # SIGINT (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
    raise AssertionError("SIGINT did not interrupt")


def killed_by_sigint(name):
    """Runs scenario `name` in a child interpreter, which must end the way
    Python ends an uncaught KeyboardInterrupt: killed by SIGINT (its
    traceback goes to the shared stderr).  Exit status 0 if it did."""
    import subprocess
    status = subprocess.run([sys.executable, __file__, name]).returncode
    if status != -signal.SIGINT:
        print("the child ended with status %d, not killed by SIGINT" % status)
        sys.exit(1)
    print("killed by SIGINT")


def os_exit():
    """os._exit(0) with live objects and queued work."""
    o = make_live()
    for _ in range(4):
        o["b"].copy_from(o["a"], stream=o["stream"])
    sys.stdout.flush()
    os._exit(0)


def shutdown():
    """cusafe.shutdown() first; the objects' releases afterwards are
    no-ops, other calls raise CusafeError(SHUTDOWN)."""
    global LIVE
    o = make_live()
    cusafe.shutdown()
    cusafe.shutdown()  # idempotent
    e = expect_error(cusafe.Status.SHUTDOWN, o["a"].write, b"1234")
    assert e.message, "no message with SHUTDOWN"
    expect_error(cusafe.Status.SHUTDOWN, cusafe.Context, 0)
    expect_error(cusafe.Status.SHUTDOWN, o["ctx"].alloc, 64)
    expect_error(cusafe.Status.SHUTDOWN, cusafe.device_count)
    o["view"].close()
    o["fill"].close()
    with o["stream"]:
        pass
    # The rest go through their finalizers, some now, some at exit.
    del o["a"], o["event"]
    gc.collect()
    LIVE = o


def start_worker():
    """Starts a daemon thread that allocates, writes, reads and releases
    in a loop until cusafe shuts down; returns it once it made progress."""
    try:
        ctx = cusafe.Context(0)
    except cusafe.NoDeviceError as e:
        skip(str(e))
    started = threading.Event()
    # Large copies, so that the thread is often inside a call (which
    # releases the GIL) when the shutdown comes.
    data = bytes(range(256)) * (1 << 17)  # 32 MiB

    def work():
        try:
            while True:
                with ctx.alloc(len(data)) as buf:
                    buf.write(data)
                    out = buf.read()
                    assert out == data
                started.set()
        except cusafe.CusafeError as e:
            if e.status != cusafe.Status.SHUTDOWN:
                raise

    t = threading.Thread(target=work, daemon=True)
    t.start()
    if not started.wait(60):
        raise AssertionError("the thread made no progress")
    return t


def thread():
    """A daemon thread inside cusafe calls while the interpreter exits."""
    global LIVE
    LIVE = make_live()
    start_worker()


def thread_shutdown():
    """cusafe.shutdown() while a thread is inside cusafe calls: the
    thread's next call raises CusafeError(SHUTDOWN) and it ends."""
    global LIVE
    LIVE = make_live()
    t = start_worker()
    cusafe.shutdown()
    t.join(60)
    assert not t.is_alive(), "the thread still runs after the shutdown"


def fork():
    """os.fork() after CUDA was used: the child gets CusafeError(FORKED)
    with its message and exits normally; the parent carries on."""
    o = make_live()
    o["stream"].synchronize()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        e = expect_error(cusafe.Status.FORKED, o["ctx"].alloc, 64)
        assert e.message == FORKED_MESSAGE, \
            "the message is %r, expected %r" % (e.message, FORKED_MESSAGE)
        expect_error(cusafe.Status.FORKED, o["a"].read)
        expect_error(cusafe.Status.FORKED, cusafe.Context, 0)
        expect_error(cusafe.Status.FORKED, cusafe.device_count)
        for name in ("fill", "view", "b"):
            o[name].close()  # releases are no-ops
        cusafe.shutdown()  # a no-op too
        sys.exit(0)  # a normal exit: the inherited exit handlers run
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, \
        "the child ended with status 0x%x" % status
    data = bytes(range(64))
    o["a"].write(data)
    assert bytes(o["a"].read(size=64)) == data
    global LIVE
    LIVE = o


def _mp_child_forked(conn, ctx):
    try:
        ctx.alloc(64)
    except cusafe.CusafeError as e:
        conn.send((int(e.status), e.message))
    else:
        conn.send((0, "allocation worked"))
    conn.close()


def _mp_child_spawned(conn):
    with cusafe.Context(0) as ctx:
        data = bytes(range(200))
        buf = cusafe.Buffer.from_host(ctx, data)
        conn.send(bytes(buf.read()) == data)
        LEFT.append(buf)  # left alive for the child's exit
    conn.close()


LEFT = []


def mp_fork():
    """multiprocessing with fork: the child gets FORKED and says so."""
    import multiprocessing
    global LIVE
    LIVE = o = make_live()
    mp = multiprocessing.get_context("fork")
    parent, child = mp.Pipe()
    p = mp.Process(target=_mp_child_forked, args=(child, o["ctx"]))
    p.start()
    status, message = parent.recv()
    p.join(60)
    assert p.exitcode == 0, "the child's exit code is %r" % p.exitcode
    assert status == cusafe.Status.FORKED and message == FORKED_MESSAGE, \
        (status, message)
    o["a"].write(b"still works")


def mp_spawn():
    """multiprocessing with spawn: the child is a fresh process that uses
    CUDA normally."""
    import multiprocessing
    global LIVE
    LIVE = make_live()
    mp = multiprocessing.get_context("spawn")
    parent, child = mp.Pipe()
    p = mp.Process(target=_mp_child_spawned, args=(child,))
    p.start()
    ok = parent.recv()
    p.join(120)
    assert p.exitcode == 0, "the child's exit code is %r" % p.exitcode
    assert ok is True, "the spawned child's copy failed"


def _mp_child_shared(buffers, queue, got):
    """Reads the Buffers it was given, writes the first, sends one of its
    own back, and exits with all of them alive."""
    assert [bytes(b.read(size=4)) for b in buffers] == \
        [bytes([i]) * 4 for i in range(len(buffers))]
    buffers[0].fill(0x77)
    with cusafe.Context(0) as ctx:
        mine = ctx.alloc_shareable(4096)
        mine.fill(0x55)
        queue.put(mine)
    got.wait(120)  # the parent has it: fetched from this process
    LEFT.extend(buffers)
    LEFT.append(mine)  # left alive for the child's exit


def mp_shared(method):
    """Shareable Buffers to a child (its arguments) and back (a Queue),
    each side exiting with imported and exported Buffers alive."""
    import multiprocessing
    global LIVE
    try:
        ctx = cusafe.Context(0)
    except cusafe.NoDeviceError as e:
        skip(str(e))
    mine = []
    for i in range(8):
        b = ctx.alloc_shareable(4096)
        b.fill(i)
        mine.append(b)
    mp = multiprocessing.get_context(method)
    queue, got = mp.Queue(), mp.Event()
    p = mp.Process(target=_mp_child_shared, args=(mine, queue, got))
    p.start()
    theirs = queue.get(timeout=120)
    got.set()
    p.join(120)
    assert p.exitcode == 0, "the child's exit code is %r" % p.exitcode
    assert bytes(theirs.read(size=4)) == b"\x55" * 4
    assert bytes(mine[0].read(size=4)) == b"\x77" * 4
    theirs.fill(0x66)
    LIVE = [ctx, mine, theirs, mine[1].view(0, 16)]


FAULT_SOURCE = r'''
extern "C" __global__ void cusafe_test_fault(void)
{
  *(volatile int *)0x10 = 1;
}
'''


def fault():
    """A kernel fault, reported by the next synchronize as CusafeError
    CUDA with cuda_error 700 (illegal address); exit with everything alive
    in the broken context."""
    global LIVE
    LIVE = o = make_live()
    if is_fake():
        # What a kernel fault leaves behind: every call on the device fails.
        cusafe.library().cdll.fake_set_sticky_error(0, 700)
    else:
        module = cusafe.Module.compile(o["ctx"], FAULT_SOURCE, "fault.cu")
        o["fault_module"] = module
        o["fault"] = module.kernel("cusafe_test_fault")
        o["fault"].launch(1, 1, stream=o["stream"])
    e = expect_error(cusafe.Status.CUDA, o["ctx"].synchronize)
    assert e.cuda_error == 700, "cuda_error is %d, expected 700" % e.cuda_error
    print("fault reported: %s" % e)


def _cupy_roundtrip(ctx):
    import cupy
    x = cupy.arange(N, dtype=cupy.float32)
    buf = ctx.alloc(4 * N)
    # cusafe's buffer seen by CuPy, in the same (primary) context.
    mem = cupy.cuda.UnownedMemory(buf.interop_pointer(), 4 * N, buf)
    y = cupy.ndarray((N,), cupy.float32, cupy.cuda.MemoryPointer(mem, 0))
    y[...] = x * 2
    cupy.cuda.runtime.deviceSynchronize()
    back = array.array("f", bytes(4 * N))
    buf.read(back)
    assert back[N - 1] == 2.0 * (N - 1), back[N - 1]
    return x, y, buf


def cupy_first():
    """CuPy imported and used first, then cusafe: they share the device's
    primary context; both exit cleanly."""
    if is_fake():
        skip("CuPy needs the real CUDA runtime")
    try:
        import cupy
    except ImportError:
        skip("CuPy is not installed")
    global LIVE
    z = cupy.ones(1 << 20, dtype=cupy.float32)
    float(z.sum())
    LIVE = (z, make_live())
    ctx = LIVE[1]["ctx"]
    LIVE += _cupy_roundtrip(ctx)


def cusafe_first():
    """cusafe used first, then CuPy imported."""
    if is_fake():
        skip("CuPy needs the real CUDA runtime")
    global LIVE
    LIVE = [make_live()]
    try:
        import cupy
    except ImportError:
        skip("CuPy is not installed")
    z = cupy.ones(1 << 20, dtype=cupy.float32)
    float(z.sum())
    LIVE += [z, _cupy_roundtrip(LIVE[0]["ctx"])]


def graph_replays(how="exit"):
    """A graph with replays queued, its buffers closed, and a capture left
    open (a `with` block that the exit interrupts: sys.exit inside it, or
    an open begin_capture()); exit 0, or 3 with sys-exit-3."""
    o = make_live()
    s = o["stream"]
    other = o["ctx"].stream(non_blocking=True)
    with s.capture() as graph:
        o["fill"].launch((N // 2 + 255) // 256, 256, o["view"],
                         cusafe.F32(1.0), N // 2, stream=s)
        o["b"].copy_from(o["a"], stream=s)
    for i in range(100):
        graph.launch(s if i % 2 else other)
    for name in ("a", "b", "view", "fill", "module"):
        o[name].close()
    LIVE.append((o, graph, other))
    if how == "sys-exit-3":
        with other.capture():
            sys.exit(3)
    other.begin_capture()  # never ended


def multi_device():
    """Work in flight on every device -- a fill, a kernel and a copy on a
    buffer of each, on a stream of each -- and peer copies between devices
    0 and 1 both ways, then exit with every handle alive: the ordered
    shutdown synchronises and destroys each device's objects.  Needs two
    devices (the fake has two)."""
    try:
        n = cusafe.device_count()
    except cusafe.NoDeviceError as e:
        skip(str(e))
    if n < 2:
        skip("%d device: the scenario needs 2" % n)
    live = []
    for d in range(n):
        ctx = cusafe.Context(d)
        s = ctx.stream(non_blocking=True)
        a = cusafe.Buffer.from_host(ctx, array.array("f", range(N)))
        b = ctx.alloc(4 * N)
        fill = cusafe.Module.builtin(ctx).kernel("cusafe_fill_f32")
        b.fill(0, stream=s)
        fill.launch((N + 255) // 256, 256, b, cusafe.F32(d + 1.0), N,
                    stream=s)
        a.copy_from(b, stream=s)
        live.append({"ctx": ctx, "stream": s, "a": a, "b": b, "fill": fill})
    d0, d1 = live[0], live[1]
    d1["b"].copy_from(d0["a"], stream=d0["stream"])  # 0 -> 1, on device 0
    d0["b"].copy_from(d1["a"], stream=d1["stream"])  # 1 -> 0, on device 1
    d0["a"].copy_from(d1["b"])  # on device 0's default stream
    LIVE.append(live)


LIVE = []

SCENARIOS = {
    "graph-replays": graph_replays,
    "multi-device": multi_device,
    "probe": probe,
    "layout": layout,
    "binding": binding,
    "errors": errors,
    "launches": launches,
    "global": global_objects,
    "cycle": cycle,
    "closure": closure,
    "sys-exit-3": sys_exit3,
    "exception": exception,
    "keyboard-interrupt": keyboard_interrupt,
    "sigint": sigint,
    "killed-by-sigint": killed_by_sigint,
    "os-exit": os_exit,
    "shutdown": shutdown,
    "thread": thread,
    "thread-shutdown": thread_shutdown,
    "fork": fork,
    "mp-fork": mp_fork,
    "mp-spawn": mp_spawn,
    "mp-shared": mp_shared,
    "fault": fault,
    "cupy-first": cupy_first,
    "cusafe-first": cusafe_first,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in SCENARIOS:
        sys.exit("usage: scenario.py {%s} [ARG]" % ",".join(SCENARIOS))
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
