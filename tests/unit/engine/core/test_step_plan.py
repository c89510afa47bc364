"""The share of a step's room an admitted prompt leaves to those waiting behind it."""

from __future__ import annotations

from conveyor.engine.core.step_plan import StepPlan, share_left_behind


def test_a_prompt_too_long_for_the_room_leaves_half_of_it_behind() -> None:
    assert share_left_behind(2048, 2048, num_needed=30_000) == 1024
    assert share_left_behind(2048, 2048) == 1024  # a running prefill's hold
    assert share_left_behind(128, 2048, num_needed=129) == 64  # a 32nd of the step


def test_a_prompt_that_fits_the_room_takes_it_whole() -> None:
    assert share_left_behind(2048, 2048, num_needed=129) == 0
    assert share_left_behind(129, 2048, num_needed=129) == 0


def test_no_sliver_of_the_step_is_held_back() -> None:
    assert share_left_behind(126, 2048, num_needed=129) == 0  # 63: under a 32nd
    assert share_left_behind(126, 2048) == 0
    assert share_left_behind(3, 16, num_needed=30) == 1  # a tiny step's halves stay


def test_the_plan_answers_for_its_own_budget() -> None:
    plan = StepPlan(2048)
    assert plan.share_left_behind(126, 129) == 0
    assert StepPlan(16).share_left_behind(126, 129) == 63
