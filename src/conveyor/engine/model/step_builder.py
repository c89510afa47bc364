"""The host side of a step: the scheduler's chunks packed into index lists and tables.

``plan_on_cpu`` packs token ids, positions and cache slots and splits the chunks into
prefills and decodes; ``decode_batch`` orders the decodes by context length and cuts them
into buckets (``decode_buckets``); ``varlen_sequences`` describes every chunk for a varlen
kernel (``paged_varlen``). The model runner copies the results to the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.decode_buckets import plan_decode_buckets
from conveyor.engine.model.paged_varlen import VarlenSequence
from conveyor.engine.model.step_inputs import DecodeBatch, DecodeBucket

__all__ = ["CpuPlan", "decode_batch", "plan_on_cpu", "varlen_sequences"]


@dataclass(frozen=True, slots=True)
class CpuPlan:
    """Host-side index lists for a step, before the single copy to the device."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    logits_indices: list[int]
    prefill_chunks: list[tuple[int, SeqChunk]]
    decode_chunks: list[tuple[int, SeqChunk]]


def plan_on_cpu(chunks: Sequence[SeqChunk], block_size: int, batch_decode: bool) -> CpuPlan:
    """Pack token ids, positions and slots; split chunks into prefill and decode groups
    (single-token chunks are decodes where ``batch_decode``)."""
    plan = CpuPlan([], [], [], [], [], [])
    for chunk in chunks:
        token_start = len(plan.input_ids)
        plan.input_ids.extend(chunk.token_ids)
        for pos in range(chunk.start_pos, chunk.end_pos):
            plan.positions.append(pos)
            plan.slot_mapping.append(
                chunk.block_table[pos // block_size] * block_size + pos % block_size
            )
        if chunk.needs_logits:
            plan.logits_indices.append(len(plan.input_ids) - 1)
        is_decode = batch_decode and len(chunk.token_ids) == 1
        group = plan.decode_chunks if is_decode else plan.prefill_chunks
        group.append((token_start, chunk))
    return plan


def decode_batch(
    decode_chunks: list[tuple[int, SeqChunk]],
    block_size: int,
    bucket_cost_blocks: float,
    to_device: Callable[[torch.Tensor], torch.Tensor],
) -> DecodeBatch | None:
    """Single-token chunks ordered by context length and cut into buckets; None if none."""
    if not decode_chunks:
        return None
    rows = sorted(decode_chunks, key=lambda row: row[1].end_pos)
    num_blocks = [-(-chunk.end_pos // block_size) for _, chunk in rows]
    buckets = []
    for start, end in plan_decode_buckets(num_blocks, bucket_cost_blocks):
        width = num_blocks[end - 1]
        # Short tables are padded with block 0: its keys lie past each row's own
        # context, so the mask gives them zero weight.
        tables = [
            [*chunk.block_table[: num_blocks[row]], *[0] * (width - num_blocks[row])]
            for row, (_, chunk) in enumerate(rows[start:end], start)
        ]
        positions = [chunk.start_pos for _, chunk in rows[start:end]]
        buckets.append(
            DecodeBucket(
                row_start=start,
                row_end=end,
                block_tables=to_device(torch.tensor(tables, dtype=torch.int64)),
                query_positions=to_device(torch.tensor(positions, dtype=torch.int64)),
            )
        )
    token_indices = torch.tensor([start for start, _ in rows], dtype=torch.int64)
    return DecodeBatch(token_indices=to_device(token_indices), buckets=tuple(buckets))


def varlen_sequences(chunks: Sequence[SeqChunk]) -> list[VarlenSequence]:
    """Every chunk as a varlen kernel reads it, in step order."""
    return [
        VarlenSequence(len(chunk.token_ids), chunk.end_pos, chunk.block_table) for chunk in chunks
    ]
