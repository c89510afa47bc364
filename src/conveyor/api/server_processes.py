"""Serve one app from several processes on one port, each with its own event loop.

Every process binds its own listening socket with ``SO_REUSEPORT`` and the kernel spreads
new connections across them, so one host's cores all take requests (as nginx's
``reuseport`` does). The parent only supervises: it starts the processes, starts another
when one dies after running a while, and turns SIGINT or SIGTERM into one SIGTERM per
process, which then drains as a single process would. Processes live in their own process
group (a terminal's Ctrl-C reaches only the parent) and stop when the parent is gone.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, Protocol

log = logging.getLogger(__name__)

# A process that exits sooner than this after its start failed to start: stop everything
# (a port in use, a bad setting) instead of restarting it forever.
MIN_UPTIME_S = 5.0
POLL_S = 0.2
# How long the processes get to drain after SIGTERM before they are killed.
STOP_GRACE_S = 30.0
EXIT_FAILED_START = 3


class ChildProcess(Protocol):
    """What the supervisor needs of a process (``multiprocessing.Process`` is one)."""

    @property
    def pid(self) -> int | None:
        """The process id."""

    @property
    def exitcode(self) -> int | None:
        """None while running."""

    def is_alive(self) -> bool:
        """Still running."""

    def terminate(self) -> None:
        """SIGTERM."""

    def kill(self) -> None:
        """SIGKILL."""

    def join(self, timeout: float | None = None) -> None:
        """Wait for the exit."""


class StopFlag(Protocol):
    """Set when the processes should stop (``threading.Event`` is one)."""

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; waits up to ``timeout`` for it."""

    def set(self) -> None:
        """Ask for the stop."""


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` that other processes may bind as well."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def is_failed_start(uptime_s: float) -> bool:
    """A process that died this soon failed to start (restarting would not help)."""
    return uptime_s < MIN_UPTIME_S


def _watch_parent(parent_pid: int) -> None:
    """Ask this process to stop (SIGTERM to itself) once its parent is gone."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def _child_main(target: Callable[..., None], args: Sequence[Any], parent_pid: int) -> None:
    """In the new process: own process group, a parent watch, then ``target(*args)``."""
    os.setpgrp()
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    target(*args)


def spawner(target: Callable[..., None], args: Sequence[Any]) -> Callable[[], ChildProcess]:
    """A function that starts one fresh process running ``target(*args)`` (spawned, so
    nothing of this process's state, event loop or sockets is inherited)."""
    context = multiprocessing.get_context("spawn")

    def start() -> ChildProcess:
        process = context.Process(target=_child_main, args=(target, tuple(args), os.getpid()))
        process.start()
        return process

    return start


def supervise(
    start: Callable[[], ChildProcess],
    num_processes: int,
    stopping: StopFlag,
    *,
    clock: Callable[[], float] = time.monotonic,
    poll_s: float = POLL_S,
) -> int:
    """Keep ``num_processes`` running until ``stopping`` is set; the exit code to use.

    A process that dies after ``MIN_UPTIME_S`` is replaced; one that dies sooner stops
    the whole set with ``EXIT_FAILED_START``.
    """
    children = [(start(), clock()) for _ in range(num_processes)]
    exit_code = 0
    while not stopping.wait(poll_s):
        for index, (child, started_at) in enumerate(children):
            if child.is_alive():
                continue
            if is_failed_start(clock() - started_at):
                log.error("server process %s exited at start (%s)", child.pid, child.exitcode)
                exit_code = EXIT_FAILED_START
                stopping.set()
                break
            log.warning(
                "server process %s exited (%s); starting another", child.pid, child.exitcode
            )
            children[index] = (start(), clock())
    _stop_all([child for child, _ in children])
    return exit_code


def _stop_all(children: Sequence[ChildProcess], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM each process once, wait for the drains, kill what is left."""
    for child in children:
        if child.is_alive():
            child.terminate()
    deadline = time.monotonic() + grace_s
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join()


def run_processes(target: Callable[..., None], args: Sequence[Any], num_processes: int) -> int:
    """Run ``target(*args)`` in ``num_processes`` processes until SIGINT or SIGTERM."""
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return supervise(spawner(target, args), num_processes, stopping)
