"""Sibling sequences: which prompts of a call form a prefix group, and when one waits."""

from __future__ import annotations

from conveyor.engine.core.sequence import Sequence
from conveyor.engine.core.siblings import prefix_groups, waits_for_sibling


def test_repeated_prompts_of_one_call_form_prefix_groups() -> None:
    groups = prefix_groups("r", [[1, 2], [3], [1, 2], [1, 2], [4]])
    assert groups == ["r-p0", None, "r-p0", "r-p0", None]
    assert prefix_groups("r", [[1], [2]]) == [None, None]


def test_a_sibling_waits_until_the_shared_blocks_are_computed() -> None:
    prompt = list(range(1, 11))  # two full blocks of 4 can be shared
    leader = Sequence("a", prompt, prefix_group="g")
    waiting = Sequence("b", prompt, prefix_group="g")
    stranger = Sequence("c", prompt)
    leader.num_computed_tokens = 7
    assert waits_for_sibling(waiting, [leader], block_size=4)
    assert not waits_for_sibling(stranger, [leader], block_size=4)
    leader.num_computed_tokens = 8
    assert not waits_for_sibling(waiting, [leader], block_size=4)
    assert not waits_for_sibling(waiting, [leader], block_size=16)  # nothing to share
