"""The one way a test waits for what another task, thread or process does: poll until it
holds.

``until`` (plain code: threads, processes, servers) and ``until_async`` (on an event loop)
call ``probe`` every ``interval_s`` until it returns something truthy, and return that.
Past ``timeout_s`` the test fails, naming what it waited for and the last value the probe
gave. Exceptions of the types in ``ignoring`` count as "not yet" (a server not listening
yet). A probe that sees the wait can never end (a process that exited) fails the test
itself.

The timeout only bounds a wait gone wrong: no test asserts how long a wait took.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_INTERVAL_S = 0.05

What = str | Callable[[], str]


def until(
    probe: Callable[[], T],
    what: What,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """``probe()``'s first truthy value; the test fails after ``timeout_s`` without one."""
    deadline = time.monotonic() + timeout_s
    while True:
        found, value = _attempt(probe, ignoring)
        if found:
            return value
        if time.monotonic() >= deadline:
            _fail(what, timeout_s, value)
        time.sleep(interval_s)


async def until_async(
    probe: Callable[[], T | Awaitable[T]],
    what: What,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """``until`` for a probe on the event loop (plain or async); it sleeps with
    ``asyncio.sleep``, so the tasks it waits for run meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
        except ignoring:
            value = None
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            _fail(what, timeout_s, value)
        await asyncio.sleep(interval_s)


def _attempt(
    probe: Callable[[], T], ignoring: tuple[type[BaseException], ...]
) -> tuple[bool, T | None]:
    """Whether ``probe`` came right this time, and what it gave."""
    try:
        value = probe()
    except ignoring:
        return False, None
    return bool(value), value


def _fail(what: What, timeout_s: float, last: object) -> None:
    """Fail the test: what was awaited, for how long, and the probe's last answer."""
    text = what() if callable(what) else what
    pytest.fail(f"timed out after {timeout_s} s waiting for {text} (last: {last!r})")
