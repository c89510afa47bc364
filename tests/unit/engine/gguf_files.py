"""Tiny GGUF files written at test time, the way llama.cpp's converter writes them.

``write_gguf`` turns a tiny Hugging Face checkpoint (``conveyor.fakes.checkpoints``) into a GGUF file
with ``gguf.GGUFWriter``: tensor names from ``gguf``'s own name map (not Conveyor's), the
query and key rows of a Llama permuted as llama.cpp's ``convert_hf_to_gguf.py`` permutes
them, shapes reversed by the writer, the tokenizer and chat template in the metadata.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load_file

# config.json model_type -> gguf architecture.
_ARCHES = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
           "qwen3": gguf.MODEL_ARCH.QWEN3}  # fmt: skip
_NORMAL, _CONTROL = 1, 3  # gguf.TokenType values llama.cpp writes for these tokens


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's ``LlamaModel.permute`` (its rope takes adjacent pairs)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_gguf(
    checkpoint: Path,
    file: Path,
    *,
    matrix_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    architecture: str | None = None,
    tensors: Mapping[str, np.ndarray | None] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``checkpoint`` as the GGUF ``file``; return its path.

    ``matrix_type`` quantises the 2-D weights; ``architecture`` overrides the
    architecture name; ``tensors`` adds or replaces GGUF tensors by name (None drops one);
    ``metadata`` adds key/value pairs (a str, int or float each).
    """
    config = json.loads((checkpoint / "config.json").read_text())
    arch = _ARCHES[config["model_type"]]
    writer = gguf.GGUFWriter(str(file), architecture or gguf.MODEL_ARCH_NAMES[arch])
    _write_config(writer, config)
    _write_tokenizer(writer, checkpoint, config)
    for key, value in (metadata or {}).items():
        _write_value(writer, key, value)
    named = _gguf_tensors(checkpoint, config, arch)
    for name, array in (tensors or {}).items():
        named[name] = array
    for name, array in named.items():
        if array is not None:
            _add_tensor(writer, name, array, matrix_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return file


def _write_config(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    writer.add_vocab_size(config["vocab_size"])


def _write_tokenizer(writer: gguf.GGUFWriter, checkpoint: Path, config: dict[str, Any]) -> None:
    """The byte-level BPE vocabulary as llama.cpp writes a "gpt2" tokenizer."""
    spec = json.loads((checkpoint / "tokenizer.json").read_text())
    vocab: dict[str, int] = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = {token["content"] for token in spec["added_tokens"] if token["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([_CONTROL if token in special else _NORMAL for token in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(True)
    template = checkpoint / "chat_template.jinja"
    if template.is_file():
        writer.add_chat_template(template.read_text())


def _write_value(writer: gguf.GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    else:
        writer.add_uint32(key, int(value))


def _gguf_tensors(
    checkpoint: Path, config: dict[str, Any], arch: gguf.MODEL_ARCH
) -> dict[str, np.ndarray | None]:
    """The checkpoint's tensors under llama.cpp's names, q/k permuted for a Llama."""
    name_map = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    state: dict[str, np.ndarray] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        state.update(load_file(str(file)))
    out: dict[str, np.ndarray | None] = {}
    for hf_name, array in state.items():
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        if arch == gguf.MODEL_ARCH.LLAMA and ".attn_q." in name:
            array = llama_cpp_permute(array, config["num_attention_heads"])
        elif arch == gguf.MODEL_ARCH.LLAMA and ".attn_k." in name:
            array = llama_cpp_permute(array, config["num_key_value_heads"])
        out[name] = array
    return out


def _add_tensor(
    writer: gguf.GGUFWriter, name: str, array: np.ndarray, matrix_type: gguf.GGMLQuantizationType
) -> None:
    """Matrices in ``matrix_type`` (the token embedding in Q8_0, as llama.cpp's Q4 files
    keep it, when quantising); vectors and non-float arrays as they are."""
    is_matrix = array.ndim == 2 and array.dtype == np.float32
    if not is_matrix or matrix_type == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, array)
        return
    kind = gguf.GGMLQuantizationType.Q8_0 if name == "token_embd.weight" else matrix_type
    writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
