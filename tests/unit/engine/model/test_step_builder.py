"""The host side of a step: packed ids, positions and slots; decode buckets; varlen rows."""

from __future__ import annotations

import math

import pytest
import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.paged_varlen import VarlenSequence
from conveyor.engine.model.step_builder import decode_batch, plan_on_cpu, varlen_sequences

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

PROMPT = SeqChunk((5, 6, 7), 2, (4, 9), True)  # positions 2..4 of blocks of 4
DECODE = SeqChunk((8,), 6, (1, 3), True)
SILENT = SeqChunk((9,), 1, (2,), False)


def test_chunks_are_packed_in_order_with_their_slots() -> None:
    plan = plan_on_cpu([PROMPT, DECODE, SILENT], block_size=4, batch_decode=True)
    assert plan.input_ids == [5, 6, 7, 8, 9]
    assert plan.positions == [2, 3, 4, 6, 1]
    # Position p lives in block table[p // 4] at offset p % 4.
    assert plan.slot_mapping == [4 * 4 + 2, 4 * 4 + 3, 9 * 4 + 0, 3 * 4 + 2, 2 * 4 + 1]
    assert plan.logits_indices == [2, 3]  # the last token of each chunk that asks
    assert plan.prefill_chunks == [(0, PROMPT)]
    assert plan.decode_chunks == [(3, DECODE), (4, SILENT)]


def test_without_batch_decode_every_chunk_is_a_prefill() -> None:
    plan = plan_on_cpu([PROMPT, DECODE], block_size=4, batch_decode=False)
    assert [start for start, _ in plan.prefill_chunks] == [0, 3] and plan.decode_chunks == []


def test_decodes_are_sorted_by_context_and_padded_per_bucket() -> None:
    rows = [(0, SeqChunk((1,), 9, (7, 8, 5), True)), (1, SeqChunk((2,), 2, (6,), True))]
    batch = decode_batch(rows, block_size=4, bucket_cost_blocks=math.inf, to_device=lambda t: t)
    assert batch is not None and batch.token_indices.tolist() == [1, 0]
    (bucket,) = batch.buckets
    assert bucket.block_tables.tolist() == [[6, 0, 0], [7, 8, 5]]
    assert bucket.query_positions.tolist() == [2, 9]
    assert decode_batch([], 4, math.inf, torch.as_tensor) is None


def test_varlen_rows_are_the_chunks_in_step_order() -> None:
    assert varlen_sequences([PROMPT, DECODE]) == [
        VarlenSequence(3, 5, (4, 9)),
        VarlenSequence(1, 7, (1, 3)),
    ]
