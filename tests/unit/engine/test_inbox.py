"""The engine's inbox: posting, taking, the counts callers read, and idleness."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, cast

from conveyor.engine.inbox import AbortCommand, AddCommand, Inbox


@dataclass
class _Counts:
    num_waiting: int
    num_waiting_online: int
    num_running: int
    num_batch: int


def _add(name: str) -> AddCommand:
    # The inbox never looks inside a command's request or stream.
    return AddCommand(request=cast(Any, name), stream=cast(Any, None))


def test_adds_count_as_waiting_from_post_until_the_scheduler_reports() -> None:
    inbox = Inbox()
    assert inbox.post(_add("a")) and inbox.post(_add("b"))
    assert inbox.post(AbortCommand("a"))
    assert inbox.num_waiting == inbox.num_waiting_online == 2  # an add's class is not known
    commands = inbox.take(has_work=False)
    assert commands is not None and len(commands) == 3
    assert inbox.num_waiting == inbox.num_waiting_online == 2  # handed over, still waiting
    inbox.publish(_Counts(num_waiting=3, num_waiting_online=1, num_running=2, num_batch=3))
    assert (inbox.num_waiting, inbox.num_waiting_online, inbox.num_running) == (3, 1, 2)
    assert inbox.num_batch == 3


def test_take_returns_at_once_when_the_scheduler_has_work() -> None:
    assert Inbox().take(has_work=True) == []


def test_nothing_is_posted_or_taken_once_stopping() -> None:
    inbox = Inbox()
    inbox.post(_add("a"))
    inbox.stop()
    assert not inbox.post(_add("b"))
    assert not inbox.post(AbortCommand("a"))
    assert inbox.take(has_work=False) is None
    (drained,) = inbox.drain()
    assert isinstance(drained, AddCommand) and drained.request == "a"
    assert inbox.num_waiting == 0


def test_idle_only_with_nothing_posted_and_the_engine_asleep() -> None:
    inbox = Inbox()
    assert inbox.wait_until_idle(0)
    inbox.post(_add("a"))
    assert not inbox.wait_until_idle(0)
    inbox.take(has_work=False)
    assert not inbox.wait_until_idle(0)  # taken, but the engine is busy with it
    inbox.mark_idle()
    assert inbox.wait_until_idle(0)


def _take_in_thread(inbox: Inbox) -> tuple[threading.Thread, list[Any]]:
    """The engine thread's ``take`` (nothing in hand), on a thread; its result lands in the
    list it returns, with the seconds it waited after waking."""
    result: list[Any] = []

    def take() -> None:
        commands = inbox.take(has_work=False)
        result.extend([commands, time.monotonic()])

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    assert inbox.wait_until_idle(5)  # asleep, waiting for work
    return thread, result


def test_woken_from_sleep_the_engine_gathers_the_rest_of_a_burst() -> None:
    inbox = Inbox(gather_s=0.5)
    thread, result = _take_in_thread(inbox)
    woken = time.monotonic()
    inbox.post(_add("a"))
    inbox.post(_add("b"))  # the burst's second request, after the first woke the engine
    thread.join(5)
    commands, returned = result
    assert [c.request for c in commands] == ["a", "b"]
    assert returned - woken >= 0.45
    assert not inbox.wait_until_idle(0)  # busy with them


def test_a_quiet_gap_ends_the_gather_before_its_window() -> None:
    inbox = Inbox(gather_s=60, quiet_s=0.2)
    thread, result = _take_in_thread(inbox)
    woken = time.monotonic()
    inbox.post(_add("a"))
    time.sleep(0.1)
    inbox.post(_add("b"))  # inside the quiet gap: it extends the gather
    thread.join(5)
    assert not thread.is_alive()  # 60 s window, yet over once arrivals stopped
    commands, returned = result
    assert [c.request for c in commands] == ["a", "b"]
    assert returned - woken >= 0.28  # 0.2 s of quiet after "b", posted 0.1 s in


def test_a_burst_that_never_pauses_is_cut_at_the_window() -> None:
    inbox = Inbox(gather_s=0.3, quiet_s=0.2)
    thread, result = _take_in_thread(inbox)
    woken = time.monotonic()
    posted = 0
    while thread.is_alive() and time.monotonic() - woken < 5:
        inbox.post(_add(str(posted)))  # every 50 ms: never 0.2 s quiet
        posted += 1
        time.sleep(0.05)
    commands, returned = result
    assert 0.25 <= returned - woken < 1.0
    assert len(commands) >= 4  # the whole 0.3 s of arrivals, not only the first


def test_no_gathering_with_work_in_hand() -> None:
    inbox = Inbox(gather_s=60)
    assert inbox.take(has_work=True) == []  # sequences running: never waits
    inbox.post(_add("a"))
    commands = inbox.take(has_work=False)  # posted before the engine could sleep
    assert commands is not None and [c.request for c in commands] == ["a"]


def test_stopping_ends_a_gather() -> None:
    inbox = Inbox(gather_s=60)
    thread, result = _take_in_thread(inbox)
    inbox.post(_add("a"))
    inbox.stop()
    thread.join(5)
    assert not thread.is_alive() and result[0] is None
