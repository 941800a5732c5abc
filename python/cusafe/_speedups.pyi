"""cusafe._speedups: the hot paths of cusafe in C (python/cusafe/_speedups.c).
The package gives it the loaded library's function addresses (init()) and
falls back to ctypes without it."""

from typing import Any, Callable, Dict, Optional, Tuple, Type, TypeVar

_O = TypeVar("_O", bound="Object")

def init(addresses: Dict[str, int], /) -> None:
    """Takes the library's function addresses (name: address); needs
    cusafe_retain and cusafe_release, takes the types' own releases and
    cusafe_buffer_alloc where given.  KeyError, TypeError or ValueError for
    a missing, non-int or null address; the previous addresses stay."""

def setup(*, check: Callable[[int], None],
          count: Callable[[Any, str], int], kinds: Dict[int, int],
          buffer: Type[BufferObject], stream: Type[Object],
          scalars: Tuple[type, ...], bytes: type,
          launch: Callable[..., None], foreign: Callable[[Any], bool],
          wrap: Callable[[Any, Any], BufferObject]) -> None:
    """What the package gives once its classes exist: the function that
    raises the library's error for a status, the one that converts a size
    (or raises), the memory kinds alloc() takes, the class of the Buffers
    that alloc() makes, the class of Streams, the typed scalars I8 ... F64,
    the class Bytes, the ctypes Kernel.launch, which runs the launches
    of other arguments, the function that tells another library's array,
    and the one that wraps it for a launch on a stream."""

def retain_handle(handle: int) -> None:
    """cusafe.retain_handle: one C call for an exact int of 64 bits; the
    ctypes twin (handle_functions()) takes every other call."""

def release_handle(handle: int) -> None:
    """cusafe.release_handle, without the GIL: one C call for an exact int
    of 64 bits; the ctypes twin takes every other call."""

def handle_functions(retain_handle: Callable[[int], None],
                     release_handle: Callable[[int], None], /) -> None:
    """The ctypes retain_handle and release_handle, which take the calls
    that this module's do not make themselves."""

def at_exit() -> None:
    """From now on a collected Object releases nothing."""

def retain(handle: int, /) -> int:
    """cusafe_retain(handle); its status.  TypeError for a non-int,
    OverflowError outside 0..2**64-1, RuntimeError before init()."""

def release(handle: int, /) -> int:
    """cusafe_release(handle), without the GIL; its status.  TypeError for
    a non-int, OverflowError outside 0..2**64-1, RuntimeError before
    init()."""

class Object:
    """An owned reference on one library handle, released by close(),
    detach(), `with` or the collector, once."""

    @property
    def _handle(self) -> int: ...
    @property
    def _live(self) -> int: ...
    @property
    def handle(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def detach(self) -> int: ...
    def __enter__(self: _O) -> _O: ...
    def __exit__(self, *exc: object) -> None: ...
    def _own(self, handle: Any, /) -> None: ...

class BufferObject(Object):
    """An Object with a size and a memory kind."""

    _size: int
    _memory: int

class ContextObject(Object):
    """An Object with alloc()."""

    def alloc(self, size: int, memory: int = ...) -> BufferObject: ...

class KernelObject(Object):
    """An Object with launch()."""

    def launch(self, grid: Any, block: Any, *args: Any, shared: int = ...,
               stream: Optional[Object] = ..., cluster: Any = ...,
               cooperative: bool = ...,
               programmatic_serialization: bool = ...,
               priority: Optional[int] = ...) -> None: ...

class PreparedObject:
    """A prepared launch: calling it launches."""

    def _prepare(self, kernel: int, config: Any, args: Optional[bytes],
                 attrs: Any, /) -> None: ...
    def __call__(self) -> None: ...
