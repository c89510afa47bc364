"""The record of one input waiting for (or riding in) a batch."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any

from conveyor.observability.context import RequestContext, current_request
from conveyor.priority import Priority


class ItemState(enum.Enum):
    """Where an input is; only QUEUED inputs may still be dropped without running."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


@dataclass(slots=True, eq=False)
class WorkItem:
    """One input: its model-ready payload, its cost, its deadline and its future.

    The future is resolved exactly once, by whoever moves the item to DONE.
    """

    payload: Any
    num_tokens: int
    priority: Priority
    enqueued_at: float
    deadline: float
    future: asyncio.Future[Any]
    state: ItemState = ItemState.QUEUED
    # This input's share of its batch's model time, by tokens (set when the batch returns).
    model_s: float = 0.0
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    # The request this input belongs to (captured where it was created), for its log line
    # and trace; and when its batch started (loop clock).
    origin: RequestContext | None = field(default_factory=current_request, repr=False)
    started_at: float | None = None

    @property
    def is_queued(self) -> bool:
        """True while the item waits and may still be dropped."""
        return self.state is ItemState.QUEUED

    def resolve(self, result: Any) -> bool:
        """Deliver ``result`` (a value or an exception); False if already resolved."""
        self.state = ItemState.DONE
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.future.done():
            return False
        if isinstance(result, asyncio.CancelledError):
            self.future.cancel()
        elif isinstance(result, BaseException):
            self.future.set_exception(result)
        else:
            self.future.set_result(result)
        return True
