"""cusafe -- a ctypes binding of libcusafe, the resource-safe CUDA runtime.

`make install` installs this package beside the library (and records the
library's path in it); `pip install ./python` installs the same package
against an installed libcusafe.  It needs nothing but the standard
library; numpy arrays work wherever bytes do, through the buffer protocol.
Its C accelerator, cusafe._speedups, runs the hot paths where it was built
(implementation() says whether; CUSAFE_PURE_PYTHON=1 turns it off).

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
use thus stay valid until the very end.  An object that owns or holds a
handle (also an Array or a PreparedLaunch) cannot be copied or pickled:
copy.copy, copy.deepcopy and pickle raise TypeError, since a copy would
release the same reference a second time, and a handle means nothing in
another process.  After shutdown() (or at exit) every
release is a no-op and every other call raises CusafeError with status
SHUTDOWN.  In a child process forked after CUDA was used, every call raises
CusafeError with status FORKED.

Integers.  Every integer argument (sizes, offsets, shapes, strides,
grids, flags, devices, handles, streams) is an int or has __index__
(numpy.int64); a float or str raises TypeError, a negative one where C
takes an unsigned type ValueError, one too large for its C type
OverflowError -- never cut down by ctypes to another value.  A string
for C (a kernel's name, a path, a label, a source) with a NUL character
raises ValueError: C would end it there.

Threads.  Every function and object may be used from any thread.
"""

from __future__ import annotations

from ._capi import (  # noqa: F401
    Arg, ArgKind, CusafeError, DeviceProperties, EVENT_BLOCKING_SYNC,
    EVENT_DISABLE_TIMING, HandleType, LaunchConfig, Library,
    LibraryNotFoundError, MEMORY_DEVICE, MEMORY_HOST_PINNED, MEMORY_MANAGED,
    Memory, NULL_HANDLE, NoDeviceError, STREAM_NON_BLOCKING, Status,
    _PROTOTYPES, c_enum, c_handle, c_status, device_count, device_properties,
    handle_type, implementation, library, load, release_handle,
    retain_handle, shutdown, status_string, version)
from ._objects import (  # noqa: F401
    Buffer, Context, Event, Graph, Module, Stream)
from ._interop import Array, from_dlpack  # noqa: F401
from ._ipc import BufferExport, recv_buffer, send_buffer  # noqa: F401
from ._launch import (  # noqa: F401
    Bytes, F32, F64, I8, I16, I32, I64, Kernel, PreparedLaunch, U8, U16, U32,
    U64)

__version__ = "0.1.0"
"""The version of this package, which is that of the library it binds."""

__all__ = [
    "Status", "HandleType", "Memory", "ArgKind",
    "CusafeError", "NoDeviceError", "LibraryNotFoundError",
    "DeviceProperties", "Arg", "LaunchConfig",
    "load", "library", "status_string", "version", "device_count",
    "device_properties", "shutdown", "release_handle", "retain_handle",
    "handle_type", "implementation",
    "Context", "Stream", "Event", "Buffer", "Module", "Kernel", "Graph",
    "Array",
    "from_dlpack",
    "BufferExport", "send_buffer", "recv_buffer",
    "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "F32", "F64",
    "Bytes",
    "MEMORY_DEVICE", "MEMORY_HOST_PINNED", "MEMORY_MANAGED",
    "STREAM_NON_BLOCKING", "EVENT_DISABLE_TIMING", "EVENT_BLOCKING_SYNC",
]
