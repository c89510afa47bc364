"""What one forward pass reads: the step's tokens, where they go in the cache, and masks.

A step packs every sequence's new tokens into one ``[T]`` row of token ids. Prefilling
sequences are attended one by one (``PrefillSpan``); single-token decodes are attended
in buckets of similar context length (``DecodeBatch``), each bucket padded only to its own
longest context (see ``decode_buckets``). Attention reads the cache a whole block at a
time: position ``p`` of a sequence lives in block ``block_table[p // block_size]`` at
offset ``p % block_size`` (its slot is ``block * block_size + offset``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conveyor.engine.model.paged_varlen import PagedVarlen

__all__ = [
    "AttentionMasks",
    "DecodeBatch",
    "DecodeBucket",
    "PrefillSpan",
    "StepInput",
    "build_masks",
    "prefill_runs",
    "window_hides_keys",
]


@dataclass(frozen=True, slots=True)
class PrefillSpan:
    """One sequence attended on its own: its tokens are ``[token_start, token_end)`` of the step.

    ``context_blocks`` holds the cache blocks of positions ``0 .. end_pos - 1``; it is None
    when ``start_pos == 0``, since then the keys are exactly this step's new tokens.
    """

    token_start: int
    token_end: int
    start_pos: int
    context_blocks: torch.Tensor | None

    @property
    def query_len(self) -> int:
        """Number of new tokens (queries)."""
        return self.token_end - self.token_start

    @property
    def end_pos(self) -> int:
        """Context length the queries attend over."""
        return self.start_pos + self.query_len


@dataclass(frozen=True, slots=True)
class DecodeBucket:
    """Decode rows ``[row_start, row_end)`` of a ``DecodeBatch``, attended in one call.

    ``block_tables`` [b, n] holds each row's blocks, padded to the bucket's longest row
    (``n`` blocks); ``query_positions`` [b] is each new token's position (its context
    length minus one): keys past it are padding.
    """

    row_start: int
    row_end: int
    block_tables: torch.Tensor
    query_positions: torch.Tensor


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """Sequences with one new token each, ordered by context length and cut into buckets.

    ``token_indices`` [B] picks row ``i``'s token out of the step.
    """

    token_indices: torch.Tensor
    buckets: tuple[DecodeBucket, ...]


@dataclass(frozen=True, slots=True)
class StepInput:
    """Everything one forward pass needs, already on the model's device."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    prefills: tuple[PrefillSpan, ...]
    decode: DecodeBatch | None
    logits_indices: torch.Tensor
    # Set where a varlen kernel attends the whole step (``varlen_kernels``); ``prefills``
    # and ``decode`` are then empty.
    varlen: PagedVarlen | None = None


@dataclass(slots=True)
class AttentionMasks:
    """Additive attention masks (0 = may attend, -inf = hidden) for one sliding-window setting.

    Additive, in the model's dtype, and built once per step for all layers: SDPA on CPU
    turns a boolean mask into this form on every call, which cost more than the attention.
    """

    prefill: list[torch.Tensor | None]
    decode: list[torch.Tensor | None]
    # (first, count): prefill spans attended in one call (see ``prefill_runs``).
    prefill_runs: list[tuple[int, int]]


def build_masks(
    step: StepInput, window: int | None, block_size: int, like: torch.Tensor
) -> AttentionMasks:
    """Masks for every group of the step (device and dtype of ``like``); None where a plain
    causal mask does."""
    device = like.device
    prefill: list[torch.Tensor | None] = []
    for seq in step.prefills:
        if seq.start_pos == 0 and not window_hides_keys(window, seq.end_pos):
            prefill.append(None)
            continue
        # Query i sits at position start_pos + i and may see keys 0 .. start_pos + i:
        # the mask is causal aligned to the bottom right, not SDPA's top-left is_causal.
        query_pos = torch.arange(seq.start_pos, seq.end_pos, device=device)[:, None]
        key_pos = torch.arange(seq.end_pos, device=device)[None, :]
        prefill.append(_additive(_causal_window_mask(query_pos, key_pos, window), like))
    decode: list[torch.Tensor | None] = []
    for bucket in step.decode.buckets if step.decode is not None else ():
        query_pos = bucket.query_positions[:, None]
        num_keys = bucket.block_tables.shape[1] * block_size
        key_pos = torch.arange(num_keys, device=device)[None, :]
        # [b, L] -> [b, 1 (heads), 1 (query), L]; padding keys lie past the query position.
        visible = _causal_window_mask(query_pos, key_pos, window)[:, None, None, :]
        decode.append(_additive(visible, like))
    return AttentionMasks(prefill, decode, prefill_runs(step.prefills, prefill))


def window_hides_keys(window: int | None, end_pos: int) -> bool:
    """Whether a sliding ``window`` hides some of a sequence's ``end_pos`` keys from one of
    its queries (else its attention is plainly causal)."""
    return window is not None and window < end_pos


def prefill_runs(
    prefills: tuple[PrefillSpan, ...], masks: list[torch.Tensor | None]
) -> list[tuple[int, int]]:
    """The step's prefill spans as runs ``(first, count)`` of ``prefills``, each attended in
    one call: consecutive whole prompts (no cached context, a plain causal mask: ``None``
    in ``masks``) of one length whose tokens follow each other in the step. Any other span
    is a run of its own. A wave of equal prompts is one call a layer, not one per prompt."""
    runs: list[tuple[int, int]] = []
    for index, (seq, mask) in enumerate(zip(prefills, masks, strict=True)):
        if runs and mask is None:
            first, count = runs[-1]
            head, previous = prefills[first], prefills[index - 1]
            if (
                masks[first] is None
                and head.query_len == seq.query_len
                and previous.token_end == seq.token_start
            ):
                runs[-1] = (first, count + 1)
                continue
        runs.append((index, 1))
    return runs


def _additive(visible: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """0 where ``visible``, -inf elsewhere, in ``like``'s dtype (every row sees its query)."""
    zeros = torch.zeros(visible.shape, dtype=like.dtype, device=like.device)
    return zeros.masked_fill_(~visible, float("-inf"))


def _causal_window_mask(
    query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None
) -> torch.Tensor:
    """``key <= query`` and, with a window, ``key > query - window`` (as Hugging Face)."""
    mask = key_pos <= query_pos
    if window is not None:
        mask = mask & (key_pos > query_pos - window)
    return mask
