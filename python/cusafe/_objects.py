"""The objects of the binding: Context, Stream, Event, Buffer, Module,
each owning one reference on a library handle."""

from __future__ import annotations

import atexit
import ctypes
import os
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, NoReturn,
                    Optional, Sequence, SupportsIndex, Tuple, Type, TypeVar,
                    Union)

from ._capi import (EVENT_BLOCKING_SYNC, EVENT_DISABLE_TIMING,
                    STREAM_NON_BLOCKING, CusafeError, Memory, Status, _c_int,
                    _call, _index, _speedups, _unsigned, c_enum, c_handle,
                    device_properties, library)

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer as _BufferLike

    from ._capi import DeviceProperties
    from ._interop import Array
    from ._ipc import BufferExport
    from ._launch import Kernel

_T = TypeVar("_T", bound="_Object")
_H = TypeVar("_H", bound="_PyHandle")
_CtxT = TypeVar("_CtxT", bound="Context")
_StreamT = TypeVar("_StreamT", bound="Stream")
_BufT = TypeVar("_BufT", bound="Buffer")
_ModT = TypeVar("_ModT", bound="Module")

# --------------------------------------------------------------------------
# Objects
# --------------------------------------------------------------------------


# Set by an exit hook of Python's, which runs before the interpreter tears
# down its modules: from then on objects no longer release their handles
# when collected.  The library's own exit handler destroys what is still
# alive, in dependency order, after the interpreter is done; releasing from
# the interpreter's teardown could pull objects from under daemon threads
# still using them.
_exiting: List[bool] = [False]


def _at_exit() -> None:
    _exiting[0] = True
    if _speedups is not None:
        _speedups.at_exit()


atexit.register(_at_exit)


class _Owner:
    """A Python object that owns, or holds, references on library handles:
    it cannot be copied or pickled.  A copy (copy.copy, copy.deepcopy, a
    pickle's load) is made without __init__ and would hold the same
    references without having taken them: two owners, one release too
    many.  Unpickled in another process (multiprocessing sends a
    Process's arguments so), the copy would release that process's object
    whose handle happens to have the same value."""

    __slots__ = ()
    # What the object holds, for the error.
    _holds = "it owns a GPU handle"

    def _no_copy(self, *args: Any) -> NoReturn:
        raise TypeError(
            "cusafe.%s cannot be pickled or copied: %s, which this object "
            "releases exactly once and which means nothing in another "
            "process; share the object itself"
            % (type(self).__name__, self._holds))

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        """Refused (TypeError): see the class."""
        self._no_copy()

    def __reduce__(self) -> NoReturn:
        """Refused (TypeError): see the class."""
        self._no_copy()

    def __getstate__(self) -> NoReturn:
        """Refused (TypeError): see the class."""
        self._no_copy()

    def __copy__(self) -> NoReturn:
        """Refused (TypeError): see the class."""
        self._no_copy()

    def __deepcopy__(self, memo: Dict[int, Any]) -> NoReturn:
        """Refused (TypeError): see the class."""
        self._no_copy()


def _provides(obj: Any, name: str) -> bool:
    """Whether obj has the attribute `name` (a protocol: __dlpack__,
    __cuda_array_interface__), found without reading it: on its type, or
    in its own __dict__.  Reading may have effects: a property's getter
    runs (cusafe's own Array.__cuda_array_interface__ marks the Array as
    lent to a consumer, so that its close() releases nothing)."""
    if hasattr(type(obj), name):  # a property found on a type: not run
        return True
    try:
        own = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return False
    return isinstance(own, dict) and name in own


class _PyHandle(_Owner):
    """The ctypes implementation of an owned reference on one library
    handle: the base of _Object where cusafe._speedups is absent (or
    CUSAFE_PURE_PYTHON=1); _speedups.Object is its twin in C."""

    # _cell holds the handle, as a ctypes value, while the object owns its
    # reference: taking it out (list.pop, one step under the GIL) is what
    # releases it, once, whichever of close(), detach() and the collector
    # comes first.  _c is that same ctypes value, for calls without
    # argument conversion, and _live the handle as an int, for packing;
    # both read 0 once closed.  _handle stays the handle, for repr and
    # equality.
    __slots__ = ("_handle", "_live", "_c", "_cell", "__weakref__")
    _handle: int
    _live: int
    _c: ctypes.c_uint64
    _cell: List[ctypes.c_uint64]
    _release_name = "cusafe_release"
    # The release function of the type, bound at the first object: a
    # ctypes function of Library.raw, which takes the handle as a ready
    # ctypes value, so that the collector runs no conversion or module
    # code.
    _release: Any = None

    def _own(self, handle: Union[int, ctypes.c_uint64]) -> None:
        """Takes over one reference on `handle` (an int, or a c_uint64 that
        becomes the object's own)."""
        c = handle if isinstance(handle, c_handle) else c_handle(handle)
        self._handle = self._live = c.value
        self._c = c
        self._cell = [c]
        cls = type(self)
        if cls._release is None:
            cls._release = getattr(library().raw, cls._release_name)

    def __del__(self, _exiting: List[bool] = _exiting) -> None:
        try:
            cell = self._cell
        except AttributeError:  # never owned a handle
            return
        if cell and not _exiting[0]:
            try:
                c = cell.pop()
            except IndexError:  # another thread closed it meanwhile
                return
            # A failure is ignored: after shutdown, or in a forked child,
            # a release is a no-op anyway.
            type(self)._release(c)

    @property
    def handle(self) -> int:
        """The handle, an int.  Raises ValueError once closed."""
        h = self._live
        if not h:
            raise ValueError("this cusafe.%s is closed" % type(self).__name__)
        return h

    @property
    def closed(self) -> bool:
        """Whether this object has given up its reference (close(),
        detach(), the end of a `with` block)."""
        return not self._live

    def close(self) -> None:
        """Releases the object's reference now (the handle goes stale if it
        was the last; parents and queued work keep what they need).
        Closing twice is a no-op.  Raises CusafeError only if the library
        refuses the release (never after shutdown: releases are no-ops)."""
        self._live = 0
        try:
            c = self._cell.pop()
        except IndexError:
            return
        status = type(self)._release(c)
        c.value = 0
        if status:
            library().check(status)

    def detach(self) -> int:
        """Gives up ownership: returns the handle, which the caller must
        release (release_handle()); the object is closed.  Raises
        ValueError if it is closed already."""
        self._live = 0
        try:
            c = self._cell.pop()
        except IndexError:
            raise ValueError("this cusafe.%s is closed"
                             % type(self).__name__) from None
        handle = c.value
        c.value = 0
        return handle

    def __enter__(self: _H) -> _H:
        """The object itself: `with` closes it at the end of the block."""
        return self

    def __exit__(self, *exc: object) -> None:
        """close(); exceptions of the block propagate."""
        self.close()


if TYPE_CHECKING or _speedups is None:
    _HandleBase = _PyHandle
else:
    class _CHandle(_Owner, _speedups.Object):
        """The C implementation of an owned reference (_speedups.Object:
        its deallocation releases, so the class has no finalizer)."""

        __slots__ = ()
        _release_name = "cusafe_release"

        @property
        def _c(self) -> ctypes.c_uint64:
            """The handle as a ctypes value (0 once closed), for ctypes
            calls without argument conversion."""
            return c_handle(self._live)

    _HandleBase = _CHandle


class _Object(_HandleBase):
    """An owned reference on one library handle."""

    __slots__ = ()

    def __init__(self) -> None:
        raise TypeError("cusafe.%s objects are made by their own "
                        "constructors or methods" % type(self).__name__)

    @classmethod
    def _adopt(cls: Type[_T], handle: int) -> _T:
        """An object owning `handle`, a reference the caller hands over."""
        obj = object.__new__(cls)
        obj._own(handle)
        return obj

    def set_label(self: _T, label: Optional[Union[str, bytes]]) -> _T:
        """Attaches a label (where or why the object was made) that the
        leak report (CUSAFE_LEAK_REPORT=1) prints; None removes it.
        Raises ValueError for a label with a NUL character."""
        _call("cusafe_handle_set_label", self.handle,
              None if label is None else _encode(label, "label"))
        return self

    def _describe(self) -> str:
        return ""

    def __repr__(self) -> str:
        name = type(self).__name__
        if self.closed:
            return "<cusafe.%s closed>" % name
        extra = self._describe()
        return "<cusafe.%s 0x%016x%s>" % (name, self._handle,
                                          " " + extra if extra else "")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Object) and type(other) is type(self) \
            and not self.closed and not other.closed \
            and other._handle == self._handle

    def __hash__(self) -> int:
        return hash((type(self), self._handle))


def _new_closed(cls: Type[_T]) -> _T:
    """An object of cls that owns nothing (closed), made without
    __init__."""
    obj = object.__new__(cls)
    if isinstance(obj, _PyHandle):  # the C Object is born closed
        obj._handle = obj._live = 0
        obj._c = c_handle(0)
        obj._cell = []
    return obj


# The bases of Context and Buffer: _Object itself for ctypes; with the C
# types that hold Context.alloc and a Buffer's size and memory kind
# otherwise.
if TYPE_CHECKING or _speedups is None:
    _ContextBase = _Object
    _BufferBase = _Object
    # A Buffer's size and memory kind: slots of the class.
    _BUFFER_SLOTS: Tuple[str, ...] = ("_size", "_memory")
else:
    class _ContextBase(_Object, _speedups.ContextObject):
        __slots__ = ()

    class _BufferBase(_Object, _speedups.BufferObject):
        __slots__ = ()

    _BUFFER_SLOTS = ()


def _raw_stream(stream: Any) -> int:
    """The cudaStream_t (an int) of a stream object of another library.
    Raises TypeError for an object that is none, ValueError and
    OverflowError for an int that is no address (negative, or beyond 64
    bits, which ctypes would cut down to another stream)."""
    if isinstance(stream, int) and not isinstance(stream, bool):
        return _unsigned(stream, "stream")
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        version, raw = proto() if callable(proto) else proto
        if version != 0:
            raise TypeError("__cuda_stream__ of version %r: cusafe reads "
                            "version 0" % (version,))
        if isinstance(raw, (bool, float, str, bytes)) or \
                not hasattr(type(raw), "__index__"):
            raise TypeError("__cuda_stream__ gave a stream that is not an "
                            "int: %s" % type(raw).__name__)
        return _unsigned(raw, "stream")
    for name in ("cuda_stream", "ptr"):
        raw = getattr(stream, name, None)
        if isinstance(raw, int) and not isinstance(raw, bool):
            return _unsigned(raw, "stream")
    if not isinstance(stream, (bool, float)) and \
            hasattr(type(stream), "__index__"):  # numpy.uint64, ...
        return _unsigned(stream, "stream")
    raise TypeError("%s is not a CUDA stream: expected an int (a "
                    "cudaStream_t), or an object with __cuda_stream__, "
                    "cuda_stream or ptr" % type(stream).__name__)


def _device_of(obj: Any, default: int = 0) -> int:
    """The device ordinal that an object of another library names."""
    dev = getattr(obj, "device", None)
    index = getattr(dev, "index", None)  # torch.device
    if isinstance(index, int):
        return index
    if isinstance(dev, int) and not isinstance(dev, bool):
        return dev
    for dev_id in (getattr(dev, "device_id", None),
                   getattr(dev, "id", None),  # cupy.cuda.Device
                   getattr(obj, "device_id", None)):
        if isinstance(dev_id, int) and not isinstance(dev_id, bool):
            return dev_id
    return default


def _done(query: str, handle: int) -> bool:
    """The answer of a query call (cusafe_stream_query,
    cusafe_event_query): True when done, False while work is pending
    (NOT_READY); other failures raise."""
    lib = library()
    st = getattr(lib.fn, query)(handle)
    if st == Status.NOT_READY:
        return False
    lib.check(st)
    return True


def _stream_handle(stream: Optional[Stream]) -> int:
    if stream is None:
        return 0
    if isinstance(stream, Stream):
        return stream.handle
    raise TypeError("stream must be a cusafe.Stream or None, not %s"
                    % type(stream).__name__)


def _handle_of(obj: Any, cls: Type[_Object], what: str) -> int:
    """The handle of `obj`, which must be an open `cls` (TypeError for
    another type, ValueError once closed)."""
    if isinstance(obj, cls):
        return obj.handle
    raise TypeError("%s must be a cusafe.%s, not %s"
                    % (what, cls.__name__, type(obj).__name__))


def _count(value: int, what: str) -> int:
    """An offset or size, for a size_t: an int (TypeError otherwise), not
    negative (ValueError), which size_t would turn into a huge one, nor
    beyond 64 bits (OverflowError), which it would cut down to a small
    one."""
    return _unsigned(value, what)


def _check_stream_context(stream: Stream, ctx: Context, what: str) -> None:
    """Raises CusafeError CONTEXT_MISMATCH when `stream` is not of ctx
    (`what`: what the stream was given for, in the message)."""
    with stream.context as owner:
        if owner.handle != ctx.handle:
            raise CusafeError(
                Status.CONTEXT_MISMATCH,
                "stream of the context of device %d given for %s in the "
                "context of device %d" % (owner.device, what, ctx.device))


class Context(_ContextBase):
    """A device's context (cusafe_context_create): one per device, shared
    with the CUDA runtime and other libraries (it is the device's primary
    context).  Each Context object holds one reference; the context lives
    while any object made in it (stream, event, buffer, module) lives, even
    after every Context object is closed.  Methods of a closed Context
    raise ValueError."""

    __slots__ = ("_device",)
    _device: int
    _release_name = "cusafe_context_release"

    def __init__(self, device: int = 0) -> None:
        """A new reference on the context of `device`, which this object
        owns.  Raises CusafeError INVALID_DEVICE for a device that does not
        exist, NoDeviceError without a driver or device, SHUTDOWN after
        shutdown(), FORKED in a child forked after CUDA was used;
        TypeError for a device that is not an int, OverflowError for one
        beyond a C int."""
        device = _c_int(device, "device")
        h = c_handle(0)
        _call("cusafe_context_create", ctypes.byref(h), device)
        self._device = device
        self._own(h)

    @classmethod
    def _adopt(cls: Type[_CtxT], handle: int) -> _CtxT:
        obj = super()._adopt(handle)
        d = ctypes.c_int(0)
        _call("cusafe_context_get_device", ctypes.byref(d), handle)
        obj._device = d.value
        return obj

    @property
    def device(self) -> int:
        """The device's ordinal (readable after close())."""
        return self._device

    @property
    def properties(self) -> DeviceProperties:
        """The DeviceProperties of the context's device (a new copy)."""
        return device_properties(self._device)

    def synchronize(self) -> None:
        """Waits for all work queued on the device, by anyone.  Raises
        CusafeError CUDA with the device's error after a kernel fault."""
        _call("cusafe_context_synchronize", self.handle)

    def stream_priority_range(self) -> Tuple[int, int]:
        """(least, greatest) stream priority of the device."""
        least, greatest = ctypes.c_int(0), ctypes.c_int(0)
        _call("cusafe_context_stream_priority_range", ctypes.byref(least),
              ctypes.byref(greatest), self.handle)
        return least.value, greatest.value

    # Factories, for convenience.
    def stream(self, non_blocking: bool = False,
               priority: int = 0) -> Stream:
        """A new Stream of this context, which the caller owns
        (Stream(ctx, non_blocking, priority))."""
        return Stream(self, non_blocking=non_blocking, priority=priority)

    def event(self, timing: bool = True,
              blocking_sync: bool = False) -> Event:
        """A new Event of this context, which the caller owns
        (Event(ctx, timing, blocking_sync))."""
        return Event(self, timing=timing, blocking_sync=blocking_sync)

    # With cusafe._speedups, alloc is _speedups.ContextObject's, in C.
    if TYPE_CHECKING or _speedups is None:
        def alloc(self, size: int, memory: int = Memory.DEVICE) -> Buffer:
            """A new Buffer of `size` bytes of `memory` in this context, which
            the caller owns (Buffer(ctx, size, memory), by the shortest path).
            Device memory is ordered on the context's default stream.  Raises
            ValueError for a closed Context, a negative size or an unknown
            memory kind, TypeError for a size that is not an int,
            OverflowError for one beyond 64 bits, CusafeError OUT_OF_MEMORY
            when the device (or host) has no room, NOT_SUPPORTED for managed
            memory on a device without it."""
            kind = _MEMORY_KINDS.get(memory)
            if kind is None:
                raise ValueError("unknown memory kind %r" % (memory,))
            fn = _alloc_fn or _bind_alloc()
            nbytes = _sizes.get(size) if type(size) is int else None
            if nbytes is None:
                size = _count(size, "size")
                nbytes = _size_value(size)
            out = c_handle()
            # Ready ctypes values (and the small int kind): nothing to convert.
            st = fn(_byref(out), self._c, kind, nbytes)
            if st:
                _alloc_failed(self, size, st)
            b = _new_buffer(Buffer)
            b._handle = b._live = out.value
            b._c = out
            b._cell = [out]
            b._size = size
            b._memory = kind
            return b

    def alloc_shareable(self, size: int) -> Buffer:
        """A new Buffer of `size` bytes of device memory that other
        processes can map, which the caller owns
        (cusafe_buffer_alloc_shareable): it travels with send_buffer(),
        multiprocessing, or Buffer.export(); its memory lives while any
        process maps it.  The allocation is rounded up to the device's
        granularity (2 MiB on current GPUs); the Buffer has `size` bytes.
        Raises ValueError for a closed Context or a negative size, TypeError
        for a size that is not an int, OverflowError for one beyond 64
        bits; CusafeError INVALID_SIZE for 0 bytes, OUT_OF_MEMORY,
        NOT_SUPPORTED where the driver lacks virtual memory management."""
        from ._ipc import alloc_shareable
        return alloc_shareable(self, size)

    def load_builtin(self) -> Module:
        """The Module of cusafe's built-in kernels (Module.builtin)."""
        return Module.builtin(self)

    def compile(self, source: Union[str, bytes], name: Optional[str] = None,
                options: Sequence[Union[str, bytes]] = ()) -> Module:
        """CUDA C++ source compiled at run time (Module.compile)."""
        return Module.compile(self, source, name, options)

    def _describe(self) -> str:
        return "device %d" % self._device


_alloc_fn: Any = None
_byref = ctypes.byref
_new_buffer: Callable[[Type[Buffer]], Buffer] = object.__new__
# The memory kinds, as plain ints: what Context.alloc accepts.
_MEMORY_KINDS: Dict[int, int] = {int(m): int(m) for m in Memory}


# Sizes as c_size_t values, made once each for the sizes allocated most:
# never written once made, so threads share them.
_sizes: Dict[int, ctypes.c_size_t] = {}


def _size_value(size: int) -> ctypes.c_size_t:
    """size (an int that fits size_t: _count) as a c_size_t, kept in
    _sizes while it holds fewer than 1024."""
    value = ctypes.c_size_t(size)
    if len(_sizes) < 1024:
        _sizes[size] = value
    return value


def _bind_alloc() -> Any:
    """cusafe_buffer_alloc of Library.raw for Context.alloc, bound once,
    with the release function of Buffer."""
    global _alloc_fn
    raw = library().raw
    if Buffer._release is None:
        Buffer._release = getattr(raw, Buffer._release_name)
    _alloc_fn = raw.cusafe_buffer_alloc
    return _alloc_fn


def _alloc_failed(ctx: Context, size: int, status: int) -> NoReturn:
    """Raises for a failed Context.alloc."""
    ctx.handle  # a closed Context raises ValueError
    library().check(status)
    raise AssertionError("unreachable")


class Stream(_Object):
    """A CUDA stream of a context (cusafe_stream_create), or another
    library's stream (Stream.wrap).  It keeps its context alive; work
    queued on it keeps it alive until done, so closing it with work queued
    is legal.  Methods of a closed Stream raise ValueError."""

    __slots__ = ()
    _release_name = "cusafe_stream_release"

    def __init__(self, ctx: Context, non_blocking: bool = False,
                 priority: int = 0, flags: Optional[int] = None) -> None:
        """A new stream of ctx, which this object owns.  `non_blocking`:
        no implicit synchronisation with the legacy default stream;
        `priority`: within ctx.stream_priority_range() (lower numbers are
        greater priorities); `flags`: the raw flags (STREAM_NON_BLOCKING),
        instead of non_blocking.  Raises ValueError for a closed ctx or
        negative flags, CusafeError INVALID_VALUE for unknown flags,
        TypeError for flags or a priority that are not ints,
        OverflowError for flags beyond 32 bits or a priority beyond a C
        int."""
        if flags is None:
            flags = STREAM_NON_BLOCKING if non_blocking else 0
        flags = _unsigned(flags, "flags", 32)
        priority = _c_int(priority, "priority")
        h = c_handle(0)
        _call("cusafe_stream_create", ctypes.byref(h),
              _handle_of(ctx, Context, "ctx"), flags,
              priority)
        self._own(h)

    def synchronize(self) -> None:
        """Waits for the work queued on the stream.  Raises CusafeError
        CUDA with the device's error after a kernel fault."""
        _call("cusafe_stream_synchronize", self.handle)

    def query(self) -> bool:
        """True if all queued work has completed, False while some is
        pending; never waits.  Other failures raise CusafeError."""
        return _done("cusafe_stream_query", self.handle)

    def wait_event(self, event: Event) -> None:
        """Makes later work on the stream wait for the event's last record."""
        _call("cusafe_stream_wait_event", self.handle,
              _handle_of(event, Event, "event"))

    @property
    def context(self) -> Context:
        """The stream's Context, as a new object with a reference of its
        own (the caller's to close)."""
        h = c_handle(0)
        _call("cusafe_stream_get_context", ctypes.byref(h), self.handle)
        return Context._adopt(h.value)

    def interop_handle(self) -> int:
        """The cudaStream_t, as an int, for other libraries; cusafe keeps
        ownership: it is valid while this object is open.  Work queued on
        it directly is not tracked: use use_buffers() for buffers it
        touches."""
        p = ctypes.c_void_p()
        _call("cusafe_stream_interop_handle", ctypes.byref(p), self.handle)
        return p.value or 0

    @classmethod
    def wrap(cls: Type[_StreamT], stream: Any,
             ctx: Optional[Context] = None) -> _StreamT:
        """A stream of another library as a cusafe stream
        (cusafe_stream_wrap): `stream` is a cudaStream_t as an int (0 for
        the device's default stream), or an object of the CUDA stream
        protocol (`__cuda_stream__`: cuda.core, CuPy 14, cusafe) or with a
        `cuda_stream` (PyTorch) or `ptr` (CuPy) attribute.  `ctx`: the
        context of its device; None: that of the device the object names
        (`device`, `device_id`), else device 0 -- a stream of another
        device raises CusafeError (CONTEXT_MISMATCH).  cusafe never
        destroys the stream: its owner keeps it valid while this object,
        and buffers last used on it, live -- except where the owner is
        cusafe (a Stream of Context.stream(), or its cudaStream_t handed
        back by another library): the new stream then holds that one,
        whose CUDA stream lives until both are closed.  Wrapping the CUDA
        stream of a Stream whose last reference is being dropped raises
        CusafeError (INVALID_VALUE)."""
        raw = _raw_stream(stream)
        if ctx is None:
            ctx = stream.context if isinstance(stream, Stream) \
                else Context(_device_of(stream))
        h = c_handle(0)
        _call("cusafe_stream_wrap", ctypes.byref(h),
              _handle_of(ctx, Context, "ctx"),
              ctypes.c_void_p(raw or None))
        return cls._adopt(h.value)

    def __cuda_stream__(self) -> Tuple[int, int]:
        """The CUDA stream protocol: (0, the cudaStream_t as an int), for
        cupy.cuda.Stream.from_external(), cuda.core and others, which must
        not use it after this object is closed."""
        return (0, self.interop_handle())

    def begin_capture(self) -> None:
        """Makes the stream capture the cusafe work queued on it, until
        end_capture() (cusafe_stream_begin_capture): copies, fills,
        launches, event records and waits become a graph instead of
        running.  Raises CusafeError CAPTURING if it captures already,
        NOT_SUPPORTED for a wrapped default stream.  Prefer capture()."""
        _call("cusafe_stream_begin_capture", self.handle)

    def end_capture(self) -> Graph:
        """Ends the capture begun on this stream and returns its Graph,
        which the caller owns (cusafe_stream_end_capture).  Raises
        CusafeError CAPTURING if the stream does not capture or only
        joined another stream's capture, CUDA if CUDA refuses the capture
        (a stream that joined was never joined back): the capture is over
        either way."""
        h = c_handle(0)
        _call("cusafe_stream_end_capture", ctypes.byref(h), self.handle)
        return Graph._adopt(h.value)

    def capture(self) -> _Capture:
        """A context manager that captures the block's work on this
        stream:

            with stream.capture() as graph:
                kernel.launch(grid, block, buf, n, stream=stream)
            graph.launch(stream)

        The Graph is usable after the block; an exception in the block
        discards the capture and propagates."""
        return _Capture(self)

    @property
    def capturing(self) -> bool:
        """Whether the stream captures (began a capture or joined one)."""
        out = ctypes.c_int(0)
        _call("cusafe_stream_is_capturing", ctypes.byref(out), self.handle)
        return bool(out.value)

    def use_buffers(self, *buffers: Buffer) -> None:
        """Records that work other code queues on this stream by address
        uses `buffers` (cusafe_stream_use_buffers): call it before queueing
        that work."""
        arr = (c_handle * len(buffers))(
            *[_handle_of(b, Buffer, "each argument") for b in buffers])
        _call("cusafe_stream_use_buffers", self.handle, arr, len(buffers))


class Graph(_Object):
    """Work captured from streams (Stream.capture), replayed by one call
    (launch).  It holds every buffer, kernel, event and stream its captured
    work used: releasing them, during or after the capture, is legal, and
    their memory stays valid for every replay.  Closing the graph with
    replays queued is legal too: its memory goes after the last replay.
    Methods of a closed Graph raise ValueError.  The Graph of a
    Stream.capture() whose capture failed (the block raised, or CUDA
    refused the capture) is closed: close() and `with` do nothing more,
    the other methods raise ValueError."""

    # _capturing: made by Stream.capture() and waiting for the capture to
    # end, which gives it its handle (unless it was closed meanwhile).
    __slots__ = ("_capturing",)
    _capturing: bool
    _release_name = "cusafe_graph_release"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Not for use: raises TypeError (Stream.capture() and
        Stream.end_capture() make Graphs)."""
        raise TypeError("use Stream.capture() or Stream.end_capture()")

    @property
    def handle(self) -> int:
        """The handle, an int.  Raises ValueError before the capture ended
        and once closed."""
        h = self._live
        if not h:
            if getattr(self, "_capturing", False):
                raise ValueError("the capture of this cusafe.Graph has not "
                                 "ended")
            raise ValueError("this cusafe.Graph is closed")
        return h

    def close(self) -> None:
        """Releases the graph (see _Object.close).  During the capture of
        Stream.capture(), the capture still ends with the block, and the
        graph it makes is released at once."""
        self._capturing = False
        super().close()

    def detach(self) -> int:
        """Gives up ownership and returns the handle (see
        _Object.detach).  Raises ValueError before the capture ended and
        once closed."""
        if getattr(self, "_capturing", False):
            raise ValueError("the capture of this cusafe.Graph has not "
                             "ended")
        return super().detach()

    def instantiate(self) -> None:
        """Makes the graph's executable form now rather than at its first
        replay (cusafe_graph_instantiate).  Raises CusafeError with CUDA's
        error if it cannot be made."""
        _call("cusafe_graph_instantiate", self.handle)

    def launch(self, stream: Optional[Stream] = None) -> None:
        """Replays the graph on `stream` (None: the context's default
        stream), after the earlier work on the buffers it uses and before
        the later (cusafe_graph_launch).  Raises CusafeError CAPTURING for
        a stream that captures, CONTEXT_MISMATCH for a stream of another
        context."""
        _call("cusafe_graph_launch", self.handle, _stream_handle(stream))

    __call__ = launch


class _Capture(_Owner):
    """The context manager of Stream.capture()."""

    __slots__ = ("_stream", "_graph")
    _holds = "it holds a capturing stream"

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._graph: Optional[Graph] = None

    def __enter__(self) -> Graph:
        self._stream.begin_capture()
        # A closed Graph with an empty cell, until the capture ends well:
        # one whose capture fails stays so (close() finds nothing to
        # release).
        g = self._graph = _new_closed(Graph)
        g._capturing = True
        return g

    def __exit__(self, exc_type: Optional[type], *exc: object) -> None:
        g = self._graph
        assert g is not None
        wanted = g._capturing  # False once closed in the block
        g._capturing = False
        if exc_type is not None:  # the capture is discarded
            try:
                self._stream.end_capture().close()
            except Exception:
                pass
            return
        h = c_handle(0)
        _call("cusafe_stream_end_capture", ctypes.byref(h),
              self._stream.handle)
        if wanted:
            g._own(h)
            return
        lib = library()
        lib.check(lib.fn.cusafe_graph_release(h.value))


class Event(_Object):
    """A CUDA event of a context (cusafe_event_create).  It keeps its
    context alive; a record queued on a stream keeps it alive until done.
    Methods of a closed Event raise ValueError."""

    __slots__ = ()
    _release_name = "cusafe_event_release"

    def __init__(self, ctx: Context, timing: bool = True,
                 blocking_sync: bool = False,
                 flags: Optional[int] = None) -> None:
        """A new event of ctx, which this object owns.  `timing`: usable
        with elapsed_ms(); `blocking_sync`: synchronize() sleeps instead of
        spinning; `flags`: the raw flags instead of both.  Raises
        ValueError for a closed ctx or negative flags, CusafeError
        INVALID_VALUE for unknown flags, TypeError for flags that are not
        an int, OverflowError for flags beyond 32 bits."""
        if flags is None:
            flags = (0 if timing else EVENT_DISABLE_TIMING) | \
                (EVENT_BLOCKING_SYNC if blocking_sync else 0)
        flags = _unsigned(flags, "flags", 32)
        h = c_handle(0)
        _call("cusafe_event_create", ctypes.byref(h),
              _handle_of(ctx, Context, "ctx"), flags)
        self._own(h)

    def record(self, stream: Optional[Stream] = None) -> None:
        """Records the event on `stream` (None: the context's default
        stream).  Raises CusafeError CONTEXT_MISMATCH for a stream of
        another context, TypeError for a stream that is not a Stream."""
        _call("cusafe_event_record", self.handle, _stream_handle(stream))

    def synchronize(self) -> None:
        """Waits for the work before the event's last record (returns at
        once for an event never recorded)."""
        _call("cusafe_event_synchronize", self.handle)

    def query(self) -> bool:
        """True if the work before the last record has completed, False
        while it is pending; never waits."""
        return _done("cusafe_event_query", self.handle)

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to `end`, both recorded and done.
        Raises CusafeError NOT_READY while either is pending, INVALID_VALUE
        for an event made without timing, CONTEXT_MISMATCH for events of
        two contexts, CusafeError with CUDA's error for one never recorded,
        TypeError for an `end` that is not an Event."""
        ms = ctypes.c_float(0)
        _call("cusafe_event_elapsed_ms", ctypes.byref(ms), self.handle,
              _handle_of(end, Event, "end"))
        return ms.value


class _HostMemory:
    """The address and size of a host object with the buffer protocol
    (bytes, bytearray, memoryview, array.array, numpy arrays, ...).  It
    holds the export for as long as it lives."""

    __slots__ = ("view", "array", "keep", "address", "nbytes")
    view: memoryview
    array: Optional[ctypes.Array[ctypes.c_char]]
    keep: Optional[bytes]
    address: Optional[int]
    nbytes: int

    def __init__(self, obj: _BufferLike, writable: bool) -> None:
        view = obj if isinstance(obj, memoryview) else memoryview(obj)
        if not view.c_contiguous:
            raise ValueError("host memory must be C-contiguous")
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        self.view = view
        self.nbytes = view.nbytes
        self.keep = None
        self.array = None
        if not view.readonly:
            self.array = (ctypes.c_char * self.nbytes).from_buffer(view)
            self.address = ctypes.addressof(self.array)
        elif writable:
            raise TypeError("cannot read into read-only memory (%s)"
                            % type(obj).__name__)
        elif isinstance(obj, bytes):
            # ctypes passes a bytes object's own storage: no copy.
            self.keep = obj
            self.address = ctypes.cast(ctypes.c_char_p(obj),
                                       ctypes.c_void_p).value
        else:
            self.keep = view.tobytes()
            self.address = ctypes.cast(ctypes.c_char_p(self.keep),
                                       ctypes.c_void_p).value

    def release(self) -> None:
        self.array = None
        self.view.release()


class Buffer(_BufferBase):
    """Device, pinned host or managed memory (cusafe_buffer_alloc), a view
    of a byte range of another buffer (Buffer.view), or another library's
    memory (Buffer.wrap, from_dlpack).  A buffer keeps its context alive,
    a view its parent; work queued on it (copies, fills, launches) keeps it
    alive until done, so closing it right after queueing work is legal:
    the memory is freed after that work.  Every offset and size is checked
    against the buffer (CusafeError OUT_OF_RANGE).  Methods of a closed
    Buffer raise ValueError."""

    # _cai: the Array behind __cuda_array_interface__, kept with the Buffer
    # object, which is what a consumer of the interface holds.
    __slots__ = ("_cai",) + _BUFFER_SLOTS
    _size: int
    _memory: int
    _cai: Array
    _release_name = "cusafe_buffer_release"

    def __init__(self, ctx: Context, size: int, memory: int = Memory.DEVICE,
                 stream: Optional[Stream] = None) -> None:
        """Allocates `size` bytes of `memory` in ctx, owned by this object;
        with a `stream`, device memory ordered on that stream
        (cusafe_buffer_alloc_async).  Contents are undefined.  Raises
        TypeError for a ctx that is not a Context or a size that is not an
        int; ValueError for a closed ctx or stream, a negative size, an
        unknown memory kind, or a stream with memory other than DEVICE;
        OverflowError for a size beyond 64 bits; CusafeError
        CONTEXT_MISMATCH for a stream of another context, OUT_OF_MEMORY,
        NOT_SUPPORTED for managed memory on a device without it."""
        ctx_handle = _handle_of(ctx, Context, "ctx")
        size = _count(size, "size")
        kind = _MEMORY_KINDS.get(memory)
        if kind is None:
            raise ValueError("unknown memory kind %r" % (memory,))
        h = c_handle(0)
        if stream is not None:
            if kind != Memory.DEVICE:
                raise ValueError("stream-ordered allocation is for device "
                                 "memory only")
            stream_handle = _stream_handle(stream)
            _check_stream_context(stream, ctx, "an allocation")
            _call("cusafe_buffer_alloc_async", ctypes.byref(h),
                  stream_handle, size)
        else:
            _call("cusafe_buffer_alloc", ctypes.byref(h), ctx_handle, kind,
                  size)
        self._size = size
        self._memory = kind
        self._own(h)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass travels through multiprocessing as Buffer does
        (its pickler matches exact types), and is rebuilt as itself where
        the receiver finds it by module and name, as pickle finds a
        class."""
        super().__init_subclass__(**kwargs)
        from ._ipc import _register
        _register(cls)

    @classmethod
    def _adopt(cls: Type[_BufT], handle: int) -> _BufT:
        obj = super()._adopt(handle)
        size, mem = ctypes.c_size_t(0), c_enum(0)
        _call("cusafe_buffer_get_size", ctypes.byref(size), handle)
        _call("cusafe_buffer_get_memory", ctypes.byref(mem), handle)
        obj._size = size.value
        obj._memory = mem.value
        return obj

    @classmethod
    def from_host(cls: Type[_BufT], ctx: Context, data: _BufferLike,
                  memory: int = Memory.DEVICE) -> _BufT:
        """A new buffer of `memory` in ctx holding a copy of host data (any
        C-contiguous object with the buffer protocol), owned by the caller;
        the copy is complete when it returns.  Raises ValueError for
        non-contiguous data, and what Buffer() raises."""
        host = _HostMemory(data, writable=False)
        try:
            buf = cls(ctx, host.nbytes, memory)
            try:
                _call("cusafe_buffer_write", buf.handle, 0, host.address,
                      host.nbytes)
            except BaseException:
                buf.close()
                raise
        finally:
            host.release()
        return buf

    @property
    def size(self) -> int:
        """The size in bytes (readable after close())."""
        return self._size

    def __len__(self) -> int:
        """The size in bytes."""
        return self._size

    @property
    def memory(self) -> Memory:
        """The kind of memory: DEVICE, HOST_PINNED or MANAGED."""
        return Memory(self._memory)

    @property
    def context(self) -> Context:
        """The buffer's Context, as a new object with a reference of its
        own (the caller's to close)."""
        h = c_handle(0)
        _call("cusafe_buffer_get_context", ctypes.byref(h), self.handle)
        return Context._adopt(h.value)

    def view(self, offset: int, size: int) -> Buffer:
        """A new Buffer, owned by the caller, for bytes [offset, offset +
        size) of this one, whose memory it keeps alive (this object may be
        closed first).  Raises CusafeError OUT_OF_RANGE for a range beyond
        the buffer."""
        offset, size = _count(offset, "offset"), _count(size, "size")
        h = c_handle(0)
        _call("cusafe_buffer_view", ctypes.byref(h), self.handle, offset,
              size)
        obj = object.__new__(Buffer)
        obj._size = size
        obj._memory = self._memory
        obj._own(h)
        return obj

    def write(self, data: _BufferLike, offset: int = 0,
              stream: Optional[Stream] = None) -> None:
        """Copies host data (bytes, bytearray, memoryview, array.array,
        numpy arrays, ...) into the buffer at `offset`.  Without a stream
        it returns when the copy is complete; with one it is ordered on
        that stream (the data may be reused when it returns)."""
        offset = _count(offset, "offset")
        host = _HostMemory(data, writable=False)
        try:
            if stream is None:
                _call("cusafe_buffer_write", self.handle, offset,
                      host.address, host.nbytes)
            else:
                _call("cusafe_buffer_write_async", self.handle, offset,
                      host.address, host.nbytes, _stream_handle(stream))
        finally:
            host.release()

    def read(self, out: Optional[_BufferLike] = None, offset: int = 0,
             size: Optional[int] = None,
             stream: Optional[Stream] = None) -> _BufferLike:
        """Copies bytes of the buffer from `offset` into host memory.  With
        `out` (a writable object with the buffer protocol: bytearray,
        memoryview, array.array, numpy array, ...) it fills all of `out`
        and returns it; without, it returns a bytearray of `size` bytes
        (default: up to the end).  Returns when the data is there."""
        offset = _count(offset, "offset")
        if out is None:
            if size is None:
                size = self._size - offset if offset <= self._size else 0
            out = bytearray(_count(size, "size"))
        host = _HostMemory(out, writable=True)
        try:
            if stream is None:
                _call("cusafe_buffer_read", self.handle, offset,
                      host.address, host.nbytes)
            else:
                _call("cusafe_buffer_read_async", self.handle, offset,
                      host.address, host.nbytes, _stream_handle(stream))
        finally:
            host.release()
        return out

    def copy_from(self, src: Buffer, size: Optional[int] = None,
                  dst_offset: int = 0, src_offset: int = 0,
                  stream: Optional[Stream] = None) -> None:
        """Copies `size` bytes (default: all of src from src_offset) from
        buffer src at src_offset to this one at dst_offset, ordered on
        `stream` (None: the context's default stream) after the work on
        both buffers; between devices, a peer copy.  Overlapping ranges of
        one buffer raise CusafeError INVALID_VALUE, ranges beyond either
        buffer OUT_OF_RANGE."""
        src_handle = _handle_of(src, Buffer, "src")
        dst_offset = _count(dst_offset, "dst_offset")
        src_offset = _count(src_offset, "src_offset")
        # A default size past the end: 0 bytes, which the library checks.
        size = _count(max(src.size - src_offset, 0) if size is None
                      else size, "size")
        _call("cusafe_buffer_copy", self.handle, dst_offset, src_handle,
              src_offset, size, _stream_handle(stream))

    def fill(self, value: int, offset: int = 0, size: Optional[int] = None,
             stream: Optional[Stream] = None) -> None:
        """Sets `size` bytes from `offset` (default: to the end) to `value`,
        ordered on `stream` (None: the context's default).  Raises
        ValueError for a value outside 0..255, TypeError for one that is
        not an int, CusafeError OUT_OF_RANGE for a range beyond the
        buffer."""
        value = _index(value, "value")
        if not 0 <= value <= 255:
            raise ValueError("fill value must be 0..255, not %r" % (value,))
        offset = _count(offset, "offset")
        size = _count(max(self._size - offset, 0) if size is None else size,
                      "size")
        _call("cusafe_buffer_fill", self.handle, offset, size, value,
              _stream_handle(stream))

    def interop_pointer(self) -> int:
        """The raw address of the first byte, as an int, for other
        libraries; valid while this object (or another reference) keeps
        the buffer.  Work queued through the address is not tracked: tell
        the stream with Stream.use_buffers(), or use as_array() / DLPack,
        whose consumers keep the memory alive."""
        p = ctypes.c_void_p()
        _call("cusafe_buffer_interop_pointer", ctypes.byref(p), self.handle)
        return p.value or 0

    # ---- interop: DLPack and the CUDA Array Interface --------------------

    def as_array(self, dtype: Any = "u1",
                 shape: Optional[Union[int, Sequence[int]]] = None,
                 strides: Optional[Sequence[int]] = None, offset: int = 0,
                 stream: Any = None) -> Array:
        """An Array: bytes of this buffer from `offset` on, as an array of
        `dtype` (a NumPy type string or name: "f4", "float32", "<i8",
        "bool", ..., or a NumPy dtype) and `shape` (default: 1-D, as many
        elements as fit), with `strides` in bytes (default: C order), for
        other libraries: cupy.asarray(a), cupy.from_dlpack(a),
        torch.from_dlpack(a), torch.as_tensor(a, device="cuda"),
        numba.cuda.as_cuda_array(a) -- zero-copy.  The Array holds a
        reference on the buffer, so the memory stays valid while it (or a
        consumer holding it) lives.  `stream`: the stream the consumer
        uses it on (a cusafe Stream of this buffer's context, or any
        stream Stream.wrap takes); None: the device's legacy default
        stream.  Raises ValueError when the elements reach beyond the
        buffer, TypeError for a shape, strides or offset that are not
        ints (numpy.int64 and other integers with __index__ are; floats
        and strings are not), CusafeError CONTEXT_MISMATCH for a cusafe
        Stream of another context (nothing is held then)."""
        from ._interop import Array
        return Array(self, dtype, shape, strides, offset, stream)

    def __dlpack__(self, *, stream: Optional[int] = None,
                   max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None,
                   copy: Optional[bool] = None) -> object:
        """The DLPack protocol for the whole buffer as a 1-D array of
        bytes (uint8); see Array.__dlpack__ for other types and shapes."""
        with self.as_array() as a:
            return a.__dlpack__(stream=stream, max_version=max_version,
                                dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(device type, device id) of DLPack: (2, device) for device
        memory (kDLCUDA), (3, 0) for pinned (kDLCUDAHost), (13, device)
        for managed (kDLCUDAManaged)."""
        from ._interop import _dlpack_device
        return _dlpack_device(self._memory, self.context.device)

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """The CUDA Array Interface (version 3) of the whole buffer as a
        1-D array of bytes; see Array for other types and shapes.  The
        memory stays valid while this Buffer object lives, also after
        close(): a consumer holds the object, not the handle."""
        a: Optional[Array]
        try:
            a = self._cai
        except AttributeError:
            a = None
        if a is None or a.closed:
            a = self._cai = self.as_array()
        return a.__cuda_array_interface__

    @classmethod
    def wrap(cls, obj: Any, ctx: Optional[Context] = None,
             stream: Any = None) -> Buffer:
        """Another library's array as a Buffer over the same memory,
        zero-copy: through DLPack when `obj` has __dlpack__ (the producer's
        deleter runs once, when this buffer's last reference and queued
        work are gone), else through __cuda_array_interface__ (a reference
        on `obj` is held as long).  The buffer spans the bytes that the
        array's elements reach.  `ctx`: the context of the array's device
        (default: that of the device the array names -- DLPack's
        __dlpack_device__, else a `device` or `device_id` attribute, else
        device 0; memory of another device raises CusafeError
        CONTEXT_MISMATCH); `stream`: where cusafe will use the memory
        first (default: the device's legacy default stream) -- it is
        ordered after the producer's work, as each protocol asks; a
        cusafe Stream of another context raises CusafeError
        CONTEXT_MISMATCH.  The protocols are looked up on the object's
        type (or its own attributes), never read to find them.  Raises
        TypeError for an object with neither protocol, CusafeError when
        the memory is not CUDA memory of ctx's device (INVALID_VALUE for
        host memory, such as a NumPy array's or a CPU tensor's: see
        from_dlpack)."""
        from ._interop import _from_cai, from_dlpack
        # Probed on the type: reading a property can have effects.
        if _provides(obj, "__dlpack__"):
            return from_dlpack(obj, ctx, stream)
        if _provides(obj, "__cuda_array_interface__"):
            return _from_cai(obj, ctx, stream)
        raise TypeError("%s has neither __dlpack__ nor "
                        "__cuda_array_interface__" % type(obj).__name__)

    def export(self) -> BufferExport:
        """The description of this shareable buffer (or view of one) for
        another process, with a new file descriptor of its memory, which
        the BufferExport owns (cusafe_buffer_export).  Waits for the work
        queued on the buffer so far, on any stream: what the importer reads
        is what that work wrote.  Raises ValueError for a closed Buffer;
        CusafeError INVALID_VALUE for memory that is not shareable
        ("buffer 0x... is not shareable: ..."; allocate it with
        Context.alloc_shareable), the error of a fault of the work waited
        for."""
        from ._ipc import export
        return export(self)

    @classmethod
    def from_export(cls: Type[_BufT], export: BufferExport,
                    ctx: Optional[Context] = None) -> _BufT:
        """A new Buffer, which the caller owns, of the memory that another
        process exported (a BufferExport whose descriptor has reached this
        process); in ctx, or by default in the context of the device that
        holds the memory (found by UUID).  The export stays the caller's
        to close, which it may do at once: the Buffer keeps the memory
        mapped, whatever the exporter does, until it is released; its
        release unmaps this process's mapping only.  Raises TypeError for
        an export that is not a BufferExport, ValueError for a closed one
        or a closed ctx; CusafeError INVALID_VALUE for an export made in
        this very process ("buffer exported by this process: use the
        buffer itself") or a descriptor of no shareable memory,
        CONTEXT_MISMATCH for a ctx of another device, INVALID_DEVICE when
        this process does not see the device (CUDA_VISIBLE_DEVICES)."""
        from ._ipc import from_export
        return from_export(cls, export, ctx)

    def _describe(self) -> str:
        return "%d bytes %s" % (self._size,
                                Memory(self._memory).name.lower())


def _encode(text: Union[str, bytes], what: str = "text") -> bytes:
    """text as bytes for a C string (str is encoded as UTF-8); TypeError
    for another type, ValueError for one with a NUL, where C would end it
    (another kernel's name, another file, a shorter source)."""
    if isinstance(text, str):
        data = text.encode()
    elif isinstance(text, bytes):
        data = text
    else:
        raise TypeError("%s must be a str or bytes, not %s"
                        % (what, type(text).__name__))
    if b"\0" in data:
        raise ValueError("%s contains a NUL character" % what)
    return data


class Module(_Object):
    """Loaded code of a context: Module.builtin(ctx), Module.from_file(),
    Module.from_data() or Module.compile(), each returning a Module that
    the caller owns.  A module keeps its context alive; its kernels keep it
    alive.  Methods of a closed Module raise ValueError."""

    __slots__ = ("_origin",)
    _origin: str
    _release_name = "cusafe_module_release"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Not for use: raises TypeError (Module.builtin(), from_file(),
        from_data() and compile() make Modules)."""
        raise TypeError("use Module.builtin(), Module.from_file(), "
                        "Module.from_data() or Module.compile()")

    @classmethod
    def _make(cls: Type[_ModT], origin: str, fn: str, *args: Any) -> _ModT:
        h = c_handle(0)
        _call(fn, ctypes.byref(h), *args)
        obj = object.__new__(cls)
        obj._origin = origin
        obj._own(h)
        return obj

    @classmethod
    def builtin(cls: Type[_ModT], ctx: Context) -> _ModT:
        """The kernels built into cusafe (cusafe_vecadd_f32, ...).  Raises
        ValueError for a closed ctx, CusafeError INVALID_IMAGE when the
        library has no code for the device's architecture."""
        return cls._make("builtin", "cusafe_module_load_builtin",
                         _handle_of(ctx, Context, "ctx"))

    @classmethod
    def from_file(cls: Type[_ModT], ctx: Context,
                  path: Union[str, os.PathLike[str]]) -> _ModT:
        """A cubin, fatbin or PTX file (the path is not kept).  Raises
        CusafeError INVALID_IMAGE for a file that cannot be read or is not
        code for the device (the message names the file and says why),
        ValueError for a path with a NUL character."""
        return cls._make(os.fspath(path), "cusafe_module_load_file",
                         _handle_of(ctx, Context, "ctx"),
                         _encode(os.fsencode(path), "path"))

    @classmethod
    def from_data(cls: Type[_ModT], ctx: Context,
                  image: Union[str, _BufferLike]) -> _ModT:
        """A cubin, fatbin or PTX image in memory (PTX as str or bytes; a
        NUL is added where missing); the image is copied as needed, so it
        may be dropped when this returns.  Raises CusafeError
        INVALID_IMAGE for data that is not code for the device."""
        if isinstance(image, str):
            image = image.encode()
        if isinstance(image, (bytes, bytearray)) and image[:1] != b"\x7f" \
                and not image.endswith(b"\0") and b".version" in image[:4096]:
            image = bytes(image) + b"\0"  # PTX text
        host = _HostMemory(image, writable=False)
        try:
            return cls._make("data", "cusafe_module_load_data",
                             _handle_of(ctx, Context, "ctx"),
                             host.address, host.nbytes)
        finally:
            host.release()

    @classmethod
    def compile(cls: Type[_ModT], ctx: Context, source: Union[str, bytes],
                name: Optional[str] = None,
                options: Sequence[Union[str, bytes]] = ()) -> _ModT:
        """CUDA C++ compiled with NVRTC for the context's device.  A
        failure raises CusafeError with status COMPILE and the compiler's
        log in its `log` attribute; a source, name or option with a NUL
        character raises ValueError."""
        opts = [_encode(o, "options") for o in options]
        array = (ctypes.c_char_p * max(len(opts), 1))(*opts)
        return cls._make(name or "source.cu", "cusafe_module_compile",
                         _handle_of(ctx, Context, "ctx"),
                         _encode(source, "source"),
                         _encode(name, "name") if name is not None else None,
                         array, len(opts))

    def kernel(self, name: str) -> Kernel:
        """The Kernel called `name`, owned by the caller; it keeps this
        module alive.  Raises CusafeError NOT_FOUND if the module has no
        such kernel, ValueError for a name with a NUL character."""
        from ._launch import Kernel, _no_fast
        h = c_handle(0)
        _call("cusafe_module_get_kernel", ctypes.byref(h), self.handle,
              _encode(name, "name"))
        obj = object.__new__(Kernel)
        obj._name = name
        obj._pack = _no_fast
        obj._own(h)
        return obj

    __getitem__ = kernel

    def _describe(self) -> str:
        return self._origin


def _check_status(status: int) -> None:
    """Raises the library's error for a failed call (for _speedups)."""
    library().check(status)
