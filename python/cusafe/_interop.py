"""Interop: DLPack and the CUDA Array Interface, in and out."""

from __future__ import annotations

import ctypes
import weakref
from typing import (Any, Callable, Dict, List, Optional, Protocol, Sequence,
                    Tuple, Union)

from ._capi import (CusafeError, Memory, Status, _DLDataType, _call, _index,
                    _unsigned, c_enum, c_handle, library)
from ._objects import (Buffer, Context, Stream, _check_stream_context,
                       _device_of, _handle_of, _Owner, _provides)

# --------------------------------------------------------------------------
# Interop: DLPack and the CUDA Array Interface
# --------------------------------------------------------------------------

# DLPack's device types and type codes (dlpack.h).
_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 1, 2, 3, 13
_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_DL_KINDS = {v: k for k, v in _DL_CODES.items()}
_kDLBfloat = 4
_DTYPE_NAMES = {
    "bool": "b1", "int8": "i1", "uint8": "u1", "int16": "i2",
    "uint16": "u2", "int32": "i4", "uint32": "u4", "int64": "i8",
    "uint64": "u8", "float16": "f2", "float32": "f4", "float64": "f8",
    "complex64": "c8", "complex128": "c16",
    # C names, as NumPy reads them: "float" and "int" are Python's.
    "byte": "i1", "ubyte": "u1", "short": "i2", "ushort": "u2",
    "intc": "i4", "uintc": "u4", "longlong": "i8", "ulonglong": "u8",
    "half": "f2", "single": "f4", "double": "f8", "float": "f8",
    "int": "i8", "complex": "c16",
}


def _typestr(dtype: Any) -> str:
    """The CAI type string ("<f4") of a dtype given as a NumPy type string,
    a name, or an object with a `str` attribute (a NumPy dtype)."""
    text = getattr(dtype, "str", dtype)
    if isinstance(dtype, type):  # numpy.float32 and the like
        text = getattr(dtype, "__name__", text)
    if not isinstance(text, str):
        raise TypeError("dtype must be a type string such as 'f4' or a "
                        "NumPy dtype, not %s" % type(dtype).__name__)
    name = _DTYPE_NAMES.get(text, text)
    if name and name[0] in "<>|=":
        order, name = name[0], name[1:]
    else:
        order = "<"
    if not name or name[:1] not in _DL_CODES or not name[1:].isdigit() or \
            int(name[1:]) not in (1, 2, 4, 8, 16):
        raise ValueError("unknown dtype %r (expected a type string such as "
                         "'f4', 'i8', 'u1', 'c8', 'b1', or a name such as "
                         "'float32')" % (dtype,))
    if order == ">" and int(name[1:]) > 1:
        raise ValueError("dtype %r is big-endian: CUDA memory is "
                         "little-endian" % (dtype,))
    size = int(name[1:])
    return ("|" if size == 1 else "<") + name


def _dlpack_device(memory: int, device: int) -> Tuple[int, int]:
    if memory == Memory.HOST_PINNED:
        return (_kDLCUDAHost, 0)
    return (_kDLCUDAManaged if memory == Memory.MANAGED else _kDLCUDA,
            device)


def _extent(shape: Sequence[int], strides: Sequence[int],
            itemsize: int) -> Tuple[int, int]:
    """[lo, hi): the bytes that elements reach from the first one."""
    if any(n == 0 for n in shape):
        return 0, 0
    lo = sum(s * (n - 1) for n, s in zip(shape, strides) if s < 0)
    hi = sum(s * (n - 1) for n, s in zip(shape, strides) if s > 0)
    return lo, hi + itemsize


def _ints(values: Any, what: str, one: bool = False) -> Tuple[int, ...]:
    """A shape or strides as a tuple of ints (operator.index: ints, and
    those of other libraries such as numpy.int64); `one`: a single int is
    taken as a 1-tuple.  TypeError naming `what` for anything else: a
    float (never truncated), a str or bytes (never split into digits)."""
    if one:
        try:
            return (_index(values, what),)
        except TypeError:
            pass
    kinds = "an int or a sequence of ints" if one else "a sequence of ints"
    if isinstance(values, (str, bytes, bytearray)) or \
            not hasattr(type(values), "__iter__"):
        raise TypeError("%s must be %s, not %s"
                        % (what, kinds, type(values).__name__))
    values = tuple(values)
    try:
        return tuple(_index(n, what) for n in values)
    except TypeError:
        raise TypeError("%s must be %s, not %r"
                        % (what, kinds, values)) from None


def _c_strides(shape: Sequence[int], itemsize: int) -> Tuple[int, ...]:
    strides: List[int]
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _consumer_stream(ctx: Context, stream: Any,
                     what: str) -> Tuple[Stream, bool]:
    """A cusafe Stream for a stream of the DLPack / CAI conventions: None
    or 1 the legacy default stream, 2 the per-thread one, another int a
    cudaStream_t; a cusafe Stream is returned as it is, once checked to be
    of ctx (CusafeError CONTEXT_MISMATCH, naming `what` the stream was
    given for).  The caller closes what it did not pass in (second value
    True)."""
    if isinstance(stream, Stream):
        _check_stream_context(stream, ctx, what)
        return stream, False
    if stream is None:
        stream = 1
    return Stream.wrap(stream, ctx), True


class _PyAPI:
    """Python's capsule functions through ctypes, and names whose storage
    lives as long as the process (a capsule keeps a pointer to its name,
    and may outlive this module at interpreter exit)."""

    def __init__(self) -> None:
        api = ctypes.pythonapi
        self.new = api.PyCapsule_New
        self.new.restype = ctypes.py_object
        self.new.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p]
        self.is_valid = api.PyCapsule_IsValid
        self.is_valid.restype = ctypes.c_int
        self.is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
        self.get_pointer = api.PyCapsule_GetPointer
        self.get_pointer.restype = ctypes.c_void_p
        self.get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        self.set_name = api.PyCapsule_SetName
        self.set_name.restype = ctypes.c_int
        self.set_name.argtypes = [ctypes.py_object, ctypes.c_void_p]
        self.incref = api.Py_IncRef
        self.incref.restype = None
        self.incref.argtypes = [ctypes.py_object]
        libc = ctypes.CDLL(None)
        libc.strdup.restype = ctypes.c_void_p
        libc.strdup.argtypes = [ctypes.c_char_p]
        self.names: Dict[bytes, Optional[int]] = {
            n: libc.strdup(n) for n in (
                b"dltensor", b"dltensor_versioned", b"used_dltensor",
                b"used_dltensor_versioned")}


_pyapi: Optional[_PyAPI] = None


def _python_api() -> _PyAPI:
    global _pyapi
    if _pyapi is None:
        _pyapi = _PyAPI()
    return _pyapi


def _function_address(name: str) -> Optional[int]:
    """The address of a function of the library, for C callbacks."""
    lib = library()
    try:
        return ctypes.cast(lib.cdll[name], ctypes.c_void_p).value
    except AttributeError:
        raise CusafeError(Status.NOT_SUPPORTED,
                          "%s does not export %s (built with "
                          "./configure --disable-dlpack?)" % (lib.path, name), 0)


def _release_array(use_buffers: Callable[..., int],
                   release: Callable[..., int], buf: int, stream: int,
                   handles: ctypes.Array[ctypes.c_uint64]) -> None:
    """An Array's finalizer: its memory is freed only after the work queued
    on its stream so far.  It calls ctypes functions bound beforehand only
    (no module global), so that it also runs while the interpreter shuts
    down; their failures (after shutdown: a no-op) are ignored."""
    use_buffers(stream, handles, 1)
    use_buffers(0, handles, 1)  # nothing of cusafe's touches stream later
    release(buf)
    release(stream)


class _Finalizer(Protocol):
    """What an Array uses of its weakref.finalize (typed by shape: the
    generic parameters of weakref.finalize differ between typeshed
    versions)."""
    atexit: bool

    @property
    def alive(self) -> bool: ...

    def __call__(self, _: Any = None) -> Any: ...


class Array(_Owner):
    """A typed, shaped window on a Buffer (Buffer.as_array), for other
    libraries: it implements the DLPack protocol (__dlpack__,
    __dlpack_device__) and the CUDA Array Interface, version 3.

    Ownership.  The Array holds a reference on the buffer and on its
    stream: the memory stays valid while the Array lives, and each DLPack
    tensor made from it holds references of its own until its deleter
    runs.  When the Array is closed (close(), `with`, the garbage
    collector), the buffer is recorded as used on its stream first, so
    that its memory is freed only after the work queued there by then --
    such as a consumer's kernels on that stream.  Once its CUDA Array
    Interface has been read, close() leaves that to the garbage collector:
    consumers of the interface (CuPy, Numba, PyTorch) keep the Array object
    as the owner of the memory.  Work a consumer queues on other streams it
    must synchronise itself before dropping the Array, as every producer of
    these protocols asks.  A stream given to as_array() must outlive the
    Array.  An Array cannot be copied or pickled (TypeError)."""

    # _lent: the CUDA Array Interface was read, so a consumer may hold this
    # object; close() then leaves the references to the garbage collector.
    __slots__ = ("_buffer", "_stream", "_dtype", "_shape", "_strides",
                 "_offset", "_ptr", "_finalizer", "_lent", "_closed",
                 "__weakref__")
    _holds = "it holds references on the handles of a GPU buffer and a " \
        "stream"
    _buffer: int
    _stream: int
    _dtype: str
    _shape: Tuple[int, ...]
    _strides: Optional[Tuple[int, ...]]
    _offset: int
    _ptr: int
    _finalizer: _Finalizer
    _lent: bool
    _closed: bool

    def __init__(self, buffer: Buffer, dtype: Any = "u1",
                 shape: Optional[Union[int, Sequence[int]]] = None,
                 strides: Optional[Sequence[int]] = None, offset: int = 0,
                 stream: Any = None) -> None:
        """Buffer.as_array(dtype, shape, strides, offset, stream), which
        says what each argument means.  Raises TypeError for a dtype that
        is not a type string or NumPy dtype, ValueError for an unknown
        dtype, a negative shape, strides of another length or not
        multiples of the element size, or elements beyond the buffer;
        ValueError for a closed buffer; TypeError for a buffer that is not
        a Buffer, a shape, strides or offset that are not ints (floats,
        str: never truncated nor split; numpy.int64 and other integers
        with __index__ are ints); CusafeError CONTEXT_MISMATCH for a
        cusafe Stream of another context."""
        _handle_of(buffer, Buffer, "buffer")
        typestr = _typestr(dtype)
        itemsize = int(typestr[2:])
        size = buffer.size
        offset = _index(offset, "offset")
        if not 0 <= offset <= size:
            raise ValueError("offset %r is outside the buffer of %d bytes"
                             % (offset, size))
        if shape is None:
            shape = ((size - offset) // itemsize,)
        else:
            shape = _ints(shape, "shape", one=True)
        if len(shape) > 64 or any(n < 0 for n in shape):
            raise ValueError("shape %r: at most 64 dimensions of sizes 0 or "
                             "more" % (shape,))
        if strides is None:
            strides = _c_strides(shape, itemsize)
            contiguous = True
        else:
            strides = _ints(strides, "strides")
            if len(strides) != len(shape):
                raise ValueError("%d strides for %d dimensions"
                                 % (len(strides), len(shape)))
            if any(s % itemsize for s in strides):
                raise ValueError("strides %r are not multiples of the "
                                 "element size %d" % (strides, itemsize))
            contiguous = strides == _c_strides(shape, itemsize)
        lo, hi = _extent(shape, strides, itemsize)
        if offset + lo < 0 or offset + hi > size:
            raise ValueError("array of bytes [%d, %d) at offset %d exceeds "
                             "buffer of %d bytes" % (lo, hi, offset, size))
        ptr = buffer.interop_pointer() + offset if hi > lo else 0
        ctx = buffer.context
        try:
            st, own = _consumer_stream(ctx, stream, "an array of a buffer")
        finally:
            ctx.close()
        lib = library()
        h = buffer.handle
        try:
            if own:
                sh = st.detach()  # the wrapper's reference is the Array's
            else:
                _call("cusafe_stream_retain", st.handle)
                sh = st.handle
        except BaseException:
            if own:
                st.close()
            raise
        try:
            _call("cusafe_buffer_retain", h)
        except BaseException:
            lib.fn.cusafe_release(sh)
            raise
        self._buffer = h
        self._stream = sh
        self._dtype = typestr
        self._shape = shape
        self._strides = None if contiguous else strides
        self._offset = offset
        self._ptr = ptr
        self._lent = self._closed = False
        self._finalizer = weakref.finalize(
            self, _release_array, lib.fn.cusafe_stream_use_buffers,
            lib.fn.cusafe_release, h, sh, (c_handle * 1)(h))
        self._finalizer.atexit = False

    @property
    def dtype(self) -> str:
        """The element type as a CAI type string ("<f4")."""
        return self._dtype

    @property
    def shape(self) -> Tuple[int, ...]:
        """The number of elements along each dimension."""
        return self._shape

    @property
    def strides(self) -> Optional[Tuple[int, ...]]:
        """Strides in bytes, or None for C order (as CAI gives them)."""
        return self._strides

    @property
    def closed(self) -> bool:
        """Whether close() was called (or the references are gone); the
        protocols of a closed Array raise ValueError."""
        return self._closed or not self._finalizer.alive

    def _open(self) -> None:
        if self.closed:
            raise ValueError("this cusafe.Array is closed")

    def close(self) -> None:
        """Releases the Array's references (after recording the buffer as
        used on its stream), unless its CUDA Array Interface was read: a
        consumer may hold this object, so the garbage collector releases
        them once nobody does.  The Array is unusable afterwards either way;
        closing twice is a no-op."""
        self._closed = True
        if not self._lent:
            self._finalizer()

    def __enter__(self) -> Array:
        """The Array itself: `with` closes it at the end of the block."""
        return self

    def __exit__(self, *exc: object) -> None:
        """close(); exceptions of the block propagate."""
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<cusafe.Array closed>"
        return "<cusafe.Array %s %s of buffer 0x%016x>" % (
            self._dtype, self._shape, self._buffer)

    def _order(self) -> None:
        """Orders the Array's stream after the work queued on the buffer."""
        handles = (c_handle * 1)(self._buffer)
        _call("cusafe_stream_use_buffers", self._stream, handles, 1)

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """The CUDA Array Interface, version 3.  Reading it orders the
        Array's stream after the buffer's queued work; `stream` names that
        stream, for the consumer to order its own work after (1: the
        legacy default stream)."""
        self._open()
        self._order()
        self._lent = True
        raw = ctypes.c_void_p()
        _call("cusafe_stream_interop_handle", ctypes.byref(raw),
              self._stream)
        return {
            "shape": self._shape,
            "typestr": self._dtype,
            "data": (self._ptr, False),
            "strides": self._strides,
            "version": 3,
            "stream": raw.value or 1,
        }

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(device type, device id) of DLPack: (2, device) for device
        memory (kDLCUDA), (3, 0) for pinned (kDLCUDAHost), (13, device)
        for managed (kDLCUDAManaged)."""
        self._open()
        mem, dev = c_enum(0), ctypes.c_int(0)
        _call("cusafe_buffer_get_memory", ctypes.byref(mem), self._buffer)
        ctx = c_handle(0)
        _call("cusafe_buffer_get_context", ctypes.byref(ctx), self._buffer)
        try:
            _call("cusafe_context_get_device", ctypes.byref(dev), ctx.value)
        finally:
            library().fn.cusafe_context_release(ctx.value)
        return _dlpack_device(Memory(mem.value), dev.value)

    def __dlpack__(self, *, stream: Optional[int] = None,
                   max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None,
                   copy: Optional[bool] = None) -> object:
        """A DLPack capsule of the Array (zero-copy): "dltensor_versioned"
        (DLPack 1.x) when the consumer's max_version is (1, 0) or newer,
        else the legacy "dltensor".  `stream`: the consumer's stream, as
        DLPack says (None or 1: the legacy default stream, 2: the
        per-thread one, another int: a cudaStream_t, -1: none); it is made
        to wait for the buffer's queued work, and the buffer's memory is
        freed only after the work queued there before the tensor's deleter
        ran.  The consumer's stream must outlive the tensor.  Raises
        BufferError for copy=True (cusafe never copies here) or another
        dl_device."""
        self._open()
        device = self.__dlpack_device__()
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError("the array is on DLPack device %r, not %r"
                              % (device, tuple(dl_device)))
        if copy:
            raise BufferError("cusafe exports without a copy; copy=True is "
                              "not supported")
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        name = b"dltensor_versioned" if versioned else b"dltensor"
        fn = "cusafe_buffer_to_dlpack" + ("" if versioned else "_legacy")
        destructor = _function_address("cusafe_dlpack_capsule_destructor")
        api = _python_api()
        itemsize = int(self._dtype[2:])
        kind = self._dtype[1]
        dt = _DLDataType(_DL_CODES[kind], 8 * itemsize, 1)
        ndim = len(self._shape)
        shape = (ctypes.c_int64 * max(ndim, 1))(*self._shape)
        strides: Optional[ctypes.Array[ctypes.c_int64]] = None
        if self._strides is not None:
            strides = (ctypes.c_int64 * ndim)(
                *[s // itemsize for s in self._strides])
        consumer: Optional[Stream] = None
        if stream != -1:
            ctx = c_handle(0)
            _call("cusafe_buffer_get_context", ctypes.byref(ctx),
                  self._buffer)
            consumer = Stream.wrap(1 if stream is None else stream,
                                   Context._adopt(ctx.value))
        out = ctypes.c_void_p()
        try:
            _call(fn, ctypes.byref(out), self._buffer, self._offset, dt, ndim,
                  shape, strides, consumer.handle if consumer else 0)
        finally:
            if consumer is not None:
                consumer.close()
        try:
            return api.new(out, api.names[name], destructor)
        except BaseException:
            _delete_tensor(out.value, versioned)
            raise


def _delete_tensor(address: Optional[int], versioned: bool) -> None:
    """Calls the deleter of a tensor that no capsule holds, through a
    capsule of its own (whose destructor finds the deleter in C)."""
    api = _python_api()
    name = b"dltensor_versioned" if versioned else b"dltensor"
    capsule = api.new(address, api.names[name],
                      _function_address("cusafe_dlpack_capsule_destructor"))
    del capsule  # its destructor deletes the unconsumed tensor


def from_dlpack(obj: Any, ctx: Optional[Context] = None,
                stream: Any = None) -> Buffer:
    """A Buffer over the memory of another library's array, through DLPack
    (obj.__dlpack__), zero-copy: CuPy and PyTorch arrays, JAX arrays,
    anything with __dlpack__.  The producer is asked for DLPack 1.x
    (max_version (1, 0)), else the legacy tensor; its deleter, which keeps
    the producer's memory alive, runs once, when the buffer's last
    reference and queued work are gone (or in the ordered shutdown).
    `stream`: the cusafe Stream (or a stream Stream.wrap takes) where the
    memory will be used; None: the device's legacy default stream.  The
    producer orders it after its own work, and cusafe's later work on the
    buffer, on any stream, is ordered after it.  `ctx`: the context of the
    array's device (default: made for it).  Raises BufferError (from the
    producer) or CusafeError (memory that is not CUDA memory of ctx's
    device, a read-only tensor).

    The producer's __dlpack_device__() is asked first: memory that is not
    CUDA's -- host memory (kDLCPU: a NumPy array, a CPU tensor) or another
    kind of device's -- raises CusafeError INVALID_VALUE ("tensor on
    DLPack device type 1 (CPU) is not CUDA memory"), CUDA device memory of
    another device than ctx's CONTEXT_MISMATCH, and a cusafe Stream of
    another context CONTEXT_MISMATCH, each before the producer is asked
    for the tensor (DLPack passes a stream for device memory only); memory
    that is not CUDA's before any context is made.  CUDA's host
    (kDLCUDAHost) and managed (kDLCUDAManaged) memory are CUDA memory."""
    if not _provides(obj, "__dlpack__") or \
            not _provides(obj, "__dlpack_device__"):
        raise TypeError("%s does not implement the DLPack protocol "
                        "(__dlpack__ and __dlpack_device__)"
                        % type(obj).__name__)
    dev_type, dev_id = obj.__dlpack_device__()
    dev_type = _index(dev_type, "__dlpack_device__()'s device type")
    dev_id = _index(dev_id, "__dlpack_device__()'s device id")
    if dev_type not in (_kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged):
        # As cusafe_buffer_from_dlpack says it.
        raise CusafeError(Status.INVALID_VALUE,
                          "tensor on DLPack device type %d%s is not CUDA "
                          "memory" % (dev_type, " (CPU)"
                                      if dev_type == _kDLCPU else ""))
    if ctx is None:
        ctx = Context(dev_id if dev_type != _kDLCUDAHost else 0)
    else:
        _handle_of(ctx, Context, "ctx")
        if dev_type == _kDLCUDA and dev_id != ctx.device:
            raise CusafeError(Status.CONTEXT_MISMATCH,
                              "tensor belongs to device %d but context "
                              "belongs to device %d" % (dev_id, ctx.device))
    st, own = _consumer_stream(ctx, stream, "memory")
    try:
        raw = st.interop_handle() or 1
        try:
            capsule = obj.__dlpack__(stream=raw, max_version=(1, 0))
        except TypeError:  # a producer older than DLPack 1.0
            capsule = obj.__dlpack__(stream=raw)
        api = _python_api()
        versioned = bool(api.is_valid(capsule, b"dltensor_versioned"))
        name = b"dltensor_versioned" if versioned else b"dltensor"
        if not versioned and not api.is_valid(capsule, name):
            raise BufferError("%s.__dlpack__ returned no DLPack capsule (or "
                              "one already used)" % type(obj).__name__)
        tensor = api.get_pointer(capsule, name)
        h = c_handle(0)
        try:
            _call("cusafe_buffer_from_dlpack" +
                  ("" if versioned else "_legacy"), ctypes.byref(h),
                  ctx.handle, tensor)
        except BaseException:
            # The tensor stays the capsule's: delete it now, while the
            # stream its deleter may order work on is still open.
            capsule = None
            raise
        # cusafe owns the tensor now: the capsule must not delete it.
        api.set_name(capsule, api.names[b"used_" + name])
        buf = Buffer._adopt(h.value)
        st.use_buffers(buf)
        return buf
    finally:
        if own:
            st.close()


def _from_cai(obj: Any, ctx: Optional[Context], stream: Any) -> Buffer:
    """Buffer.wrap of an object with __cuda_array_interface__ only."""
    cai = obj.__cuda_array_interface__
    if not isinstance(cai, dict) or cai.get("version", 0) < 0:
        raise TypeError("%s.__cuda_array_interface__ is not a dict"
                        % type(obj).__name__)
    if cai.get("mask") is not None:
        raise ValueError("masked arrays are not supported")
    # The producer's integers are checked as the caller's are: ctypes
    # would cut a pointer of 2**64 + p down to p.
    shape = _ints(cai["shape"], "the interface's shape")
    if any(n < 0 for n in shape):
        raise ValueError("the interface's shape %r has a negative size"
                         % (shape,))
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    ptr, readonly = cai["data"]
    ptr = _unsigned(ptr, "the interface's data pointer")
    if readonly:
        raise ValueError("the array is read-only; cusafe buffers are "
                         "writable")
    strides = _ints(cai.get("strides") or _c_strides(shape, itemsize),
                    "the interface's strides")
    lo, hi = _extent(shape, strides, itemsize)
    if ctx is None:
        ctx = Context(_device_of(obj))
    st, own = _consumer_stream(ctx, stream, "memory")
    lib = library()
    release = _function_address("cusafe_python_release")
    api = _python_api()
    try:
        producer = cai.get("stream")
        start = ptr + lo if hi > lo else None
        h = c_handle(0)
        status: Any = None  # a ctypes call's result
        for kind in (Memory.DEVICE, Memory.MANAGED, Memory.HOST_PINNED):
            status = lib.fn.cusafe_buffer_wrap(
                ctypes.byref(h), ctx.handle, int(kind), start, hi - lo,
                release, id(obj))
            if status != Status.INVALID_VALUE or not start:
                break
        lib.check(status)
        # The buffer holds obj from now on; cusafe_python_release drops it.
        api.incref(obj)
        buf = Buffer._adopt(h.value)
        if producer is not None:  # CAI v3: order after the producer's work
            with Stream.wrap(producer, ctx) as ps:
                ps.use_buffers(buf)
        st.use_buffers(buf)
        return buf
    finally:
        if own:
            st.close()
