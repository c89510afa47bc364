"""What each request cost, and its sums per tenant, model and minute: pure, no I/O.

A request's usage is an `UsageEvent`: its tokens and its model-seconds, the share of every
batch (or engine step) it rode in, split by tokens. Cost is model-seconds at the model's
GPU-hour price. A `Payer` names who pays and where the event goes: the online ledger
(flushed to the job store each second) or a batch shard attempt (committed with its result).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from conveyor.stores.tenant_records import UsageRow

SECONDS_PER_HOUR = 3600
SECONDS_PER_MINUTE = 60


@dataclass(frozen=True, slots=True)
class UsageEvent:
    """One finished request (or batch line) of one tenant on one model."""

    tenant: str
    model: str
    input_tokens: int
    output_tokens: int
    model_s: float
    cost_usd: float

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


class UsageRecorder(Protocol):
    """Where finished requests' usage goes."""

    def record(self, event: UsageEvent, now_s: float) -> None:
        """Take one request's usage, finished at `now_s` (unix seconds)."""
        ...


class Admission(Protocol):
    """A request's admission against its tenant's rate limits (see `tenants.ticket`)."""

    def admit_at_once(self, model: str, input_tokens: int, output_tokens: int) -> bool:
        """As `admit` when it needs no waiting (False: call `admit`)."""
        ...

    async def admit(self, model: str, input_tokens: int, output_tokens: int) -> None:
        """`admit_at_once` by waiting for the limiter, after it said False (raises 400,
        429 or 503)."""
        ...

    def settle(self, input_tokens: int, output_tokens: int) -> None:
        """Settle at what the request used."""
        ...


@dataclass(frozen=True, slots=True)
class Payer:
    """Who a request is billed to, and the recorder its usage goes to (None: metrics only).

    `admission`, on `serve`'s online requests under rate limits, is admitted once the
    request's tokens are counted and settled when it is billed (None: no limits apply).
    """

    tenant: str
    recorder: UsageRecorder | None = None
    admission: Admission | None = None

    def admit_now(self, model: str, input_tokens: int, output_tokens: int) -> bool:
        """Admit without waiting, when no limit applies or the limiter answers from memory
        (False: await `wait_admitted`). Raises as `admit`."""
        admission = self.admission
        return admission is None or admission.admit_at_once(model, input_tokens, output_tokens)

    async def wait_admitted(self, model: str, input_tokens: int, output_tokens: int) -> None:
        """Admit by waiting for the limiter, after `admit_now` said False."""
        if self.admission is not None:
            await self.admission.admit(model, input_tokens, output_tokens)

    async def admit(self, model: str, input_tokens: int, output_tokens: int) -> None:
        """Admit against the rate limits, if any apply (waiting for the limiter if need be)."""
        if not self.admit_now(model, input_tokens, output_tokens):
            await self.wait_admitted(model, input_tokens, output_tokens)


def cost_usd(model_s: float, gpu_hour_usd: float) -> float:
    """What `model_s` seconds of a model cost at `gpu_hour_usd` an hour."""
    return model_s * gpu_hour_usd / SECONDS_PER_HOUR


def split_by_tokens(total_s: float, num_tokens: Sequence[int]) -> list[float]:
    """Each item's share of `total_s`, in proportion to its tokens (evenly when none has any)."""
    if not num_tokens:
        return []
    weights = [max(0, n) for n in num_tokens]
    total = sum(weights)
    if total == 0:
        return [total_s / len(weights)] * len(weights)
    return [total_s * w / total for w in weights]


def minute_of(now_s: float) -> int:
    """The start of the minute `now_s` falls in (unix seconds)."""
    return int(now_s) // SECONDS_PER_MINUTE * SECONDS_PER_MINUTE


def row_of(event: UsageEvent, now_s: float) -> UsageRow:
    """A one-request usage row for the minute the request finished in."""
    return UsageRow(
        event.tenant, event.model, minute_of(now_s), 1, event.input_tokens,
        event.output_tokens, event.model_s, event.cost_usd,
    )  # fmt: skip


class UsageTally:
    """Usage rows summed by tenant, model and minute, until taken."""

    def __init__(self) -> None:
        """An empty tally."""
        self._rows: dict[tuple[str, str, int], UsageRow] = {}

    def __len__(self) -> int:
        """How many distinct (tenant, model, minute) rows are held."""
        return len(self._rows)

    def add(self, row: UsageRow) -> None:
        """Fold one row in."""
        held = self._rows.get(row.key)
        self._rows[row.key] = row if held is None else held.plus(row)

    def record(self, event: UsageEvent, now_s: float) -> None:
        """Fold one request in (a `UsageRecorder`)."""
        self.add(row_of(event, now_s))

    def add_all(self, rows: Iterable[UsageRow]) -> None:
        """Fold several rows in (e.g. rows a failed flush gives back)."""
        for row in rows:
            self.add(row)

    def take(self) -> list[UsageRow]:
        """Every row held, oldest minute first; the tally is empty afterwards."""
        rows = sorted(self._rows.values(), key=lambda r: (r.minute_start, r.tenant, r.model))
        self._rows = {}
        return rows

    def peek(self) -> list[UsageRow]:
        """Every row held, without taking them."""
        return list(self._rows.values())


def merge_rows(rows: Iterable[UsageRow]) -> list[UsageRow]:
    """Rows of equal key summed into one (the order of first appearance kept)."""
    tally: dict[tuple[str, str, int], UsageRow] = {}
    for row in rows:
        held = tally.get(row.key)
        tally[row.key] = row if held is None else held.plus(row)
    return list(tally.values())
