"""Grouped-query attention against plain softmax attention with repeated KV heads."""

from __future__ import annotations

import math

import pytest
import torch

from conveyor.engine.model.hf_config import DecoderConfig, RopeSpec
from conveyor.engine.model.layers.attention import Attention, decode_attention, grouped_attention
from conveyor.engine.model.step_inputs import AttentionMasks, PrefillSpan, StepInput

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_matches_the_reference(dtype: torch.dtype) -> None:
    # One query per row, three query heads per KV head, rows with different context lengths.
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(4, 6, 1, 8, generator=generator)
    k = torch.randn(4, 2, 12, 8, generator=generator)
    v = torch.randn(4, 2, 12, 8, generator=generator)
    lengths = torch.tensor([12, 5, 1, 9])
    visible = (torch.arange(12)[None, :] < lengths[:, None])[:, None, None, :]
    additive = torch.zeros(visible.shape).masked_fill(~visible, -math.inf)
    # decode_attention takes keys and values as gathered: [B, len, kv_heads, dim].
    gathered_k, gathered_v = k.transpose(1, 2).to(dtype), v.transpose(1, 2).to(dtype)
    out = decode_attention(q.to(dtype), gathered_k, gathered_v, additive.to(dtype))
    expected = _reference_attention(q, k, v, visible.expand(4, 1, 1, 12))
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, **tolerance)


def test_decode_attention_without_a_mask_sees_every_key() -> None:
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 1, 8, generator=generator)
    k = torch.randn(2, 4, 7, 8, generator=generator)
    v = torch.randn(2, 4, 7, 8, generator=generator)
    everything = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    torch.testing.assert_close(
        decode_attention(q, k.transpose(1, 2), v.transpose(1, 2), None),
        _reference_attention(q, k, v, everything),
    )


def _attention(num_heads: int, num_kv_heads: int, head_dim: int) -> Attention:
    config = DecoderConfig(
        model_type="llama", vocab_size=16, hidden_size=num_heads * head_dim,
        intermediate_size=8, num_layers=1, num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, rms_norm_eps=1e-5, max_position_embeddings=64,
        rope=RopeSpec("default", 10000.0), tie_word_embeddings=False, has_qkv_bias=False,
        has_o_bias=False, has_mlp_bias=False, has_qk_norm=False, sliding_windows=(None,),
    )  # fmt: skip
    return Attention(config, device=torch.device("cpu"), dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equal_prompts_in_one_call_attend_as_one_call_each(dtype: torch.dtype) -> None:
    # Three 5-token prompts, then one of 3, each from position 0: in runs or one by one,
    # every row attends its own prompt's keys alone (no row sees another prompt's).
    attention = _attention(num_heads=4, num_kv_heads=2, head_dim=8)
    gen = torch.Generator().manual_seed(3)
    spans = tuple(
        PrefillSpan(start, start + n, 0, None) for start, n in ((0, 5), (5, 5), (10, 5), (15, 3))
    )
    q, k, v = (torch.randn(18, heads, 8, generator=gen).to(dtype) for heads in (4, 2, 2))
    slots = torch.arange(18)
    step = StepInput(slots, slots, slots, spans, None, slots)

    def attended(runs: list[tuple[int, int]]) -> torch.Tensor:
        cache = (torch.zeros(5, 4, 2, 8, dtype=dtype), torch.zeros(5, 4, 2, 8, dtype=dtype))
        masks = AttentionMasks([None] * 4, [], runs)
        return attention.attend(q, k, v, step, cache, masks)

    batched = attended([(0, 3), (3, 1)])
    assert torch.equal(batched, attended([(0, 1), (1, 1), (2, 1), (3, 1)]))
    first = grouped_attention(*(x[:5].transpose(0, 1)[None] for x in (q, k, v)), None)
    torch.testing.assert_close(batched[:5], first[0].transpose(0, 1).reshape(5, 32))
