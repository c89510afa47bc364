"""Grouped-query attention against plain softmax attention with repeated KV heads."""

from __future__ import annotations

import math

import pytest
import torch

from conveyor.engine.model.layers.attention import grouped_attention

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs


def _reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Plain softmax attention with KV heads repeated by hand."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1) @ v


@pytest.mark.parametrize("can_repeat_kv", [True, False])
def test_grouped_attention_with_a_mask(can_repeat_kv: bool) -> None:
    # The repeated-KV path is what CUDA takes; both must equal the reference.
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 5, 8, generator=generator)
    k = torch.randn(3, 2, 9, 8, generator=generator)
    v = torch.randn(3, 2, 9, 8, generator=generator)
    query_pos = torch.arange(4, 9)[:, None]
    mask = (torch.arange(9)[None, :] <= query_pos)[None, None].expand(3, 1, 5, 9)
    out = grouped_attention(q, k, v, mask, can_repeat_kv=can_repeat_kv)
    torch.testing.assert_close(out, _reference_attention(q, k, v, mask))
