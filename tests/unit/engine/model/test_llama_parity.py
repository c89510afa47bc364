"""Greedy output of the paged decoder must equal Hugging Face ``generate`` token for token.

A minimal in-test driver stands in for the scheduler: each sequence gets consecutive blocks,
prompts are prefilled (whole or in chunks, optionally on top of another sequence's cached
blocks) and then all sequences decode together, one token per step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.fakes.checkpoints import (
    build_tiny_llama,
    build_tiny_mistral,
    build_tiny_qwen2,
    device_under_test,
    dtype_under_test,
)
from tests.unit.model_helpers import HFReference, random_prompts

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

DEVICE = device_under_test()  # CONVEYOR_TEST_DEVICE: cpu unless the GPU check sets cuda
BLOCK_SIZE = 4
NUM_KV_BLOCKS = 512
MAX_NEW_TOKENS = 10


@dataclass
class _Seq:
    """One request in the driver: its prompt, blocks and generated tokens."""

    prompt: list[int]
    block_table: tuple[int, ...]
    output: list[int] = field(default_factory=list)
    is_finished: bool = False

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens so far."""
        return len(self.prompt) + len(self.output)


class _Driver:
    """Hands out consecutive blocks and runs prefill and decode steps greedily."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.next_free_block = 0

    def new_seq(self, prompt: Sequence[int], *, shared_blocks: Sequence[int] = ()) -> _Seq:
        """A sequence whose table starts with ``shared_blocks`` then fresh consecutive ones."""
        total = len(prompt) + MAX_NEW_TOKENS
        num_fresh = math.ceil(total / BLOCK_SIZE) - len(shared_blocks)
        fresh = range(self.next_free_block, self.next_free_block + num_fresh)
        self.next_free_block += num_fresh
        return _Seq(list(prompt), (*shared_blocks, *fresh))

    def prefill(self, seqs: Sequence[_Seq], *, num_chunks: int = 1) -> None:
        """Feed whole prompts in ``num_chunks`` steps, every sequence in every step."""
        bounds = [_chunk_bounds(len(seq.prompt), num_chunks) for seq in seqs]
        for index in range(num_chunks):
            chunks = []
            for seq, seq_bounds in zip(seqs, bounds, strict=True):
                begin, end = seq_bounds[index], seq_bounds[index + 1]
                is_last = index == num_chunks - 1
                chunks.append(
                    SeqChunk(tuple(seq.prompt[begin:end]), begin, seq.block_table, is_last)
                )
            logits = self.runner.execute(chunks)
        self.record(seqs, logits)

    def decode_step(self, seqs: Sequence[_Seq]) -> None:
        """One decode step for every unfinished sequence."""
        active = [seq for seq in seqs if not seq.is_finished]
        chunks = [
            SeqChunk((seq.output[-1],), seq.num_tokens - 1, seq.block_table, True) for seq in active
        ]
        self.record(active, self.runner.execute(chunks))

    def decode_all(self, seqs: Sequence[_Seq]) -> None:
        """Decode until every sequence hit EOS or MAX_NEW_TOKENS."""
        while any(not seq.is_finished for seq in seqs):
            self.decode_step(seqs)

    def record(self, seqs: Sequence[_Seq], logits: torch.Tensor) -> None:
        """Append each sequence's greedy token from its logits row."""
        assert logits.shape == (len(seqs), self.runner.vocab_size)
        assert logits.dtype == torch.float32
        for seq, token in zip(seqs, logits.argmax(dim=-1).tolist(), strict=True):
            seq.output.append(int(token))
            is_eos = int(token) in self.runner.eos_token_ids
            seq.is_finished = is_eos or len(seq.output) >= MAX_NEW_TOKENS


def _chunk_bounds(length: int, num_chunks: int) -> list[int]:
    """``num_chunks + 1`` cut points splitting [0, length) into near-equal non-empty parts."""
    assert length >= num_chunks, "every chunk needs a token"
    return [length * index // num_chunks for index in range(num_chunks + 1)]


@dataclass
class _Model:
    """A checkpoint under test and its Hugging Face reference."""

    path: Path
    reference: HFReference

    def runner(self, **kwargs: Any) -> ModelRunner:
        options = {"device": device_under_test(), "dtype": dtype_under_test(), **kwargs}
        return ModelRunner(self.path, num_kv_blocks=NUM_KV_BLOCKS, block_size=BLOCK_SIZE, **options)


def _model(
    tmp_path_factory: pytest.TempPathFactory, build: Callable[..., Path], **kw: Any
) -> _Model:
    path = build(tmp_path_factory.mktemp("ckpt"), **kw)
    return _Model(path, HFReference(path))


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(
    request: pytest.FixtureRequest, llama_path: Path, qwen3_path: Path, llama_reference: HFReference
) -> _Model:
    if request.param == "llama":
        return _Model(llama_path, llama_reference)
    return _Model(qwen3_path, HFReference(qwen3_path))


def _assert_matches_reference(model: _Model, seqs: Sequence[_Seq]) -> None:
    for seq in seqs:
        assert seq.output == model.reference.generate(seq.prompt, MAX_NEW_TOKENS), (
            f"prompt {seq.prompt}"
        )


def test_tiny_checkpoints_give_varied_well_separated_greedy_output(model: _Model) -> None:
    # Guards the parity tests' power: a model that always repeats one token, or whose top
    # logits nearly tie, would make "matches HF" weak or flaky.
    prompt = random_prompts([16], 512, seed=7)[0]
    with torch.no_grad():
        logits = model.reference.model(torch.tensor([prompt], device=DEVICE)).logits[0]
    top2 = logits.topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-3
    assert len(set(model.reference.generate(prompt, MAX_NEW_TOKENS))) > MAX_NEW_TOKENS // 2


def test_single_request_matches_hf(model: _Model) -> None:
    driver = _Driver(model.runner())
    seq = driver.new_seq(random_prompts([11], driver.runner.vocab_size, seed=1)[0])
    driver.prefill([seq])
    driver.decode_all([seq])
    _assert_matches_reference(model, [seq])


@pytest.mark.parametrize(
    "runner_options",
    [
        {"batch_decode": False},
        {"decode_bucket_cost_blocks": 1e9},  # one padded bucket for all decode rows
        {"decode_bucket_cost_blocks": 0.0},  # a bucket per distinct length
        {},
    ],
    ids=["per-row", "one-bucket", "bucket-per-length", "default"],
)
def test_batch_of_mixed_lengths_matches_hf(model: _Model, runner_options: dict[str, Any]) -> None:
    driver = _Driver(model.runner(**runner_options))
    lengths = [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 23, 31, 40, 6, 12]
    seqs = [driver.new_seq(p) for p in random_prompts(lengths, driver.runner.vocab_size, 2)]
    driver.prefill(seqs)
    driver.decode_all(seqs)
    _assert_matches_reference(model, seqs)


def test_prompt_prefilled_in_three_chunks_matches_hf(model: _Model) -> None:
    driver = _Driver(model.runner())
    prompts = random_prompts([19, 30, 9], driver.runner.vocab_size, seed=3)
    seqs = [driver.new_seq(p) for p in prompts]
    driver.prefill(seqs, num_chunks=3)
    driver.decode_all(seqs)
    _assert_matches_reference(model, seqs)


def test_prefix_reuse_of_full_blocks_matches_hf(model: _Model) -> None:
    driver = _Driver(model.runner())
    vocab_size = driver.runner.vocab_size
    first_prompt = random_prompts([3 * BLOCK_SIZE + 2], vocab_size, seed=4)[0]
    first = driver.new_seq(first_prompt)
    driver.prefill([first])
    num_shared_blocks = 3
    shared_len = num_shared_blocks * BLOCK_SIZE
    suffix = random_prompts([5], vocab_size, seed=5)[0]
    second = driver.new_seq(
        first_prompt[:shared_len] + suffix, shared_blocks=first.block_table[:num_shared_blocks]
    )
    # The second sequence computes only its suffix; the shared prefix comes from the cache.
    # It prefills in the same step as the first sequence's first decode.
    decode_chunk = SeqChunk((first.output[-1],), first.num_tokens - 1, first.block_table, True)
    prefill_chunk = SeqChunk(tuple(suffix), shared_len, second.block_table, True)
    logits = driver.runner.execute([decode_chunk, prefill_chunk])
    driver.record([first, second], logits)
    driver.decode_all([first, second])
    _assert_matches_reference(model, [first, second])


def test_requests_joining_while_others_decode_match_hf(model: _Model) -> None:
    # Continuous batching: new prompts prefill in the same steps as older sequences decode.
    driver = _Driver(model.runner())
    prompts = random_prompts([5, 14, 2, 21, 8, 11], driver.runner.vocab_size, seed=6)
    seqs = [driver.new_seq(p) for p in prompts]
    running: list[_Seq] = []
    for seq in seqs:
        active = [s for s in running if not s.is_finished]
        chunks = [SeqChunk((s.output[-1],), s.num_tokens - 1, s.block_table, True) for s in active]
        chunks.append(SeqChunk(tuple(seq.prompt), 0, seq.block_table, True))
        driver.record([*active, seq], driver.runner.execute(chunks))
        running.append(seq)
    driver.decode_all(running)
    _assert_matches_reference(model, seqs)


def test_logits_only_for_chunks_that_ask_in_order(model: _Model) -> None:
    runner = model.runner()
    prompts = random_prompts([6, 9, 4], runner.vocab_size, seed=8)
    chunks = [
        SeqChunk(tuple(prompt), 0, tuple(range(10 * i, 10 * i + 10)), needs_logits=i != 1)
        for i, prompt in enumerate(prompts)
    ]
    logits = runner.execute(chunks)
    with torch.no_grad():
        expected = [
            model.reference.model(torch.tensor([prompts[i]], device=DEVICE)).logits[0, -1]
            for i in (0, 2)
        ]
    assert logits.shape == (2, runner.vocab_size)
    torch.testing.assert_close(logits, torch.stack(expected).float(), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- architecture variants


def _greedy_batch_matches_hf(model: _Model, lengths: Sequence[int], *, num_chunks: int) -> None:
    driver = _Driver(model.runner())
    seqs = [driver.new_seq(p) for p in random_prompts(lengths, driver.runner.vocab_size, 9)]
    driver.prefill(seqs, num_chunks=num_chunks)
    driver.decode_all(seqs)
    _assert_matches_reference(model, seqs)


def test_llama3_rope_scaling_matches_hf(tmp_path_factory: pytest.TempPathFactory) -> None:
    rope_scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    model = _model(tmp_path_factory, build_tiny_llama, rope_scaling=rope_scaling, seed=1)
    assert model.runner().config.rope.rope_type == "llama3"
    _greedy_batch_matches_hf(model, [40, 70, 3], num_chunks=2)


def test_linear_rope_scaling_matches_hf(tmp_path_factory: pytest.TempPathFactory) -> None:
    rope_scaling = {"rope_type": "linear", "factor": 4.0}
    model = _model(tmp_path_factory, build_tiny_llama, rope_scaling=rope_scaling, seed=2)
    _greedy_batch_matches_hf(model, [25, 7], num_chunks=1)


def test_tied_embeddings_match_hf(tmp_path_factory: pytest.TempPathFactory) -> None:
    model = _model(tmp_path_factory, build_tiny_llama, tie_word_embeddings=True, seed=3)
    runner = model.runner()
    assert runner.model.lm_head.weight is runner.model.model.embed_tokens.weight
    _greedy_batch_matches_hf(model, [12, 5, 20], num_chunks=2)


def test_qwen2_qkv_bias_matches_hf(tmp_path_factory: pytest.TempPathFactory) -> None:
    model = _model(tmp_path_factory, build_tiny_qwen2)
    assert model.runner().config.has_qkv_bias
    _greedy_batch_matches_hf(model, [12, 5, 20], num_chunks=2)


def test_mistral_sliding_window_matches_hf(tmp_path_factory: pytest.TempPathFactory) -> None:
    model = _model(tmp_path_factory, build_tiny_mistral, sliding_window=6)
    assert model.runner().config.sliding_windows == (6, 6)
    # Prompts longer than the window, chunked, then decoded past it.
    _greedy_batch_matches_hf(model, [14, 3, 25], num_chunks=3)


def test_qwen2_per_layer_sliding_window_matches_hf(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    model = _model(
        tmp_path_factory,
        build_tiny_qwen2,
        use_sliding_window=True,
        sliding_window=5,
        max_window_layers=1,
    )
    assert model.runner().config.sliding_windows == (None, 5)
    _greedy_batch_matches_hf(model, [14, 3, 25], num_chunks=2)
