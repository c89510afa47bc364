"""The null adapter base requests run under on vLLM's CPU build: a PEFT adapter Conveyor's
own reader accepts for the model, whose every weight is zero, in a slot of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from conveyor.config.model_config import LoraConfig
from conveyor.engine.model.hf_config import DecoderConfig
from conveyor.engine.model.lora.peft_format import load_peft_adapter
from conveyor.engine.vllm_lora import (
    NULL_ADAPTER_ID,
    NULL_ADAPTER_NAME,
    null_adapter_args,
    write_null_adapter,
)

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
         "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 256}  # fmt: skip


def test_the_null_adapter_is_a_zero_lora_of_the_model(tmp_path: Path) -> None:
    config = DecoderConfig.from_hf(LLAMA)
    fields = write_null_adapter(tmp_path / "null", config)
    assert fields == {"lora_name": NULL_ADAPTER_NAME, "lora_int_id": NULL_ADAPTER_ID,
                      "lora_path": str(tmp_path / "null")}  # fmt: skip
    weights = load_peft_adapter(tmp_path / "null", config, max_rank=1)  # shapes checked
    assert weights.rank == 1 and list(weights.modules) == [(0, "qkv_proj")]
    for a, b in weights.modules.values():
        assert not torch.count_nonzero(a) and not torch.count_nonzero(b)
    peft = json.loads((tmp_path / "null" / "adapter_config.json").read_text())
    assert peft["target_modules"] == ["q_proj"]


def test_it_takes_a_slot_of_its_own_and_a_name_no_adapter_can_have() -> None:
    assert null_adapter_args({"max_loras": 3, "enable_lora": True}) == {
        "max_loras": 4, "enable_lora": True
    }  # fmt: skip
    with pytest.raises(ValidationError, match="must match"):
        LoraConfig(adapters={NULL_ADAPTER_NAME: Path("/adapters/x")})
