"""Attention masks of a step: bottom-right causal for chunks, sliding windows, decodes."""

from __future__ import annotations

import pytest
import torch

from conveyor.engine.model.step_inputs import (
    DecodeBatch,
    DecodeBucket,
    PrefillSpan,
    StepInput,
    build_masks,
    prefill_runs,
    window_hides_keys,
)

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

LIKE = torch.empty(0)  # masks in float32 on the CPU


def _step(prefills: tuple[PrefillSpan, ...], decode: DecodeBatch | None = None) -> StepInput:
    empty = torch.empty(0, dtype=torch.int64)
    return StepInput(empty, empty, empty, prefills, decode, empty)


def test_a_whole_prompt_without_a_binding_window_uses_the_plain_causal_mask() -> None:
    step = _step((PrefillSpan(0, 4, 0, None),))
    assert build_masks(step, None, 4, LIKE).prefill == [None]
    assert build_masks(step, 8, 4, LIKE).prefill == [None]


def test_a_later_chunk_sees_its_whole_context_causally() -> None:
    step = _step((PrefillSpan(0, 2, 3, torch.arange(2)),))
    (mask,) = build_masks(step, None, 4, LIKE).prefill
    assert mask is not None
    assert (mask == 0).tolist() == [[True] * 4 + [False], [True] * 5]


def test_a_binding_window_hides_keys_too_far_back() -> None:
    step = _step((PrefillSpan(0, 3, 0, None),))
    (mask,) = build_masks(step, 2, 4, LIKE).prefill
    assert mask is not None
    assert (mask == 0).tolist() == [[True, False, False], [True, True, False], [False, True, True]]


def test_a_window_hides_keys_only_when_shorter_than_the_context() -> None:
    # A query at position end_pos - 1 sees keys end_pos - window .. end_pos - 1.
    assert not window_hides_keys(None, 100)
    assert not window_hides_keys(8, 8)
    assert window_hides_keys(7, 8)


def test_decode_rows_hide_padding_past_each_query() -> None:
    bucket = DecodeBucket(
        row_start=0,
        row_end=2,
        block_tables=torch.zeros((2, 1), dtype=torch.int64),
        query_positions=torch.tensor([2, 0]),
    )
    decode = DecodeBatch(token_indices=torch.tensor([0, 1]), buckets=(bucket,))
    masks = build_masks(_step((), decode), None, 3, LIKE)
    (mask,) = masks.decode
    assert mask is not None
    assert mask.shape == (2, 1, 1, 3)
    assert mask.dtype == torch.float32 and set(mask.flatten().tolist()) == {0.0, float("-inf")}
    assert (mask[:, 0, 0] == 0).tolist() == [[True, True, True], [True, False, False]]


def test_each_decode_bucket_gets_a_mask_as_wide_as_its_blocks() -> None:
    short = DecodeBucket(0, 1, torch.zeros((1, 1), dtype=torch.int64), torch.tensor([1]))
    long = DecodeBucket(1, 3, torch.zeros((2, 3), dtype=torch.int64), torch.tensor([9, 11]))
    decode = DecodeBatch(token_indices=torch.tensor([1, 0, 2]), buckets=(short, long))
    first, second = build_masks(_step((), decode), 4, 4, LIKE).decode
    assert first is not None and second is not None
    assert (first[:, 0, 0] == 0).tolist() == [[True, True, False, False]]
    # A window of 4 hides keys at or before query - 4 as well as padding past the query.
    assert (second[1, 0, 0] == 0).nonzero().flatten().tolist() == [8, 9, 10, 11]
    assert (second[0, 0, 0] == 0).nonzero().flatten().tolist() == [6, 7, 8, 9]


def test_equal_whole_prompts_back_to_back_are_one_run() -> None:
    spans = (
        PrefillSpan(0, 4, 0, None),
        PrefillSpan(4, 8, 0, None),
        PrefillSpan(8, 12, 0, None),
        PrefillSpan(12, 15, 0, None),  # another length: a run of its own
        PrefillSpan(15, 18, 0, None),  # and this one joins it
    )
    assert prefill_runs(spans, [None] * 5) == [(0, 3), (3, 2)]
    assert build_masks(_step(spans), None, 4, LIKE).prefill_runs == [(0, 3), (3, 2)]


def test_chunks_windows_and_gaps_break_a_run() -> None:
    chunk = PrefillSpan(8, 12, 4, torch.tensor([0, 1]))  # cached context: its own mask
    spans = (PrefillSpan(0, 4, 0, None), PrefillSpan(4, 8, 0, None), chunk)
    masks = build_masks(_step(spans), None, 4, LIKE)
    assert masks.prefill_runs == [(0, 2), (2, 1)]
    # A binding window gives whole prompts masks: no runs.
    assert build_masks(_step(spans[:2]), 2, 4, LIKE).prefill_runs == [(0, 1), (1, 1)]
    # Not back to back in the step (decode tokens between them): no run.
    apart = (PrefillSpan(0, 4, 0, None), PrefillSpan(5, 9, 0, None))
    assert prefill_runs(apart, [None, None]) == [(0, 1), (1, 1)]
