"""The multi-process supervisor, on fake processes; and two processes sharing one port."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from conveyor.api.server_processes import (
    EXIT_FAILED_START,
    MIN_UPTIME_S,
    is_failed_start,
    reuse_port_socket,
    supervise,
)


class FakeProcess:
    """Alive until the test or the supervisor ends it."""

    count = 0

    def __init__(self) -> None:
        FakeProcess.count += 1
        self.pid = FakeProcess.count
        self.exitcode: int | None = None
        self.signals: list[str] = []

    def is_alive(self) -> bool:
        return self.exitcode is None

    def terminate(self) -> None:
        self.signals.append("TERM")
        self.exitcode = 0

    def kill(self) -> None:
        self.signals.append("KILL")
        self.exitcode = -9

    def join(self, timeout: float | None = None) -> None:
        pass


class Script:
    """Drives ``supervise``: a fake clock, and one scripted step at each poll."""

    def __init__(self) -> None:
        self.now = 0.0
        self.started: list[FakeProcess] = []
        self.steps: list[Callable[[], None]] = []
        self.is_stopping = False

    def start(self) -> FakeProcess:
        self.started.append(FakeProcess())
        return self.started[-1]

    def wait(self, timeout: float | None = None) -> bool:
        """The supervisor's poll: run the next step (none left: stop)."""
        if not self.is_stopping and self.steps:
            self.steps.pop(0)()
            return self.is_stopping
        return True

    def set(self) -> None:
        self.is_stopping = True

    def run(self, num_processes: int) -> int:
        return supervise(self.start, num_processes, self, clock=lambda: self.now)


def test_a_process_that_dies_after_running_a_while_is_replaced() -> None:
    script = Script()

    def crash_first() -> None:
        script.now = MIN_UPTIME_S + 1
        script.started[0].exitcode = 1

    script.steps = [crash_first, lambda: None]
    assert script.run(2) == 0
    assert len(script.started) == 3  # two, then a replacement
    assert script.started[1].signals == ["TERM"] and script.started[2].signals == ["TERM"]
    assert script.started[0].signals == []  # already gone: not signalled


def test_a_process_that_dies_at_start_stops_them_all() -> None:
    script = Script()

    def fail_at_start() -> None:
        script.now = 1.0
        script.started[1].exitcode = 3

    script.steps = [fail_at_start]
    assert script.run(2) == EXIT_FAILED_START
    assert len(script.started) == 2
    assert script.started[0].signals == ["TERM"]


def test_a_stop_terminates_each_process_once() -> None:
    script = Script()
    script.steps = [script.set]
    assert script.run(3) == 0
    assert [p.signals for p in script.started] == [["TERM"]] * 3


def test_failed_start_is_judged_by_uptime() -> None:
    assert is_failed_start(MIN_UPTIME_S - 0.1)
    assert not is_failed_start(MIN_UPTIME_S)


def test_two_sockets_share_a_port_and_both_listen() -> None:
    first = reuse_port_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    second = reuse_port_socket("127.0.0.1", port)
    try:
        first.listen()
        second.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        plain = socket.socket()
        with pytest.raises(OSError):  # without SO_REUSEPORT the port is taken
            plain.bind(("127.0.0.1", port))
        plain.close()
    finally:
        first.close()
        second.close()
