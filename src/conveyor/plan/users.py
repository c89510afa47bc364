"""Concurrent users as the load: ``--users N --think-time-s Z`` instead of ``--qps``.

Each user waits for an answer (R seconds), reads it and thinks (Z seconds), then asks
again: a closed loop of N users. Little's law over that cycle gives the request rate:
``X = N / (Z + R)``. R is the plan's predicted mean latency at the load it plans for,
which depends on X; the planner scales replicas with X, so R barely moves and the fixed
point is found in a few rounds (starting from R = 0, the highest X it could be).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Plan = dict[str, Any]
MAX_ROUNDS = 50
# Rounds stop once R moves by less than this share (or a microsecond).
SETTLED = 1e-4


@dataclass(frozen=True, slots=True)
class Users:
    """A closed population: how many, and how long each thinks between answer and ask."""

    users: int
    think_time_s: float

    def __post_init__(self) -> None:
        """Reject a population the law cannot use."""
        if self.users < 1 or self.think_time_s <= 0:
            raise ValueError("--users must be >= 1 and --think-time-s > 0")

    def rate(self, response_s: float) -> float:
        """Requests per second when each answer takes ``response_s``."""
        return self.users / (self.think_time_s + response_s)


def mean_response_s(plan: Plan) -> float | None:
    """A caller's mean wait in the plan (None when the plan has no figure for it)."""
    for key in ("predicted_mean_ms", "predicted_request_ms"):
        value = plan.get(key)
        if value is not None:
            return float(value) / 1000
    return None


def plan_for_users(users: Users, plan_at: Callable[[float], Plan]) -> Plan:
    """``plan_at(qps)`` at the rate the users make, with the derivation in ``users``."""
    response_s = 0.0
    for _ in range(MAX_ROUNDS):
        plan = plan_at(users.rate(response_s))
        measured = mean_response_s(plan)
        if measured is None or abs(measured - response_s) <= max(1e-6, SETTLED * measured):
            break
        response_s = measured
    qps = users.rate(response_s)
    plan["users"] = {
        "users": users.users,
        "think_time_s": users.think_time_s,
        "response_ms": round(response_s * 1000, 3),
        "qps": round(qps, 4),
        "derivation": derivation(users, response_s, qps),
    }
    return plan


def derivation(users: Users, response_s: float, qps: float) -> str:
    """The arithmetic, as a person checks it."""
    cycle = users.think_time_s + response_s
    return (
        f"Little's law over a user's cycle: rate = users / (think time + response time) = "
        f"{users.users:,} / ({users.think_time_s:,.3f} s + {response_s:,.3f} s) = "
        f"{users.users:,} / {cycle:,.3f} s = {qps:,.2f} requests/s"
    )
