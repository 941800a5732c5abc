"""Kernels and their launches: typed scalar arguments, argument packing,
prepared launches."""

from __future__ import annotations

import ctypes
import operator
import struct
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Optional,
                    Sequence, Tuple, Type, Union, cast)

from ._capi import (Arg, ArgKind, LaunchAttr, LaunchAttrId, LaunchConfig, _call,
                    _speedups, _unsigned, library)
from ._objects import (_MEMORY_KINDS, Buffer, Stream, _check_status, _count,
                       _encode, _Object, _Owner, _provides, _stream_handle)

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer as _BufferLike

    # A grid or block: an int or 1 to 3 ints.
    _Dim = Union[int, Sequence[int]]
    # Kernel._pack: a fast path of _make_fast, or _no_fast.
    _FastFn = Callable[["Kernel", _Dim, _Dim, int, Tuple[Any, ...]],
                       Optional[bool]]

# Typed kernel arguments.  A plain int is passed as I64 and a float as F64;
# wrap a value to pass another type: kernel.launch(g, b, buf, F32(2.0), n).
class _Scalar:
    __slots__ = ("value",)
    value: Union[int, float]
    # None here; every concrete type (_scalar) sets both.
    kind: ArgKind = None  # type: ignore[assignment]
    field: str = None  # type: ignore[assignment]

    if TYPE_CHECKING:
        # Set per type by _scalar: checks that the value fits.
        def _check(self) -> None: ...

    def __init__(self, value: Union[int, float]) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "%s(%r)" % (type(self).__name__, self.value)


def _scalar(kind: ArgKind, field: str, lo: Optional[int] = None,
            hi: Optional[int] = None) -> Type[_Scalar]:
    def check(self: _Scalar) -> None:
        v = self.value
        if lo is not None:  # an integer type: lo and hi are given together
            if type(v) is not int:
                try:
                    v = self.value = operator.index(cast(Any, v))
                except TypeError:
                    raise TypeError("%s takes an int, not %s"
                                    % (kind.name, type(v).__name__)) from None
            if not lo <= v <= hi:  # type: ignore[operator]
                raise OverflowError("%r does not fit %s" % (v, kind.name))
        elif type(v) is not float:
            if isinstance(v, (str, bytes)) or not hasattr(type(v),
                                                          "__float__"):
                raise TypeError("%s takes a float, not %s"
                                % (kind.name, type(v).__name__))
            v = self.value = float(v)
        if field == "f32":  # finite, but rounds to infinity
            try:
                struct.pack("<f", v)
            except OverflowError:
                raise OverflowError("%r does not fit %s"
                                    % (v, kind.name)) from None
    cls = cast(Type[_Scalar],
               type(kind.name, (_Scalar,), {"__slots__": (), "kind": kind,
                                           "field": field, "_check": check}))
    cls.__doc__ = "A kernel argument of type %s." % kind.name
    return cls


I8 = _scalar(ArgKind.I8, "i", -2**7, 2**7 - 1)
U8 = _scalar(ArgKind.U8, "u", 0, 2**8 - 1)
I16 = _scalar(ArgKind.I16, "i", -2**15, 2**15 - 1)
U16 = _scalar(ArgKind.U16, "u", 0, 2**16 - 1)
I32 = _scalar(ArgKind.I32, "i", -2**31, 2**31 - 1)
U32 = _scalar(ArgKind.U32, "u", 0, 2**32 - 1)
I64 = _scalar(ArgKind.I64, "i", -2**63, 2**63 - 1)
U64 = _scalar(ArgKind.U64, "u", 0, 2**64 - 1)
F32 = _scalar(ArgKind.F32, "f32")
F64 = _scalar(ArgKind.F64, "f64")


class Bytes:
    """A kernel argument passed by value as raw bytes (a struct): any
    object with the buffer protocol, such as a ctypes.Structure."""

    __slots__ = ("data",)
    data: bytes

    def __init__(self, data: _BufferLike) -> None:
        """Copies `data` (any C-contiguous object with the buffer
        protocol).  Its size must be that of the kernel's parameter, which
        the launch checks (CusafeError INVALID_ARGUMENTS)."""
        self.data = bytes(memoryview(data).cast("B"))


def _dims(v: _Dim, what: str) -> Tuple[int, ...]:
    """A grid or block as 3 ints of 32 bits; TypeError for another type,
    ValueError for more than 3 or fewer than 1, or a negative one,
    OverflowError for one beyond 32 bits (which the unsigned int of the
    launch would cut down to another size)."""
    if isinstance(v, (str, bytes)):
        raise TypeError("%s must be an int or 1 to 3 ints, not %s"
                        % (what, type(v).__name__))
    try:
        dims = (operator.index(v),) if not hasattr(v, "__iter__") \
            else tuple(operator.index(d) for d in v)
    except TypeError:
        raise TypeError("%s must be an int or 1 to 3 ints, not %r"
                        % (what, v)) from None
    if not 1 <= len(dims) <= 3:
        raise ValueError("%s must be an int or 1 to 3 ints" % what)
    for d in dims:
        _unsigned(d, what, 32)
    return dims + (1,) * (3 - len(dims))


_I64_MIN, _I64_MAX = -2**63, 2**63 - 1


_configs: Dict[Tuple[Tuple[int, ...], Tuple[int, ...], int], LaunchConfig] = {}
# The same, by the exact ints a launch gave (grid, block, shared).
_int_configs: Dict[Tuple[_Dim, _Dim, int], LaunchConfig] = {}


def _launch_config(grid: _Dim, block: _Dim, shared: int,
                   stream: Optional[Stream]) -> LaunchConfig:
    """A LaunchConfig, shared between the launches on the default stream
    with the same shape: the library reads it during the call only, and
    nobody writes it.  Every value is checked first, so that a value that
    merely equals a cached one (1.0 for 1) is refused as well."""
    # Exact ints (no float, bool or other type that merely equals one)
    # find their checked configuration first, by the values given.
    exact = (stream is None and type(grid) is int and type(block) is int
             and type(shared) is int)
    if exact:
        config = _int_configs.get((grid, block, shared))
        if config is not None:
            return config
    g, b = _dims(grid, "grid"), _dims(block, "block")
    checked = _unsigned(shared, "shared")
    key = (g, b, checked)
    if stream is None:
        config = _configs.get(key)
        if config is not None:
            return config
    config = LaunchConfig(g, b, checked, _stream_handle(stream))
    if len(_configs) < 256 and stream is None:
        _configs[key] = config
        if exact:
            _int_configs[(grid, block, shared)] = config
    return config


_VALUE_FORMAT = {"i": "q", "u": "Q", "f32": "f4x", "f64": "d"}
_K_BUFFER, _K_I64, _K_F64, _K_BYTES = 1, 8, 11, 12
_formats: Dict[str, Callable[..., bytes]] = {}


def _pack_args(args: Sequence[Any], stream: Optional[Stream] = None
               ) -> Tuple[Optional[bytes], Optional[List[Any]]]:
    """The general path: the cusafe_arg array of `args` (every type that
    Kernel.launch takes) as bytes, packed by one struct call (None for no
    arguments), which ctypes passes as the address of its contents; and
    what must stay alive with it (the bytes of Bytes arguments, the
    Buffers that wrap other libraries' arrays for a launch on `stream`).
    Raises TypeError or OverflowError naming the argument that cannot be
    passed."""
    fmt = "<"
    values: List[Any] = []
    keep: Optional[List[Any]] = None
    for i, a in enumerate(args):
        t = type(a)
        if t is Buffer or isinstance(a, Buffer):
            fmt += "IIQ"
            values += (_K_BUFFER, 0, a.handle)
        elif t is int or (isinstance(a, int) and t is not bool):
            if not _I64_MIN <= a <= _I64_MAX:
                raise OverflowError("argument %d: %r does not fit I64"
                                    % (i, a))
            fmt += "IIq"
            values += (_K_I64, 0, int(a))
        elif t is float or isinstance(a, float):
            fmt += "IId"
            values += (_K_F64, 0, float(a))
        elif isinstance(a, _Scalar):
            try:
                a._check()
            except (TypeError, OverflowError) as e:
                raise type(e)("argument %d: %s" % (i, e)) from None
            fmt += "II" + _VALUE_FORMAT[a.field]
            values += (int(a.kind), 0, a.value)
        elif isinstance(a, Bytes):
            fmt += "IIQ"
            values += (_K_BYTES, len(a.data),
                       ctypes.cast(ctypes.c_char_p(a.data),
                                   ctypes.c_void_p).value)
            keep = (keep or []) + [a.data]
        elif t is bool:
            raise TypeError("argument %d: pass a bool as I32() or U8()" % i)
        elif _foreign(a):
            # Another library's array (or a cusafe Array): wrapped for this
            # launch, whose queued work then keeps it alive.  The probe
            # looks at the class: reading a cusafe Array's interface would
            # mark it lent, and its close() would then release nothing.
            buf = _wrap_arg(a, stream)
            fmt += "IIQ"
            values += (_K_BUFFER, 0, buf.handle)
            keep = (keep or []) + [buf]
        else:
            raise TypeError("argument %d: cannot pass %s to a kernel"
                            % (i, type(a).__name__))
    pack = _formats.get(fmt)
    if pack is None:
        pack = _formats[fmt] = struct.Struct(fmt).pack
    return (pack(*values) if args else None), keep


def _launch_attrs(cluster: Optional[_Dim], cooperative: bool,
                  programmatic_serialization: bool,
                  priority: Optional[int]) -> Optional[Any]:
    """The cusafe_launch_attr array of Kernel.launch's keyword arguments
    (a ctypes array), or None where they ask for nothing.  A cluster of
    more than 8 blocks asks for non-portable clusters too.  Raises
    TypeError for a flag that is not a bool or a priority that is not an
    int, ValueError or OverflowError for a cluster as for a grid, and
    OverflowError for a priority beyond 32 bits; the library checks the
    rest."""
    for name, flag in (("cooperative", cooperative),
                       ("programmatic_serialization",
                        programmatic_serialization)):
        if type(flag) is not bool:
            raise TypeError("%s must be a bool, not %s"
                            % (name, type(flag).__name__))
    attrs: List[Tuple[int, Tuple[str, Any]]] = []
    if cluster is not None:
        dims = _dims(cluster, "cluster")
        attrs.append((LaunchAttrId.CLUSTER, ("dim", dims)))
        if dims[0] * dims[1] * dims[2] > 8:
            attrs.append((LaunchAttrId.NON_PORTABLE_CLUSTER, ("flag", 1)))
    if cooperative:
        attrs.append((LaunchAttrId.COOPERATIVE, ("flag", 1)))
    if programmatic_serialization:
        attrs.append((LaunchAttrId.PROGRAMMATIC_SERIALIZATION, ("flag", 1)))
    if priority is not None:
        if isinstance(priority, bool):
            raise TypeError("priority must be an int, not bool")
        try:
            p = operator.index(priority)
        except TypeError:
            raise TypeError("priority must be an int, not %s"
                            % type(priority).__name__) from None
        if not -2**31 <= p < 2**31:
            raise OverflowError("priority %d does not fit 32 bits" % p)
        attrs.append((LaunchAttrId.PRIORITY, ("priority", p)))
    if not attrs:
        return None
    array = (LaunchAttr * len(attrs))()
    for a, (ident, (field, value)) in zip(array, attrs):
        a.id = int(ident)
        if field == "dim":
            a.value.dim[:] = value
        else:
            setattr(a.value, field, value)
    return array


def _raw_launch_ex() -> Any:
    """cusafe_kernel_launch_ex of Library.raw: called with the kernel's
    c_uint64, a pointer to the LaunchConfig, the attributes (a ctypes
    array), a c_size_t count, the arguments and a c_size_t count."""
    return library().raw.cusafe_kernel_launch_ex


def _raw_launch() -> Any:
    """cusafe_kernel_launch of Library.raw: called with the kernel's
    c_uint64, a pointer to the LaunchConfig, the arguments (a ctypes array
    or packed bytes) and a c_size_t count."""
    return library().raw.cusafe_kernel_launch


# (grid, block, shared) -> (LaunchConfig, a c_void_p of its address), for
# the default stream only; never removed, so the addresses stay valid.
_fast_configs: Dict[Tuple[_Dim, _Dim, int],
                    Tuple[LaunchConfig, ctypes.c_void_p]] = {}
# Argument counts as size_t values, made once.
_SIZES = tuple(ctypes.c_size_t(n) for n in range(64))

# The struct format of each typed scalar's value in the cusafe_arg union:
# its own width, padded to 8 bytes (so struct checks the range).
_SCALAR_FORMATS = {"I8": "b7x", "U8": "B7x", "I16": "h6x", "U16": "H6x",
                   "I32": "i4x", "U32": "I4x", "I64": "q", "U64": "Q",
                   "F32": "f4x", "F64": "d"}


def _make_fast(types: Tuple[type, ...], grid: _Dim, block: _Dim,
               shared: int) -> Optional[_FastFn]:
    """Kernel.launch's fast path for arguments of exactly these types on
    this grid, block and shared memory, on the default stream: a function
    fast(kernel, grid, block, shared, args) that launches and returns True,
    or returns None for anything else (then the general path runs).
    Generated per signature, so that a launch runs one comparison of the
    shape, one struct call and one ctypes call, and no loop.  None when a
    type needs the general path or the shape cannot be cached."""
    try:
        key = (grid, block, shared)
        config = _fast_configs.get(key)
        if config is None:
            if len(_fast_configs) >= 256:
                return None
            fast = _launch_config(grid, block, shared, None)
            config = _fast_configs[key] = (
                fast, ctypes.c_void_p(ctypes.addressof(fast)))
    except TypeError:  # an unhashable grid or block (a list)
        return None
    fields: List[str]
    fmt, fields = "<", []
    for i, t in enumerate(types):
        # Each cusafe_arg: kind and size (0) as one little-endian 64-bit
        # constant, then the value.
        if t is Buffer:
            fmt += "QQ"
            fields.append("%d, a%d._live" % (_K_BUFFER, i))
        elif t is int:
            fmt += "Qq"
            fields.append("%d, a%d" % (_K_I64, i))
        elif t is float:
            fmt += "Qd"
            fields.append("%d, a%d" % (_K_F64, i))
        elif isinstance(t, type) and issubclass(t, _Scalar) and \
                t.__name__ in _SCALAR_FORMATS and \
                t is globals().get(t.__name__):
            fmt += "Q" + _SCALAR_FORMATS[t.__name__]
            fields.append("%d, a%d.value" % (int(t.kind), i))
        else:
            return None
    n = len(types)
    src = "def fast(k, grid, block, shared, args):\n"
    src += "    if grid != _g or block != _b or shared != _s or " \
           "len(args) != %d:\n        return None\n" % n
    if types:
        src += "    (%s,) = args\n" % ", ".join("a%d" % i for i in range(n))
        src += "    if %s:\n        return None\n" % " or ".join(
            "type(a%d) is not _t%d" % (i, i) for i in range(n))
    src += "    st = _launch(k._c, _cfg, _pack(%s), _n)\n" % \
        ", ".join(fields)
    src += "    if st:\n        k._failed(st, args)\n    return True\n"
    env: Dict[str, Any] = {
        "_pack": struct.Struct(fmt).pack, "_g": grid, "_b": block,
        "_s": shared, "_cfg": config[1],
        "_n": _SIZES[n] if n < len(_SIZES) else ctypes.c_size_t(n),
        "_launch": _raw_launch()}
    env.update(("_t%d" % i, t) for i, t in enumerate(types))
    exec(src, env)
    return cast("_FastFn", env["fast"])


def _no_fast(k: Kernel, grid: _Dim, block: _Dim, shared: int,
             args: Tuple[Any, ...]) -> None:
    return None


class _PyPrepared:
    """The ctypes implementation of a PreparedLaunch's call: one ctypes
    call; _speedups.PreparedObject is its twin in C."""

    __slots__ = ("_fn", "_argv")
    _fn: Any  # a ctypes function
    # cusafe_kernel_launch's arguments, or cusafe_kernel_launch_ex's
    _argv: Tuple[Any, ...]

    def _prepare(self, kernel: int, config: LaunchConfig,
                 cargs: Optional[bytes], attrs: Optional[Any]) -> None:
        # A function object of its own with no argtypes, called with ctypes
        # values made once: ctypes then converts nothing per call.  The
        # values have the exact C types of cusafe_kernel_launch (or, with
        # attributes, of cusafe_kernel_launch_ex).
        nargs = len(cargs) // ctypes.sizeof(Arg) if cargs else 0
        if attrs is None:
            self._fn = _raw_launch()
            self._argv = (ctypes.c_uint64(kernel),
                          ctypes.c_void_p(ctypes.addressof(config)), cargs,
                          ctypes.c_size_t(nargs))
        else:
            self._fn = _raw_launch_ex()
            self._argv = (ctypes.c_uint64(kernel),
                          ctypes.c_void_p(ctypes.addressof(config)),
                          ctypes.c_void_p(ctypes.addressof(attrs)),
                          ctypes.c_size_t(len(attrs)), cargs,
                          ctypes.c_size_t(nargs))

    def __call__(self, *args: object, **kwargs: object) -> None:
        if args or kwargs:  # as the C twin says it
            raise TypeError("%s() takes no arguments" % type(self).__name__)
        st = self._fn(*self._argv)
        if st:
            library().check(st)


if TYPE_CHECKING or _speedups is None:
    _PreparedBase = _PyPrepared
else:
    _PreparedBase = _speedups.PreparedObject


class PreparedLaunch(_Owner, _PreparedBase):
    """A kernel launch with its configuration and arguments converted once
    (Kernel.prepare); calling it launches again, raising CusafeError on a
    failure.  It keeps the kernel and the argument objects alive.  It
    cannot be copied or pickled (TypeError)."""

    __slots__ = ("_keep",)
    _holds = "it holds the GPU handles of its kernel and arguments"
    _keep: Tuple[Kernel, LaunchConfig, Tuple[Any, ...], Optional[List[Any]],
                 Optional[Any]]

    def __init__(self, kernel: Kernel, config: LaunchConfig,
                 args: Tuple[Any, ...],
                 stream: Optional[Stream] = None,
                 attrs: Optional[Any] = None) -> None:
        cargs, keep = _pack_args(args, stream)
        self._prepare(kernel.handle, config, cargs, attrs)
        self._keep = (kernel, config, args, keep, attrs)


if TYPE_CHECKING or _speedups is None:
    _KernelBase = _Object
else:
    class _KernelBase(_Object, _speedups.KernelObject):
        __slots__ = ()


class Kernel(_KernelBase):
    """A kernel of a module (Module.kernel), which it keeps alive; queued
    launches keep the kernel and their buffers alive until done.  Every
    launch is checked against the kernel's real parameters (count and
    sizes, and types where they are known: see signature and declare()):
    a mismatch raises CusafeError INVALID_ARGUMENTS naming the argument.
    Methods of a closed Kernel raise ValueError."""

    __slots__ = ("_name", "_pack")
    _name: str
    _pack: _FastFn
    _release_name = "cusafe_kernel_release"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Not for use: raises TypeError (Module.kernel(name) makes
        Kernels)."""
        raise TypeError("use Module.kernel(name)")

    @property
    def name(self) -> str:
        """The kernel's name in its module (readable after close())."""
        return self._name

    @property
    def params(self) -> List[int]:
        """The sizes in bytes of the kernel's parameters, as a list."""
        count = ctypes.c_size_t(0)
        _call("cusafe_kernel_get_params", ctypes.byref(count), None, 0,
              self.handle)
        sizes = (ctypes.c_size_t * max(count.value, 1))()
        _call("cusafe_kernel_get_params", ctypes.byref(count), sizes,
              count.value, self.handle)
        return list(sizes[:count.value])

    @property
    def signature(self) -> str:
        """The kernel's parameters as C, "scale(float*, int)": read from a
        C++ kernel's mangled name (the name demangled), the built-in
        kernels' own, or declared (declare()).  Where the types are
        unknown, the name and "(?)" ("my_kernel(?)"): launches then check
        the arguments' sizes only."""
        length = ctypes.c_size_t(0)
        _call("cusafe_kernel_get_signature", None, 0, ctypes.byref(length),
              self.handle)
        while True:  # a declaration on another thread may change it
            text = ctypes.create_string_buffer(length.value + 1)
            _call("cusafe_kernel_get_signature", text, len(text),
                  ctypes.byref(length), self.handle)
            if length.value < len(text):
                return text.value.decode("utf-8", "replace")

    def declare(self, signature: str) -> None:
        """Declares the C types of the kernel's parameters, for kernels
        whose names carry none (extern "C"): a C parameter list such as
        "float *y, const float *x, float a, size_t n" (names optional;
        "" for none).  Every launch then checks each argument's type, not
        only its size: a pointer takes a Buffer (or another library's
        array) only, an integer ints and the typed integers of its width
        (I32 or U32 for int), float F32 only, double F64 (and floats) only;
        a struct or another type name takes Bytes and every value of its
        size.  The types replace those read from a C++ kernel's name.
        Raises CusafeError INVALID_VALUE where the list cannot be read or
        does not fit the kernel's parameters (their number, a type's
        size; the kernel keeps its types then), TypeError for a signature
        that is not a str, ValueError for one with a NUL character."""
        if not isinstance(signature, str):
            raise TypeError("signature must be a str, not %s"
                            % type(signature).__name__)
        _call("cusafe_kernel_declare", self.handle,
              _encode(signature, "signature"))

    def suggest_config(self, n: int, shared: int = 0) -> Tuple[int, int]:
        """(grid, block) that covers n threads with the best occupancy,
        each block using `shared` bytes of dynamic shared memory.  Raises
        TypeError for an n or shared that is not an int, ValueError for a
        negative one, OverflowError for one beyond 64 bits."""
        n, shared = _unsigned(n, "n"), _unsigned(shared, "shared")
        block, grid = ctypes.c_uint32(0), ctypes.c_uint32(0)
        _call("cusafe_kernel_suggest_config", ctypes.byref(block),
              ctypes.byref(grid), self.handle, shared, n)
        return grid.value, block.value

    def launch(self, grid: _Dim, block: _Dim, *args: Any, shared: int = 0,
               stream: Optional[Stream] = None,
               cluster: Optional[_Dim] = None, cooperative: bool = False,
               programmatic_serialization: bool = False,
               priority: Optional[int] = None) -> None:
        """Launches the kernel: grid and block are ints or tuples of up to
        3 ints; args are Buffers (passed as their device address), arrays
        of other libraries (objects with __dlpack__ or
        __cuda_array_interface__: CuPy, PyTorch, a cusafe Array), wrapped
        for the launch (Buffer.wrap) and passed as the address of their
        lowest byte (their first element, unless a stride is negative),
        whose memory stays alive until the kernel has completed, ints
        (I64), floats (F64), typed values (I32(...), F32(...), ...) or
        Bytes(...).  Ordered on `stream` (None: the context's default);
        the buffers stay alive until the kernel has completed.  A closed
        Kernel or Buffer raises ValueError.  Grid and block sizes must fit
        32 bits and `shared` 64 (OverflowError; ValueError for a negative
        one, TypeError for one that is not an int).  An array of host
        memory (NumPy, a CPU tensor) raises CusafeError INVALID_VALUE, as
        from_dlpack does.

        Launches on the default stream with the shape, and arguments of
        the types, of the kernel's previous launch take a fast path: one
        generated function compares them, packs the arguments with one
        struct call, and launches with one ctypes call.

        Hopper's launches (cusafe_kernel_launch_ex), keyword-only:
        `cluster`, the thread block cluster (an int or 1 to 3 ints, each
        dividing the grid's; more than 8 blocks opts the kernel into
        non-portable sizes, up to 16); `cooperative`, a grid whose blocks
        can all wait for each other (grid.sync()), at most as many blocks
        as can be resident at once; `programmatic_serialization`, a
        programmatic dependent launch (compute capability 9.0); and
        `priority`, within Context.stream_priority_range.  A rule broken
        raises CusafeError (INVALID_CONFIGURATION, INVALID_VALUE or
        NOT_SUPPORTED) with the library's sentence; a flag that is not a
        bool or a priority that is not an int raises TypeError.  These
        launches take the general path of the ctypes implementation; with
        the C accelerator (implementation() == "c") they are one C call,
        as the common launches are."""
        if cluster is not None or cooperative is not False or \
                programmatic_serialization is not False or \
                priority is not None:
            self._launch_ex(grid, block, args, shared, stream, _launch_attrs(
                cluster, cooperative, programmatic_serialization, priority))
            return
        if stream is None:
            try:
                if self._pack(self, grid, block, shared, args):
                    return
            except (struct.error, OverflowError, TypeError):
                pass  # a value out of range: the general path says which
        self._launch_general(grid, block, args, shared, stream)

    def _launch_general(self, grid: _Dim, block: _Dim, args: Tuple[Any, ...],
                        shared: int, stream: Optional[Stream]) -> None:
        """Kernel.launch with every check of the binding; prepares the fast
        path for the next launch of the same shape."""
        config = _launch_config(grid, block, shared, stream)
        cargs, _keep = _pack_args(args, stream)
        st = _raw_launch()(self._c, ctypes.byref(config), cargs,
                           _SIZES[len(args)] if len(args) < 64
                           else ctypes.c_size_t(len(args)))
        if st and self.closed:
            raise ValueError("this cusafe.Kernel is closed")
        if st:
            library().check(st)
        if stream is None:
            self._pack = _make_fast(tuple(map(type, args)), grid, block,
                                    shared) or _no_fast

    def _launch_ex(self, grid: _Dim, block: _Dim, args: Tuple[Any, ...],
                   shared: int, stream: Optional[Stream],
                   attrs: Optional[Any]) -> None:
        """Kernel.launch with attributes (None: none after all, a plain
        launch through cusafe_kernel_launch_ex)."""
        config = _launch_config(grid, block, shared, stream)
        cargs, _keep = _pack_args(args, stream)
        n = ctypes.c_size_t(len(attrs) if attrs is not None else 0)
        st = _raw_launch_ex()(self._c, ctypes.byref(config), attrs, n, cargs,
                              ctypes.c_size_t(len(args)))
        if st and self.closed:
            raise ValueError("this cusafe.Kernel is closed")
        if st:
            library().check(st)

    def _failed(self, status: int, args: Tuple[Any, ...]) -> None:
        """Raises for a failed fast launch: ValueError for a closed object
        (whose handle the fast path passed as 0), else the library's
        error."""
        if self.closed:
            raise ValueError("this cusafe.Kernel is closed")
        for a in args:
            if type(a) is Buffer and a.closed:
                raise ValueError("this cusafe.Buffer is closed")
        library().check(status)

    def prepare(self, grid: _Dim, block: _Dim, *args: Any, shared: int = 0,
                stream: Optional[Stream] = None,
                cluster: Optional[_Dim] = None, cooperative: bool = False,
                programmatic_serialization: bool = False,
                priority: Optional[int] = None) -> PreparedLaunch:
        """A PreparedLaunch: this launch with its configuration and
        arguments converted once, to be run many times for the cost of one
        ctypes call.  The handles are read now: a Buffer closed later makes
        the launch fail with INVALID_HANDLE (the library checks every
        handle), never use freed memory.  Arrays of other libraries are
        wrapped now, once: their memory lives as long as the prepared
        launch, and the producer's work is waited for at this call only.
        cluster, cooperative, programmatic_serialization and priority are
        those of launch(), checked (in Python) now and by the library at
        every call."""
        attrs = _launch_attrs(cluster, cooperative,
                              programmatic_serialization, priority)
        return PreparedLaunch(self, _launch_config(grid, block, shared,
                                                   stream), args, stream,
                              attrs)

    __call__ = launch

    def _describe(self) -> str:
        return self._name


def _foreign(a: Any) -> bool:
    """Whether a launch argument is another library's array (or a cusafe
    Array), as _pack_args tells them: found on the class, never read."""
    return _provides(a, "__cuda_array_interface__") or \
        _provides(a, "__dlpack__")


def _wrap_arg(a: Any, stream: Optional[Stream]) -> Buffer:
    """The Buffer of another library's array for a launch on `stream`, as
    _pack_args makes it."""
    return Buffer.wrap(a, stream=stream)


if _speedups is not None:
    # Kernel.launch is _speedups.KernelObject's, in C; the ctypes one above
    # runs the launches it does not convert itself.
    _launch_py = Kernel.__dict__["launch"]
    delattr(Kernel, "launch")
    setattr(Kernel, "__call__", _speedups.KernelObject.__dict__["launch"])
    _speedups.setup(check=_check_status, count=_count, kinds=_MEMORY_KINDS,
                    buffer=Buffer, stream=Stream,
                    scalars=(I8, U8, I16, U16, I32, U32, I64, U64, F32, F64),
                    bytes=Bytes, launch=_launch_py, foreign=_foreign,
                    wrap=_wrap_arg)
