"""Loading safetensors checkpoints: sharded files, and the checks on names and shapes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.llama import LlamaDecoder
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.model.weight_loader import count_checkpoint_params, load_weights
from conveyor.fakes.checkpoints import build_tiny_llama, torch_threads

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


def _rewrite(checkpoint: Path, edit: dict[str, torch.Tensor | None]) -> None:
    """Replace (or, for None, drop) tensors of a one-file checkpoint."""
    file = checkpoint / "model.safetensors"
    tensors = load_file(str(file))
    for name, tensor in edit.items():
        if tensor is None:
            del tensors[name]
        else:
            tensors[name] = tensor
    save_file(tensors, str(file), metadata={"format": "pt"})


def _load(checkpoint: Path) -> LlamaDecoder:
    config = DecoderConfig.from_hf(load_hf_config(checkpoint))
    model = LlamaDecoder(config, device=torch.device("cpu"), dtype=torch.float32)
    load_weights(model, config, checkpoint)
    return model


def test_sharded_checkpoint_loads_the_same_weights(tmp_path: Path) -> None:
    whole = build_tiny_llama(tmp_path / "whole")
    sharded = build_tiny_llama(tmp_path / "sharded", max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    runners = [
        ModelRunner(p, num_kv_blocks=8, block_size=4, device="cpu") for p in (whole, sharded)
    ]
    chunk = SeqChunk((5, 6, 7, 8, 9), 0, (0, 1), True)
    torch.testing.assert_close(runners[0].execute([chunk]), runners[1].execute([chunk]))


def test_packed_projections_take_their_rows_from_each_tensor(tmp_path: Path) -> None:
    checkpoint = build_tiny_llama(tmp_path)
    tensors = load_file(str(checkpoint / "model.safetensors"))
    model = _load(checkpoint)
    packed = model.model.layers[0].self_attn.qkv_proj.weight
    prefix = "model.layers.0.self_attn."
    expected = torch.cat(
        [tensors[f"{prefix}{name}.weight"] for name in ("q_proj", "k_proj", "v_proj")]
    )
    torch.testing.assert_close(packed, expected.to(packed.dtype))
    assert count_checkpoint_params(checkpoint) == sum(t.numel() for t in tensors.values())


def test_a_missing_tensor_is_named(tmp_path: Path) -> None:
    checkpoint = build_tiny_llama(tmp_path)
    _rewrite(checkpoint, {"model.layers.1.self_attn.k_proj.weight": None})
    with pytest.raises(ValueError, match=r"lacks weights for: \['model.layers.1.self_attn.qkv"):
        _load(checkpoint)


def test_a_tensor_of_the_wrong_shape_is_named(tmp_path: Path) -> None:
    checkpoint = build_tiny_llama(tmp_path)
    _rewrite(checkpoint, {"model.norm.weight": torch.ones(3)})
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(3,\)"):
        _load(checkpoint)


def test_an_unknown_tensor_is_refused(tmp_path: Path) -> None:
    checkpoint = build_tiny_llama(tmp_path)
    _rewrite(checkpoint, {"model.extra.weight": torch.ones(3)})
    with pytest.raises(ValueError, match=r"unexpected weight 'model\.extra\.weight'"):
        _load(checkpoint)
