"""The C interface of libcusafe, mirrored from include/cusafe.h: enums,
structs, the ctypes prototypes of every function, errors, and loading the
library."""

from __future__ import annotations

import ctypes
import enum
import importlib
import operator
import os
import threading
from types import ModuleType
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, NoReturn,
                    Optional, Tuple, Type, Union, cast)

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
    CAPTURING = 20


class HandleType(enum.IntEnum):
    """cusafe_handle_type."""
    INVALID = 0
    CONTEXT = 1
    STREAM = 2
    EVENT = 3
    BUFFER = 4
    MODULE = 5
    KERNEL = 6
    GRAPH = 7


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

    # The fields' Python types, for type checkers (annotations only).
    name: bytes
    total_memory: int
    compute_capability_major: int
    compute_capability_minor: int
    multiprocessor_count: int
    max_threads_per_block: int
    max_block_dim: ctypes.Array[ctypes.c_int]
    max_grid_dim: ctypes.Array[ctypes.c_int]
    shared_memory_per_block: int
    shared_memory_per_block_optin: int
    warp_size: int
    managed_memory: int
    concurrent_managed_access: int
    memory_pools: int
    pci_bus_id: int
    pci_device_id: int
    pci_domain_id: int

    @property
    def device_name(self) -> str:
        """The device's name, as a str (`name` is the raw bytes)."""
        return self.name.decode("utf-8", "replace")

    @property
    def compute_capability(self) -> Tuple[int, int]:
        """(major, minor), such as (9, 0)."""
        return (self.compute_capability_major, self.compute_capability_minor)

    def __repr__(self) -> str:
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


class LaunchAttrId(enum.IntEnum):
    """cusafe_launch_attr_id."""
    CLUSTER = 1
    NON_PORTABLE_CLUSTER = 2
    COOPERATIVE = 3
    PROGRAMMATIC_SERIALIZATION = 4
    PRIORITY = 5


class _LaunchAttrValue(ctypes.Union):
    _fields_ = [
        ("dim", ctypes.c_uint32 * 3),
        ("flag", ctypes.c_int32),
        ("priority", ctypes.c_int32),
        ("pad", ctypes.c_uint64 * 2),
    ]


class LaunchAttr(ctypes.Structure):
    """cusafe_launch_attr: one attribute of a launch, 24 bytes."""
    _fields_ = [
        ("id", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("value", _LaunchAttrValue),
    ]


class IpcDesc(ctypes.Structure):
    """cusafe_ipc_desc: what another process needs to map a shareable
    buffer, 80 bytes."""
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("fd", ctypes.c_int32),
        ("allocation", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("device_uuid", ctypes.c_uint8 * 16),
        ("process", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 3),
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
_PROTOTYPES: Dict[str, Tuple[Any, List[Any]]] = {
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
    # between processes
    "cusafe_buffer_alloc_shareable": (c_status, [_P(_h), _h, _sz]),
    "cusafe_buffer_export": (c_status, [_P(IpcDesc), _h]),
    "cusafe_buffer_import": (c_status, [_P(_h), _h, _P(IpcDesc)]),
    "cusafe_ipc_send": (c_status, [ctypes.c_int, _P(IpcDesc)]),
    "cusafe_ipc_recv": (c_status, [ctypes.c_int, _P(IpcDesc)]),
    "cusafe_ipc_device": (c_status, [_P(ctypes.c_int), _P(IpcDesc)]),
    "cusafe_python_release": (None, [_vp]),
    # graphs
    "cusafe_stream_begin_capture": (c_status, [_h]),
    "cusafe_stream_end_capture": (c_status, [_P(_h), _h]),
    "cusafe_stream_is_capturing": (c_status, [_P(ctypes.c_int), _h]),
    "cusafe_graph_instantiate": (c_status, [_h]),
    "cusafe_graph_launch": (c_status, [_h, _h]),
    "cusafe_graph_retain": (c_status, [_h]),
    "cusafe_graph_release": (c_status, [_h]),
    # cusafe_dlpack.h (absent from a library built with --disable-dlpack):
    # tensors as addresses
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
    "cusafe_kernel_declare": (c_status, [_h, ctypes.c_char_p]),
    "cusafe_kernel_get_signature": (c_status, [ctypes.c_char_p, _sz, _P(_sz),
                                               _h]),
    "cusafe_kernel_launch": (c_status, [_h, _P(LaunchConfig), _P(Arg), _sz]),
    "cusafe_kernel_launch_ex": (c_status, [_h, _P(LaunchConfig),
                                           _P(LaunchAttr), _sz, _P(Arg),
                                           _sz]),
    "cusafe_kernel_suggest_config": (c_status, [_P(ctypes.c_uint32),
                                                _P(ctypes.c_uint32), _h,
                                                _sz, _sz]),
}

del _P, _h, _sz, _vp

# The functions of the hot paths, bound a second time in Library.raw with
# no argtypes (restype cusafe_status): callers pass ready ctypes values of
# the exact C types (c_uint64 handles, c_size_t sizes, byref() pointers;
# small ints only where the C type is int or an enum), so that ctypes
# converts nothing per call.
_RAW = ("cusafe_retain", "cusafe_release", "cusafe_context_release",
        "cusafe_stream_release", "cusafe_event_release",
        "cusafe_buffer_alloc", "cusafe_buffer_release",
        "cusafe_module_release", "cusafe_kernel_release",
        "cusafe_graph_release", "cusafe_kernel_launch",
        "cusafe_kernel_launch_ex")

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

    # Set (to the compiler's log) on an error of status COMPILE only.
    log: str

    def __init__(self, status: int, message: str = "",
                 cuda_error: int = 0) -> None:
        """An error of `status` (kept as a Status where it is one), with
        the library's `message` and the `cuda_error` behind it."""
        try:
            status = Status(status)
        except ValueError:
            status = int(status)
        super().__init__(status, message, cuda_error)
        self.status: Union[Status, int] = status
        self.message = message
        self.cuda_error = cuda_error

    def __str__(self) -> str:
        text = status_string(self.status)
        return "%s: %s" % (text, self.message) if self.message else text

    def __repr__(self) -> str:
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
    20: "stream capturing",
}


def status_string(status: int) -> str:
    """The library's description of a status (cusafe_status_string)."""
    try:
        lib = library()
    except LibraryNotFoundError:
        return _STATUS_WORDS.get(int(status), "unknown status")
    return cast(str, lib.fn.cusafe_status_string(int(status)).decode(
        "utf-8", "replace"))


# --------------------------------------------------------------------------
# The C extension (cusafe._speedups), where it was built
# --------------------------------------------------------------------------

# The package runs on ctypes alone; the extension, where it imports and
# CUSAFE_PURE_PYTHON is not "1", takes over the hot paths: the owning
# objects' handle and release (the C base of Context, Buffer, ...),
# Context.alloc, retain_handle and release_handle.  It links no libcusafe:
# load() gives it the addresses of the loaded library's functions, so it
# calls the same library as ctypes does.  Both ways keep one behaviour: the
# pure one is the reference.  The choice is made once, at import: the
# classes are built on it.
_speedups: Optional[ModuleType] = None
if os.environ.get("CUSAFE_PURE_PYTHON") != "1":
    try:
        _speedups = importlib.import_module("._speedups", __package__)
    except ImportError:
        _speedups = None

# The extension's functions for the loaded library; None where the package
# takes the ctypes path.
_c_retain: Optional[Callable[[int], int]] = None
_c_release: Optional[Callable[[int], int]] = None

# The functions whose addresses the extension needs, and those it takes
# where the library has them (else: a type's release is cusafe_release;
# the C allocation raises the error of a missing function).
_SPEEDUPS_FUNCTIONS = ("cusafe_retain", "cusafe_release")
_SPEEDUPS_OPTIONAL = (
    "cusafe_context_release", "cusafe_stream_release",
    "cusafe_event_release", "cusafe_buffer_release",
    "cusafe_module_release", "cusafe_kernel_release",
    "cusafe_graph_release", "cusafe_buffer_alloc", "cusafe_kernel_launch",
    "cusafe_kernel_launch_ex")


def _init_speedups(cdll: ctypes.CDLL, path: str) -> None:
    """Gives the extension the functions of `cdll`, the library just
    loaded from `path`.  Raises LibraryNotFoundError for a library without
    cusafe_retain or cusafe_release, which no object could release
    through."""
    global _c_retain, _c_release
    if _speedups is None:
        return
    addresses: Dict[str, int] = {}
    for name in _SPEEDUPS_FUNCTIONS + _SPEEDUPS_OPTIONAL:
        try:
            address = ctypes.cast(cdll[name], ctypes.c_void_p).value
        except AttributeError:
            address = None
        if address:
            addresses[name] = address
        elif name in _SPEEDUPS_FUNCTIONS:
            raise LibraryNotFoundError(
                "%s is no libcusafe: it does not export %s" % (path, name))
    _speedups.init(addresses)
    _c_retain = _speedups.retain
    _c_release = _speedups.release


def implementation() -> str:
    """Which code runs the hot paths: "c" (the extension cusafe._speedups)
    or "python" (ctypes: no extension built, or CUSAFE_PURE_PYTHON=1 in
    the environment at import).  Loads nothing."""
    return "python" if _speedups is None else "c"


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------


class _Missing:
    """Stands for a function that the loaded library does not export (an
    older libcusafe than this binding): calling it raises CusafeError."""

    def __init__(self, name: str, path: str) -> None:
        self.name = name
        self.path = path

    def __call__(self, *args: Any) -> NoReturn:
        raise CusafeError(Status.NOT_SUPPORTED,
                          "%s does not export %s (is it older than this "
                          "binding?)" % (self.path, self.name))


class _Functions:
    if TYPE_CHECKING:
        # Attributes are set per function of _PROTOTYPES: ctypes functions
        # (or _Missing), dynamic for a type checker.
        def __getattr__(self, name: str) -> Any: ...


class Library:
    """A loaded libcusafe.  `cdll` is the ctypes.CDLL; `fn` holds every
    function of cusafe.h as a ctypes function with its argtypes and restype
    declared (a function missing from the library raises CusafeError with
    status NOT_SUPPORTED when called); `raw` holds the functions of the
    binding's hot paths again, without argtypes, for callers that pass
    ctypes values of the exact C types; `path` is what was loaded; `missing`
    lists the functions of the headers that the library lacks."""

    def __init__(self, cdll: ctypes.CDLL, path: str) -> None:
        self.cdll = cdll
        self.path = path
        self.fn = _Functions()
        self.raw = _Functions()
        self.missing: List[str] = []
        for name in _RAW:
            try:
                f = cdll[name]
            except AttributeError:  # an older library: see `missing`
                setattr(self.raw, name, _Missing(name, path))
                continue
            f.restype = c_status
            setattr(self.raw, name, f)
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

    def check(self, status: int) -> None:
        """Raises the error for a failed call; the message and the CUDA
        error are the calling thread's, so call it right after the call."""
        if status == 0:
            return
        message = self.fn.cusafe_last_error_message()
        message = message.decode("utf-8", "replace") if message else ""
        cuda_error = self.fn.cusafe_last_cuda_error()
        cls: Type[CusafeError] = NoDeviceError if status in (Status.NO_DRIVER,
                                          Status.NO_DEVICE) else CusafeError
        err = cls(status, message, cuda_error)
        if status == Status.COMPILE:
            log = self.fn.cusafe_last_compile_log()
            err.log = log.decode("utf-8", "replace") if log else ""
        try:
            raise err
        finally:
            # No cycle of the error, its traceback and this frame: the
            # frames of a failed call go as soon as the error does.
            del err

    def __repr__(self) -> str:
        return "<cusafe.Library %r>" % (self.path,)


_lock = threading.Lock()
_library: Optional[Library] = None

DEFAULT_NAMES = ("libcusafe.so.0", "libcusafe.so")


def _installed_library() -> Optional[str]:
    """The library's path that `make install` recorded beside this package
    (_config.py), or None for a package installed otherwise (pip)."""
    try:
        config = importlib.import_module("._config", __package__)
    except ImportError:
        return None
    path = getattr(config, "LIBRARY", None)
    return path if isinstance(path, str) and os.path.exists(path) else None


def load(path: Optional[str] = None) -> Library:
    """Loads libcusafe and returns the Library.  `path`: the file to load;
    None: $CUSAFE_LIBRARY if set, else the library that was installed with
    this package (its path recorded by `make install`), else
    libcusafe.so.0, then libcusafe.so, through the dynamic linker's search
    path.  Loading twice returns the
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
            recorded = _installed_library()
            if recorded:
                candidates.insert(0, ("installed with this package",
                                      recorded))
        tried: List[str] = []
        for origin, name in candidates:
            try:
                cdll = ctypes.CDLL(name)
            except OSError as e:
                tried.append("%s (%s): %s" % (name, origin, e))
                continue
            loaded = Library(cdll, name)
            _init_speedups(cdll, name)
            _library = loaded
            return _library
        raise LibraryNotFoundError(
            "cannot load libcusafe; tried " + "; ".join(tried) +
            ". Install cusafe (and run ldconfig), or set CUSAFE_LIBRARY to "
            "the path of libcusafe.so")


def library() -> Library:
    """The loaded Library, loading the default one on first use."""
    lib = _library
    return lib if lib is not None else load()


def _call(name: str, *args: Any) -> None:
    """Calls a function of Library.fn and raises its error; an argument
    that ctypes cannot convert raises TypeError."""
    lib = library()
    try:
        status = getattr(lib.fn, name)(*args)
    except ctypes.ArgumentError as e:
        raise TypeError("%s: %s" % (name, e)) from None
    if status:
        lib.check(status)


# --------------------------------------------------------------------------
# Integers at the border
# --------------------------------------------------------------------------

# ctypes converts a Python int to a C integer type by dropping the bits
# that do not fit, silently: -1 becomes SIZE_MAX, 2**64 + 8 becomes 8.
# Every integer the caller gives is therefore taken through __index__
# (ints, and those of other libraries: numpy.int64, ...; never a float,
# str or bytes) and checked against its C type before ctypes sees it.


def _index(value: Any, what: str) -> int:
    """value as an int (operator.index: int, numpy.int64, ...); TypeError
    naming `what` for anything else (float, str, bytes, None, ...)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("%s must be an int, not %s"
                        % (what, type(value).__name__)) from None


_U64_MAX = 2**64 - 1


def _unsigned(value: Any, what: str, bits: int = 64) -> int:
    """value as an int for an unsigned C type of `bits` bits (size_t,
    a handle, a cudaStream_t: 64; unsigned int: 32): TypeError for a
    non-int, ValueError for a negative one, OverflowError for one that
    does not fit."""
    n = _index(value, what)
    if n < 0:
        raise ValueError("%s must not be negative: %d" % (what, n))
    if n >> bits:
        raise OverflowError("%s %d does not fit %d bits" % (what, n, bits))
    return n


def _c_int(value: Any, what: str) -> int:
    """value as an int for a C int (a device ordinal, a priority):
    TypeError for a non-int, OverflowError outside the range of int."""
    n = _index(value, what)
    if not -2**31 <= n < 2**31:
        raise OverflowError("%s %d does not fit a C int" % (what, n))
    return n


# --------------------------------------------------------------------------
# Library-wide functions
# --------------------------------------------------------------------------


def version() -> str:
    """The library's version, "MAJOR.MINOR.PATCH"."""
    return cast(str, library().fn.cusafe_version_string().decode())


def device_count() -> int:
    """The number of CUDA devices.  Raises NoDeviceError without a driver
    or device."""
    n = ctypes.c_int(0)
    _call("cusafe_device_count", ctypes.byref(n))
    return n.value


def device_properties(device: int = 0) -> DeviceProperties:
    """The DeviceProperties of a device.  Raises TypeError for a device
    that is not an int, OverflowError for one beyond a C int, CusafeError
    INVALID_DEVICE for one that does not exist."""
    props = DeviceProperties()
    _call("cusafe_device_get_properties", ctypes.byref(props),
          _c_int(device, "device"))
    return props


def shutdown() -> None:
    """Destroys every object still alive, in dependency order, and shuts
    the library down (cusafe_shutdown).  Afterwards releases are no-ops and
    every other call raises CusafeError with status SHUTDOWN.  Idempotent."""
    _call("cusafe_shutdown")


def handle_type(handle: int) -> HandleType:
    """The HandleType of a live handle (an int).  Raises CusafeError
    INVALID_HANDLE for a stale or forged one; TypeError, ValueError or
    OverflowError for a value that is not a 64-bit unsigned int (never
    cut down to one: 2**64 + h is not h)."""
    t = c_enum(0)
    _call("cusafe_handle_get_type", ctypes.byref(t),
          _unsigned(handle, "handle"))
    return HandleType(t.value)


def retain_handle(handle: int) -> None:
    """Adds a reference to a live handle (an int) of any type
    (cusafe_retain): the caller owns it and must release it
    (release_handle).  Raises CusafeError INVALID_HANDLE for a stale or
    null handle, SHUTDOWN after shutdown(); TypeError, ValueError or
    OverflowError for a value that is not a 64-bit unsigned int."""
    fast = _c_retain
    if fast is not None:
        try:  # the extension takes ints of 64 bits ...
            st = fast(handle)
        except (TypeError, OverflowError):
            # ... and _unsigned explains the rest as the ctypes path does,
            # or converts what it takes (numpy.int64: __index__).
            st = fast(_unsigned(handle, "handle"))
        if st:
            library().check(st)
        return
    try:  # ctypes converts (the common case costs one comparison) ...
        c = c_handle(handle)
    except TypeError:
        _unsigned(handle, "handle")  # ... and what it refuses, or cuts
        raise  # down silently, _unsigned explains
    if c.value != handle:
        _unsigned(handle, "handle")
    st = library().raw.cusafe_retain(c)
    if st:
        library().check(st)


def release_handle(handle: int) -> None:
    """Drops one reference of a handle of any type (cusafe_release); the
    last one destroys the object once its children and queued work are
    gone.  Raises CusafeError INVALID_HANDLE for a stale or forged handle
    (a double release is caught, never undefined).  Releasing NULL_HANDLE
    (0), and any release after shutdown(), is a no-op.  A value that is
    not a 64-bit unsigned int raises TypeError, ValueError or
    OverflowError, and releases nothing."""
    fast = _c_release
    if fast is not None:
        try:  # the extension takes ints of 64 bits ...
            st = fast(handle)
        except (TypeError, OverflowError):
            # ... and _unsigned explains the rest as the ctypes path does,
            # or converts what it takes (numpy.int64: __index__).
            st = fast(_unsigned(handle, "handle"))
        if st:
            library().check(st)
        return
    try:  # ctypes converts (the common case costs one comparison) ...
        c = c_handle(handle)
    except TypeError:
        _unsigned(handle, "handle")  # ... and what it refuses, or cuts
        raise  # down silently, _unsigned explains
    if c.value != handle:
        _unsigned(handle, "handle")
    st = library().raw.cusafe_release(c)
    if st:
        library().check(st)


# The extension's functions, where it was built, take the public names (one
# C call each for a handle that is an exact int); the ctypes ones above
# take every other call from them.
_retain_handle_py = retain_handle
_release_handle_py = release_handle
if not TYPE_CHECKING and _speedups is not None:
    _speedups.handle_functions(_retain_handle_py, _release_handle_py)
    retain_handle = _speedups.retain_handle
    release_handle = _speedups.release_handle
