"""pytest fixtures for the Python package: the library under test comes from
CUSAFE_LIBRARY (tests/pytest.sh sets it: the build with the fake CUDA, or
the real one, where the whole run is skipped without a device)."""

import ctypes
import gc
import os
import subprocess
import sys
import textwrap

import pytest

import cusafe


def pytest_report_header(config):
    return "cusafe: %s (%s)" % (cusafe.library().path, cusafe.version())


def is_fake():
    return hasattr(cusafe.library().cdll, "fake_set_sticky_error")


@pytest.fixture(scope="session", autouse=True)
def device():
    try:
        n = cusafe.device_count()
    except cusafe.NoDeviceError as e:
        pytest.skip("no CUDA device: %s" % e, allow_module_level=True)
    return n


@pytest.fixture
def ctx():
    with cusafe.Context(0) as c:
        yield c
    gc.collect()


def stale(handle):
    """Whether a handle is no longer live."""
    try:
        cusafe.handle_type(handle)
    except cusafe.CusafeError as e:
        return e.status == cusafe.Status.INVALID_HANDLE
    return False


needs_fake = pytest.mark.skipif(
    not is_fake(), reason="uses the controls of the fake CUDA")


_declared = []


def fake():
    """The control functions of the fake CUDA (tests/fakecuda/fakecuda.h),
    declared with their C types; call only where is_fake()."""
    cdll = cusafe.library().cdll
    if not _declared:
        size_t, c_int, c_ulong = ctypes.c_size_t, ctypes.c_int, ctypes.c_ulong
        for name in ("fake_live_allocations", "fake_live_bytes",
                     "fake_live_streams", "fake_live_events",
                     "fake_live_libraries", "fake_live_vmm_handles"):
            getattr(cdll, name).restype = size_t
            getattr(cdll, name).argtypes = [c_int]
        cdll.fake_primary_ctx_refcount.restype = c_int
        cdll.fake_primary_ctx_refcount.argtypes = [c_int]
        cdll.fake_set_sticky_error.argtypes = [c_int, c_int]
        cdll.fake_set_paused.argtypes = [c_int]
        cdll.fake_set_managed_supported.argtypes = [c_int, c_int]
        cdll.fake_fail_function.argtypes = [ctypes.c_char_p, c_int]
        cdll.fake_fail_after.argtypes = [c_ulong, c_int, c_int]
        cdll.fake_last_launch_args.restype = size_t
        cdll.fake_last_launch_args.argtypes = [ctypes.c_void_p, size_t]
        cdll.fake_foreign_stream.restype = ctypes.c_void_p
        cdll.fake_foreign_stream.argtypes = [c_int]
        cdll.fake_foreign_stream_destroy.argtypes = [ctypes.c_void_p]
        cdll.fake_last_nvrtc_options.restype = ctypes.c_char_p
        _declared.append(True)
    return cdll


def live_counts():
    """What the fake CUDA holds on all devices: (allocations, streams,
    events, libraries), after a garbage collection."""
    gc.collect()
    f = fake()
    return (f.fake_live_allocations(-1), f.fake_live_streams(-1),
            f.fake_live_events(-1), f.fake_live_libraries(-1))


def last_launch_args():
    """The argument bytes of the fake's last successful launch."""
    f = fake()
    n = f.fake_last_launch_args(None, 0)
    out = ctypes.create_string_buffer(n)
    f.fake_last_launch_args(out, n)
    return out.raw


def run_python(code, **env):
    """Runs `code` in a fresh interpreter (sys.executable) with this
    process's environment, the same library and the same package, plus
    `env`; returns the subprocess.CompletedProcess, with text output."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(cusafe.__file__)))
    full = dict(os.environ)
    full["CUSAFE_LIBRARY"] = cusafe.library().path
    full["PYTHONPATH"] = os.pathsep.join(
        [pkg, os.path.dirname(os.path.abspath(__file__))] +
        ([full["PYTHONPATH"]] if full.get("PYTHONPATH") else []))
    full["PYTHONDONTWRITEBYTECODE"] = "1"
    full.pop("PYTHONWARNINGS", None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          env=full, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=120)


needs_dlpack = pytest.mark.skipif(
    "cusafe_buffer_to_dlpack" in cusafe.library().missing,
    reason="libcusafe was built without DLPack")

capsule_name = ctypes.pythonapi.PyCapsule_GetName
"""The name of a PyCapsule (bytes)."""
capsule_name.restype = ctypes.c_char_p
capsule_name.argtypes = [ctypes.py_object]
