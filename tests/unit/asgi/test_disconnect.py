"""The disconnect watcher: through the server's hook when there is one, else a task."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message

from conveyor.asgi.disconnect import DISCONNECT_HOOK, DisconnectHook, DisconnectWatcher

pytestmark = pytest.mark.anyio


async def _never() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_a_fired_hook_calls_the_watcher_back_without_a_task() -> None:
    hook = DisconnectHook()
    calls: list[str] = []
    tasks_before = len(asyncio.all_tasks())
    watcher = DisconnectWatcher(_never, lambda: calls.append("gone"),
                                {"extensions": {DISCONNECT_HOOK: hook}})  # fmt: skip
    assert len(asyncio.all_tasks()) == tasks_before
    hook.fire()
    hook.fire()  # once only
    assert calls == ["gone"] and watcher.is_gone


async def test_a_closed_watcher_is_not_called_back() -> None:
    hook = DisconnectHook()
    watcher = DisconnectWatcher(_never, lambda: pytest.fail("closed"),
                                {"extensions": {DISCONNECT_HOOK: hook}})  # fmt: skip
    watcher.close()
    hook.fire()
    assert not watcher.is_gone


async def test_a_hook_fired_before_watching_calls_back_at_once() -> None:
    hook = DisconnectHook()
    hook.fire()
    calls: list[str] = []
    watcher = DisconnectWatcher(_never, lambda: calls.append("gone"),
                                {"extensions": {DISCONNECT_HOOK: hook}})  # fmt: skip
    assert calls == ["gone"] and watcher.is_gone


async def test_without_a_hook_a_task_waits_for_the_disconnect_message() -> None:
    messages = asyncio.Queue[Message]()
    calls: list[str] = []
    watcher = DisconnectWatcher(messages.get, lambda: calls.append("gone"), {"type": "http"})
    await messages.put({"type": "http.disconnect"})
    for _ in range(5):
        await asyncio.sleep(0)
    assert calls == ["gone"] and watcher.is_gone
    watcher.close()
