"""Running one batch line: the endpoint call, retries with backoff, and its output record.

- 429 (the model's batch queue is full) is back-pressure, not failure: wait and retry for as
  long as it takes;
- other transient statuses (500, 502, 503, 504) are retried `max_retries` times with
  exponential backoff and jitter, then recorded;
- any other error (4xx, 501) is the request's own answer: recorded at once, never retried.

Exceptions that are not `ConveyorError` propagate: they kill the shard attempt, and a line
that keeps doing so is found by bisection (see `isolation`).
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from conveyor.errors import ConveyorError, InvalidRequest
from conveyor.jobs.cache import fresh_answer
from conveyor.jobs.keys import line_id
from conveyor.jobs.lines import Decoded, failure_record, response_record
from conveyor.observability.context import RequestContext, line_request_id, request_scope
from conveyor.tenants.usage import Payer

# (endpoint, body, payer): the payer is the batch's tenant and its attempt's usage tally.
RunRequest = Callable[[str, dict[str, Any], Payer], Awaitable[dict[str, Any]]]
Sleep = Callable[[float], Awaitable[None]]

QUEUE_FULL = 429
RETRIED_STATUSES = frozenset({500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff for retried lines: `base_s * 2**n`, capped at `max_s`, times a jitter in [0.5, 1]."""

    max_retries: int
    base_s: float
    max_s: float

    def __post_init__(self) -> None:
        """Reject negative retry counts and non-positive delays."""
        if self.max_retries < 0 or self.base_s <= 0 or self.max_s < self.base_s:
            raise ValueError(f"invalid retry policy: {self}")

    def delay_s(self, num_tries: int, jitter: float) -> float:
        """The wait before try number `num_tries + 1` (`jitter` in [0, 1))."""
        growth = 2.0 ** min(num_tries, 30)
        return min(self.max_s, self.base_s * growth) * (0.5 + jitter / 2)


class LineOutcome(enum.Enum):
    """Where a line's record goes and how it counts."""

    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class LineResult:
    """A finished line: its JSONL record, outcome, and a body to cache (if any)."""

    record: bytes
    outcome: LineOutcome
    cache_entry: tuple[str, bytes] | None = None
    is_cache_hit: bool = False


class LineCaller:
    """Runs the lines of one batch against its endpoint."""

    def __init__(
        self,
        run_request: RunRequest,
        endpoint: str,
        batch_id: str,
        retry: RetryPolicy,
        payer: Payer,
        *,
        sleep: Sleep = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        """Call `run_request(endpoint, body, payer)` per line; `sleep`, `jitter` for tests."""
        self._run_request = run_request
        self.payer = payer
        self.endpoint = endpoint
        self.batch_id = batch_id
        self._retry = retry
        self._sleep = sleep
        self._jitter = jitter

    async def run(
        self,
        line_no: int,
        request: Decoded,
        *,
        cached: bytes | None = None,
        key: str | None = None,
    ) -> LineResult:
        """Run the decoded input line `line_no` (or answer it from `cached`); build its record."""
        rid = line_id(self.batch_id, line_no)
        if isinstance(request, ValueError):
            error = InvalidRequest(f"line {line_no + 1} is not a valid request: {request}")
            return LineResult(failure_record(rid, "", error), LineOutcome.FAILED)
        if cached is not None:
            answer = orjson.Fragment(fresh_answer(self.endpoint, cached))
            record = response_record(rid, request.custom_id, 200, answer)
            return LineResult(record, LineOutcome.COMPLETED, is_cache_hit=True)
        context = RequestContext(line_request_id(self.batch_id, request.custom_id), self.endpoint)
        try:
            with request_scope(context):  # the line's id follows it into batches and traces
                body = await self._call_with_retries(request.body)
        except ConveyorError as exc:
            return LineResult(failure_record(rid, request.custom_id, exc), LineOutcome.FAILED)
        entry = None if key is None else (key, orjson.dumps(body))
        record = response_record(rid, request.custom_id, 200, body)
        return LineResult(record, LineOutcome.COMPLETED, cache_entry=entry)

    async def _call_with_retries(self, body: dict[str, Any]) -> dict[str, Any]:
        """Call the endpoint, waiting out back-pressure and retrying transient failures."""
        num_full = 0
        num_retries = 0
        while True:
            try:
                return await self._run_request(self.endpoint, body, self.payer)
            except ConveyorError as exc:
                if exc.status_code == QUEUE_FULL:
                    delay_s = self._retry.delay_s(num_full, self._jitter())
                    num_full += 1
                elif exc.status_code in RETRIED_STATUSES and num_retries < self._retry.max_retries:
                    delay_s = self._retry.delay_s(num_retries, self._jitter())
                    num_retries += 1
                else:
                    raise
            await self._sleep(delay_s)
