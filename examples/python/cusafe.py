"""cusafe.py -- a ctypes binding of libcusafe, the resource-safe CUDA runtime.

Copy this one file next to your program (it needs nothing but the standard
library; numpy arrays work wherever bytes do, through the buffer protocol).

    import cusafe

    with cusafe.Context(0) as ctx:
        a = ctx.alloc(4 * n)
        a.write(array.array("f", values))
        ...

Loading.  The first use loads the library: the path given to load(), else
the one in the environment variable CUSAFE_LIBRARY, else the installed
libcusafe.so.0 (then libcusafe.so) through the dynamic linker's usual search.
A library that cannot be loaded raises LibraryNotFoundError, which says what
was tried.

Errors.  Every failed call raises CusafeError(status, message, cuda_error):
`status` is a Status, `message` the library's sentence (such as "copy of
100 bytes at offset 0 exceeds buffer of 64 bytes"), `cuda_error` the
cudaError_t behind it (0 if none).  A machine without a CUDA driver or
device raises NoDeviceError, a subclass, at the first call that needs one.

Lifetime.  Every object (Context, Stream, Event, Buffer, Module, Kernel)
owns one reference on a library handle.  close(), the end of a `with` block
or the garbage collector releases it.  The library keeps each object's
parents alive for it (a buffer its context, a view its buffer, a kernel its
module), and queued work keeps its buffers alive, so Python objects may be
dropped in any order.  At interpreter exit, objects still alive are left to
the library's own exit handler, which destroys them in dependency order
before the CUDA runtime tears itself down; objects that daemon threads still
use thus stay valid until the very end.  After shutdown() (or at exit) every
release is a no-op and every other call raises CusafeError with status
SHUTDOWN.  In a child process forked after CUDA was used, every call raises
CusafeError with status FORKED.

Threads.  Every function and object may be used from any thread.
"""

import ctypes
import struct
import enum
import os
import threading
import weakref

__all__ = [
    "Status", "HandleType", "Memory", "ArgKind",
    "CusafeError", "NoDeviceError", "LibraryNotFoundError",
    "DeviceProperties", "Arg", "LaunchConfig",
    "load", "library", "status_string", "version", "device_count",
    "device_properties", "shutdown", "release_handle", "retain_handle",
    "handle_type",
    "Context", "Stream", "Event", "Buffer", "Module", "Kernel", "Array",
    "from_dlpack",
    "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "F32", "F64",
    "Bytes",
    "MEMORY_DEVICE", "MEMORY_HOST_PINNED", "MEMORY_MANAGED",
    "STREAM_NON_BLOCKING", "EVENT_DISABLE_TIMING", "EVENT_BLOCKING_SYNC",
]

# --------------------------------------------------------------------------
# The C interface, mirrored from include/cusafe.h
# --------------------------------------------------------------------------


class Status(enum.IntEnum):
    """cusafe_status."""
    SUCCESS = 0
    INVALID_HANDLE = 1
    INVALID_VALUE = 2
    INVALID_SIZE = 3
    OUT_OF_RANGE = 4
    INVALID_DEVICE = 5
    CONTEXT_MISMATCH = 6
    NO_DRIVER = 7
    NO_DEVICE = 8
    OUT_OF_MEMORY = 9
    NOT_READY = 10
    NOT_SUPPORTED = 11
    CUDA = 12
    SHUTDOWN = 13
    FORKED = 14
    INVALID_ARGUMENTS = 15
    INVALID_CONFIGURATION = 16
    INVALID_IMAGE = 17
    COMPILE = 18
    NOT_FOUND = 19


class HandleType(enum.IntEnum):
    """cusafe_handle_type."""
    INVALID = 0
    CONTEXT = 1
    STREAM = 2
    EVENT = 3
    BUFFER = 4
    MODULE = 5
    KERNEL = 6


class Memory(enum.IntEnum):
    """cusafe_memory."""
    DEVICE = 0
    HOST_PINNED = 1
    MANAGED = 2


MEMORY_DEVICE = Memory.DEVICE
MEMORY_HOST_PINNED = Memory.HOST_PINNED
MEMORY_MANAGED = Memory.MANAGED


class ArgKind(enum.IntEnum):
    """cusafe_arg_kind."""
    BUFFER = 1
    I8 = 2
    U8 = 3
    I16 = 4
    U16 = 5
    I32 = 6
    U32 = 7
    I64 = 8
    U64 = 9
    F32 = 10
    F64 = 11
    BYTES = 12


STREAM_NON_BLOCKING = 0x1
EVENT_DISABLE_TIMING = 0x1
EVENT_BLOCKING_SYNC = 0x2

NULL_HANDLE = 0

c_handle = ctypes.c_uint64   # cusafe_handle and all its typedefs
c_status = ctypes.c_int      # cusafe_status (a C enum)
c_enum = ctypes.c_int        # the other C enums


class DeviceProperties(ctypes.Structure):
    """cusafe_device_properties."""
    _fields_ = [
        ("name", ctypes.c_char * 256),
        ("total_memory", ctypes.c_size_t),
        ("compute_capability_major", ctypes.c_int),
        ("compute_capability_minor", ctypes.c_int),
        ("multiprocessor_count", ctypes.c_int),
        ("max_threads_per_block", ctypes.c_int),
        ("max_block_dim", ctypes.c_int * 3),
        ("max_grid_dim", ctypes.c_int * 3),
        ("shared_memory_per_block", ctypes.c_size_t),
        ("shared_memory_per_block_optin", ctypes.c_size_t),
        ("warp_size", ctypes.c_int),
        ("managed_memory", ctypes.c_int),
        ("concurrent_managed_access", ctypes.c_int),
        ("memory_pools", ctypes.c_int),
        ("pci_bus_id", ctypes.c_int),
        ("pci_device_id", ctypes.c_int),
        ("pci_domain_id", ctypes.c_int),
    ]

    @property
    def device_name(self):
        """The device's name, as a str (`name` is the raw bytes)."""
        return self.name.decode("utf-8", "replace")

    @property
    def compute_capability(self):
        return (self.compute_capability_major, self.compute_capability_minor)

    def __repr__(self):
        return "<cusafe.DeviceProperties %r, CC %d.%d, %d bytes>" % (
            self.device_name, self.compute_capability_major,
            self.compute_capability_minor, self.total_memory)


class _ArgValue(ctypes.Union):
    _fields_ = [
        ("buffer", c_handle),
        ("i", ctypes.c_int64),
        ("u", ctypes.c_uint64),
        ("f32", ctypes.c_float),
        ("f64", ctypes.c_double),
        ("bytes", ctypes.c_void_p),
    ]


class Arg(ctypes.Structure):
    """cusafe_arg: one kernel argument, a tagged value of 16 bytes."""
    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("value", _ArgValue),
    ]


class LaunchConfig(ctypes.Structure):
    """cusafe_launch_config."""
    _fields_ = [
        ("grid", ctypes.c_uint32 * 3),
        ("block", ctypes.c_uint32 * 3),
        ("shared_memory", ctypes.c_size_t),
        ("stream", c_handle),
    ]


class _DLDataType(ctypes.Structure):
    """DLPack's DLDataType, passed by value to cusafe_buffer_to_dlpack."""
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


_P = ctypes.POINTER
_h = c_handle
_sz = ctypes.c_size_t
_vp = ctypes.c_void_p

# name: (restype, argtypes), for every function that cusafe.h declares.
_PROTOTYPES = {
    # status codes and error reporting
    "cusafe_status_string": (ctypes.c_char_p, [c_status]),
    "cusafe_last_error_message": (ctypes.c_char_p, []),
    "cusafe_last_cuda_error": (ctypes.c_int, []),
    "cusafe_version_string": (ctypes.c_char_p, []),
    # handles
    "cusafe_retain": (c_status, [_h]),
    "cusafe_release": (c_status, [_h]),
    "cusafe_handle_get_type": (c_status, [_P(c_enum), _h]),
    "cusafe_handle_set_label": (c_status, [_h, ctypes.c_char_p]),
    # library and devices
    "cusafe_shutdown": (c_status, []),
    "cusafe_device_count": (c_status, [_P(ctypes.c_int)]),
    "cusafe_device_get_properties": (c_status, [_P(DeviceProperties),
                                                ctypes.c_int]),
    # contexts
    "cusafe_context_create": (c_status, [_P(_h), ctypes.c_int]),
    "cusafe_context_retain": (c_status, [_h]),
    "cusafe_context_release": (c_status, [_h]),
    "cusafe_context_get_device": (c_status, [_P(ctypes.c_int), _h]),
    "cusafe_context_synchronize": (c_status, [_h]),
    "cusafe_context_stream_priority_range": (
        c_status, [_P(ctypes.c_int), _P(ctypes.c_int), _h]),
    # streams
    "cusafe_stream_create": (c_status, [_P(_h), _h, ctypes.c_uint,
                                        ctypes.c_int]),
    "cusafe_stream_retain": (c_status, [_h]),
    "cusafe_stream_release": (c_status, [_h]),
    "cusafe_stream_synchronize": (c_status, [_h]),
    "cusafe_stream_query": (c_status, [_h]),
    "cusafe_stream_wait_event": (c_status, [_h, _h]),
    "cusafe_stream_get_context": (c_status, [_P(_h), _h]),
    # events
    "cusafe_event_create": (c_status, [_P(_h), _h, ctypes.c_uint]),
    "cusafe_event_retain": (c_status, [_h]),
    "cusafe_event_release": (c_status, [_h]),
    "cusafe_event_record": (c_status, [_h, _h]),
    "cusafe_event_synchronize": (c_status, [_h]),
    "cusafe_event_query": (c_status, [_h]),
    "cusafe_event_elapsed_ms": (c_status, [_P(ctypes.c_float), _h, _h]),
    # buffers
    "cusafe_buffer_alloc": (c_status, [_P(_h), _h, c_enum, _sz]),
    "cusafe_buffer_alloc_async": (c_status, [_P(_h), _h, _sz]),
    "cusafe_buffer_view": (c_status, [_P(_h), _h, _sz, _sz]),
    "cusafe_buffer_retain": (c_status, [_h]),
    "cusafe_buffer_release": (c_status, [_h]),
    "cusafe_buffer_get_size": (c_status, [_P(_sz), _h]),
    "cusafe_buffer_get_memory": (c_status, [_P(c_enum), _h]),
    "cusafe_buffer_get_context": (c_status, [_P(_h), _h]),
    "cusafe_buffer_write": (c_status, [_h, _sz, _vp, _sz]),
    "cusafe_buffer_read": (c_status, [_h, _sz, _vp, _sz]),
    "cusafe_buffer_write_async": (c_status, [_h, _sz, _vp, _sz, _h]),
    "cusafe_buffer_read_async": (c_status, [_h, _sz, _vp, _sz, _h]),
    "cusafe_buffer_copy": (c_status, [_h, _sz, _h, _sz, _sz, _h]),
    "cusafe_buffer_fill": (c_status, [_h, _sz, _sz, ctypes.c_ubyte, _h]),
    # interop
    "cusafe_buffer_interop_pointer": (c_status, [_P(_vp), _h]),
    "cusafe_stream_interop_handle": (c_status, [_P(_vp), _h]),
    "cusafe_stream_wrap": (c_status, [_P(_h), _h, _vp]),
    # the release function (cusafe_release_fn) as an address: see
    # cusafe_buffer_wrap in cusafe.h
    "cusafe_buffer_wrap": (c_status, [_P(_h), _h, c_enum, _vp, _sz,
                                      _vp, _vp]),
    "cusafe_stream_use_buffers": (c_status, [_h, _P(_h), _sz]),
    "cusafe_python_release": (None, [_vp]),
    # cusafe_dlpack.h (a library built with DLPack): tensors as addresses
    "cusafe_buffer_to_dlpack": (c_status, [_P(_vp), _h, _sz, _DLDataType,
                                           ctypes.c_int32, _P(ctypes.c_int64),
                                           _P(ctypes.c_int64), _h]),
    "cusafe_buffer_to_dlpack_legacy": (c_status, [
        _P(_vp), _h, _sz, _DLDataType, ctypes.c_int32, _P(ctypes.c_int64),
        _P(ctypes.c_int64), _h]),
    "cusafe_buffer_from_dlpack": (c_status, [_P(_h), _h, _vp]),
    "cusafe_buffer_from_dlpack_legacy": (c_status, [_P(_h), _h, _vp]),
    "cusafe_dlpack_capsule_destructor": (None, [_vp]),
    # modules and kernels
    "cusafe_module_load_builtin": (c_status, [_P(_h), _h]),
    "cusafe_module_load_file": (c_status, [_P(_h), _h, ctypes.c_char_p]),
    "cusafe_module_load_data": (c_status, [_P(_h), _h, _vp, _sz]),
    "cusafe_module_compile": (c_status, [_P(_h), _h, ctypes.c_char_p,
                                         ctypes.c_char_p,
                                         _P(ctypes.c_char_p), _sz]),
    "cusafe_last_compile_log": (ctypes.c_char_p, []),
    "cusafe_module_retain": (c_status, [_h]),
    "cusafe_module_release": (c_status, [_h]),
    "cusafe_module_get_kernel": (c_status, [_P(_h), _h, ctypes.c_char_p]),
    "cusafe_kernel_retain": (c_status, [_h]),
    "cusafe_kernel_release": (c_status, [_h]),
    "cusafe_kernel_get_params": (c_status, [_P(_sz), _P(_sz), _sz, _h]),
    "cusafe_kernel_launch": (c_status, [_h, _P(LaunchConfig), _P(Arg), _sz]),
    "cusafe_kernel_suggest_config": (c_status, [_P(ctypes.c_uint32),
                                                _P(ctypes.c_uint32), _h,
                                                _sz, _sz]),
}

del _P, _h, _sz, _vp

# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


class LibraryNotFoundError(OSError):
    """libcusafe could not be loaded."""


class CusafeError(Exception):
    """A cusafe call failed.

    status     -- a Status (a plain int for a status this binding does not
                  know)
    message    -- the library's sentence about the failure (may be "")
    cuda_error -- the cudaError_t behind it, or 0
    """

    def __init__(self, status, message="", cuda_error=0):
        try:
            status = Status(status)
        except ValueError:
            status = int(status)
        super().__init__(status, message, cuda_error)
        self.status = status
        self.message = message
        self.cuda_error = cuda_error

    def __str__(self):
        text = status_string(self.status)
        return "%s: %s" % (text, self.message) if self.message else text

    def __repr__(self):
        name = self.status.name if isinstance(self.status, Status) \
            else str(self.status)
        return "%s(%s, %r, cuda_error=%d)" % (
            type(self).__name__, name, self.message, self.cuda_error)


class NoDeviceError(CusafeError):
    """No CUDA driver (status NO_DRIVER) or no CUDA device (NO_DEVICE)."""


_STATUS_WORDS = {
    0: "success", 1: "invalid handle", 2: "invalid value",
    3: "invalid size", 4: "out of range", 5: "invalid device",
    6: "context mismatch", 7: "no CUDA driver", 8: "no CUDA device",
    9: "out of memory", 10: "not ready", 11: "not supported",
    12: "CUDA error", 13: "shut down", 14: "forked",
    15: "invalid arguments", 16: "invalid configuration",
    17: "invalid image", 18: "compile error", 19: "not found",
}


def status_string(status):
    """The library's description of a status (cusafe_status_string)."""
    try:
        lib = library()
    except LibraryNotFoundError:
        return _STATUS_WORDS.get(int(status), "unknown status")
    return lib.fn.cusafe_status_string(int(status)).decode("utf-8",
                                                           "replace")


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------


class _Missing:
    """Stands for a function that the loaded library does not export (an
    older libcusafe than this binding): calling it raises CusafeError."""

    def __init__(self, name, path):
        self.name = name
        self.path = path

    def __call__(self, *args):
        raise CusafeError(Status.NOT_SUPPORTED,
                          "%s does not export %s (is it older than this "
                          "binding?)" % (self.path, self.name))


class _Functions:
    pass


class Library:
    """A loaded libcusafe.  `cdll` is the ctypes.CDLL; `fn` holds every
    function of cusafe.h as a ctypes function with its argtypes and restype
    declared (a function missing from the library raises CusafeError with
    status NOT_SUPPORTED when called); `path` is what was loaded."""

    def __init__(self, cdll, path):
        self.cdll = cdll
        self.path = path
        self.fn = _Functions()
        self.missing = []
        for name, (restype, argtypes) in _PROTOTYPES.items():
            try:
                # Indexing makes a new function object, private to this
                # binding: nobody else's argtypes can change it.
                f = cdll[name]
            except AttributeError:
                self.missing.append(name)
                setattr(self.fn, name, _Missing(name, path))
                continue
            f.restype = restype
            f.argtypes = argtypes
            setattr(self.fn, name, f)

    def check(self, status):
        """Raises the error for a failed call; the message and the CUDA
        error are the calling thread's, so call it right after the call."""
        if status == 0:
            return
        message = self.fn.cusafe_last_error_message()
        message = message.decode("utf-8", "replace") if message else ""
        cuda_error = self.fn.cusafe_last_cuda_error()
        cls = NoDeviceError if status in (Status.NO_DRIVER,
                                          Status.NO_DEVICE) else CusafeError
        err = cls(status, message, cuda_error)
        if status == Status.COMPILE:
            log = self.fn.cusafe_last_compile_log()
            err.log = log.decode("utf-8", "replace") if log else ""
        raise err

    def __repr__(self):
        return "<cusafe.Library %r>" % (self.path,)


_lock = threading.Lock()
_library = None

DEFAULT_NAMES = ("libcusafe.so.0", "libcusafe.so")


def load(path=None):
    """Loads libcusafe and returns the Library.  `path`: the file to load;
    None: $CUSAFE_LIBRARY if set, else libcusafe.so.0, then libcusafe.so,
    through the dynamic linker's search path.  Loading twice returns the
    same Library; asking for another file once one is loaded raises
    RuntimeError (one process, one cusafe)."""
    global _library
    with _lock:
        if _library is not None:
            if path is not None and \
                    os.path.realpath(path) != os.path.realpath(
                        _library.path) and path != _library.path:
                raise RuntimeError("cusafe is already loaded from %s"
                                   % _library.path)
            return _library
        if path is not None:
            candidates = [("the path given to cusafe.load()", path)]
        elif os.environ.get("CUSAFE_LIBRARY"):
            candidates = [("CUSAFE_LIBRARY", os.environ["CUSAFE_LIBRARY"])]
        else:
            candidates = [("the default", name) for name in DEFAULT_NAMES]
        tried = []
        for origin, name in candidates:
            try:
                cdll = ctypes.CDLL(name)
            except OSError as e:
                tried.append("%s (%s): %s" % (name, origin, e))
                continue
            _library = Library(cdll, name)
            return _library
        raise LibraryNotFoundError(
            "cannot load libcusafe; tried " + "; ".join(tried) +
            ". Install cusafe (and run ldconfig), or set CUSAFE_LIBRARY to "
            "the path of libcusafe.so")


def library():
    """The loaded Library, loading the default one on first use."""
    lib = _library
    return lib if lib is not None else load()


def _call(name, *args):
    lib = library()
    lib.check(getattr(lib.fn, name)(*args))


# --------------------------------------------------------------------------
# Library-wide functions
# --------------------------------------------------------------------------


def version():
    """The library's version, "MAJOR.MINOR.PATCH"."""
    return library().fn.cusafe_version_string().decode()


def device_count():
    """The number of CUDA devices.  Raises NoDeviceError without a driver
    or device."""
    n = ctypes.c_int(0)
    _call("cusafe_device_count", ctypes.byref(n))
    return n.value


def device_properties(device=0):
    """The DeviceProperties of a device."""
    props = DeviceProperties()
    _call("cusafe_device_get_properties", ctypes.byref(props), device)
    return props


def shutdown():
    """Destroys every object still alive, in dependency order, and shuts
    the library down (cusafe_shutdown).  Afterwards releases are no-ops and
    every other call raises CusafeError with status SHUTDOWN.  Idempotent."""
    _call("cusafe_shutdown")


def handle_type(handle):
    """The HandleType of a live handle (an int)."""
    t = c_enum(0)
    _call("cusafe_handle_get_type", ctypes.byref(t), handle)
    return HandleType(t.value)


def retain_handle(handle):
    """Adds a reference to a handle of any type (cusafe_retain)."""
    _call("cusafe_retain", handle)


def release_handle(handle):
    """Drops a reference of a handle of any type (cusafe_release)."""
    _call("cusafe_release", handle)


# --------------------------------------------------------------------------
# Objects
# --------------------------------------------------------------------------


class _Object:
    """An owned reference on one library handle."""

    # _live is the handle while the object is open and 0 once it is
    # closed, for fast paths that must not call the `handle` property.
    __slots__ = ("_handle", "_live", "_finalizer", "__weakref__")
    _release_name = "cusafe_release"

    def __init__(self):
        raise TypeError("cusafe.%s objects are made by their own "
                        "constructors or methods" % type(self).__name__)

    def _own(self, handle):
        lib = library()
        self._handle = self._live = handle
        # The release function is bound now, not looked up at release
        # time, so that it still works while the interpreter shuts down
        # and module globals are gone.  It is a raw ctypes function (no
        # Python code runs in it) that ignores its status: after shutdown
        # or in a forked child a release is a no-op anyway.
        self._finalizer = weakref.finalize(
            self, getattr(lib.fn, self._release_name), handle)
        # At interpreter exit the library's own exit handler destroys what
        # is still alive, in dependency order; releasing from Python's exit
        # hooks could pull objects from under daemon threads still using
        # them.
        self._finalizer.atexit = False

    @classmethod
    def _adopt(cls, handle):
        """An object owning `handle`, a reference the caller hands over."""
        obj = object.__new__(cls)
        obj._own(handle)
        return obj

    @property
    def handle(self):
        """The handle, an int.  Raises ValueError once closed."""
        if not self._finalizer.alive:
            raise ValueError("this cusafe.%s is closed" % type(self).__name__)
        return self._handle

    @property
    def closed(self):
        return not self._finalizer.alive

    def close(self):
        """Releases the reference now; closing twice is a no-op."""
        lib = library()
        self._live = 0
        status = self._finalizer()
        if status:  # None when already closed
            lib.check(status)

    def set_label(self, label):
        """Attaches a label (where or why the object was made) that the
        leak report (CUSAFE_LEAK_REPORT=1) prints; None removes it."""
        _call("cusafe_handle_set_label", self.handle,
              None if label is None else _encode(label))
        return self

    def detach(self):
        """Gives up ownership: returns the handle, which the caller must
        release (release_handle()); the object is closed."""
        handle = self.handle
        self._finalizer.detach()
        self._live = 0
        return handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _describe(self):
        return ""

    def __repr__(self):
        name = type(self).__name__
        if self.closed:
            return "<cusafe.%s closed>" % name
        extra = self._describe()
        return "<cusafe.%s 0x%016x%s>" % (name, self._handle,
                                          " " + extra if extra else "")

    def __eq__(self, other):
        return type(other) is type(self) and not self.closed and \
            not other.closed and other._handle == self._handle

    def __hash__(self):
        return hash((type(self), self._handle))


def _raw_stream(stream):
    """The cudaStream_t (an int) of a stream object of another library."""
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        version, raw = proto() if callable(proto) else proto
        if version != 0:
            raise TypeError("__cuda_stream__ of version %r: cusafe reads "
                            "version 0" % (version,))
        return int(raw)
    for name in ("cuda_stream", "ptr"):
        raw = getattr(stream, name, None)
        if isinstance(raw, int):
            return raw
    raise TypeError("%s is not a CUDA stream: expected an int (a "
                    "cudaStream_t), or an object with __cuda_stream__, "
                    "cuda_stream or ptr" % type(stream).__name__)


def _device_of(obj, default=0):
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


def _stream_handle(stream):
    if stream is None:
        return 0
    if isinstance(stream, Stream):
        return stream.handle
    raise TypeError("stream must be a cusafe.Stream or None, not %s"
                    % type(stream).__name__)


class Context(_Object):
    """A device's context (cusafe_context_create): one per device, shared
    with the CUDA runtime and other libraries; each Context object holds
    one reference."""

    __slots__ = ("_device",)
    _release_name = "cusafe_context_release"

    def __init__(self, device=0):
        h = c_handle(0)
        _call("cusafe_context_create", ctypes.byref(h), device)
        self._device = device
        self._own(h.value)

    @classmethod
    def _adopt(cls, handle):
        obj = super()._adopt(handle)
        d = ctypes.c_int(0)
        _call("cusafe_context_get_device", ctypes.byref(d), handle)
        obj._device = d.value
        return obj

    @property
    def device(self):
        return self._device

    @property
    def properties(self):
        return device_properties(self._device)

    def synchronize(self):
        """Waits for all work on the device."""
        _call("cusafe_context_synchronize", self.handle)

    def stream_priority_range(self):
        """(least, greatest) stream priority of the device."""
        least, greatest = ctypes.c_int(0), ctypes.c_int(0)
        _call("cusafe_context_stream_priority_range", ctypes.byref(least),
              ctypes.byref(greatest), self.handle)
        return least.value, greatest.value

    # Factories, for convenience.
    def stream(self, non_blocking=False, priority=0):
        return Stream(self, non_blocking=non_blocking, priority=priority)

    def event(self, timing=True, blocking_sync=False):
        return Event(self, timing=timing, blocking_sync=blocking_sync)

    def alloc(self, size, memory=Memory.DEVICE):
        return Buffer(self, size, memory)

    def load_builtin(self):
        return Module.builtin(self)

    def compile(self, source, name=None, options=()):
        return Module.compile(self, source, name, options)

    def _describe(self):
        return "device %d" % self._device


class Stream(_Object):
    """A CUDA stream of a context (cusafe_stream_create)."""

    __slots__ = ()
    _release_name = "cusafe_stream_release"

    def __init__(self, ctx, non_blocking=False, priority=0, flags=None):
        if flags is None:
            flags = STREAM_NON_BLOCKING if non_blocking else 0
        h = c_handle(0)
        _call("cusafe_stream_create", ctypes.byref(h), ctx.handle, flags,
              priority)
        self._own(h.value)

    def synchronize(self):
        _call("cusafe_stream_synchronize", self.handle)

    def query(self):
        """True if all queued work has completed."""
        lib = library()
        st = lib.fn.cusafe_stream_query(self.handle)
        if st == Status.NOT_READY:
            return False
        lib.check(st)
        return True

    def wait_event(self, event):
        """Makes later work on the stream wait for the event's last record."""
        _call("cusafe_stream_wait_event", self.handle, event.handle)

    @property
    def context(self):
        h = c_handle(0)
        _call("cusafe_stream_get_context", ctypes.byref(h), self.handle)
        return Context._adopt(h.value)

    def interop_handle(self):
        """The cudaStream_t, as an int; cusafe keeps ownership."""
        p = ctypes.c_void_p()
        _call("cusafe_stream_interop_handle", ctypes.byref(p), self.handle)
        return p.value or 0

    @classmethod
    def wrap(cls, stream, ctx=None):
        """A stream of another library as a cusafe stream
        (cusafe_stream_wrap): `stream` is a cudaStream_t as an int (0 for
        the device's default stream), or an object of the CUDA stream
        protocol (`__cuda_stream__`: cuda.core, CuPy 14, cusafe) or with a
        `cuda_stream` (PyTorch) or `ptr` (CuPy) attribute.  `ctx`: the
        context of its device; None: that of the device the object names
        (`device`, `device_id`), else device 0 -- a stream of another
        device raises CusafeError (CONTEXT_MISMATCH).  cusafe never
        destroys the stream: its owner keeps it valid while this object,
        and buffers last used on it, live."""
        raw = _raw_stream(stream)
        if ctx is None:
            ctx = stream.context if isinstance(stream, Stream) \
                else Context(_device_of(stream))
        h = c_handle(0)
        _call("cusafe_stream_wrap", ctypes.byref(h), ctx.handle,
              ctypes.c_void_p(raw or None))
        return cls._adopt(h.value)

    def __cuda_stream__(self):
        """The CUDA stream protocol: (0, the cudaStream_t as an int), for
        cupy.cuda.Stream.from_external(), cuda.core and others, which must
        not use it after this object is closed."""
        return (0, self.interop_handle())

    def use_buffers(self, *buffers):
        """Records that work other code queues on this stream by address
        uses `buffers` (cusafe_stream_use_buffers): call it before queueing
        that work."""
        arr = (c_handle * len(buffers))(*[b.handle for b in buffers])
        _call("cusafe_stream_use_buffers", self.handle, arr, len(buffers))


class Event(_Object):
    """A CUDA event of a context (cusafe_event_create)."""

    __slots__ = ()
    _release_name = "cusafe_event_release"

    def __init__(self, ctx, timing=True, blocking_sync=False, flags=None):
        if flags is None:
            flags = (0 if timing else EVENT_DISABLE_TIMING) | \
                (EVENT_BLOCKING_SYNC if blocking_sync else 0)
        h = c_handle(0)
        _call("cusafe_event_create", ctypes.byref(h), ctx.handle, flags)
        self._own(h.value)

    def record(self, stream=None):
        """Records the event on `stream` (None: the context's default)."""
        _call("cusafe_event_record", self.handle, _stream_handle(stream))

    def synchronize(self):
        _call("cusafe_event_synchronize", self.handle)

    def query(self):
        """True if the work before the last record has completed."""
        lib = library()
        st = lib.fn.cusafe_event_query(self.handle)
        if st == Status.NOT_READY:
            return False
        lib.check(st)
        return True

    def elapsed_ms(self, end):
        """Milliseconds from this event to `end` (both recorded, done)."""
        ms = ctypes.c_float(0)
        _call("cusafe_event_elapsed_ms", ctypes.byref(ms), self.handle,
              end.handle)
        return ms.value


class _HostMemory:
    """The address and size of a host object with the buffer protocol
    (bytes, bytearray, memoryview, array.array, numpy arrays, ...).  It
    holds the export for as long as it lives."""

    __slots__ = ("view", "array", "keep", "address", "nbytes")

    def __init__(self, obj, writable):
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

    def release(self):
        self.array = None
        self.view.release()


class Buffer(_Object):
    """Device, pinned host or managed memory (cusafe_buffer_alloc), or a
    view of a byte range of another buffer (Buffer.view)."""

    # _cai: the Array behind __cuda_array_interface__, kept with the Buffer
    # object, which is what a consumer of the interface holds.
    __slots__ = ("_size", "_memory", "_cai")
    _release_name = "cusafe_buffer_release"

    def __init__(self, ctx, size, memory=Memory.DEVICE, stream=None):
        """Allocates `size` bytes of `memory` in ctx; with a `stream`,
        device memory ordered on that stream (cusafe_buffer_alloc_async)."""
        h = c_handle(0)
        if stream is not None:
            if memory != Memory.DEVICE:
                raise ValueError("stream-ordered allocation is for device "
                                 "memory only")
            _call("cusafe_buffer_alloc_async", ctypes.byref(h),
                  _stream_handle(stream), size)
        else:
            _call("cusafe_buffer_alloc", ctypes.byref(h), ctx.handle,
                  int(memory), size)
        self._size = size
        self._memory = Memory(memory)
        self._own(h.value)

    @classmethod
    def _adopt(cls, handle):
        obj = super()._adopt(handle)
        size, mem = ctypes.c_size_t(0), c_enum(0)
        _call("cusafe_buffer_get_size", ctypes.byref(size), handle)
        _call("cusafe_buffer_get_memory", ctypes.byref(mem), handle)
        obj._size = size.value
        obj._memory = Memory(mem.value)
        return obj

    @classmethod
    def from_host(cls, ctx, data, memory=Memory.DEVICE):
        """A new buffer holding a copy of host data (any object with the
        buffer protocol)."""
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
    def size(self):
        return self._size

    def __len__(self):
        return self._size

    @property
    def memory(self):
        return self._memory

    @property
    def context(self):
        h = c_handle(0)
        _call("cusafe_buffer_get_context", ctypes.byref(h), self.handle)
        return Context._adopt(h.value)

    def view(self, offset, size):
        """A Buffer for bytes [offset, offset + size); it keeps this
        buffer's memory alive."""
        h = c_handle(0)
        _call("cusafe_buffer_view", ctypes.byref(h), self.handle, offset,
              size)
        obj = object.__new__(Buffer)
        obj._size = size
        obj._memory = self._memory
        obj._own(h.value)
        return obj

    def write(self, data, offset=0, stream=None):
        """Copies host data (bytes, bytearray, memoryview, array.array,
        numpy arrays, ...) into the buffer at `offset`.  Without a stream
        it returns when the copy is complete; with one it is ordered on
        that stream (the data may be reused when it returns)."""
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

    def read(self, out=None, offset=0, size=None, stream=None):
        """Copies bytes of the buffer from `offset` into host memory.  With
        `out` (a writable object with the buffer protocol: bytearray,
        memoryview, array.array, numpy array, ...) it fills all of `out`
        and returns it; without, it returns a bytearray of `size` bytes
        (default: up to the end).  Returns when the data is there."""
        if out is None:
            if size is None:
                size = self._size - offset if offset <= self._size else 0
            out = bytearray(size)
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

    def copy_from(self, src, size=None, dst_offset=0, src_offset=0,
                  stream=None):
        """Copies `size` bytes (default: all of src from src_offset) from
        buffer src, ordered on `stream`."""
        if size is None:
            size = src.size - src_offset
        _call("cusafe_buffer_copy", self.handle, dst_offset, src.handle,
              src_offset, size, _stream_handle(stream))

    def fill(self, value, offset=0, size=None, stream=None):
        """Sets bytes to `value` (0..255), ordered on `stream`."""
        if size is None:
            size = self._size - offset
        _call("cusafe_buffer_fill", self.handle, offset, size, value,
              _stream_handle(stream))

    def interop_pointer(self):
        """The raw address of the first byte, as an int; valid while this
        object is open.  Work queued through it is not tracked."""
        p = ctypes.c_void_p()
        _call("cusafe_buffer_interop_pointer", ctypes.byref(p), self.handle)
        return p.value or 0

    # ---- interop: DLPack and the CUDA Array Interface --------------------

    def as_array(self, dtype="u1", shape=None, strides=None, offset=0,
                 stream=None):
        """An Array: bytes of this buffer from `offset` on, as an array of
        `dtype` (a NumPy type string or name: "f4", "float32", "<i8",
        "bool", ..., or a NumPy dtype) and `shape` (default: 1-D, as many
        elements as fit), with `strides` in bytes (default: C order), for
        other libraries: cupy.asarray(a), cupy.from_dlpack(a),
        torch.from_dlpack(a), torch.as_tensor(a, device="cuda"),
        numba.cuda.as_cuda_array(a) -- zero-copy.  The Array holds a
        reference on the buffer, so the memory stays valid while it (or a
        consumer holding it) lives.  `stream`: the stream the consumer
        uses it on (a cusafe Stream, or any stream Stream.wrap takes);
        None: the device's legacy default stream.  Raises ValueError when
        the elements reach beyond the buffer."""
        return Array(self, dtype, shape, strides, offset, stream)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None,
                   copy=None):
        """The DLPack protocol for the whole buffer as a 1-D array of
        bytes (uint8); see Array.__dlpack__ for other types and shapes."""
        with self.as_array() as a:
            return a.__dlpack__(stream=stream, max_version=max_version,
                                dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        """(device type, device id) of DLPack: (2, device) for device
        memory (kDLCUDA), (3, 0) for pinned (kDLCUDAHost), (13, device)
        for managed (kDLCUDAManaged)."""
        return _dlpack_device(self._memory, self.context.device)

    @property
    def __cuda_array_interface__(self):
        """The CUDA Array Interface (version 3) of the whole buffer as a
        1-D array of bytes; see Array for other types and shapes.  The
        memory stays valid while this Buffer object lives, also after
        close(): a consumer holds the object, not the handle."""
        try:
            a = self._cai
        except AttributeError:
            a = None
        if a is None or a.closed:
            a = self._cai = self.as_array()
        return a.__cuda_array_interface__

    @classmethod
    def wrap(cls, obj, ctx=None, stream=None):
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
        ordered after the producer's work, as each protocol asks.  Raises
        TypeError for an object with neither protocol, CusafeError when
        the memory is not CUDA memory of ctx's device."""
        if hasattr(obj, "__dlpack__"):
            return from_dlpack(obj, ctx, stream)
        if hasattr(obj, "__cuda_array_interface__"):
            return _from_cai(obj, ctx, stream)
        raise TypeError("%s has neither __dlpack__ nor "
                        "__cuda_array_interface__" % type(obj).__name__)

    def _describe(self):
        return "%d bytes %s" % (self._size, self._memory.name.lower())

# --------------------------------------------------------------------------
# Interop: DLPack and the CUDA Array Interface
# --------------------------------------------------------------------------

# DLPack's device types and type codes (dlpack.h).
_kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 2, 3, 13
_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_DL_KINDS = {v: k for k, v in _DL_CODES.items()}
_kDLBfloat = 4
_DTYPE_NAMES = {
    "bool": "b1", "int8": "i1", "uint8": "u1", "int16": "i2",
    "uint16": "u2", "int32": "i4", "uint32": "u4", "int64": "i8",
    "uint64": "u8", "float16": "f2", "float32": "f4", "float64": "f8",
    "complex64": "c8", "complex128": "c16", "byte": "u1",
    "half": "f2", "float": "f4", "double": "f8", "int": "i8",
}


def _typestr(dtype):
    """The CAI type string ("<f4") of a dtype given as a NumPy type string,
    a name, or an object with a `str` attribute (a NumPy dtype)."""
    text = getattr(dtype, "str", dtype)
    if isinstance(dtype, type):  # numpy.float32 and the like
        text = getattr(dtype, "__name__", text)
    if not isinstance(text, str):
        raise TypeError("dtype must be a type string such as 'f4' or a "
                        "NumPy dtype, not %s" % type(dtype).__name__)
    name = _DTYPE_NAMES.get(text, text)
    if name[:1] in "<>|=":
        order, name = name[0], name[1:]
    else:
        order = "<"
    if name[:1] not in _DL_CODES or not name[1:].isdigit() or \
            int(name[1:]) not in (1, 2, 4, 8, 16):
        raise ValueError("unknown dtype %r (expected a type string such as "
                         "'f4', 'i8', 'u1', 'c8', 'b1', or a name such as "
                         "'float32')" % (dtype,))
    if order == ">" and int(name[1:]) > 1:
        raise ValueError("dtype %r is big-endian: CUDA memory is "
                         "little-endian" % (dtype,))
    size = int(name[1:])
    return ("|" if size == 1 else "<") + name


def _dlpack_device(memory, device):
    if memory == Memory.HOST_PINNED:
        return (_kDLCUDAHost, 0)
    return (_kDLCUDAManaged if memory == Memory.MANAGED else _kDLCUDA,
            device)


def _extent(shape, strides, itemsize):
    """[lo, hi): the bytes that elements reach from the first one."""
    if any(n == 0 for n in shape):
        return 0, 0
    lo = sum(s * (n - 1) for n, s in zip(shape, strides) if s < 0)
    hi = sum(s * (n - 1) for n, s in zip(shape, strides) if s > 0)
    return lo, hi + itemsize


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _consumer_stream(ctx, stream):
    """A cusafe Stream for a stream of the DLPack / CAI conventions: None
    or 1 the legacy default stream, 2 the per-thread one, another int a
    cudaStream_t; a cusafe Stream is returned as it is.  The caller closes
    what it did not pass in (second value True)."""
    if isinstance(stream, Stream):
        return stream, False
    if stream is None:
        stream = 1
    return Stream.wrap(stream, ctx), True


class _PyAPI:
    """Python's capsule functions through ctypes, and names whose storage
    lives as long as the process (a capsule keeps a pointer to its name,
    and may outlive this module at interpreter exit)."""

    def __init__(self):
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
        self.names = {n: libc.strdup(n) for n in (
            b"dltensor", b"dltensor_versioned", b"used_dltensor",
            b"used_dltensor_versioned")}


_pyapi = None


def _python_api():
    global _pyapi
    if _pyapi is None:
        _pyapi = _PyAPI()
    return _pyapi


def _function_address(name):
    """The address of a function of the library, for C callbacks."""
    lib = library()
    try:
        return ctypes.cast(lib.cdll[name], ctypes.c_void_p).value
    except AttributeError:
        raise CusafeError(Status.NOT_SUPPORTED,
                          "%s does not export %s (built without DLPack? "
                          "./configure reports it)" % (lib.path, name), 0)


def _release_array(use_buffers, release, buf, stream, handles):
    """An Array's finalizer: its memory is freed only after the work queued
    on its stream so far.  It calls ctypes functions bound beforehand only
    (no module global), so that it also runs while the interpreter shuts
    down; their failures (after shutdown: a no-op) are ignored."""
    use_buffers(stream, handles, 1)
    use_buffers(0, handles, 1)  # nothing of cusafe's touches stream later
    release(buf)
    release(stream)


class Array:
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
    Array."""

    # _lent: the CUDA Array Interface was read, so a consumer may hold this
    # object; close() then leaves the references to the garbage collector.
    __slots__ = ("_buffer", "_stream", "_dtype", "_shape", "_strides",
                 "_offset", "_ptr", "_finalizer", "_lent", "_closed",
                 "__weakref__")

    def __init__(self, buffer, dtype="u1", shape=None, strides=None,
                 offset=0, stream=None):
        typestr = _typestr(dtype)
        itemsize = int(typestr[2:])
        size = buffer.size
        if not isinstance(offset, int) or not 0 <= offset <= size:
            raise ValueError("offset %r is outside the buffer of %d bytes"
                             % (offset, size))
        if shape is None:
            shape = ((size - offset) // itemsize,)
        elif isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(n) for n in shape)
        if len(shape) > 64 or any(n < 0 for n in shape):
            raise ValueError("shape %r: at most 64 dimensions of sizes 0 or "
                             "more" % (shape,))
        if strides is None:
            strides = _c_strides(shape, itemsize)
            contiguous = True
        else:
            strides = tuple(int(s) for s in strides)
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
            st, own = _consumer_stream(ctx, stream)
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
    def dtype(self):
        """The element type as a CAI type string ("<f4")."""
        return self._dtype

    @property
    def shape(self):
        return self._shape

    @property
    def strides(self):
        """Strides in bytes, or None for C order."""
        return self._strides

    @property
    def closed(self):
        return self._closed or not self._finalizer.alive

    def _open(self):
        if self.closed:
            raise ValueError("this cusafe.Array is closed")

    def close(self):
        """Releases the Array's references (after recording the buffer as
        used on its stream), unless its CUDA Array Interface was read: a
        consumer may hold this object, so the garbage collector releases
        them once nobody does.  The Array is unusable afterwards either way;
        closing twice is a no-op."""
        self._closed = True
        if not self._lent:
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self.closed:
            return "<cusafe.Array closed>"
        return "<cusafe.Array %s %s of buffer 0x%016x>" % (
            self._dtype, self._shape, self._buffer)

    def _order(self):
        """Orders the Array's stream after the work queued on the buffer."""
        handles = (c_handle * 1)(self._buffer)
        _call("cusafe_stream_use_buffers", self._stream, handles, 1)

    @property
    def __cuda_array_interface__(self):
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

    def __dlpack_device__(self):
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

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None,
                   copy=None):
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
        strides = None
        if self._strides is not None:
            strides = (ctypes.c_int64 * ndim)(
                *[s // itemsize for s in self._strides])
        consumer = None
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


def _delete_tensor(address, versioned):
    """Calls the deleter of a tensor that no capsule holds, through a
    capsule of its own (whose destructor finds the deleter in C)."""
    api = _python_api()
    name = b"dltensor_versioned" if versioned else b"dltensor"
    capsule = api.new(address, api.names[name],
                      _function_address("cusafe_dlpack_capsule_destructor"))
    del capsule  # its destructor deletes the unconsumed tensor


def from_dlpack(obj, ctx=None, stream=None):
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
    device, a read-only tensor)."""
    dev_type, dev_id = obj.__dlpack_device__()
    if ctx is None:
        ctx = Context(dev_id if dev_type != _kDLCUDAHost else 0)
    st, own = _consumer_stream(ctx, stream)
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
        _call("cusafe_buffer_from_dlpack" + ("" if versioned else "_legacy"),
              ctypes.byref(h), ctx.handle, tensor)
        # cusafe owns the tensor now: the capsule must not delete it.
        api.set_name(capsule, api.names[b"used_" + name])
        buf = Buffer._adopt(h.value)
        st.use_buffers(buf)
        return buf
    finally:
        if own:
            st.close()


def _from_cai(obj, ctx, stream):
    """Buffer.wrap of an object with __cuda_array_interface__ only."""
    cai = obj.__cuda_array_interface__
    if not isinstance(cai, dict) or cai.get("version", 0) < 0:
        raise TypeError("%s.__cuda_array_interface__ is not a dict"
                        % type(obj).__name__)
    if cai.get("mask") is not None:
        raise ValueError("masked arrays are not supported")
    shape = tuple(cai["shape"])
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    ptr, readonly = cai["data"]
    if readonly:
        raise ValueError("the array is read-only; cusafe buffers are "
                         "writable")
    strides = cai.get("strides") or _c_strides(shape, itemsize)
    lo, hi = _extent(shape, strides, itemsize)
    if ctx is None:
        ctx = Context(_device_of(obj))
    st, own = _consumer_stream(ctx, stream)
    lib = library()
    release = _function_address("cusafe_python_release")
    api = _python_api()
    try:
        producer = cai.get("stream")
        start = ptr + lo if hi > lo else None
        h = c_handle(0)
        status = None
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



def _encode(text):
    return text.encode() if isinstance(text, str) else text


class Module(_Object):
    """Loaded code of a context: Module.builtin(ctx), Module.from_file(),
    Module.from_data() or Module.compile()."""

    __slots__ = ("_origin",)
    _release_name = "cusafe_module_release"

    def __init__(self, *args, **kwargs):
        raise TypeError("use Module.builtin(), Module.from_file(), "
                        "Module.from_data() or Module.compile()")

    @classmethod
    def _make(cls, origin, fn, *args):
        h = c_handle(0)
        _call(fn, ctypes.byref(h), *args)
        obj = object.__new__(cls)
        obj._origin = origin
        obj._own(h.value)
        return obj

    @classmethod
    def builtin(cls, ctx):
        """The kernels built into cusafe (cusafe_vecadd_f32, ...)."""
        return cls._make("builtin", "cusafe_module_load_builtin", ctx.handle)

    @classmethod
    def from_file(cls, ctx, path):
        """A cubin, fatbin or PTX file."""
        return cls._make(os.fspath(path), "cusafe_module_load_file",
                         ctx.handle, os.fsencode(path))

    @classmethod
    def from_data(cls, ctx, image):
        """A cubin, fatbin or PTX image in memory (PTX as str or bytes; a
        NUL is added where missing)."""
        if isinstance(image, str):
            image = image.encode()
        if isinstance(image, (bytes, bytearray)) and image[:1] != b"\x7f" \
                and not image.endswith(b"\0") and b".version" in image[:4096]:
            image = bytes(image) + b"\0"  # PTX text
        host = _HostMemory(image, writable=False)
        try:
            return cls._make("data", "cusafe_module_load_data", ctx.handle,
                             host.address, host.nbytes)
        finally:
            host.release()

    @classmethod
    def compile(cls, ctx, source, name=None, options=()):
        """CUDA C++ compiled with NVRTC for the context's device.  A
        failure raises CusafeError with status COMPILE and the compiler's
        log in its `log` attribute."""
        opts = [_encode(o) for o in options]
        array = (ctypes.c_char_p * max(len(opts), 1))(*opts)
        return cls._make(name or "source.cu", "cusafe_module_compile",
                         ctx.handle, _encode(source),
                         _encode(name) if name is not None else None,
                         array, len(opts))

    def kernel(self, name):
        """The Kernel called `name` (CusafeError NOT_FOUND if none)."""
        h = c_handle(0)
        _call("cusafe_module_get_kernel", ctypes.byref(h), self.handle,
              _encode(name))
        obj = object.__new__(Kernel)
        obj._name = name
        obj._pack = _no_packer
        obj._c_live = c_handle(h.value)
        obj._own(h.value)
        return obj

    __getitem__ = kernel

    def _describe(self):
        return self._origin


# Typed kernel arguments.  A plain int is passed as I64 and a float as F64;
# wrap a value to pass another type: kernel.launch(g, b, buf, F32(2.0), n).
class _Scalar:
    __slots__ = ("value",)
    kind = None
    field = None

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return "%s(%r)" % (type(self).__name__, self.value)


def _scalar(kind, field, lo=None, hi=None):
    def check(self):
        v = self.value
        if lo is not None and not lo <= v <= hi:
            raise OverflowError("%r does not fit %s" % (v, kind.name))
        if field == "f32":  # finite, but rounds to infinity
            try:
                struct.pack("<f", v)
            except OverflowError:
                raise OverflowError("%r does not fit %s"
                                    % (v, kind.name)) from None
    cls = type(kind.name, (_Scalar,), {"__slots__": (), "kind": kind,
                                      "field": field, "_check": check})
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

    def __init__(self, data):
        self.data = bytes(memoryview(data).cast("B"))


def _dims(v, what):
    if isinstance(v, int):
        v = (v,)
    v = tuple(v)
    if not 1 <= len(v) <= 3:
        raise ValueError("%s must be an int or 1 to 3 ints" % what)
    return v + (1,) * (3 - len(v))


_I64_MIN, _I64_MAX = -2**63, 2**63 - 1


_configs = {}


def _launch_config(grid, block, shared, stream):
    """A LaunchConfig, shared between the launches with the same shape:
    the library reads it during the call only, and nobody writes it."""
    key = (grid, block, shared, stream)
    try:
        return _configs[key]
    except (KeyError, TypeError):  # TypeError: an unhashable grid (a list)
        pass
    config = LaunchConfig(_dims(grid, "grid"), _dims(block, "block"), shared,
                          _stream_handle(stream))
    if len(_configs) < 256 and stream is None:
        try:
            _configs[key] = config
        except TypeError:
            pass
    return config


_VALUE_FORMAT = {"i": "q", "u": "Q", "f32": "f4x", "f64": "d"}
_K_BUFFER, _K_I64, _K_F64, _K_BYTES = 1, 8, 11, 12
_formats = {}


def _pack_args(args, stream=None):
    """The cusafe_arg array of `args`, packed by one struct call, and what
    must stay alive with it (the bytes of Bytes arguments, the Buffers that
    wrap other libraries' arrays; `stream` is the launch's)."""
    n = len(args)
    fmt = "<"
    values = []
    keep = None
    for a in args:
        t = type(a)
        if t is Buffer:
            fmt += "IIQ"
            values += (_K_BUFFER, 0, a.handle)
        elif t is int:
            if not _I64_MIN <= a <= _I64_MAX:
                raise OverflowError("%r does not fit I64" % (a,))
            fmt += "IIq"
            values += (_K_I64, 0, a)
        elif t is float:
            fmt += "IId"
            values += (_K_F64, 0, a)
        else:
            f, v, k = _pack_other(a, len(values) // 3, stream)
            fmt += f
            values += v
            if k is not None:
                keep = (keep or []) + [k]
    pack = _formats.get(fmt)
    if pack is None:
        pack = _formats[fmt] = struct.Struct(fmt).pack
    if not n:
        return (Arg * 1)(), keep
    return (Arg * n).from_buffer_copy(pack(*values)), keep


def _pack_other(a, i, stream=None):
    if isinstance(a, Buffer):
        return "IIQ", (_K_BUFFER, 0, a.handle), None
    if hasattr(a, "__cuda_array_interface__") or hasattr(a, "__dlpack__"):
        # Another library's array (or a cusafe Array): wrapped for this
        # launch, whose queued work then keeps it alive.
        buf = Buffer.wrap(a, stream=stream)
        return "IIQ", (_K_BUFFER, 0, buf.handle), buf
    if isinstance(a, _Scalar):
        a._check()
        return "II" + _VALUE_FORMAT[a.field], (int(a.kind), 0, a.value), None
    if isinstance(a, Bytes):
        return "IIQ", (_K_BYTES, len(a.data),
                       ctypes.cast(ctypes.c_char_p(a.data),
                                   ctypes.c_void_p).value), a.data
    if isinstance(a, bool):
        raise TypeError("argument %d: pass a bool as I32() or U8()" % i)
    if isinstance(a, int):
        I64(a)._check()
        return "IIq", (_K_I64, 0, int(a)), None
    if isinstance(a, float):
        return "IId", (_K_F64, 0, float(a)), None
    raise TypeError("argument %d: cannot pass %s to a kernel"
                    % (i, type(a).__name__))


def _kernel_launch(*args):
    # Bound to the ctypes function at the first launch.
    global _kernel_launch
    _kernel_launch = library().fn.cusafe_kernel_launch
    return _kernel_launch(*args)


def _launch_packed(*args):
    """cusafe_kernel_launch(handle, config, packed arguments, n) for
    Kernel.launch's fast path: a function object of its own with no
    argtypes, called with ready ctypes values and a bytes object (passed
    as its address), so that ctypes converts nothing."""
    global _launch_packed
    fn = library().cdll["cusafe_kernel_launch"]
    fn.restype = c_status
    _launch_packed = fn
    return fn(*args)


# (grid, block, shared) -> (LaunchConfig, a c_void_p of its address), for
# the default stream only; never removed, so the addresses stay valid.
_fast_configs = {}
# Argument counts as size_t values, made once.
_SIZES = tuple(ctypes.c_size_t(n) for n in range(64))

# The struct format of each typed scalar's value in the cusafe_arg union:
# its own width, padded to 8 bytes (so struct checks the range).
_SCALAR_FORMATS = {"I8": "b7x", "U8": "B7x", "I16": "h6x", "U16": "H6x",
                   "I32": "i4x", "U32": "I4x", "I64": "q", "U64": "Q",
                   "F32": "f4x", "F64": "d"}


def _make_packer(types):
    """A function that packs arguments of exactly these types into the bytes
    of a cusafe_arg array, returning None for arguments of other types; or
    None when a type needs the general path.  Generated per signature, so
    that a launch runs one struct call and no loop."""
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
    names = "".join("a%d, " % i for i in range(len(types)))
    guard = " or ".join("type(a%d) is not _t%d" % (i, i)
                        for i in range(len(types)))
    src = "def pack(args):\n"
    if types:
        src += "    (%s) = args\n" % names
        src += "    if %s:\n        return None\n" % guard
    else:
        src += "    if args:\n        return None\n"
    src += "    return _pack(%s)\n" % ", ".join(fields)
    env = {"_pack": struct.Struct(fmt).pack}
    env.update(("_t%d" % i, t) for i, t in enumerate(types))
    exec(src, env)
    return env["pack"]


def _no_packer(args):
    return None


class PreparedLaunch:
    """A kernel launch with its configuration and arguments converted once
    (Kernel.prepare); calling it launches again, raising CusafeError on a
    failure.  It keeps the kernel and the argument objects alive."""

    __slots__ = ("_fn", "_argv", "_keep")

    def __init__(self, kernel, config, args, stream=None):
        # A function object of its own with no argtypes, called with ctypes
        # values made once: ctypes then converts nothing per call.  The
        # values have the exact C types of cusafe_kernel_launch.
        self._fn = library().cdll["cusafe_kernel_launch"]
        self._fn.restype = ctypes.c_int
        cargs, keep = _pack_args(args, stream)
        self._argv = (ctypes.c_uint64(kernel.handle),
                      ctypes.c_void_p(ctypes.addressof(config)), cargs,
                      ctypes.c_size_t(len(args)))
        self._keep = (kernel, config, args, keep)

    def __call__(self):
        st = self._fn(*self._argv)
        if st:
            library().check(st)


class Kernel(_Object):
    """A kernel of a module (Module.kernel)."""

    # _c_live: _live as a ready ctypes value, for the fast launch path.
    __slots__ = ("_name", "_pack", "_c_live")
    _release_name = "cusafe_kernel_release"

    def __init__(self, *args, **kwargs):
        raise TypeError("use Module.kernel(name)")

    @property
    def name(self):
        return self._name

    @property
    def params(self):
        """The sizes in bytes of the kernel's parameters, as a list."""
        count = ctypes.c_size_t(0)
        _call("cusafe_kernel_get_params", ctypes.byref(count), None, 0,
              self.handle)
        sizes = (ctypes.c_size_t * max(count.value, 1))()
        _call("cusafe_kernel_get_params", ctypes.byref(count), sizes,
              count.value, self.handle)
        return list(sizes[:count.value])

    def suggest_config(self, n, shared=0):
        """(grid, block) that covers n threads with the best occupancy."""
        block, grid = ctypes.c_uint32(0), ctypes.c_uint32(0)
        _call("cusafe_kernel_suggest_config", ctypes.byref(block),
              ctypes.byref(grid), self.handle, shared, n)
        return grid.value, block.value

    def launch(self, grid, block, *args, shared=0, stream=None):
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
        Kernel or Buffer raises ValueError.

        Launches on the default stream whose arguments have the types of
        the kernel's previous launch take a fast path: one generated
        struct call packs the arguments, one ctypes call launches."""
        if stream is None:
            try:
                packed = self._pack(args)
                config = _fast_configs[grid, block, shared][1]
                n = _SIZES[len(args)]
            except Exception:  # a new signature, shape, or a bad value
                packed = None
            if packed is not None:
                st = _launch_packed(self._c_live, config, packed, n)
                if st:
                    self._failed(st, args)
                return
        self._launch_general(grid, block, args, shared, stream)

    def _launch_general(self, grid, block, args, shared, stream):
        """Kernel.launch with every check of the binding; prepares the fast
        path for the next launch of the same shape."""
        config = _launch_config(grid, block, shared, stream)
        cargs, _keep = _pack_args(args, stream)
        st = _kernel_launch(self.handle, ctypes.byref(config), cargs,
                            len(args))
        if st:
            library().check(st)
        if stream is None:
            key = (grid, block, shared)
            try:
                if key not in _fast_configs and len(_fast_configs) < 256:
                    fast = _launch_config(grid, block, shared, None)
                    _fast_configs[key] = (
                        fast, ctypes.c_void_p(ctypes.addressof(fast)))
            except TypeError:  # an unhashable grid or block (a list)
                pass
            self._pack = _make_packer(tuple(map(type, args))) or _no_packer

    def close(self):
        self._c_live.value = 0
        _Object.close(self)

    def detach(self):
        handle = _Object.detach(self)
        self._c_live.value = 0
        return handle

    def _failed(self, status, args):
        """Raises for a failed fast launch: ValueError for a closed object
        (whose handle the fast path passed as 0), else the library's
        error."""
        if self.closed:
            raise ValueError("this cusafe.Kernel is closed")
        for a in args:
            if type(a) is Buffer and a.closed:
                raise ValueError("this cusafe.Buffer is closed")
        library().check(status)

    def prepare(self, grid, block, *args, shared=0, stream=None):
        """A PreparedLaunch: this launch with its configuration and
        arguments converted once, to be run many times for the cost of one
        ctypes call.  The handles are read now: a Buffer closed later makes
        the launch fail with INVALID_HANDLE (the library checks every
        handle), never use freed memory.  Arrays of other libraries are
        wrapped now, once: their memory lives as long as the prepared
        launch, and the producer's work is waited for at this call only."""
        return PreparedLaunch(self, _launch_config(grid, block, shared,
                                                   stream), args, stream)

    __call__ = launch

    def _describe(self):
        return self._name
