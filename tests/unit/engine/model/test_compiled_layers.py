"""Compiled decoder layers: the same tokens as eager, one graph for every layer and step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.compiled_layers import MIN_COMPILED_TOKENS, decode_inputs, kv_pair
from conveyor.engine.model.model_runner import ModelRunner

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

NUM_KV_BLOCKS = 16
BLOCK_SIZE = 4


def _runner(
    path: Path, *, enforce_eager: bool, dtype: str = "float32", native: bool = False
) -> ModelRunner:
    """A runner on the tiny Llama; PyTorch alone unless ``native`` (the native kernel)."""
    return ModelRunner(
        path, num_kv_blocks=NUM_KV_BLOCKS, block_size=BLOCK_SIZE, device="cpu", dtype=dtype,
        enforce_eager=enforce_eager, native_kernels=native,
    )  # fmt: skip


def _mixed_steps(runner: ModelRunner) -> list[torch.Tensor]:
    """Three sequences prefilled, decoded twice, then decoded beside a fourth's prefill."""
    prompts = [(5, 9, 11, 4, 7, 2, 8, 9, 3), (3, 8, 6), (4, 4, 5, 6, 7, 8)]
    tables = [(0, 1, 2, 3, 4), (5, 6, 7, 8, 9), (10, 11, 12, 13, 14)]
    logits = [
        runner.execute([SeqChunk(p, 0, t, True) for p, t in zip(prompts, tables, strict=True)])
    ]
    lengths = [len(prompt) for prompt in prompts]
    for step in range(3):
        picked = logits[-1][:3].argmax(-1).tolist()
        chunks = [SeqChunk((picked[i],), lengths[i], tables[i], True) for i in range(3)]
        if step == 2:
            chunks.append(SeqChunk((6, 2, 9), 0, (15,), True))
        logits.append(runner.execute(chunks))
        lengths = [length + 1 for length in lengths]
    return logits


@pytest.mark.slow  # compiles (seconds; more on a busy machine)
@pytest.mark.timeout(240)
def test_mixed_and_decode_steps_match_eager_without_a_recompile(llama_path: Path) -> None:
    eager, compiled = (
        _runner(llama_path, enforce_eager=True),
        _runner(llama_path, enforce_eager=False),
    )
    layers = compiled.model.compiled_layers
    assert layers is not None and compiled.compiled_decode is not None
    assert layers.traced and layers.traced_decode  # both regions traced at start-up
    calls_at_start = layers.num_calls
    for got, want in zip(_mixed_steps(compiled), _mixed_steps(eager), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    num_layers = len(compiled.model.model.layers)
    # Every layer of all four steps ran compiled, none fell back to eager.
    assert layers.num_calls - calls_at_start == 4 * num_layers
    assert layers.num_fallbacks == 0
    # The mixed step's decode rows went through the compiled attention inside the op.
    assert compiled.compiled_decode.num_calls > 0
    assert compiled.compiled_decode.num_fallbacks == 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bfloat16_compiled_layers_keep_the_greedy_tokens(llama_path: Path) -> None:
    def greedy(runner: ModelRunner) -> list[list[int]]:
        return [step[:3].argmax(-1).tolist() for step in _mixed_steps(runner)]

    eager = _runner(llama_path, enforce_eager=True, dtype="bfloat16")
    compiled = _runner(llama_path, enforce_eager=False, dtype="bfloat16")
    assert greedy(compiled) == greedy(eager)


def test_a_one_token_step_runs_eager(llama_path: Path) -> None:
    runner = _runner(llama_path, enforce_eager=True)
    from conveyor.engine.model.compiled_layers import CompiledLayers, LayerSteps

    layers = CompiledLayers(runner.model.model.layers)
    h = torch.zeros(MIN_COMPILED_TOKENS - 1, runner.config.hidden_size)
    rope = (torch.ones(1, 1, runner.config.head_dim), torch.zeros(1, 1, runner.config.head_dim))
    state = LayerSteps(step=None, kv_caches=[], masks=[])  # type: ignore[arg-type]
    out, done = layers.run(h, rope, state)
    assert done == 0 and out is h and layers.num_calls == 0


def test_kv_pair_views_k_and_v_as_one_tensor() -> None:
    cache = torch.arange(2 * 2 * 3 * 4 * 2 * 5, dtype=torch.float32).view(2, 2, 3, 4, 2, 5)
    k_cache, v_cache = cache[1, 0], cache[1, 1]
    pair = kv_pair(k_cache, v_cache)
    assert pair is not None
    assert torch.equal(pair[0], k_cache) and torch.equal(pair[1], v_cache)
    pair[1, 2, 3] = -1.0  # a view: writes land in the cache
    assert torch.all(v_cache[2, 3] == -1.0)


def test_kv_pair_refuses_caches_it_cannot_view_together() -> None:
    k_cache, v_cache = torch.zeros(3, 4, 2, 5), torch.zeros(3, 4, 2, 5)
    assert kv_pair(k_cache, v_cache) is None  # two storages
    cache = torch.zeros(2, 3, 4, 2, 5)
    assert kv_pair(cache[1], cache[0]) is None  # V before K
    assert kv_pair(cache[0], cache[1, :2]) is None  # shapes differ


def test_decode_inputs_only_for_decode_rows_in_one_bucket(llama_path: Path) -> None:
    from conveyor.engine.model.compiled_layers import LayerSteps
    from conveyor.engine.model.step_inputs import build_masks

    runner = _runner(llama_path, enforce_eager=True)

    def inputs(chunks: list[SeqChunk]) -> object:
        step = runner._prepare(chunks)
        masks = [build_masks(step, None, BLOCK_SIZE, torch.zeros(1))] * runner.config.num_layers
        return decode_inputs(LayerSteps(step, runner.kv_caches, masks))

    decodes = [SeqChunk((5,), 6, (0, 1), True), SeqChunk((6,), 2, (2, 3), True)]
    prefill = SeqChunk((6, 2, 9), 0, (4,), True)
    assert inputs([*decodes, prefill]) is None  # a prefill in the step
    assert inputs([SeqChunk((5,), 2, (0,), True), SeqChunk((6,), 1, (2,), True)]) is None  # 1 block
    runner.decode_bucket_cost_blocks = 0.0  # one bucket per block count: two buckets
    assert inputs(decodes) is None
    runner.decode_bucket_cost_blocks = float("inf")
    got = inputs(decodes)
    assert got is not None
    # Rows sorted by context put token 1 first; the tables come back in token order.
    assert got.tables.tolist() == [[0, 1], [2, 0]]  # type: ignore[attr-defined]


def test_the_general_region_runs_its_loops_on_the_torch_threads() -> None:
    from conveyor.engine.model.compiled_layers import INDUCTOR_OPTIONS, general_options

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert general_options()["cpp.threads"] == 3  # prefill loops: every thread
    finally:
        torch.set_num_threads(threads)
    assert INDUCTOR_OPTIONS["cpp.threads"] == 1  # the decode region's small loops: one
