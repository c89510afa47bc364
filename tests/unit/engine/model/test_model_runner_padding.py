"""ModelRunner's row buckets: an eager CPU step padded to its bucket gives the logits and
the KV cache of the step unpadded, where padding is off, and up to which row count."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model import model_runner
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.lora.runtime import new_lora_runtime
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.model.row_buckets import bucket_sizes

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

NUM_KV_BLOCKS = 64
BLOCK_SIZE = 4


def _runner(
    path: Path, dtype: str, *, padded: bool = True, up_to: int | None = 4096
) -> ModelRunner:
    runner = ModelRunner(path, num_kv_blocks=NUM_KV_BLOCKS, block_size=BLOCK_SIZE,
                         device="cpu", dtype=dtype, row_buckets_up_to=up_to)  # fmt: skip
    assert runner.pad_rows  # an eager CPU runner with packed projections pads
    runner.pad_rows = padded
    return runner


def _prompt(length: int, first_block: int, seed: int) -> SeqChunk:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, 500, (length,), generator=generator).tolist()
    table = tuple(range(first_block, first_block + -(-length // BLOCK_SIZE)))
    return SeqChunk(tuple(tokens), 0, table, needs_logits=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_padded_step_gives_the_unpadded_logits_and_cache(llama_path: Path, dtype: str) -> None:
    padded, plain = _runner(llama_path, dtype), _runner(llama_path, dtype, padded=False)
    # Two steps: a prompt of 70 (padded to 72), then a prompt of 67 beside the first's
    # decode (68 rows, padded to 72).
    first = _prompt(70, 0, seed=1)
    second = _prompt(67, 20, seed=2)
    decode = SeqChunk((7,), 70, (*first.block_table, 18), needs_logits=True)
    assert padded._prepare([first]).input_ids.shape[0] == 72
    assert padded._prepare([first]).slot_mapping.shape[0] == 70
    for step in ([first], [decode, second]):
        torch.testing.assert_close(padded.execute(step), plain.execute(step))
    # The padding rows wrote nothing: the caches are the same, slot for slot.
    torch.testing.assert_close(padded.kv_cache, plain.kv_cache)


def test_hidden_states_come_back_one_row_a_token(llama_path: Path) -> None:
    runner = _runner(llama_path, "float32")
    step = runner._prepare([_prompt(65, 0, seed=3)])
    assert step.input_ids.shape[0] == 72
    with torch.inference_mode():
        hidden = runner.model.hidden_states(step, runner.kv_caches)
    assert hidden.shape[0] == 65


def test_every_bucket_is_warmed_only_where_steps_are_padded(llama_path: Path) -> None:
    runner = _runner(llama_path, "float32")
    assert runner.warm_row_buckets(300) == len(bucket_sizes(300)) > 0
    runner.pad_rows = False
    assert runner.warm_row_buckets(300) == 0


def test_steps_past_the_limit_keep_their_row_count(llama_path: Path) -> None:
    runner = _runner(llama_path, "float32", up_to=100)
    assert runner._prepare([_prompt(70, 0, seed=5)]).input_ids.shape[0] == 72
    assert runner._prepare([_prompt(101, 0, seed=5)]).input_ids.shape[0] == 101
    assert runner.warm_row_buckets(300) == len(bucket_sizes(100))  # 72 ... 104
    never = _runner(llama_path, "float32", up_to=0)
    assert never._prepare([_prompt(70, 0, seed=5)]).input_ids.shape[0] == 70
    assert never.warm_row_buckets(300) == 0


def test_without_a_limit_it_is_measured_when_the_buckets_are_warmed(
    llama_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = _runner(llama_path, "float32", up_to=None)
    assert runner._prepare([_prompt(101, 0, seed=6)]).input_ids.shape[0] == 104  # until then
    asked: list[tuple[int, int]] = []

    def choose(parts: object, layers: int, max_rows: int) -> int:
        asked.append((layers, max_rows))
        return 80

    monkeypatch.setattr(model_runner, "choose_padding_limit", choose)
    assert runner.warm_row_buckets(300) == len(bucket_sizes(80))
    assert asked == [(runner.config.num_layers, 300)]
    assert runner._prepare([_prompt(79, 0, seed=6)]).input_ids.shape[0] == 80
    assert runner._prepare([_prompt(101, 0, seed=6)]).input_ids.shape[0] == 101


def test_no_padding_with_lora_or_unpacked_weights(llama_path: Path) -> None:
    unpacked = ModelRunner(llama_path, num_kv_blocks=4, block_size=4, device="cpu",
                           prepack_weights=False)  # fmt: skip
    assert not unpacked.pad_rows
    lora = new_lora_runtime(
        DecoderConfig.from_hf(load_hf_config(llama_path)), slots=1, max_cpu_loras=1,
        max_rank=8, device=torch.device("cpu"), dtype=torch.float32,
    )  # fmt: skip
    with_lora = ModelRunner(llama_path, num_kv_blocks=4, block_size=4, device="cpu", lora=lora)
    assert not with_lora.pad_rows
    assert with_lora._prepare([_prompt(70, 0, seed=4)]).input_ids.shape[0] == 70
