"""Heavy per-request CPU work, such as parsing or tokenizing a large input, off the event loop.

Small inputs are handled inline: a thread hop costs more than they do. An input of
``LARGE_INPUT_BYTES`` or more runs on a small pool of its own, so a 10 MB prompt being
tokenized never stalls the requests behind it, and at most ``LARGE_INPUT_WORKERS`` such
inputs are worked on at once (the rest wait their turn, holding no memory yet).
After each one, freed heap pages are handed back to the operating system.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from conveyor.c_library import c_library
from conveyor.errors import ConveyorError

LARGE_INPUT_BYTES = 64 * 1024
LARGE_INPUT_WORKERS = 2

P = ParamSpec("P")
T = TypeVar("T")

_pool = ThreadPoolExecutor(LARGE_INPUT_WORKERS, thread_name_prefix="large-input")


async def run_sized(num_bytes: int, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)``: inline for a small input, on the large-input pool otherwise."""
    if num_bytes < LARGE_INPUT_BYTES:
        return fn(*args, **kwargs)
    call = functools.partial(fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_pool, _call_then_trim, call)


def _call_then_trim(call: Callable[[], T]) -> T:
    try:
        return call()
    except ConveyorError as exc:
        # An expected refusal (a prompt too long, say): drop the failed call's frames here,
        # so their locals (millions of token ids) are freed on this thread, not later on the
        # event loop when the error is answered.
        exc.__traceback__ = None
        raise
    finally:
        release_free_memory()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    trim = getattr(c_library(), "malloc_trim", None)  # None without a C library too
    return trim  # type: ignore[no-any-return]


def release_free_memory() -> None:
    """Return free heap pages to the OS (glibc keeps them after a large input otherwise)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
