"""Steady online load through a gateway from a few client threads, with per-request outcomes."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from tests.integration.fleet.conftest import Proc, embed

TIMEOUT_MS = 3000


@dataclass
class LoadOutcome:
    """What every request of a load run ended as."""

    statuses: Counter[int] = field(default_factory=Counter)
    hung: int = 0  # the client gave up: no answer 2 s after the deadline
    error_bodies: list[str] = field(default_factory=list)
    max_latency_s: float = 0.0

    @property
    def num_sent(self) -> int:
        return sum(self.statuses.values()) + self.hung

    @property
    def num_ok(self) -> int:
        return self.statuses[200]


class SteadyLoad:
    """``num_threads`` clients each sending requests back to back until ``num_requests``."""

    def __init__(self, gateway: Proc, *, num_requests: int, num_threads: int = 6) -> None:
        self.gateway = gateway
        self.num_requests = num_requests
        self.num_threads = num_threads
        self.outcome = LoadOutcome()
        self.num_done = 0
        self._lock = threading.Lock()
        self._next = 0
        self._pool = ThreadPoolExecutor(num_threads)
        self._futures = [self._pool.submit(self._client) for _ in range(num_threads)]

    def _take(self) -> int | None:
        with self._lock:
            if self._next >= self.num_requests:
                return None
            self._next += 1
            return self._next

    def _client(self) -> None:
        with httpx.Client() as client:
            while (index := self._take()) is not None:
                started = time.monotonic()
                try:
                    response = embed(client, self.gateway, f"req {index}", TIMEOUT_MS)
                except httpx.TimeoutException:
                    self._record(None, "", time.monotonic() - started)
                    continue
                self._record(response.status_code, response.text, time.monotonic() - started)

    def _record(self, status: int | None, body: str, latency_s: float) -> None:
        with self._lock:
            self.num_done += 1
            self.outcome.max_latency_s = max(self.outcome.max_latency_s, latency_s)
            if status is None:
                self.outcome.hung += 1
                return
            self.outcome.statuses[status] += 1
            if status != 200:
                self.outcome.error_bodies.append(body)

    def wait(self) -> LoadOutcome:
        """Block until every request has an outcome."""
        for future in self._futures:
            future.result()
        self._pool.shutdown()
        return self.outcome
