"""The process's C library through ctypes, loaded once, for the few calls Python's standard
library does not wrap (``malloc_trim``, ``madvise``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["c_library"]


@functools.cache
def c_library() -> ctypes.CDLL | None:
    """The C library (``errno`` kept for ``ctypes.get_errno``), or None where none is found."""
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name, use_errno=True)
