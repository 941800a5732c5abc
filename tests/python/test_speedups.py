"""The C extension cusafe._speedups next to the ctypes path: the same
retain and release, the same statuses and errors, whichever runs.  Each
implementation runs in a process of its own (CUSAFE_PURE_PYTHON is read
at import)."""

import os
import subprocess
import sys
import textwrap

import pytest

import cusafe

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


def run(pure):
    env = dict(os.environ)
    env.pop("CUSAFE_PURE_PYTHON", None)
    if pure:
        env["CUSAFE_PURE_PYTHON"] = "1"
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env,
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
