"""A random LoRA on the real SmolLM2-135M-Instruct: Conveyor's greedy tokens under the adapter
equal PEFT's merged model (``merge_and_unload``), and the base's equal transformers', with
adapter and base requests mixed in the same steps.

The adapter (rank 8 on every projection, drawn at random: PEFT starts ``lora_B`` at zero,
which would change nothing) is made by PEFT on transformers' reading of the GGUF and saved;
Conveyor reads that directory, and so does PEFT for the merged reference. Parity is checked
teacher-forced (see ``smollm2_reference``).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from conveyor.engine.llm_engine import EngineConfig, LLMEngine
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.lora.runtime import LoraRuntime, new_lora_runtime
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.stream import GenerationStream
from conveyor.engine.tokenizer import Tokenizer
from tests.integration.smollm2_fixtures import save_random_adapter, shared_gguf_reads
from tests.integration.smollm2_reference import HFScorer, parity_problems
from tests.unit.model_helpers import Result, collect

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]

RANK = 8
# Spread of the random A and B: enough to move greedy choices, not enough to garble the text.
SCALE = 0.03
MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
PROMPTS = (
    "The best way to learn a new language is",
    "Water boils at a temperature of",
    "My favourite season of the year is autumn, because",
    "The first step in baking bread is",
)


@pytest.fixture(scope="module")
def adapter(smollm2_hf: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PEFT's random adapter of SmolLM2, saved as PEFT saves it."""
    return save_random_adapter(
        smollm2_hf, tmp_path_factory.mktemp("smollm2-lora") / "adapter", rank=RANK, scale=SCALE
    )


@pytest.fixture(scope="module")
def merged(smollm2_hf: Any, adapter: Path) -> HFScorer:
    """PEFT's merged model of the saved adapter, as a teacher-forced reference."""
    from peft import PeftModel

    model: Any = PeftModel.from_pretrained(copy.deepcopy(smollm2_hf), str(adapter))
    return HFScorer(model.merge_and_unload().eval())


@pytest.fixture(scope="module")
def lora_engine(
    smollm2_path: Path, smollm2_tokenizer: Tokenizer
) -> Iterator[tuple[LLMEngine, LoraRuntime]]:
    """An engine whose runner (a second load of the GGUF) serves one adapter slot."""
    lora = new_lora_runtime(
        DecoderConfig.from_hf(load_hf_config(smollm2_path)), slots=1, max_cpu_loras=1,
        max_rank=RANK, device=torch.device("cpu"), dtype=torch.float32,
    )  # fmt: skip
    with shared_gguf_reads():
        runner = ModelRunner(smollm2_path, num_kv_blocks=64, block_size=8, device="cpu",
                             dtype="float32", lora=lora)  # fmt: skip
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=256,
                          num_kv_blocks=64, block_size=8, max_loras_per_batch=1)  # fmt: skip
    engine = LLMEngine(runner, smollm2_tokenizer, config)
    engine.start()
    yield engine, lora
    engine.stop()


async def mixed(engine: LLMEngine, prompts: list[list[int]], adapter_id: int) -> list[Result]:
    """Each prompt twice, queued together: under the adapter, then on the base."""
    streams = []
    for index, prompt in enumerate(prompts):
        for row, chosen in enumerate((adapter_id, 0)):
            stream = GenerationStream()
            request_id = f"r{index}-{row}"
            request = engine.new_request(request_id, prompt, GREEDY, adapter_id=chosen)
            engine.add_request(request, stream)
            streams.append(stream)
    return list(await asyncio.gather(*map(collect, streams)))


def problems_of(scorer: HFScorer, prompt: list[int], result: Result) -> list[str]:
    logprobs = [entry.logprob for output in result.outputs for entry in output.logprobs]
    return parity_problems(scorer.score(prompt, result.token_ids), result.token_ids, logprobs)


def test_a_random_lora_matches_peft_merged_greedily(
    lora_engine: tuple[LLMEngine, LoraRuntime],
    adapter: Path,
    merged: HFScorer,
    smollm2_scorer: HFScorer,
    smollm2_tokenizer: Tokenizer,
) -> None:
    engine, lora = lora_engine
    entry = lora.registry.load("random", adapter)
    prompts = [smollm2_tokenizer.encode(text) for text in PROMPTS]
    results = asyncio.run(mixed(engine, prompts, entry.adapter_id))
    assert engine.stats.max_num_running == 2 * len(prompts)  # one batch, both kinds
    problems = []
    for index, prompt in enumerate(prompts):
        with_adapter, base = results[2 * index], results[2 * index + 1]
        problems += [f"adapter {index}: {p}" for p in problems_of(merged, prompt, with_adapter)]
        problems += [f"base {index}: {p}" for p in problems_of(smollm2_scorer, prompt, base)]
    assert not problems, "\n".join(problems)
    # The adapter changes what the model says, or this test could not fail.
    changed = [results[i].token_ids != results[i + 1].token_ids for i in range(0, len(results), 2)]
    assert sum(changed) >= len(prompts) // 2, changed
