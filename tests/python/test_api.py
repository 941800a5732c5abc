"""The package's module-level API: its names, enums and constants against
the C header, loading, errors, the library-wide functions and the
functions on raw handles."""

import ctypes
import os
import pickle
import re

import pytest

import cusafe
from conftest import is_fake, needs_fake, run_python, stale

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, os.pardir, os.pardir, "include", "cusafe.h")


def header_text():
    with open(HEADER) as f:
        return f.read()


def header_enum(name, prefix):
    """{NAME: value} of the C enum `name`, its enumerators without
    `prefix`."""
    m = re.search(r"typedef enum %s \{(.*?)\}" % name, header_text(), re.S)
    body = re.sub(r"/\*.*?\*/", " ", m.group(1), flags=re.S)
    out = {}
    for e in re.finditer(r"\b(CUSAFE_\w+)\s*=\s*(\d+)", body):
        full, value = e.group(1), int(e.group(2))
        out[full[len(prefix):] if full.startswith(prefix)
            else full[len("CUSAFE_"):]] = value
    return out


def test_all_names_exist():
    names = {}
    exec("from cusafe import *", names)
    names.pop("__builtins__")
    assert sorted(names) == sorted(cusafe.__all__)
    assert len(set(cusafe.__all__)) == len(cusafe.__all__)
    for name in cusafe.__all__:
        assert getattr(cusafe, name) is names[name]


@pytest.mark.parametrize("enum, c_name, prefix", [
    (cusafe.Status, "cusafe_status", "CUSAFE_ERROR_"),
    (cusafe.HandleType, "cusafe_handle_type", "CUSAFE_TYPE_"),
    (cusafe.Memory, "cusafe_memory", "CUSAFE_MEMORY_"),
    (cusafe.ArgKind, "cusafe_arg_kind", "CUSAFE_ARG_"),
])
def test_enums_mirror_the_header(enum, c_name, prefix):
    assert {m.name: int(m) for m in enum} == header_enum(c_name, prefix)


def test_constants_mirror_the_header():
    text = header_text()

    def define(name):
        m = re.search(r"#define %s\s+\(?\(?\w*\)?\s*(0x[0-9a-f]+|\d+)u?\b"
                      % name, text)
        return int(m.group(1), 0)

    assert cusafe.STREAM_NON_BLOCKING == define("CUSAFE_STREAM_NON_BLOCKING")
    assert cusafe.EVENT_DISABLE_TIMING == define("CUSAFE_EVENT_DISABLE_TIMING")
    assert cusafe.EVENT_BLOCKING_SYNC == define("CUSAFE_EVENT_BLOCKING_SYNC")
    assert cusafe.NULL_HANDLE == define("CUSAFE_NULL_HANDLE") == 0
    assert cusafe.MEMORY_DEVICE is cusafe.Memory.DEVICE
    assert cusafe.MEMORY_HOST_PINNED is cusafe.Memory.HOST_PINNED
    assert cusafe.MEMORY_MANAGED is cusafe.Memory.MANAGED


def test_structs_have_the_c_sizes():
    assert ctypes.sizeof(cusafe.Arg) == 16
    assert ctypes.sizeof(cusafe.LaunchConfig) == 40
    assert ctypes.sizeof(cusafe._capi.IpcDesc) == 80
    config = cusafe.LaunchConfig((1, 2, 3), (4, 5, 6), 7, 8)
    assert list(config.grid) == [1, 2, 3] and list(config.block) == [4, 5, 6]
    assert (config.shared_memory, config.stream) == (7, 8)
    arg = cusafe.Arg(int(cusafe.ArgKind.F32), 0)
    arg.value.f32 = 1.5
    assert arg.kind == 10 and arg.value.f32 == 1.5


def test_version():
    text = header_text()
    want = ".".join(re.search(r"#define CUSAFE_VERSION_%s (\d+)" % part,
                              text).group(1)
                    for part in ("MAJOR", "MINOR", "PATCH"))
    assert cusafe.version() == want == cusafe.__version__


def test_status_strings():
    words = [cusafe.status_string(s) for s in cusafe.Status]
    assert words[0] == "success"
    assert all(isinstance(w, str) and w for w in words)
    assert len(set(words)) == len(words)
    assert cusafe.status_string(cusafe.Status.OUT_OF_RANGE) == "out of range"
    assert cusafe.status_string(int(cusafe.Status.NOT_FOUND)) == "not found"
    assert cusafe.status_string(999) == "unknown status"
    assert cusafe.status_string(-1) == "unknown status"


def test_load_and_library():
    lib = cusafe.library()
    assert cusafe.load() is lib
    assert cusafe.load(lib.path) is lib
    assert cusafe.load(os.path.realpath(lib.path)) is lib
    assert isinstance(lib, cusafe.Library)
    assert repr(lib) == "<cusafe.Library %r>" % (lib.path,)
    assert isinstance(lib.cdll, ctypes.CDLL)
    with pytest.raises(RuntimeError, match="already loaded from"):
        cusafe.load("/nonexistent/libcusafe-other.so")
    assert cusafe.library() is lib


def test_library_check():
    lib = cusafe.library()
    assert lib.check(0) is None
    st = lib.fn.cusafe_handle_get_type(ctypes.byref(ctypes.c_int()), 0)
    assert st == cusafe.Status.INVALID_HANDLE
    with pytest.raises(cusafe.CusafeError) as e:
        lib.check(st)
    assert type(e.value) is cusafe.CusafeError
    assert e.value.status is cusafe.Status.INVALID_HANDLE
    assert e.value.message == "handle is the NULL handle"
    assert e.value.cuda_error == 0
    with pytest.raises(cusafe.NoDeviceError) as e:
        lib.check(cusafe.Status.NO_DEVICE)
    assert e.value.status is cusafe.Status.NO_DEVICE
    with pytest.raises(cusafe.NoDeviceError) as e:
        lib.check(cusafe.Status.NO_DRIVER)
    assert e.value.status is cusafe.Status.NO_DRIVER


def test_a_missing_function_raises_not_supported():
    lib = cusafe.library()
    for name in lib.missing:
        with pytest.raises(cusafe.CusafeError) as e:
            getattr(lib.fn, name)()
        assert e.value.status == cusafe.Status.NOT_SUPPORTED
        assert name in e.value.message
    for name in ("cusafe_retain", "cusafe_release", "cusafe_kernel_launch",
                 "cusafe_buffer_alloc"):
        assert callable(getattr(lib.raw, name))


def test_cusafe_error():
    e = cusafe.CusafeError(cusafe.Status.OUT_OF_RANGE, "too far", 3)
    assert isinstance(e, Exception)
    assert e.status is cusafe.Status.OUT_OF_RANGE
    assert (e.message, e.cuda_error) == ("too far", 3)
    assert str(e) == "out of range: too far"
    assert repr(e) == "CusafeError(OUT_OF_RANGE, 'too far', cuda_error=3)"
    assert str(cusafe.CusafeError(4)) == "out of range"
    plain = cusafe.CusafeError(2)
    assert (plain.message, plain.cuda_error) == ("", 0)
    unknown = cusafe.CusafeError(999, "odd")
    assert unknown.status == 999 and type(unknown.status) is int
    assert str(unknown) == "unknown status: odd"
    assert repr(unknown) == "CusafeError(999, 'odd', cuda_error=0)"
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is cusafe.CusafeError
    assert (again.status, again.message, again.cuda_error) == \
        (e.status, e.message, e.cuda_error)
    assert issubclass(cusafe.NoDeviceError, cusafe.CusafeError)
    assert issubclass(cusafe.LibraryNotFoundError, OSError)
    nd = cusafe.NoDeviceError(cusafe.Status.NO_DEVICE, "none")
    assert str(nd) == "%s: none" % cusafe.status_string(8)


def test_library_not_found():
    r = run_python("""
        import cusafe
        assert cusafe.status_string(4) == "out of range", \\
            cusafe.status_string(4)
        assert cusafe.status_string(999) == "unknown status"
        for call in (cusafe.device_count, cusafe.version,
                     lambda: cusafe.Context(0)):
            try:
                call()
            except cusafe.LibraryNotFoundError as e:
                assert isinstance(e, OSError)
                print(e)
            else:
                raise AssertionError("no LibraryNotFoundError")
        """, CUSAFE_LIBRARY="/nonexistent/libcusafe-missing.so")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3
    for line in lines:
        assert line.startswith("cannot load libcusafe; tried "
                               "/nonexistent/libcusafe-missing.so "
                               "(CUSAFE_LIBRARY): ")
        assert "set CUSAFE_LIBRARY" in line


@needs_fake
@pytest.mark.parametrize("driver, status, cuda_error", [
    (1, cusafe.Status.NO_DRIVER, 35),
    (2, cusafe.Status.NO_DEVICE, 100),
])
def test_no_device_error(driver, status, cuda_error):
    r = run_python("""
        import cusafe
        cusafe.library().cdll.fake_set_driver(%d)
        for call in (cusafe.device_count, lambda: cusafe.Context(0),
                     lambda: cusafe.device_properties(0)):
            try:
                call()
            except cusafe.NoDeviceError as e:
                print(type(e).__name__, int(e.status), e.cuda_error,
                      bool(e.message))
            else:
                raise AssertionError("no NoDeviceError")
        """ % driver)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout == \
        ("NoDeviceError %d %d True\n" % (status, cuda_error)) * 3


def test_device_count_and_properties(device):
    assert cusafe.device_count() == device >= 1
    for d in range(device):
        p = cusafe.device_properties(d)
        assert isinstance(p, cusafe.DeviceProperties)
        assert p.device_name == p.name.decode() and p.device_name
        assert p.compute_capability == (p.compute_capability_major,
                                        p.compute_capability_minor)
        assert p.compute_capability >= (3, 0)
        assert repr(p) == "<cusafe.DeviceProperties %r, CC %d.%d, %d " \
            "bytes>" % ((p.device_name,) + p.compute_capability +
                        (p.total_memory,))
        assert p.total_memory > 0 and p.multiprocessor_count > 0
        assert p.warp_size == 32
        assert p.max_threads_per_block >= 32
        assert list(p.max_block_dim)[0] >= p.max_threads_per_block
        assert list(p.max_grid_dim)[0] >= 65535
        assert p.shared_memory_per_block_optin >= \
            p.shared_memory_per_block > 0
    assert cusafe.device_properties().total_memory == \
        cusafe.device_properties(0).total_memory
    if is_fake():
        p = cusafe.device_properties(1)
        assert p.device_name == "Fake GPU 1" and p.total_memory == 1 << 30
        assert (list(p.max_block_dim), p.compute_capability) == \
            ([1024, 1024, 64], (9, 0))


@pytest.mark.parametrize("bad", [-1, "count", 1 << 20])
def test_device_out_of_range(device, bad):
    d = device if bad == "count" else bad
    for call in (cusafe.device_properties, cusafe.Context):
        with pytest.raises(cusafe.CusafeError) as e:
            call(d)
        assert e.value.status == cusafe.Status.INVALID_DEVICE
        assert e.value.message == "device %d is out of range: %d " \
            "device(s) found" % (d, device)


def test_handle_type_of_every_type(ctx):
    m = ctx.load_builtin()
    objects = {
        cusafe.HandleType.CONTEXT: ctx,
        cusafe.HandleType.STREAM: ctx.stream(),
        cusafe.HandleType.EVENT: ctx.event(),
        cusafe.HandleType.BUFFER: ctx.alloc(16),
        cusafe.HandleType.MODULE: m,
        cusafe.HandleType.KERNEL: m.kernel("cusafe_fill_f32"),
    }
    for t, obj in objects.items():
        got = cusafe.handle_type(obj.handle)
        assert got is t


def test_handle_type_errors(ctx):
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.handle_type(cusafe.NULL_HANDLE)
    assert e.value.status == cusafe.Status.INVALID_HANDLE
    assert e.value.message == "handle is the NULL handle"
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.handle_type(12345)
    assert e.value.status == cusafe.Status.INVALID_HANDLE
    assert e.value.message == \
        "handle 0x0000000000003039 is not a cusafe handle"
    b = ctx.alloc(8)
    h = b.handle
    b.close()
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.handle_type(h)
    assert e.value.status == cusafe.Status.INVALID_HANDLE
    assert e.value.message == \
        "handle 0x%016x is stale: its object was released" % h


def test_retain_and_release_handles(ctx):
    b = ctx.alloc(8)
    h = b.handle
    cusafe.retain_handle(h)
    b.close()
    assert not stale(h)  # the reference retain_handle added
    cusafe.retain_handle(h)
    cusafe.release_handle(h)
    assert not stale(h)
    cusafe.release_handle(h)
    assert stale(h)
    for call in (cusafe.retain_handle, cusafe.release_handle):
        with pytest.raises(cusafe.CusafeError) as e:
            call(h)
        assert e.value.status == cusafe.Status.INVALID_HANDLE
        assert e.value.message == \
            "handle 0x%016x is stale: its object was released" % h
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.retain_handle(cusafe.NULL_HANDLE)
    assert e.value.status == cusafe.Status.INVALID_HANDLE
    assert e.value.message == "handle is the NULL handle"
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.retain_handle(12345)
    assert e.value.message == \
        "handle 0x0000000000003039 is not a cusafe handle"


def test_releasing_the_null_handle_is_a_no_op():
    # As cusafe_release(CUSAFE_NULL_HANDLE): nothing done, no error.
    assert cusafe.release_handle(cusafe.NULL_HANDLE) is None


def test_retain_limit(ctx):
    """A handle counts at most 65535 references of the caller."""
    s = ctx.stream()
    h = s.handle
    for _ in range(65534):  # the Stream object holds the first
        cusafe.retain_handle(h)
    with pytest.raises(cusafe.CusafeError) as e:
        cusafe.retain_handle(h)
    assert e.value.status == cusafe.Status.OUT_OF_MEMORY
    assert "too many references" in e.value.message
    for _ in range(65534):
        cusafe.release_handle(h)
    assert not stale(h)
    s.close()
    assert stale(h)


def test_reprs_equality_and_hashes(ctx):
    m = ctx.load_builtin()
    objects = [
        (ctx, "<cusafe.Context 0x%016x device 0>"),
        (ctx.stream(), "<cusafe.Stream 0x%016x>"),
        (ctx.event(), "<cusafe.Event 0x%016x>"),
        (ctx.alloc(48), "<cusafe.Buffer 0x%016x 48 bytes device>"),
        (ctx.alloc(8, cusafe.Memory.HOST_PINNED),
         "<cusafe.Buffer 0x%016x 8 bytes host_pinned>"),
        (ctx.alloc(16, cusafe.Memory.MANAGED),
         "<cusafe.Buffer 0x%016x 16 bytes managed>"),
        (m, "<cusafe.Module 0x%016x builtin>"),
        (m.kernel("cusafe_fill_f64"),
         "<cusafe.Kernel 0x%016x cusafe_fill_f64>"),
    ]
    for obj, form in objects:
        assert repr(obj) == form % obj.handle
        assert obj == obj and not (obj != obj)
        assert {obj: 1}[obj] == 1
    b = objects[3][0]
    assert b != objects[4][0] and b != b.handle and b != b.view(0, 48)
    # Two objects of one handle: each Context object, and each context
    # that a child hands out, holds a reference on the device's context.
    for same in (cusafe.Context(0), b.context, objects[1][0].context,
                 cusafe.Stream.wrap(0, ctx).context):
        assert same == ctx and hash(same) == hash(ctx)
    other = cusafe.Context(0)
    other.close()
    assert other != ctx and ctx != other
