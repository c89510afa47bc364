"""What a run measures: per-second series and totals.

Counters and latencies are bucketed by the simulated second they happened in; gauges
(queue depth, KV use...) are sampled once a second. Totals are over the whole run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

from conveyor.sim.request import Outcome, SimRequest

LATENCIES = ("e2e_ms", "ttft_ms", "tpot_ms")


def _percentiles(values: list[float]) -> dict[str, float | None]:
    """p50 and p99 of ``values`` (None when empty)."""
    if not values:
        return {"p50": None, "p99": None}
    p50, p99 = np.percentile(np.asarray(values), [50, 99])
    return {"p50": round(float(p50), 3), "p99": round(float(p99), 3)}


class Metrics:
    """Counters, latencies and gauges by simulated second."""

    def __init__(self, bucket_s: float = 1.0) -> None:
        self.bucket_s = bucket_s
        self.counts: defaultdict[str, defaultdict[int, float]] = defaultdict(
            lambda: defaultdict(float)
        )
        self.latencies: dict[str, defaultdict[int, list[float]]] = {
            name: defaultdict(list) for name in LATENCIES
        }
        self.gauges: defaultdict[str, dict[int, float]] = defaultdict(dict)
        self.retry_after_s: list[float] = []
        # Requests sent and not yet answered: what is left of them at the end is lost.
        self.open: dict[int, SimRequest] = {}
        self.num_requests = 0

    def _bucket(self, now_s: float) -> int:
        return int(now_s // self.bucket_s)

    def add(self, name: str, now_s: float, amount: float = 1.0) -> None:
        """Count ``amount`` of ``name`` at ``now_s``."""
        self.counts[name][int(now_s // self.bucket_s)] += amount  # _bucket, without a call

    def gauge(self, name: str, now_s: float, value: float) -> None:
        """Sample gauge ``name``."""
        self.gauges[name][self._bucket(now_s)] = value

    def arrived(self, request: SimRequest) -> None:
        """A caller sent ``request``."""
        self.open[request.rid] = request
        self.num_requests += 1
        self.add("arrivals", request.arrival_s)

    def answered(
        self, request: SimRequest, outcome: Outcome, now_s: float, retry_after_s: float = 0.0
    ) -> None:
        """The caller got an answer (a second one counts as a duplicate)."""
        request.num_answers += 1
        if request.num_answers > 1:
            self.add("duplicated", now_s)
            return
        request.outcome = outcome
        self.open.pop(request.rid, None)
        self.add(outcome.value, now_s)
        if outcome is Outcome.REJECTED_429:
            self.retry_after_s.append(retry_after_s)
        if outcome is not Outcome.COMPLETED:
            return
        self.latencies["e2e_ms"][self._bucket(now_s)].append((now_s - request.arrival_s) * 1e3)
        first = request.first_token_s
        if first is not None:
            self.latencies["ttft_ms"][self._bucket(now_s)].append((first - request.arrival_s) * 1e3)
            if request.output_tokens > 1 and now_s > first:
                tpot = (now_s - first) / (request.output_tokens - 1) * 1e3
                self.latencies["tpot_ms"][self._bucket(now_s)].append(tpot)

    def num_seconds(self) -> int:
        """Buckets covered by any figure."""
        keys = [k for series in self.counts.values() for k in series]
        keys += [k for series in self.latencies.values() for k in series]
        keys += [k for series in self.gauges.values() for k in series]
        return max(keys, default=-1) + 1

    def series(self) -> dict[str, Any]:
        """Per-second lists: every counter, latency p50/p99 and gauge."""
        n = self.num_seconds()
        out: dict[str, Any] = {"t_s": [i * self.bucket_s for i in range(n)]}
        for name, counts in sorted(self.counts.items()):
            out[name] = [counts.get(i, 0.0) / self.bucket_s for i in range(n)]
        for name, latencies in self.latencies.items():
            cuts = [_percentiles(latencies.get(i, [])) for i in range(n)]
            out[f"{name}_p50"] = [c["p50"] for c in cuts]
            out[f"{name}_p99"] = [c["p99"] for c in cuts]
        for name, gauges in sorted(self.gauges.items()):
            out[name] = [gauges.get(i) for i in range(n)]
        return out

    def total(self, name: str) -> float:
        """A counter over the whole run."""
        return sum(self.counts.get(name, {}).values())

    def latency_totals(self, until_s: float = math.inf) -> dict[str, dict[str, float | None]]:
        """p50 and p99 of each latency over the run (answers before ``until_s``)."""
        last = self._bucket(until_s) if math.isfinite(until_s) else None
        return {
            name: _percentiles(
                [
                    v
                    for bucket, values in by_bucket.items()
                    if last is None or bucket < last
                    for v in values
                ]
            )
            for name, by_bucket in self.latencies.items()
        }

    def lost(self, now_s: float) -> int:
        """Requests unanswered past their deadline: every path answers by then (a 504 at
        the latest), so these were dropped."""
        return sum(1 for request in self.open.values() if request.deadline_s < now_s)

    def unfinished(self, now_s: float) -> int:
        """Requests still within their deadline when the run stopped."""
        return len(self.open) - self.lost(now_s)
