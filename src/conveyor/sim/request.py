"""One simulated request: what it asks for, where it went, and how it ended."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from conveyor.fleet.affinity import Affinity
from conveyor.priority import Priority


class Outcome(enum.Enum):
    """How a request ended for its caller."""

    COMPLETED = "completed"
    REJECTED_429 = "rejected_429"
    FAILED_5XX = "failed_5xx"


@dataclass(slots=True, eq=False)
class SimRequest:
    """A request from arrival to its caller's answer (at most one counts)."""

    rid: int
    source: str
    tenant: str
    prompt_ids: list[int]
    output_tokens: int
    arrival_s: float
    deadline_s: float
    priority: Priority = Priority.ONLINE
    affinity: Affinity | None = None
    # Workers tried so far, in order (a tuple: a set is 216 bytes a request, and a million
    # requests are in flight at 100,000 a second).
    tried: tuple[str, ...] = ()
    worker_id: str | None = None
    first_token_s: float | None = None
    outcome: Outcome | None = None
    # Answers the caller received: exactly one, or the request was lost or duplicated.
    num_answers: int = 0
    # For chat sessions: who to tell when the answer comes.
    session: Any = None
    # The gateway's deadline timer (cancelled once answered).
    deadline_timer: Any = None
    gateway_id: str | None = None
    # The prompt's length where its ids are not kept (``prompt_ids`` then empty).
    prompt_len: int | None = None

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length in tokens."""
        return len(self.prompt_ids) if self.prompt_len is None else self.prompt_len
