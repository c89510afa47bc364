"""Attention masks of a step: bottom-right causal for chunks, sliding windows, decodes."""

from __future__ import annotations

import pytest
import torch

from conveyor.engine.step_inputs import DecodeBatch, PrefillSpan, StepInput, build_masks

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

CPU = torch.device("cpu")


def _step(prefills: tuple[PrefillSpan, ...], decode: DecodeBatch | None = None) -> StepInput:
    empty = torch.empty(0, dtype=torch.int64)
    return StepInput(empty, empty, empty, prefills, decode, empty)


def test_a_whole_prompt_without_a_binding_window_uses_the_plain_causal_mask() -> None:
    step = _step((PrefillSpan(0, 4, 0, None),))
    assert build_masks(step, None, CPU).prefill == [None]
    assert build_masks(step, 8, CPU).prefill == [None]


def test_a_later_chunk_sees_its_whole_context_causally() -> None:
    step = _step((PrefillSpan(0, 2, 3, torch.arange(5)),))
    (mask,) = build_masks(step, None, CPU).prefill
    assert mask is not None
    assert mask.tolist() == [[True] * 4 + [False], [True] * 5]


def test_a_binding_window_hides_keys_too_far_back() -> None:
    step = _step((PrefillSpan(0, 3, 0, None),))
    (mask,) = build_masks(step, 2, CPU).prefill
    assert mask is not None
    assert mask.tolist() == [[True, False, False], [True, True, False], [False, True, True]]


def test_decode_rows_hide_padding_past_each_query() -> None:
    decode = DecodeBatch(
        token_indices=torch.tensor([0, 1]),
        context_slots=torch.zeros((2, 3), dtype=torch.int64),
        query_positions=torch.tensor([2, 0]),
    )
    masks = build_masks(_step((), decode), None, CPU)
    assert masks.decode is not None
    assert masks.decode.shape == (2, 1, 1, 3)
    assert masks.decode[:, 0, 0].tolist() == [[True, True, True], [True, False, False]]
