"""Parsing Hugging Face config dicts into the decoder's config."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.engine.model.hf_config import DecoderConfig, RopeSpec


def _raw(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model_type": "llama",
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
    }
    return base | overrides


def test_defaults_for_a_plain_llama_config() -> None:
    config = DecoderConfig.from_hf(_raw())
    assert config.head_dim == 16
    assert config.rope == RopeSpec(rope_type="default", theta=10000.0)
    assert config.sliding_windows == (None, None)
    assert not (config.has_qkv_bias or config.has_qk_norm or config.tie_word_embeddings)


def test_explicit_head_dim_wins() -> None:
    assert DecoderConfig.from_hf(_raw(head_dim=32)).head_dim == 32


def test_transformers_4_rope_layout() -> None:
    scaling = {"type": "linear", "factor": 2.0}
    config = DecoderConfig.from_hf(_raw(rope_theta=500000.0, rope_scaling=scaling))
    assert config.rope == RopeSpec(rope_type="linear", theta=500000.0, factor=2.0)


def test_transformers_5_rope_layout() -> None:
    params = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    config = DecoderConfig.from_hf(_raw(rope_parameters=params))
    assert config.rope.rope_type == "llama3"
    assert config.rope.theta == 500000.0
    assert config.rope.original_max_position_embeddings == 8192


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic", "longrope"])
def test_unsupported_rope_type_is_a_clear_error(rope_type: str) -> None:
    with pytest.raises(ValueError, match=rf"unsupported rope type '{rope_type}'"):
        DecoderConfig.from_hf(_raw(rope_scaling={"rope_type": rope_type, "factor": 2.0}))


def test_unsupported_model_type_and_activation() -> None:
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        DecoderConfig.from_hf(_raw(model_type="gpt2"))
    with pytest.raises(ValueError, match="hidden_act"):
        DecoderConfig.from_hf(_raw(hidden_act="gelu"))


def test_heads_must_group_evenly() -> None:
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        DecoderConfig.from_hf(_raw(num_key_value_heads=3))


def test_qwen_variants() -> None:
    qwen2 = DecoderConfig.from_hf(_raw(model_type="qwen2"))
    assert qwen2.has_qkv_bias and not qwen2.has_o_bias and not qwen2.has_qk_norm
    qwen3 = DecoderConfig.from_hf(_raw(model_type="qwen3", head_dim=8))
    assert qwen3.has_qk_norm and not qwen3.has_qkv_bias


def test_sliding_windows() -> None:
    mistral = DecoderConfig.from_hf(_raw(model_type="mistral", sliding_window=4096))
    assert mistral.sliding_windows == (4096, 4096)
    no_window = DecoderConfig.from_hf(_raw(model_type="mistral", sliding_window=None))
    assert no_window.sliding_windows == (None, None)
    qwen_off = DecoderConfig.from_hf(_raw(model_type="qwen2", sliding_window=4096))
    assert qwen_off.sliding_windows == (None, None)
    qwen_on = DecoderConfig.from_hf(
        _raw(model_type="qwen2", use_sliding_window=True, sliding_window=64, max_window_layers=1)
    )
    assert qwen_on.sliding_windows == (None, 64)
