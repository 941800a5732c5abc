"""Buffers shared between processes: shareable device memory
(Context.alloc_shareable), its description for another process
(Buffer.export, a BufferExport), its import there (Buffer.from_export),
and the two ways it travels -- a Unix domain socket (send_buffer,
recv_buffer) and multiprocessing, whose pickler takes a shareable Buffer
like any other argument or queued object.

The memory lives while any process maps it: a received Buffer keeps it
after the sender has released its own, exited or been killed.  What
travels is a description and a file descriptor of the memory; the
descriptor must reach the receiver:

- send_buffer() puts it in the socket (SCM_RIGHTS) at once: the sender
  may exit as soon as send_buffer() returns, before the receiver calls
  recv_buffer();
- multiprocessing passes the Buffers among a Process's arguments to the
  child when it starts (spawn and forkserver): the parent may exit once
  start() has returned;
- a Buffer put on a multiprocessing Queue or sent on a Connection is
  fetched by the receiver from the sender's process when it unpickles it
  (as multiprocessing does for every file descriptor): the sender must
  live until the receiver has the Buffer (ConnectionError otherwise).
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib
import os
import pickle
import weakref
from multiprocessing import context as _mp_context
from multiprocessing import reduction as _mp_reduction
from typing import Any, Callable, Optional, Tuple, Type, TypeVar

from ._capi import (CusafeError, IpcDesc, Status, _call, _c_int, c_handle)
from ._objects import Buffer, Context, _count, _handle_of, _Owner

_B = TypeVar("_B", bound=Buffer)
_E = TypeVar("_E", bound="BufferExport")

# The description's fields other than fd, in the order _rebuild takes them.
_FIELDS = ("version", "allocation", "offset", "size", "device_uuid",
           "process")


def _uuid_words(raw: Any) -> str:
    """A device UUID as nvidia-smi writes it: GPU-xxxxxxxx-xxxx-..."""
    h = bytes(raw).hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20],
                                    h[20:])


class BufferExport(_Owner):
    """A shareable Buffer's description for another process
    (Buffer.export()): where the buffer lies in its allocation, on which
    device, and a file descriptor of the memory, which this object owns
    and closes (close(), `with`, or collection).  Another process imports
    it with Buffer.from_export() once the descriptor has reached it
    (send_buffer and multiprocessing carry it).  It cannot be pickled or
    copied: it owns a file descriptor."""

    __slots__ = ("_desc", "_fd", "__weakref__")
    _holds = "it owns a file descriptor"
    _desc: IpcDesc
    _fd: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("cusafe.BufferExport objects are made by "
                        "Buffer.export()")

    @classmethod
    def _take(cls: Type[_E], desc: IpcDesc) -> _E:
        """An object owning desc and its fd."""
        obj = object.__new__(cls)
        obj._desc = desc
        obj._fd = desc.fd
        return obj

    def _live_fd(self) -> int:
        if self._fd < 0:
            raise ValueError("BufferExport is closed")
        return self._fd

    @property
    def fd(self) -> int:
        """The memory's file descriptor, which this object owns (close-on-
        exec).  Raises ValueError once closed or detached."""
        return self._live_fd()

    @property
    def closed(self) -> bool:
        """Whether the descriptor is closed or detached."""
        return self._fd < 0

    @property
    def size(self) -> int:
        """The buffer's bytes."""
        return int(self._desc.size)

    @property
    def offset(self) -> int:
        """Where the buffer begins in its allocation, in bytes."""
        return int(self._desc.offset)

    @property
    def allocation(self) -> int:
        """The bytes of the whole shareable allocation."""
        return int(self._desc.allocation)

    @property
    def device_uuid(self) -> str:
        """The UUID of the memory's device, as nvidia-smi -L writes it
        ("GPU-" and 32 hex digits)."""
        return _uuid_words(self._desc.device_uuid)

    @property
    def process_id(self) -> int:
        """The pid of the process that exported the buffer."""
        return int(self._desc.process) >> 32

    def to_bytes(self) -> bytes:
        """The description without its descriptor: 80 bytes (struct
        cusafe_ipc_desc, fd -1) to send by a transport of your own, with
        the descriptor beside it (socket.send_fds, SCM_RIGHTS); the other
        process rebuilds the export with from_bytes().  Works after
        close()."""
        d = IpcDesc.from_buffer_copy(self._desc)
        d.fd = -1
        return bytes(d)

    @classmethod
    def from_bytes(cls: Type[_E], data: bytes, fd: int) -> _E:
        """The export that to_bytes() described in another process, with
        `fd`, the memory's descriptor as received in this one, which the
        new object owns (and closes) from now on, also when data is
        refused, and makes close-on-exec, as an export's; import it with
        Buffer.from_export().  Raises TypeError
        for an fd that is not an int (a bool is not one) and data without
        the buffer protocol or not C-contiguous, OverflowError for an fd
        beyond a C int, ValueError for an fd that is negative or not open
        (nothing is closed then) and data that is not 80 bytes."""
        if isinstance(fd, bool):
            raise TypeError("fd must be an int, not bool")
        fd = _c_int(fd, "fd")
        if fd < 0:
            raise ValueError("fd %d is not a file descriptor" % fd)
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            raise ValueError("fd %d is not an open file descriptor"
                             % fd) from None
        try:
            os.set_inheritable(fd, False)  # as exports' own descriptors
            raw = memoryview(data).cast("B")
            if raw.nbytes != ctypes.sizeof(IpcDesc):
                raise ValueError(
                    "a BufferExport is %d bytes (to_bytes()), not %d"
                    % (ctypes.sizeof(IpcDesc), raw.nbytes))
            desc = IpcDesc.from_buffer_copy(raw)
        except BaseException:
            try:
                os.close(fd)
            except OSError:  # closed by others meanwhile: the error is data's
                pass
            raise
        desc.fd = fd
        return cls._take(desc)

    def close(self) -> None:
        """Closes the descriptor (idempotent)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def detach(self) -> int:
        """Hands the descriptor over to the caller, who must close it; this
        object is closed.  Raises ValueError once closed."""
        fd = self._live_fd()
        self._fd = -1
        return fd

    def __enter__(self: _E) -> _E:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except (AttributeError, OSError):  # never set up; closed by others
            pass

    def __repr__(self) -> str:
        return "<cusafe.BufferExport %d bytes at offset %d of %d on %s%s>" % (
            self.size, self.offset, self.allocation, self.device_uuid,
            ", closed" if self.closed else ", fd %d" % self._fd)


def alloc_shareable(ctx: Context, size: int) -> Buffer:
    """Context.alloc_shareable (see there)."""
    ctx_handle = _handle_of(ctx, Context, "ctx")
    size = _count(size, "size")
    h = c_handle(0)
    _call("cusafe_buffer_alloc_shareable", ctypes.byref(h), ctx_handle, size)
    return Buffer._adopt(h.value)


def export(buffer: Buffer) -> BufferExport:
    """Buffer.export (see there)."""
    desc = IpcDesc()
    try:
        _call("cusafe_buffer_export", ctypes.byref(desc),
              _handle_of(buffer, Buffer, "buffer"))
    except CusafeError as e:
        if e.status != Status.INVALID_VALUE or \
                "cusafe_buffer_alloc_shareable" not in e.message:
            raise
        # The library's words name its C call: these, the package's.
        raise CusafeError(e.status, e.message.replace(
            "cusafe_buffer_alloc_shareable", "Context.alloc_shareable"),
            e.cuda_error) from None
    return BufferExport._take(desc)


def _import(cls: Type[_B], desc: IpcDesc, ctx: Optional[Context]) -> _B:
    """A Buffer (of class cls) of the memory desc names, in ctx or, for
    None, in the context of the device that holds it; desc.fd stays the
    caller's."""
    if ctx is None:
        device = ctypes.c_int(-1)
        _call("cusafe_ipc_device", ctypes.byref(device), ctypes.byref(desc))
        with Context(device.value) as own:
            return _import(cls, desc, own)
    ctx_handle = _handle_of(ctx, Context, "ctx")
    h = c_handle(0)
    _call("cusafe_buffer_import", ctypes.byref(h), ctx_handle,
          ctypes.byref(desc))
    return cls._adopt(h.value)


def from_export(cls: Type[_B], export: BufferExport,
                ctx: Optional[Context]) -> _B:
    """Buffer.from_export (see there)."""
    if not isinstance(export, BufferExport):
        raise TypeError("export must be a cusafe.BufferExport, not %s"
                        % type(export).__name__)
    export._live_fd()
    return _import(cls, export._desc, ctx)


def _socket_fd(sock: Any) -> int:
    """The descriptor of a socket object (its fileno()) or an int."""
    fileno = getattr(sock, "fileno", None)
    fd = fileno() if fileno is not None else sock
    if isinstance(fd, bool):  # not stdin's or stdout's number
        raise TypeError("sock must be a socket or an int, not bool")
    return _c_int(fd, "sock")


def send_buffer(sock: Any, buffer: Buffer) -> None:
    """Sends a shareable Buffer (or a view of one) over a connected Unix
    domain socket (a socket.socket of AF_UNIX, or its descriptor), in one
    message that carries the memory's file descriptor (SCM_RIGHTS): the
    receiver's recv_buffer() maps it, even once this process has exited.
    Waits for the work queued on the buffer first (Buffer.export).  Raises
    what Buffer.export raises (CusafeError INVALID_VALUE for a buffer that
    is not shareable), CusafeError INVALID_VALUE for a socket that is not
    a connected AF_UNIX socket or a failed send ("cannot send on socket
    5: Broken pipe"); TypeError for sock of no fileno() and no int (a
    bool is none)."""
    fd = _socket_fd(sock)
    with export(buffer) as e:
        _call("cusafe_ipc_send", fd, ctypes.byref(e._desc))


def recv_buffer(sock: Any, ctx: Optional[Context] = None) -> Buffer:
    """Receives a Buffer that send_buffer() sent on the socket's other end,
    as a new Buffer of the shared memory, which the caller owns; in ctx,
    or by default in the context of the device that holds the memory
    (found by UUID: ordinals may differ between processes).  Blocks until
    a message comes, without the GIL.  Raises CusafeError INVALID_VALUE for
    a socket closed by its peer or a message that is not send_buffer()'s,
    what Buffer.from_export raises, and TypeError as send_buffer."""
    fd = _socket_fd(sock)
    if ctx is not None:  # refused before a message is taken, not after
        _handle_of(ctx, Context, "ctx")
    desc = IpcDesc()
    _call("cusafe_ipc_recv", fd, ctypes.byref(desc))
    try:
        return _import(Buffer, desc, ctx)
    finally:
        os.close(desc.fd)


# --------------------------------------------------------------------------
# multiprocessing
# --------------------------------------------------------------------------


def _find_class(module: str, qualname: str) -> Any:
    """The object that pickle would find for a class by these names;
    raises what the import or the lookup raises."""
    if "<locals>" in qualname.split("."):
        raise AttributeError("it is local to a function")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _class_name(cls: Type[Buffer]) -> Tuple[str, str]:
    """The names by which a receiver finds cls: raises pickle.PicklingError
    where pickle could not name it, before anything is exported."""
    module, qualname = cls.__module__, cls.__qualname__
    try:
        found = _find_class(module, qualname)
    except Exception as e:
        found = e
    if found is not cls:
        raise pickle.PicklingError(
            "cusafe.Buffer subclass %s.%s cannot be sent: pickle cannot "
            "name it (%s); define it at the top level of a module"
            % (module, qualname, found if isinstance(found, Exception)
               else "that name is another object"))
    return module, qualname


def _rebuild(fields: Tuple[int, int, int, int, bytes, int], dup: Any,
             sender: int,
             cls_name: Tuple[str, str] = ("cusafe", "Buffer")) -> Buffer:
    """The receiver's half of _reduce: the Buffer of the memory, of the
    sender's class, in the context of the device that holds it."""
    try:
        fd = dup.detach()
    except _mp_context.AuthenticationError as e:
        raise ConnectionError(
            "a cusafe.Buffer sent by process %d could not be received: its "
            "sender's multiprocessing refused this process (%s); a Buffer "
            "on a Queue or Connection travels only between processes of one "
            "multiprocessing family; use send_buffer() between others"
            % (sender, e)) from e
    except OSError as e:
        raise ConnectionError(
            "a cusafe.Buffer sent by process %d could not be received: its "
            "sender is gone (%s); the sender must live until the receiver "
            "has the Buffer, or pass it among a Process's arguments or "
            "with send_buffer()" % (sender, e)) from e
    try:
        # multiprocessing hands it over inheritable: a process started
        # meanwhile (an import below may start one) must not keep the memory.
        os.set_inheritable(fd, False)
        module, qualname = cls_name
        try:
            cls = _find_class(module, qualname)
        except Exception as e:
            cls = e
        if not (isinstance(cls, type) and issubclass(cls, Buffer)):
            raise pickle.UnpicklingError(
                "a cusafe.Buffer sent by process %d could not be received: "
                "its class %s.%s is not a cusafe.Buffer subclass in this "
                "process (%s); define the subclass at the top level of a "
                "module that both processes import"
                % (sender, module, qualname,
                   cls if isinstance(cls, Exception) else
                   "that name is %s" % type(cls).__name__))
        version, allocation, offset, size, uuid, process = fields
        desc = IpcDesc(version=version, fd=fd, allocation=allocation,
                       offset=offset, size=size, process=process)
        ctypes.memmove(desc.device_uuid, uuid, len(desc.device_uuid))
        return _import(cls, desc, None)
    finally:
        os.close(fd)


def _reduce(buffer: Buffer) -> Tuple[Callable[..., Buffer], Tuple[Any, ...]]:
    """How multiprocessing's pickler sends a Buffer: its description, and
    its memory's descriptor as multiprocessing sends descriptors (to a
    child being started, or fetched from this process by the receiver)."""
    cls_name = _class_name(type(buffer))
    try:
        e = export(buffer)
    except CusafeError as err:
        if err.status != Status.INVALID_VALUE:
            raise
        raise TypeError(
            "cusafe.%s cannot be pickled or copied: its memory (%s) is not "
            "shareable, and its handle means nothing in another process; "
            "allocate it with Context.alloc_shareable(size) to send it"
            % (type(buffer).__name__, buffer._describe())) from None
    d = e._desc
    fields = (int(d.version), int(d.allocation), int(d.offset), int(d.size),
              bytes(d.device_uuid), int(d.process))
    popen = _mp_context.get_spawning_popen()
    fd = e.detach()
    try:
        dup = _mp_reduction.DupFd(fd)
    except BaseException:
        os.close(fd)
        raise
    if popen is not None:
        # A child being started gets the descriptor itself, when start()
        # launches it: it stays open while the Process's starter lives.
        weakref.finalize(popen, os.close, fd)
    else:
        os.close(fd)  # the resource sharer holds its own copy
    return _rebuild, (fields, dup, os.getpid(), cls_name)


def _register(cls: Type[Buffer]) -> None:
    _mp_reduction.ForkingPickler.register(cls, _reduce)


_register(Buffer)
