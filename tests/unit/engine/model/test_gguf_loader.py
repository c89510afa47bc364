"""GGUF checkpoints on tiny synthetic files: the name mapping, the q/k un-permutation, the
config and tokenizer from the metadata, and what is refused (with one line, before loading).

Each file is written at test time from a tiny Hugging Face checkpoint the way llama.cpp's
converter writes it (``gguf_files``), so loading it must give back that checkpoint.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from conveyor.cli.startup_checks import generate_model_problems
from conveyor.config.model_config import GenerateModelConfig
from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.gguf_format import find_gguf_file, hf_tensor_name, read_gguf
from conveyor.engine.model.gguf_loader import unpermute_rows
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config, read_eos_token_ids
from conveyor.engine.model.llama import LlamaDecoder
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.model.weight_loader import count_checkpoint_params, load_weights
from conveyor.engine.tokenizer import Tokenizer
from conveyor.fakes.checkpoints import build_tiny_llama, build_tiny_qwen2, build_tiny_qwen3
from conveyor.plan.shape import load_shape
from tests.unit.engine.gguf_files import llama_cpp_permute, write_gguf

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

Q4_1 = gguf.GGMLQuantizationType.Q4_1
BUILDERS = {"llama": build_tiny_llama, "qwen2": build_tiny_qwen2, "qwen3": build_tiny_qwen3}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """A tiny checkpoint directory and the F32 GGUF file written from it."""
    root = tmp_path_factory.mktemp(request.param)
    checkpoint = BUILDERS[request.param](root / "hf")
    return checkpoint, write_gguf(checkpoint, root / "model.gguf")


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("llama-gguf")
    checkpoint = build_tiny_llama(root / "hf", tie_word_embeddings=True)
    return checkpoint, write_gguf(checkpoint, root / "model.gguf")


def _decoder(path: Path) -> LlamaDecoder:
    config = DecoderConfig.from_hf(load_hf_config(path))
    model = LlamaDecoder(config, device=torch.device("cpu"), dtype=torch.float32)
    load_weights(model, config, path)
    return model


@pytest.mark.parametrize(
    ("gguf_name", "hf_name"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
        ("blk.12.ffn_norm.weight", "model.layers.12.post_attention_layernorm.weight"),
        ("blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight"),
        ("blk.1.attn_k.bias", "model.layers.1.self_attn.k_proj.bias"),
        ("blk.1.attn_output.weight", "model.layers.1.self_attn.o_proj.weight"),
        ("blk.1.attn_q_norm.weight", "model.layers.1.self_attn.q_norm.weight"),
        ("blk.3.ffn_gate.weight", "model.layers.3.mlp.gate_proj.weight"),
        ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
        ("blk.3.ffn_gate_exps.weight", None),
        ("rope_freqs.weight", None),
        ("token_embd.scales", None),
    ],
)
def test_gguf_names_map_onto_hugging_face_names(gguf_name: str, hf_name: str | None) -> None:
    assert hf_tensor_name(gguf_name) == hf_name


def test_unpermuting_undoes_llama_cpps_row_order() -> None:
    # One head of 4 rows: llama.cpp stores rows 0, 2, 1, 3 (its rope pairs adjacent rows).
    stored = torch.tensor([[0.0], [2.0], [1.0], [3.0]])
    assert unpermute_rows(stored, 1).flatten().tolist() == [0.0, 1.0, 2.0, 3.0]
    weights = np.arange(6 * 8 * 3, dtype=np.float32).reshape(6 * 8, 3)
    permuted = torch.from_numpy(llama_cpp_permute(weights, 6))
    assert torch.equal(unpermute_rows(permuted, 6), torch.from_numpy(weights))
    with pytest.raises(ValueError, match="do not split into 5 heads"):
        unpermute_rows(permuted, 5)


def test_the_decoder_config_from_the_metadata_is_the_checkpoints(pair: tuple[Path, Path]) -> None:
    checkpoint, file = pair
    from_dir = DecoderConfig.from_hf(load_hf_config(checkpoint))
    from_gguf = DecoderConfig.from_hf(load_hf_config(file))
    # GGUF stores epsilon as a float32.
    assert from_gguf.rms_norm_eps == pytest.approx(from_dir.rms_norm_eps, rel=1e-6)
    assert dataclasses.replace(from_gguf, rms_norm_eps=from_dir.rms_norm_eps) == from_dir
    assert count_checkpoint_params(file) == count_checkpoint_params(checkpoint)
    shape = load_shape(file)
    assert shape.name == "model"
    assert dataclasses.replace(shape, name=checkpoint.name) == load_shape(checkpoint)


def test_the_loaded_weights_are_the_checkpoints_bit_for_bit(pair: tuple[Path, Path]) -> None:
    checkpoint, file = pair
    expected, loaded = _decoder(checkpoint).state_dict(), _decoder(file).state_dict()
    assert expected.keys() == loaded.keys()
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


def test_tied_embeddings_come_from_the_token_embedding(llama_gguf: tuple[Path, Path]) -> None:
    checkpoint, file = llama_gguf
    assert "output.weight" not in {tensor.name for tensor in read_gguf(file).tensors}
    model = _decoder(file)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, _decoder(checkpoint).lm_head.weight)


def test_a_runner_on_the_file_gives_the_checkpoints_logits(llama_gguf: tuple[Path, Path]) -> None:
    runners = [
        ModelRunner(path, num_kv_blocks=8, block_size=4, device="cpu") for path in llama_gguf
    ]
    chunk = SeqChunk((5, 6, 7, 8, 9), 0, (0, 1), True)
    assert torch.equal(runners[0].execute([chunk]), runners[1].execute([chunk]))
    assert runners[1].eos_token_ids == runners[0].eos_token_ids


def test_quantised_weights_equal_transformers_gguf_loader(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    checkpoint = build_tiny_llama(tmp_path / "hf")
    file = write_gguf(checkpoint, tmp_path / "q.gguf", matrix_type=Q4_1)
    reference = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=file.name, dtype=torch.float32
    ).state_dict()
    ours = _decoder(file)
    config = ours.config
    for layer in range(config.num_layers):
        prefix = f"model.layers.{layer}"
        qkv = ours.state_dict()[f"{prefix}.self_attn.qkv_proj.weight"]
        q, k, v = qkv.split([config.q_size, config.kv_size, config.kv_size])
        assert torch.equal(q, reference[f"{prefix}.self_attn.q_proj.weight"])
        assert torch.equal(k, reference[f"{prefix}.self_attn.k_proj.weight"])
        assert torch.equal(v, reference[f"{prefix}.self_attn.v_proj.weight"])
    for name in (
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.layers.1.mlp.down_proj.weight",
    ):
        assert torch.equal(ours.state_dict()[name], reference[name]), name


def test_the_tokenizer_and_chat_template_come_from_the_metadata(
    llama_gguf: tuple[Path, Path],
) -> None:
    checkpoint, file = llama_gguf
    ours, theirs = Tokenizer(file), Tokenizer(checkpoint)
    for text in ("Hello world, café 🙂 日本語", "user: tell me a story.\n  spaces  "):
        assert ours.encode(text) == theirs.encode(text)
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert ours.apply_chat_template(chat) == theirs.apply_chat_template(chat)
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)


def test_end_of_turn_ids_stop_generation_beside_eos(tmp_path: Path) -> None:
    checkpoint = build_tiny_llama(tmp_path / "hf")
    file = write_gguf(checkpoint, tmp_path / "m.gguf", metadata={"tokenizer.ggml.eot_token_id": 7})
    raw = load_hf_config(file)
    assert raw["eos_token_id"] == [2, 7]
    assert read_eos_token_ids(file, raw) == (2, 7)


def test_linear_rope_scaling_is_read_and_yarn_refused(tmp_path: Path) -> None:
    checkpoint = build_tiny_llama(tmp_path / "hf")
    linear = write_gguf(checkpoint, tmp_path / "linear.gguf", metadata={
        "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0})  # fmt: skip
    assert load_hf_config(linear)["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}
    yarn = write_gguf(checkpoint, tmp_path / "yarn.gguf", metadata={
        "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0})  # fmt: skip
    with pytest.raises(ValueError, match="unsupported GGUF rope scaling 'yarn'"):
        load_hf_config(yarn)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"architecture": "phi3"}, "m.gguf: unsupported GGUF architecture 'phi3'"),
        (
            {"tensors": {"blk.0.ffn_up.weight": np.ones((128, 64), dtype=np.int8)}},
            "tensor 'blk.0.ffn_up.weight' has type I8, which gguf cannot dequantise",
        ),
        (
            {"tensors": {"rope_freqs.weight": np.ones(8, dtype=np.float32)}},
            r"per-dimension rope frequencies \(rope_freqs.weight",
        ),
        (
            {"tensors": {"blk.0.ffn_gate_exps.weight": np.ones((2, 8), dtype=np.float32)}},
            "unexpected tensor 'blk.0.ffn_gate_exps.weight'",
        ),
    ],
)
def test_what_cannot_run_is_refused_with_one_line_before_any_weight_loads(
    tmp_path: Path, edit: dict[str, object], message: str
) -> None:
    checkpoint = build_tiny_llama(tmp_path / "hf")
    file = write_gguf(checkpoint, tmp_path / "m.gguf", **edit)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message) as caught:
        ModelRunner(file, num_kv_blocks=8, block_size=4, device="cpu")
    assert "\n" not in str(caught.value)
    config = GenerateModelConfig(kind="generate", name="m", path=file)
    problems = generate_model_problems(config)
    assert len(problems) == 1 and problems[0].startswith("model 'm': ")
    assert re.search(message, problems[0])


def test_a_directory_must_hold_exactly_one_gguf_file(tmp_path: Path) -> None:
    checkpoint = build_tiny_llama(tmp_path / "hf")
    holder = tmp_path / "holder"
    holder.mkdir()
    assert find_gguf_file(holder) is None
    with pytest.raises(FileNotFoundError, match=r"no config.json \(nor a \.gguf file\) in"):
        load_hf_config(holder)
    first = write_gguf(checkpoint, holder / "a.gguf")
    assert find_gguf_file(holder) == first
    assert DecoderConfig.from_hf(load_hf_config(holder)).num_layers == 2
    write_gguf(checkpoint, holder / "b.gguf")
    with pytest.raises(ValueError, match=r"holds 2 .gguf files \(a.gguf, b.gguf\); name one"):
        load_hf_config(holder)
    assert find_gguf_file(checkpoint) is None  # a config.json makes it a Hugging Face directory


def test_a_generate_entry_takes_a_gguf_file_but_not_another_file(tmp_path: Path) -> None:
    checkpoint = build_tiny_llama(tmp_path / "hf")
    file = write_gguf(checkpoint, tmp_path / "m.gguf")
    assert GenerateModelConfig(kind="generate", name="m", path=file).path == file
    with pytest.raises(ValueError, match=r"neither a directory nor a \.gguf file"):
        GenerateModelConfig(kind="generate", name="m", path=checkpoint / "config.json")
