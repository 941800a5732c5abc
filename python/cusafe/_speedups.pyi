"""cusafe._speedups: the hot paths of cusafe in C (python/cusafe/_speedups.c).
The package gives it the loaded library's function addresses (init()) and
falls back to ctypes without it."""

from typing import Dict

def init(addresses: Dict[str, int], /) -> None:
    """Takes the library's function addresses (name: address); needs
    cusafe_retain and cusafe_release.  KeyError, TypeError or ValueError for
    a missing, non-int or null address; the previous addresses stay."""

def retain(handle: int, /) -> int:
    """cusafe_retain(handle); its status.  TypeError for a non-int,
    OverflowError outside 0..2**64-1, RuntimeError before init()."""

def release(handle: int, /) -> int:
    """cusafe_release(handle); its status.  TypeError for a non-int,
    OverflowError outside 0..2**64-1, RuntimeError before init()."""
