"""ModelRunner: its properties, input checks, cache sizing and out-of-memory handling."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from conveyor.engine.core.step import PromptScoring, SeqChunk
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.kv_sizing import KVOutOfMemory
from conveyor.engine.model.layers.linear import bfloat16_packing_supported
from conveyor.engine.model.lora.runtime import new_lora_runtime
from conveyor.engine.model.model_runner import ModelRunner, StepOutOfMemory
from conveyor.errors import ModelOutOfMemory
from conveyor.fakes.checkpoints import build_tiny_llama

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

NUM_KV_BLOCKS = 16
BLOCK_SIZE = 4


@pytest.fixture
def runner(llama_path: Path) -> Iterator[ModelRunner]:
    yield ModelRunner(llama_path, num_kv_blocks=NUM_KV_BLOCKS, block_size=BLOCK_SIZE, device="cpu")


def test_properties_come_from_the_checkpoint(runner: ModelRunner) -> None:
    assert runner.vocab_size == 512
    assert runner.max_model_len == 1024
    assert runner.eos_token_ids == (2,)
    assert runner.num_kv_blocks == NUM_KV_BLOCKS
    assert runner.block_size == BLOCK_SIZE
    assert runner.dtype == torch.float32
    assert runner.device == torch.device("cpu")
    key_cache, value_cache = runner.kv_caches[0]
    assert key_cache.shape == (NUM_KV_BLOCKS, BLOCK_SIZE, 2, 16)
    assert value_cache.shape == key_cache.shape
    assert runner.kv_cache_bytes == 2 * 2 * 2 * 16 * 4 * NUM_KV_BLOCKS * BLOCK_SIZE


def test_eos_ids_merge_generation_config_and_config(tmp_path: Path) -> None:
    path = build_tiny_llama(tmp_path / "ckpt")
    generation = json.loads((path / "generation_config.json").read_text())
    generation["eos_token_id"] = [2, 7]
    (path / "generation_config.json").write_text(json.dumps(generation))
    runner = ModelRunner(path, num_kv_blocks=2, block_size=4, device="cpu")
    assert runner.eos_token_ids == (2, 7)


def test_empty_step_returns_no_logits(runner: ModelRunner) -> None:
    assert runner.execute([]).shape == (0, runner.vocab_size)


def test_step_without_logits_still_fills_the_cache(runner: ModelRunner) -> None:
    assert runner.execute([SeqChunk((5, 6, 7), 0, (3,), needs_logits=False)]).shape == (0, 512)
    key_cache = runner.kv_caches[0][0]
    assert key_cache[3, :3].abs().sum() > 0
    assert key_cache[3, 3].abs().sum() == 0


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        (SeqChunk((), 0, (0,), True), "at least one token"),
        (SeqChunk((5,), -1, (0,), True), "start_pos"),
        (SeqChunk((5,) * 5, 0, (0,), True), "block_table has 1 blocks"),
        (SeqChunk((5,), 0, (NUM_KV_BLOCKS,), True), "block ids"),
        (SeqChunk((512,), 0, (0,), True), "token ids"),
        (SeqChunk((5,), 1024, (0,) * 257, True), "max_model_len"),
        (SeqChunk((5, 6), 0, (0,), True, scoring=PromptScoring(1, (7, 8))), "inside the chunk"),
        (SeqChunk((5, 6), 0, (0,), True, scoring=PromptScoring(0, (512,))), "scored token ids"),
        (SeqChunk((5, 6), 0, (0,), True, scoring=PromptScoring(0, (7,), -1)), "num_top"),
    ],
)
def test_bad_chunks_are_rejected(runner: ModelRunner, chunk: SeqChunk, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        runner.execute([chunk])


def test_out_of_memory_in_a_step_becomes_step_out_of_memory(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(runner.model, "hidden_states", explode)
    with pytest.raises(StepOutOfMemory) as caught:
        runner.execute([SeqChunk((5, 6), 0, (0,), True)])
    assert isinstance(caught.value, ModelOutOfMemory)
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)


def test_kv_cache_that_does_not_fit_is_kv_out_of_memory(llama_path: Path) -> None:
    # Far beyond any host's memory, so the allocator refuses at once.
    with pytest.raises(KVOutOfMemory):
        ModelRunner(llama_path, num_kv_blocks=10**12, block_size=4, device="cpu")


def test_other_runtime_errors_are_not_called_out_of_memory(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(runner.model, "hidden_states", explode)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        runner.execute([SeqChunk((5, 6), 0, (0,), True)])


def test_bfloat16_runs_on_cpu_and_returns_float32(llama_path: Path) -> None:
    runner = ModelRunner(llama_path, num_kv_blocks=4, block_size=4, device="cpu", dtype="bfloat16")
    logits = runner.execute([SeqChunk((5, 6, 7), 0, (0,), True)])
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prepacked_weights_give_the_same_greedy_tokens(llama_path: Path, dtype: str) -> None:
    # A prefill then decodes of two sequences, with and without oneDNN-prepacked weights.
    def greedy(prepack: bool) -> list[list[int]]:
        runner = ModelRunner(
            llama_path, num_kv_blocks=NUM_KV_BLOCKS, block_size=BLOCK_SIZE, device="cpu",
            dtype=dtype, prepack_weights=prepack,
        )  # fmt: skip
        assert (
            any(getattr(m, "packed", None) is not None for m in runner.model.modules()) is prepack
        )
        tokens = [[5, 9, 11, 4, 7], [3, 8, 6]]
        tables = [(0, 1, 2, 3), (4, 5, 6, 7)]
        chunks = [SeqChunk(tuple(t), 0, tables[i], True) for i, t in enumerate(tokens)]
        for _ in range(4):
            picked = runner.execute(chunks).argmax(-1).tolist()
            chunks = [
                SeqChunk((picked[i],), len(tokens[i]), tables[i], True) for i in range(len(tokens))
            ]
            for i, token in enumerate(picked):
                tokens[i].append(token)
        return tokens

    assert greedy(True) == greedy(False)


@pytest.mark.skipif(
    not bfloat16_packing_supported(), reason="no bfloat16 hardware here (AVX512-BF16, AMX)"
)
def test_bfloat16_mlps_run_fused_unless_an_adapter_needs_gate_up(llama_path: Path) -> None:
    def fused(**options: Any) -> list[bool]:
        runner = ModelRunner(
            llama_path, num_kv_blocks=4, block_size=4, device="cpu", dtype="bfloat16", **options
        )
        return [layer.mlp.packed_gate_and_up is not None for layer in runner.model.decoder_layers]

    assert all(fused())
    assert not any(fused(prepack_weights=False))
    lora = new_lora_runtime(
        DecoderConfig.from_hf(load_hf_config(llama_path)), slots=1, max_cpu_loras=1,
        max_rank=8, device=torch.device("cpu"), dtype=torch.bfloat16,
    )  # fmt: skip
    assert not any(fused(lora=lora))  # LoRA adds its delta to gate_up's output


def _greedy_decodes(runner: ModelRunner, num_steps: int) -> list[list[int]]:
    """Three sequences prefilled, then decoded greedily together for ``num_steps`` steps."""
    tokens = [[5, 9, 11, 4, 7, 2, 8, 9, 3], [3, 8, 6], [4, 4, 5, 6, 7, 8]]
    tables = [(0, 1, 2, 3, 4), (5, 6, 7, 8, 9), (10, 11, 12, 13, 14)]
    chunks = [SeqChunk(tuple(t), 0, tables[i], True) for i, t in enumerate(tokens)]
    for _ in range(num_steps):
        picked = runner.execute(chunks).argmax(-1).tolist()
        for i, token in enumerate(picked):
            tokens[i].append(token)
        chunks = [
            SeqChunk((tokens[i][-1],), len(tokens[i]) - 1, tables[i], True)
            for i in range(len(tokens))
        ]
    return tokens


@pytest.mark.slow  # compiles (seconds; more on a busy machine)
@pytest.mark.timeout(240)
def test_compiled_decode_attention_gives_the_same_greedy_tokens(llama_path: Path) -> None:
    def runner(enforce_eager: bool) -> ModelRunner:
        return ModelRunner(
            llama_path, num_kv_blocks=NUM_KV_BLOCKS, block_size=BLOCK_SIZE, device="cpu",
            dtype="float32", enforce_eager=enforce_eager, native_kernels=False,
        )  # fmt: skip

    eager, compiled = runner(True), runner(False)
    assert eager.pad_rows and not compiled.pad_rows  # compiled layers take every row count
    assert eager.compiled_decode is None and eager.compile_s == 0.0
    assert compiled.compiled_decode is not None and compiled.compile_s > 0
    assert _greedy_decodes(compiled, 6) == _greedy_decodes(eager, 6)
    # Every step of two tokens or more went through the compiled layers, none fell back
    # (decode-only steps attend inside them: see test_compiled_layers for mixed steps).
    assert compiled.model.compiled_layers is not None
    assert compiled.model.compiled_layers.num_calls > 0
    assert compiled.model.compiled_layers.num_fallbacks == 0
    assert compiled.compiled_decode.num_fallbacks == 0


@pytest.mark.slow  # compiles the decoder layers (seconds; more on a busy machine)
@pytest.mark.timeout(240)
def test_the_native_decode_attention_gives_the_same_greedy_tokens(llama_path: Path) -> None:
    def runner(enforce_eager: bool, native: bool) -> ModelRunner:
        return ModelRunner(
            llama_path, num_kv_blocks=NUM_KV_BLOCKS, block_size=BLOCK_SIZE, device="cpu",
            dtype="float32", enforce_eager=enforce_eager, native_kernels=native,
        )  # fmt: skip

    pytorch, native, native_compiled = runner(True, False), runner(True, True), runner(False, True)
    assert pytorch.native_decode is None
    want = _greedy_decodes(pytorch, 6)
    for candidate in (native, native_compiled):
        assert candidate.native_decode is not None  # built here: the suite's machine has g++
        assert candidate.compiled_decode is None  # the inductor attention is not compiled
        # One bucket a step: hidden padding costs the kernel next to nothing.
        assert candidate.decode_bucket_cost_blocks == math.inf
        with torch.profiler.profile() as profiled:
            assert _greedy_decodes(candidate, 6) == want
        ops = {event.name for event in profiled.events()}
        assert "conveyor_native::decode_attention" in ops
    # Eager decode buckets called it through Attention.paged_decode; the compiled runner's
    # decode steps attended inside its compiled layers, none falling back.
    assert native.native_decode is not None and native.native_decode.num_calls > 0
    assert native_compiled.model.compiled_layers is not None
    assert native_compiled.model.compiled_layers.native
    assert native_compiled.model.compiled_layers.num_fallbacks == 0
