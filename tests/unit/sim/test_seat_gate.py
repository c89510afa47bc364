"""The simulated workers' admission arithmetic: 429s, Retry-After, the shedding clock."""

from __future__ import annotations

from conveyor.priority import Priority
from conveyor.sim.request import SimRequest
from conveyor.sim.seat_gate import SHED_EVERY_S, SeatGate


def request(priority: Priority = Priority.ONLINE, deadline_s: float = 10.0) -> SimRequest:
    return SimRequest(rid=1, source="s", tenant="t", prompt_ids=[1, 2], output_tokens=4,
                      arrival_s=0.0, deadline_s=deadline_s, priority=priority)  # fmt: skip


def seat_every_second(gate: SeatGate, last_s: float) -> None:
    """Seats turned over once a second up to ``last_s``, with requests waiting throughout
    (enough intervals for a measured mean)."""
    for now in range(1, int(last_s) + 1):
        gate.on_finish(float(now), admitted_s=now - 0.5, num_waiting=10)


def test_a_full_queue_refuses_online_requests_and_never_batch_lines() -> None:
    gate = SeatGate(max_queue=2, max_num_seqs=4)
    assert gate.refusal(request(), 0.0, num_waiting=1, num_waiting_online=1) is None
    assert gate.refusal(request(), 0.0, num_waiting=2, num_waiting_online=2) == 1.0
    assert gate.refusal(request(Priority.BATCH), 0.0, 50, 0) is None


def test_a_seat_predicted_after_the_deadline_is_a_429_with_the_drain_as_retry_after() -> None:
    gate = SeatGate(max_queue=100, max_num_seqs=4)
    seat_every_second(gate, 10.0)
    assert gate.refusal(request(deadline_s=10.0 + 20.0), 10.0, 10, 10) is None
    assert gate.refusal(request(deadline_s=10.0 + 2.0), 10.0, 10, 10) == 10.0


def test_before_any_turnover_retry_after_is_rounds_of_the_mean_run() -> None:
    gate = SeatGate(max_queue=100, max_num_seqs=4)
    assert gate.retry_after_s(9) == 1.0  # 3 rounds of the 0.1 s floor, at least a second
    assert gate.shed_interval_s(0.0) is None and gate.is_shed_due(0.0)


def test_shedding_is_looked_at_most_every_shed_interval() -> None:
    gate = SeatGate(max_queue=100, max_num_seqs=4)
    seat_every_second(gate, 10.0)
    assert gate.shed_interval_s(10.0) == 1.0
    assert not gate.is_shed_due(10.0 + SHED_EVERY_S / 2)
    assert gate.is_shed_due(10.0 + SHED_EVERY_S)
