"""The stepping life both generative worker models share: at most one step in flight, a
step planned as soon as work arrives, late waiting requests shed at a step's start, and
steps planned before a kill ignored (each carries the epoch it was planned in)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from conveyor.sim.clock import Clock
from conveyor.sim.seat_gate import SeatGate

__all__ = ["StepLoop"]


class StepLoop(ABC):
    """Base of ``LlmWorker`` and ``CountedLlmWorker``, which plan the step itself."""

    def __init__(self, clock: Clock, gate: SeatGate) -> None:
        """Alive and idle on ``clock``; ``gate`` holds the waiting requests' seats."""
        self.is_alive = True
        self.gate = gate
        self._clock = clock
        self._epoch = 0
        self._is_stepping = False

    def _wake(self) -> None:
        """Plan a step now unless one is in flight (or the worker is dead)."""
        if not self._is_stepping and self.is_alive:
            self._is_stepping = True
            self._clock.after(0.0, self._step, self._epoch)

    def _step(self, epoch: int) -> None:
        """Shed what turned late, then plan a step; idle when there is nothing to run."""
        if epoch != self._epoch:
            return
        now = self._clock.now
        if self.gate.is_shed_due(now):
            self._shed_late(now)
        if not self._plan_step(now, epoch):
            self._is_stepping = False

    def _stop_stepping(self) -> None:
        """The worker died: no step of this epoch runs on."""
        self.is_alive = False
        self._epoch += 1

    @abstractmethod
    def _plan_step(self, now: float, epoch: int) -> bool:
        """Plan and time one step (its end scheduled on the clock); False when none runs."""

    @abstractmethod
    def _shed_late(self, now: float) -> None:
        """Refuse (429) waiting requests that would get a seat after their deadline."""
