"""Tests for the engine's per-request state."""

from __future__ import annotations

import pytest

from conveyor.engine.core.sequence import Priority, Sequence, SequenceStatus, check_token_id


def test_new_sequence_holds_a_copy_of_the_prompt() -> None:
    prompt = [5, 6, 7]
    seq = Sequence("s", prompt, Priority.BATCH, arrival=3)
    prompt.append(8)
    assert seq.prompt_token_ids == [5, 6, 7]
    assert seq.token_ids == [5, 6, 7]
    assert seq.token_ids is not seq.prompt_token_ids
    assert seq.status is SequenceStatus.WAITING
    assert (seq.num_computed_tokens, seq.num_cached_tokens, seq.num_preemptions) == (0, 0, 0)
    assert seq.block_table == []
    assert seq.priority is Priority.BATCH


def test_counters_follow_generation() -> None:
    seq = Sequence("s", [1, 2, 3])
    assert (seq.num_tokens, seq.num_prompt_tokens, seq.num_output_tokens) == (3, 3, 0)
    seq.num_computed_tokens = 3
    seq.append_token(9)
    seq.append_token(10)
    assert (seq.num_tokens, seq.num_prompt_tokens, seq.num_output_tokens) == (5, 3, 2)
    assert seq.output_token_ids == [9, 10]
    assert seq.num_uncomputed_tokens == 2


def test_output_token_ids_is_a_copy() -> None:
    seq = Sequence("s", [1])
    seq.append_token(2)
    seq.output_token_ids.append(99)
    assert seq.token_ids == [1, 2]


def test_is_prefill_until_the_sequence_decodes_its_own_sample() -> None:
    seq = Sequence("s", [1, 2, 3, 4])
    assert seq.is_prefill
    seq.num_computed_tokens = 2  # first chunk done
    assert seq.is_prefill
    seq.num_computed_tokens = 4
    seq.append_token(5)
    assert not seq.is_prefill  # one token to compute: the one it sampled
    seq.num_computed_tokens = 0  # preempted: everything is recomputed
    assert seq.is_prefill


def test_one_token_prompt_is_a_prefill() -> None:
    seq = Sequence("s", [1])
    assert seq.num_uncomputed_tokens == 1
    assert seq.is_prefill


def test_priority_accepts_ints_and_orders_online_first() -> None:
    assert Sequence("s", [1], priority=1).priority is Priority.BATCH  # type: ignore[arg-type]
    assert Priority.ONLINE < Priority.BATCH


def test_is_finished() -> None:
    seq = Sequence("s", [1])
    assert not seq.is_finished
    seq.status = SequenceStatus.RUNNING
    assert not seq.is_finished
    seq.status = SequenceStatus.ABORTED
    assert seq.is_finished
    seq.status = SequenceStatus.FINISHED
    assert seq.is_finished


def test_equality_is_identity() -> None:
    a = Sequence("s", [1])
    b = Sequence("s", [1])
    assert a != b
    assert a == a
    assert len({a, b}) == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seq_id": "", "prompt_token_ids": [1]}, "seq_id"),
        ({"seq_id": "s", "prompt_token_ids": []}, "must not be empty"),
        ({"seq_id": "s", "prompt_token_ids": [1, -1]}, "out of range"),
        ({"seq_id": "s", "prompt_token_ids": [2**63]}, "out of range"),
        ({"seq_id": "s", "prompt_token_ids": [1.0]}, "must be ints"),
        ({"seq_id": "s", "prompt_token_ids": [True]}, "must be ints"),
        # One bad id among many plain ones (prompts are checked in bulk first).
        ({"seq_id": "s", "prompt_token_ids": [5] * 999 + [False]}, "must be ints"),
        ({"seq_id": "s", "prompt_token_ids": [5] * 999 + [2**63]}, "out of range"),
        ({"seq_id": "s", "prompt_token_ids": [5] * 999 + [-1]}, "out of range"),
        ({"seq_id": "s", "prompt_token_ids": [1], "arrival": -1}, "arrival"),
        ({"seq_id": "s", "prompt_token_ids": [1], "arrival": 1.5}, "arrival"),
        ({"seq_id": "s", "prompt_token_ids": [1], "priority": 7}, "Priority"),
        ({"seq_id": "s", "prompt_token_ids": [1], "prefix_group": ""}, "prefix_group"),
        ({"seq_id": "s", "prompt_token_ids": [1], "prefix_group": 3}, "prefix_group"),
        ({"seq_id": "s", "prompt_token_ids": [1], "uses_prefix_cache": 0}, "uses_prefix_cache"),
    ],
)
def test_bad_construction_raises(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Sequence(**kwargs)  # type: ignore[arg-type]


def test_append_token_rejects_bad_ids() -> None:
    seq = Sequence("s", [1])
    with pytest.raises(ValueError, match="out of range"):
        seq.append_token(-3)
    with pytest.raises(ValueError, match="must be ints"):
        seq.append_token(True)
    with pytest.raises(ValueError, match="out of range"):
        seq.append_token(2**63)
    assert seq.token_ids == [1]


class _TokenId(int):
    """An int subclass: a valid id, though not a plain int."""


def test_int_subclasses_are_valid_ids_in_prompts_and_samples() -> None:
    seq = Sequence("s", [1, _TokenId(2), 2**63 - 1])
    seq.append_token(_TokenId(3))
    assert seq.token_ids == [1, 2, 2**63 - 1, 3]


def test_check_token_id_accepts_the_full_range() -> None:
    check_token_id("s", 0)
    check_token_id("s", 2**63 - 1)
