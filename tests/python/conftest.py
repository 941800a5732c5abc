"""pytest fixtures for the Python package: the library under test comes from
CUSAFE_LIBRARY (tests/pytest.sh sets it: the build with the fake CUDA, or
the real one, where the whole run is skipped without a device)."""

import gc

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
