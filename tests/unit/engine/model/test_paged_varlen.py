"""The varlen kernels' view of a step: offsets, padded tables, compressed pages."""

from __future__ import annotations

import pytest
import torch

from conveyor.engine.model.paged_varlen import VarlenSequence, paged_varlen


def test_a_prefill_a_decode_and_a_chunk_with_context() -> None:
    step = paged_varlen(
        [
            VarlenSequence(query_len=5, context_len=5, blocks=(7, 8, 99)),  # whole prompt
            VarlenSequence(query_len=1, context_len=9, blocks=(1, 2, 3)),  # a decode
            VarlenSequence(query_len=3, context_len=12, blocks=(4, 5, 6)),  # a later chunk
        ],
        block_size=4,
    )
    assert step.query_start.tolist() == [0, 5, 6, 9]
    assert step.context_start.tolist() == [0, 5, 14, 26]
    assert step.context_lens.tolist() == [5, 9, 12]
    # Only the blocks the context fills: the prompt's third block is not read.
    assert step.block_table.tolist() == [[7, 8, 0], [1, 2, 3], [4, 5, 6]]
    assert step.page_start.tolist() == [0, 2, 5, 8]
    assert step.page_ids.tolist() == [7, 8, 1, 2, 3, 4, 5, 6]
    assert step.last_page_len.tolist() == [1, 1, 4]
    assert (step.max_query_len, step.max_context_len, step.num_sequences) == (5, 12, 3)
    tensors = (step.query_start, step.block_table, step.page_ids, step.last_page_len)
    assert all(tensor.dtype == torch.int32 for tensor in tensors)


def test_moving_keeps_values_and_lengths() -> None:
    step = paged_varlen([VarlenSequence(2, 2, (3,))], block_size=16)
    moved = step.to(torch.device("cpu"))
    assert moved.page_ids.tolist() == [3] and moved.max_context_len == 2


@pytest.mark.parametrize(
    ("sequences", "message"),
    [
        ([], "at least one sequence"),
        ([VarlenSequence(0, 4, (1,))], "query_len 0"),
        ([VarlenSequence(5, 4, (1,))], "query_len 5"),
        ([VarlenSequence(1, 9, (1, 2))], "need 3 blocks"),
    ],
)
def test_bad_sequences_are_refused(sequences: list[VarlenSequence], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        paged_varlen(sequences, block_size=4)
