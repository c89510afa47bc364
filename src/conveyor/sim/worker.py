"""What every simulated worker offers the gateways, the job runner and the faults."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from conveyor.sim.request import SimRequest

# A worker's answer to one attempt: the request, an HTTP status, Retry-After seconds.
Reply = Callable[[SimRequest, int, float], None]
# Status of an attempt that never reached a live process (refused, reset, timed out).
TRANSPORT_ERROR = 0


class SimWorker(Protocol):
    """A worker process as the rest of the simulation sees it."""

    worker_id: str
    region: str
    is_alive: bool
    is_reachable: bool
    slowdown: float

    def receive(self, request: SimRequest, reply: Reply) -> None:
        """An attempt arrives; ``reply`` is called once, when it ends."""

    def abort(self, rid: int) -> None:
        """The caller left (deadline passed): drop the request if it is still here."""

    def kill(self) -> list[tuple[SimRequest, Reply]]:
        """The process dies: everything in flight, for the faults to fail."""

    def load(self) -> dict[str, Any]:
        """The heartbeat's load entry (the shape a real worker reports)."""

    def sample(self, now_s: float) -> dict[str, float]:
        """Gauges for the per-second series: queue depth, running, KV use, batch fill."""
