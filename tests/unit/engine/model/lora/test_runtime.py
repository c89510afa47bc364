"""PEFT adapters: packing, scaling, the checks that refuse what cannot be served, and the
device LRU of the LoRA runtime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.lora.peft_format import AdapterError, load_peft_adapter
from conveyor.engine.model.lora.runtime import new_lora_runtime
from conveyor.fakes.checkpoints import build_lora_adapter, build_tiny_llama

# Building PEFT adapters (peft's first import included) takes seconds on a busy machine.
pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

PREFIX = "base_model.model.model.layers"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def config(base: Path) -> DecoderConfig:
    return DecoderConfig.from_hf(load_hf_config(base))


def edit_config(adapter: Path, **changes: Any) -> None:
    path = adapter / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_qkv_parts_are_packed_block_diagonally_with_the_scaling(
    base: Path, config: DecoderConfig, tmp_path: Path
) -> None:
    adapter = build_lora_adapter(
        base, tmp_path / "a", rank=4, alpha=12, target_modules=("q_proj", "v_proj")
    )
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    weights = load_peft_adapter(adapter, config, max_rank=8)
    a, b = weights.modules[(0, "qkv_proj")]
    assert a.shape == (8, config.hidden_size)  # q's and v's A, stacked
    assert b.shape == (config.q_size + 2 * config.kv_size, 8)
    q_a = tensors[f"{PREFIX}.0.self_attn.q_proj.lora_A.weight"]
    v_b = tensors[f"{PREFIX}.0.self_attn.v_proj.lora_B.weight"]
    assert torch.equal(a[:4], q_a)
    v_rows = slice(config.q_size + config.kv_size, None)
    assert torch.allclose(b[v_rows, 4:], v_b * 3.0)  # lora_alpha / r = 12 / 4
    assert not b[: config.q_size + config.kv_size, 4:].any()  # v's columns touch v's rows only
    assert not b[config.q_size : config.q_size + config.kv_size].any()  # k has no LoRA
    assert (0, "gate_up_proj") not in weights.modules


def test_rslora_scales_by_the_square_root_of_the_rank(
    base: Path, config: DecoderConfig, tmp_path: Path
) -> None:
    adapter = build_lora_adapter(base, tmp_path / "a", rank=4, alpha=8, use_rslora=True)
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    _, b = load_peft_adapter(adapter, config, max_rank=8).modules[(1, "o_proj")]
    assert torch.allclose(b, tensors[f"{PREFIX}.1.self_attn.o_proj.lora_B.weight"] * 4.0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"use_dora": True}, "use_dora"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"rank_pattern": {"q_proj": 2}}, "rank_pattern"),
        ({"peft_type": "IA3"}, "is not LORA"),
        ({"r": 0}, "positive int"),
        ({"r": 9}, "above this model's max_rank 8"),
    ],
)
def test_options_that_cannot_be_served_are_refused(
    base: Path, config: DecoderConfig, tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    adapter = build_lora_adapter(base, tmp_path / "a", rank=4)
    edit_config(adapter, **changes)
    with pytest.raises(AdapterError, match=message):
        load_peft_adapter(adapter, config, max_rank=8)


def test_an_adapter_for_another_base_is_refused(config: DecoderConfig, tmp_path: Path) -> None:
    other = build_tiny_llama(tmp_path / "other", intermediate_size=96)
    adapter = build_lora_adapter(other, tmp_path / "a", rank=4)
    with pytest.raises(AdapterError, match="is it for another base model"):
        load_peft_adapter(adapter, config, max_rank=8)


def test_unknown_or_half_weights_are_refused(
    base: Path, config: DecoderConfig, tmp_path: Path
) -> None:
    adapter = build_lora_adapter(base, tmp_path / "a", rank=4)
    file = adapter / "adapter_model.safetensors"
    tensors = load_file(str(file))
    save_file({**tensors, "base_model.model.lm_head.lora_A.weight": torch.zeros(4, 64)}, str(file))
    with pytest.raises(AdapterError, match=r"lm_head.*not supported"):
        load_peft_adapter(adapter, config, max_rank=8)
    del tensors[f"{PREFIX}.0.mlp.up_proj.lora_B.weight"]
    save_file(tensors, str(file))
    with pytest.raises(AdapterError, match="lacks lora_A or lora_B"):
        load_peft_adapter(adapter, config, max_rank=8)


def test_the_device_keeps_the_recently_used_adapters(
    base: Path, config: DecoderConfig, tmp_path: Path
) -> None:
    runtime = new_lora_runtime(
        config,
        slots=2,
        max_cpu_loras=4,
        max_rank=8,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    ids = [
        runtime.registry.load(
            f"a{i}", build_lora_adapter(base, tmp_path / f"a{i}", rank=2, seed=i)
        ).adapter_id
        for i in range(3)
    ]

    def chunk(adapter_id: int, num_tokens: int = 1) -> SeqChunk:
        return SeqChunk((5,) * num_tokens, 0, (0,), True, adapter_id=adapter_id)

    runtime.begin_step([chunk(ids[0], 3), chunk(0, 2)])  # one adapter: its rows, a group
    assert [rows.tolist() for _, rows in runtime.state.groups] == [[0, 1, 2]]
    runtime.end_step()
    # Several adapters in a small step: stacked, each token marked with its adapter's slot.
    runtime.begin_step([chunk(ids[0], 3), chunk(0, 2), chunk(ids[1])])
    stacked = runtime.state.stacked
    assert stacked is not None and runtime.state.groups == []
    assert stacked.token_slots.flatten().tolist() == [0, 0, 0, -1, -1, 1]
    a, b, owner = stacked.stacks[(0, "down_proj")]
    assert a.shape[0] == b.shape[1] == owner.shape[0] == 4  # two rank-2 adapters
    assert owner.tolist() == [0, 0, 1, 1]
    runtime.end_step()
    assert runtime.state.groups == [] and runtime.state.stacked is None
    runtime.begin_step([chunk(ids[2]), chunk(ids[1])])
    assert sorted(runtime.resident_ids) == sorted([ids[1], ids[2]])  # ids[0] was evicted
    assert runtime.num_device_loads == 3
    with pytest.raises(ValueError, match="only 2 fit"):
        runtime.begin_step([chunk(adapter_id) for adapter_id in ids])
