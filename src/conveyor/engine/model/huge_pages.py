"""Transparent huge pages for the CPU KV cache.

A decode step reads each row's KV blocks wherever the block manager put them: at 64 rows of
SmolLM2 that is some four thousand 4 KiB pages a layer, more than the CPU's TLB holds, so
blocks handed out in no order cost a page walk each. Asked for huge pages
(``madvise(MADV_HUGEPAGE)``, which Linux honours where transparent huge pages are
``always`` or ``madvise``), the same cache spans a few hundred 2 MiB pages instead.

The advice must come before the memory is first touched: ``cache_at_offset`` allocates
empty, advises, then zeroes.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
from collections.abc import Callable
from typing import cast

import torch

from conveyor.c_library import c_library

__all__ = ["HUGE_PAGE_BYTES", "advise_huge_pages"]

log = logging.getLogger(__name__)

HUGE_PAGE_BYTES = 2 << 20
_MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise``, or None off Linux (or where libc cannot be found)."""
    library = c_library() if sys.platform.startswith("linux") else None
    if library is None:
        return None
    function = library.madvise
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return cast("Callable[[int, int, int], int]", function)


def advise_huge_pages(tensor: torch.Tensor) -> int:
    """Ask Linux to back ``tensor``'s whole 2 MiB pages with huge pages; the bytes advised
    (0 for a tensor on another device, smaller than a huge page's span, or off Linux; a
    refusal is logged, never raised: the cache works either way)."""
    madvise = _madvise()
    if tensor.device.type != "cpu" or madvise is None:
        return 0
    first = tensor.data_ptr()
    last = first + tensor.numel() * tensor.element_size()
    start = -(-first // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    end = last // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if end <= start:
        return 0
    if madvise(start, end - start, _MADV_HUGEPAGE) != 0:
        log.info("huge pages for the KV cache refused (errno %d)", ctypes.get_errno())
        return 0
    return end - start
