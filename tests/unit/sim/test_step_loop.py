"""The stepping life the generative worker models share: one step in flight, idle when
nothing runs, late requests shed at a step's start, steps of a dead epoch ignored."""

from __future__ import annotations

from conveyor.sim.clock import Clock
from conveyor.sim.seat_gate import SeatGate
from conveyor.sim.step_loop import StepLoop


class Steps(StepLoop):
    """Runs ``work`` steps of 1 s each; records what it planned and shed."""

    def __init__(self, clock: Clock, work: int) -> None:
        super().__init__(clock, SeatGate(max_queue=8, max_num_seqs=2))
        self.work = work
        self.planned: list[float] = []
        self.shed: list[float] = []

    def _plan_step(self, now: float, epoch: int) -> bool:
        if not self.work:
            return False
        self.work -= 1
        self.planned.append(now)
        self._clock.after(1.0, self._step, epoch)
        return True

    def _shed_late(self, now: float) -> None:
        self.shed.append(now)


def test_one_step_at_a_time_until_the_work_is_done_then_idle() -> None:
    clock = Clock()
    loop = Steps(clock, work=3)
    loop._wake()
    loop._wake()  # a step is already planned: no second one
    clock.run(10.0)
    assert loop.planned == [0.0, 1.0, 2.0]
    assert not loop._is_stepping
    assert loop.shed  # shedding is looked at when a step starts
    loop.work = 1
    loop._wake()  # idle: new work plans a step again
    clock.run(20.0)
    assert loop.planned[-1] == 10.0


def test_a_killed_worker_runs_no_step_of_its_old_epoch_and_wakes_no_more() -> None:
    clock = Clock()
    loop = Steps(clock, work=5)
    loop._wake()
    clock.run(1.5)
    loop._stop_stepping()
    clock.run(10.0)
    assert loop.planned == [0.0, 1.0]
    loop._wake()
    clock.run(20.0)
    assert loop.planned == [0.0, 1.0]
