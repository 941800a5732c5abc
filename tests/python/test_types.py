"""The types of kernels' parameters from Python: Kernel.signature (read
from a C++ kernel's mangled name, the built-in kernels' own) and
Kernel.declare, and the launches they refuse, on the fast path and on the
general one."""

import threading

import pytest

import cusafe

SOURCE = r"""
extern "C" __global__ void k(float *x, int n) {
  if (threadIdx.x == 0 && x && n > 0) x[0] = 1.0f;
}
__global__ void scale(float *x, int n) {
  if (threadIdx.x == 0 && x && n > 0) x[0] *= 2.0f;
}
"""


@pytest.fixture
def typed(ctx):
    with ctx.compile(SOURCE, "typed.cu") as m:
        yield m


def refused(kernel, args, text):
    """Both paths of a launch, and a prepared launch, refuse `args` with
    INVALID_ARGUMENTS and `text`."""
    for call in (lambda: kernel.launch(1, 32, *args),
                 lambda: kernel.launch(1, 32, *args),
                 lambda: kernel.prepare(1, 32, *args)()):
        with pytest.raises(cusafe.CusafeError) as e:
            call()
        assert e.value.status == cusafe.Status.INVALID_ARGUMENTS
        assert e.value.message == text


def test_builtin_signatures(ctx):
    with ctx.load_builtin() as m:
        fill = m.kernel("cusafe_fill_f64")
        assert fill.signature == "cusafe_fill_f64(double*, double, size_t)"
        b = ctx.alloc(64)
        # Python's ints pass as I64, which size_t takes; its floats as F64
        fill.launch(1, 32, b, 2.5, 8)
        fill.launch(1, 32, b, 2.5, 8)  # the fast path
        refused(fill, (b, 2, 8),
                "argument 1 of kernel cusafe_fill_f64(double*, double, "
                "size_t) is a 64-bit integer, parameter 1 is double")
        refused(fill, (b, 2.5, b),
                "argument 2 of kernel cusafe_fill_f64(double*, double, "
                "size_t) is a buffer, parameter 2 is size_t")
        refused(fill, (8, 2.5, 8),
                "argument 0 of kernel cusafe_fill_f64(double*, double, "
                "size_t) is a 64-bit integer, parameter 0 is double*")
        assert list(memoryview(b.read()).cast("d")) == [2.5] * 8


def test_mangled_names_are_read(ctx, typed):
    scale = typed.kernel("_Z5scalePfi")
    assert scale.signature == "scale(float*, int)"
    assert scale.name == "_Z5scalePfi"
    b = ctx.alloc(16)
    scale.launch(1, 32, b, cusafe.I32(1))
    scale.launch(1, 32, b, cusafe.U32(1))
    refused(scale, (b, cusafe.F32(1)),
            "argument 1 of kernel scale(float*, int) is a float, parameter 1 "
            "is int")
    refused(scale, (cusafe.U64(0), cusafe.I32(1)),
            "argument 0 of kernel scale(float*, int) is an unsigned 64-bit "
            "integer, parameter 0 is float*")


def test_declare(ctx, typed):
    k = typed.kernel("k")
    assert k.signature == "k(?)"
    b = ctx.alloc(16)
    k.launch(1, 32, b, cusafe.F32(1))  # sizes only: a float takes int's 4
    assert k.declare("float *x, int n") is None
    assert k.signature == "k(float*, int)"
    refused(k, (b, cusafe.F32(1)),
            "argument 1 of kernel k(float*, int) is a float, parameter 1 is "
            "int")
    k.launch(1, 32, b, cusafe.I32(1))
    k.declare("float*, unsigned")
    assert k.signature == "k(float*, unsigned int)"


def test_declare_refused(typed):
    k = typed.kernel("k")
    for decl, text in (
            ("float**x y", 'cannot read the declaration "float**x y": '
                           'parameter 0: unexpected "y"'),
            ("float*", "the declaration has 1 parameters, kernel k has 2"),
            ("float*, double", "parameter 1 is declared double (8 bytes), "
                               "the kernel's is 4 bytes")):
        with pytest.raises(cusafe.CusafeError) as e:
            k.declare(decl)
        assert e.value.status == cusafe.Status.INVALID_VALUE
        assert e.value.message == text
    assert k.signature == "k(?)"
    with pytest.raises(TypeError, match="signature must be a str, not bytes"):
        k.declare(b"float*, int")
    with pytest.raises(ValueError, match="signature contains a NUL"):
        k.declare("float*, int\0")
    k.close()
    with pytest.raises(ValueError, match="closed"):
        k.declare("float*, int")
    with pytest.raises(ValueError, match="closed"):
        k.signature


def test_declare_races_launches(ctx):
    with ctx.load_builtin() as m:
        fill = m.kernel("cusafe_fill_f32")
        b = ctx.alloc(64)
        done = threading.Event()
        seen = set()
        errors = []

        def launch():
            try:
                while not done.is_set():
                    fill.launch(1, 32, b, cusafe.F32(1), 16)
                    seen.add(fill.signature)
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        t = threading.Thread(target=launch)
        t.start()
        for i in range(200):
            fill.declare("float *x, float v, size_t n" if i % 2
                         else "float*, float, unsigned long")
        done.set()
        t.join()
        assert not errors
        assert seen <= {"cusafe_fill_f32(float*, float, size_t)",
                        "cusafe_fill_f32(float*, float, unsigned long)"}
