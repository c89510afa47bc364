"""What a varlen paged attention kernel (flash-attn, FlashInfer) reads about a step.

Such a kernel attends every sequence of the step in one call a layer, prefills and decodes
alike, reading keys and values where they lie in the paged cache. It takes the step's
queries as one ``[T, heads, dim]`` tensor, sequence after sequence (as the runner packs
them), and describes the sequences twice over, once in each library's terms:

- flash-attn: cumulative query and context lengths (``cu_seqlens_q`` / ``cu_seqlens_k``)
  and a block table padded to the longest sequence;
- FlashInfer: the same query offsets (``qo_indptr``) and the pages in compressed rows
  (``paged_kv_indptr``, ``paged_kv_indices``, ``paged_kv_last_page_len``).

Every index is int32, as both libraries take them. Built on the host once a step, copied to
the device once; pure logic otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

__all__ = ["PagedVarlen", "VarlenSequence", "paged_varlen"]


@dataclass(frozen=True, slots=True)
class VarlenSequence:
    """One sequence of a step: ``query_len`` new tokens ending a context of ``context_len``
    tokens (the new ones included), whose positions ``p`` live in block
    ``blocks[p // block_size]``."""

    query_len: int
    context_len: int
    blocks: Sequence[int]


@dataclass(frozen=True, slots=True)
class PagedVarlen:
    """One step's sequences as the varlen kernels take them (int32 tensors, N sequences)."""

    query_start: torch.Tensor  # [N + 1]: sequence i's queries are rows [q[i], q[i + 1])
    context_start: torch.Tensor  # [N + 1]: cumulative context lengths (cu_seqlens_k)
    context_lens: torch.Tensor  # [N]
    block_table: torch.Tensor  # [N, most blocks], short rows padded with block 0
    page_start: torch.Tensor  # [N + 1]: sequence i's pages are page_ids[p[i], p[i + 1])
    page_ids: torch.Tensor  # [all pages of the step]
    last_page_len: torch.Tensor  # [N]: tokens in each sequence's last page, 1 .. block_size
    max_query_len: int
    max_context_len: int

    @property
    def num_sequences(self) -> int:
        """Sequences in the step."""
        return int(self.context_lens.shape[0])

    def to(self, device: torch.device) -> PagedVarlen:
        """The same tensors on ``device`` (one copy each; not blocking the host)."""

        def moved(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to(device, non_blocking=True)

        return PagedVarlen(
            moved(self.query_start), moved(self.context_start), moved(self.context_lens),
            moved(self.block_table), moved(self.page_start), moved(self.page_ids),
            moved(self.last_page_len), self.max_query_len, self.max_context_len,
        )  # fmt: skip


def paged_varlen(sequences: Sequence[VarlenSequence], block_size: int) -> PagedVarlen:
    """The kernels' view of ``sequences``, in the order their queries lie in the step."""
    if not sequences:
        raise ValueError("a step needs at least one sequence")
    tables: list[list[int]] = []
    for seq in sequences:
        if not 1 <= seq.query_len <= seq.context_len:
            raise ValueError(f"query_len {seq.query_len} must be in [1, {seq.context_len}]")
        num_blocks = -(-seq.context_len // block_size)
        if len(seq.blocks) < num_blocks:
            raise ValueError(f"{seq.context_len} tokens need {num_blocks} blocks")
        tables.append(list(seq.blocks[:num_blocks]))
    width = max(len(table) for table in tables)
    context_lens = [seq.context_len for seq in sequences]

    def int32(values: Sequence[int] | Sequence[Sequence[int]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32)

    return PagedVarlen(
        query_start=int32([0, *accumulate(seq.query_len for seq in sequences)]),
        context_start=int32([0, *accumulate(context_lens)]),
        context_lens=int32(context_lens),
        block_table=int32([[*table, *[0] * (width - len(table))] for table in tables]),
        page_start=int32([0, *accumulate(len(table) for table in tables)]),
        page_ids=int32([block for table in tables for block in table]),
        last_page_len=int32([(length - 1) % block_size + 1 for length in context_lens]),
        max_query_len=max(seq.query_len for seq in sequences),
        max_context_len=max(context_lens),
    )
