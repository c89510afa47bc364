"""The scaling signal: arrival and service rates per model and Little's-law replicas."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


class RateMeter:
    """Events per second over a sliding window, from explicit timestamps."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._events: deque[tuple[float, float]] = deque()
        self._total = 0.0

    def record(self, now: float, count: float = 1.0) -> None:
        """Count ``count`` events at ``now``."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self._events.append((now, count))
        self._total += count
        self._expire(now)

    def rate_per_s(self, now: float) -> float:
        """Events per second over the window that ends at ``now``."""
        self._expire(now)
        return self._total / self.window_s

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window_s:
            _, count = self._events.popleft()
            self._total -= count


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """What the fleet sees for one model right now."""

    model: str
    arrival_per_s: float
    service_per_s_per_replica: float
    queue_depth: int
    num_replicas: int


def desired_replicas(demand: ModelDemand, target_utilisation: float) -> int:
    """Little's law: arrival rate x mean service time / target utilisation, rounded up.

    The mean service time of one input on one replica is ``1 / service_per_s_per_replica``.
    Without a measured service rate the current count is kept (no signal is better than a
    wrong one); a backlog with no arrivals still needs one replica to drain it.
    """
    if not 0 < target_utilisation <= 1:
        raise ValueError(f"target_utilisation must be in (0, 1], got {target_utilisation}")
    if demand.service_per_s_per_replica <= 0:
        return demand.num_replicas
    busy = demand.arrival_per_s / demand.service_per_s_per_replica
    wanted = math.ceil(busy / target_utilisation - 1e-9)
    if demand.queue_depth > 0:
        wanted = max(wanted, 1)
    return max(wanted, 0)
