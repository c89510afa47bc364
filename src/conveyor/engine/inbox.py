"""Where callers leave work for the engine thread, and the counts they read back.

Callers on any thread post requests and aborts; the engine thread takes them all
between steps, so nothing changes under a running step. Everything here is guarded by
one condition variable, which also wakes the engine thread when work arrives and wakes
:meth:`Inbox.wait_until_idle` when the engine runs out of it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from conveyor.engine.stream import GenerationStream

if TYPE_CHECKING:  # only named in annotations: the inbox itself needs no torch
    from conveyor.engine.request import GenerationRequest

__all__ = ["AbortCommand", "AddCommand", "Command", "Inbox"]


@dataclass(slots=True)
class AddCommand:
    """Queue a request whose outputs go to ``stream``."""

    request: GenerationRequest
    stream: GenerationStream


@dataclass(slots=True)
class AbortCommand:
    """Drop a request and free its blocks."""

    request_id: str


Command = AddCommand | AbortCommand


class QueueCounts(Protocol):
    """The scheduler's queue sizes the engine thread publishes."""

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission."""
        ...

    @property
    def num_waiting_online(self) -> int:
        """Online sequences among the waiting ones."""
        ...

    @property
    def num_running(self) -> int:
        """Sequences holding KV-cache blocks."""
        ...

    @property
    def num_batch(self) -> int:
        """Batch-job sequences waiting or running."""
        ...


class Inbox:
    """Commands from callers, and the queue sizes the engine thread publishes back.

    ``gather_s``: woken from idle, the engine thread waits up to that long more before it
    takes the commands, so that the rest of a burst whose first request woke it starts in
    the same step (else the first one's prefill runs alone and the others wait it out).
    ``quiet_s`` ends the wait early: once that long passes with nothing posted, the burst
    is taken as over (None: always wait the whole ``gather_s``).
    """

    def __init__(self, *, gather_s: float = 0.0, quiet_s: float | None = None) -> None:
        self._gather_s = gather_s
        self._quiet_s = quiet_s
        self._last_post_s = 0.0
        self._wakeup = threading.Condition(threading.Lock())
        self._commands: list[Command] = []
        self._num_pending_adds = 0
        self._num_waiting = 0
        self._num_waiting_online = 0
        self._num_running = 0
        self._num_batch = 0
        self._is_idle = True
        self._is_stopping = False

    # -- any thread ---------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        """Requests posted or waiting in the scheduler (as of the last publish)."""
        with self._wakeup:
            return self._num_pending_adds + self._num_waiting

    @property
    def num_waiting_online(self) -> int:
        """Online requests an online arrival would queue behind: those waiting in the
        scheduler, and every posted add not yet taken (its class is not counted apart)."""
        with self._wakeup:
            return self._num_pending_adds + self._num_waiting_online

    @property
    def num_running(self) -> int:
        """Sequences holding KV blocks (as of the last publish)."""
        with self._wakeup:
            return self._num_running

    @property
    def num_batch(self) -> int:
        """Batch-job sequences waiting or running (as of the last publish; a posted add
        counts as online until the scheduler has it)."""
        with self._wakeup:
            return self._num_batch

    def post(self, command: Command) -> bool:
        """Queue a command and wake the engine thread; False, queuing nothing, once stopping."""
        with self._wakeup:
            if self._is_stopping:
                return False
            self._commands.append(command)
            self._last_post_s = time.monotonic()
            if isinstance(command, AddCommand):
                self._num_pending_adds += 1
            self._wakeup.notify_all()
            return True

    def stop(self) -> None:
        """Refuse commands from now on and wake the engine thread so it can exit."""
        with self._wakeup:
            self._is_stopping = True
            self._wakeup.notify_all()

    def wait_until_idle(self, timeout_s: float | None) -> bool:
        """Block until the engine thread is idle with nothing posted; False on timeout."""
        with self._wakeup:
            return self._wakeup.wait_for(lambda: self._is_idle and not self._commands, timeout_s)

    # -- engine thread ------------------------------------------------------------

    def take(self, *, has_work: bool) -> list[Command] | None:
        """Sleep until there is work; take the posted commands. None when stopping.

        ``has_work`` says the scheduler still has sequences: then do not sleep at all.
        Woken from sleep, gather the rest of a burst (see the class docstring).
        """
        with self._wakeup:
            slept = False
            while not self._is_stopping and not self._commands and not has_work:
                self._is_idle = True
                self._wakeup.notify_all()
                self._wakeup.wait()
                slept = True
            self._is_idle = False
            if slept and self._gather_s > 0:
                self._gather_burst()
            if self._is_stopping:
                return None
            commands, self._commands = self._commands, []
            # Moved from "pending" to the scheduler's queue, so num_waiting stays whole.
            self._num_waiting += self._num_pending_adds
            self._num_waiting_online += self._num_pending_adds
            self._num_pending_adds = 0
            return commands

    def _gather_burst(self) -> None:
        """Wait (the lock held by ``take``) until ``gather_s`` has passed, or ``quiet_s``
        since the last post, or stopping."""
        deadline_s = time.monotonic() + self._gather_s
        while not self._is_stopping:
            until_s = deadline_s
            if self._quiet_s is not None:
                until_s = min(until_s, self._last_post_s + self._quiet_s)
            remaining_s = until_s - time.monotonic()
            if remaining_s <= 0:
                return
            self._wakeup.wait(remaining_s)

    def drain(self) -> list[Command]:
        """Take every posted command without running it (to fail them)."""
        with self._wakeup:
            commands, self._commands = self._commands, []
            self._num_pending_adds = 0
            return commands

    def publish(self, counts: QueueCounts) -> None:
        """Record the scheduler's queue sizes for callers to read."""
        with self._wakeup:
            self._num_waiting = counts.num_waiting
            self._num_waiting_online = counts.num_waiting_online
            self._num_running = counts.num_running
            self._num_batch = counts.num_batch

    def mark_idle(self) -> None:
        """The engine thread is gone: wake everyone waiting for it to go idle."""
        with self._wakeup:
            self._is_idle = True
            self._wakeup.notify_all()
