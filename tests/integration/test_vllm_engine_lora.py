"""LoRA on ``engine: vllm``: a random adapter of the real SmolLM2, served by ``conveyor serve``
in vLLM's environment, answers greedily as Conveyor's own engine does with that adapter; the
base answers as before when no adapter is named; loading and unloading at run time go through
vLLM (``add_lora``, ``remove_lora``) with Conveyor's checks and answers.

One vLLM engine, shared with ``test_vllm_engine`` and the batch test (its start-up is most
of the cost; the batch test's restart configures the adapter). The adapter (rank 8 on every
projection, drawn at random) is made by PEFT and saved, as in ``test_smollm2_lora``
(``save_random_adapter``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from conveyor.engine.llm_engine import EngineConfig, LLMEngine
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.lora.files import REFUSAL
from conveyor.engine.model.lora.runtime import new_lora_runtime
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.stream import GenerationStream
from conveyor.engine.tokenizer import Tokenizer
from tests.e2e.conftest import Server
from tests.integration.smollm2_fixtures import shared_gguf_reads
from tests.integration.vllm_worker import (
    LORA_ADAPTER,
    LORA_RANK,
    VLLM_MODEL_NAME,
    SharedVllmServer,
)
from tests.unit.model_helpers import Result, collect

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.timeout(1200)]

MAX_TOKENS = 16
PROMPTS = (
    "The best way to learn a new language is",
    "Water boils at a temperature of",
    "My favourite season of the year is autumn, because",
)


@pytest.fixture(scope="module")
def server(
    vllm_launched: SharedVllmServer,
    vllm_adapter_root: Path,
    conveyors_answers: dict[str | None, list[str]],
) -> Server:  # conveyors_answers: computed while vLLM starts (if it still has to)
    """The shared vLLM server with ``LORA_ADAPTER`` configured (started with it after the
    batch test's kill; started again with it here when that test did not run first)."""
    return vllm_launched.ready(vllm_adapter_root)


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.api, timeout=600) as made:
        yield made


@pytest.fixture(scope="module")
def prompts(smollm2_tokenizer: Tokenizer) -> list[list[int]]:
    return [smollm2_tokenizer.encode(text) for text in PROMPTS]


@pytest.fixture(scope="module")
def conveyors_answers(
    smollm2_path: Path,
    smollm2_tokenizer: Tokenizer,
    vllm_adapter_root: Path,
    prompts: list[list[int]],
) -> dict[str | None, list[str]]:
    """Conveyor's own engine's greedy texts: per prompt, under the adapter and on the base."""
    from conveyor.fakes.checkpoints import torch_threads

    lora = new_lora_runtime(
        DecoderConfig.from_hf(load_hf_config(smollm2_path)), slots=1, max_cpu_loras=1,
        max_rank=LORA_RANK, device=torch.device("cpu"), dtype=torch.float32,
    )  # fmt: skip
    entry = lora.registry.load(LORA_ADAPTER, vllm_adapter_root / LORA_ADAPTER)
    with torch_threads(1), shared_gguf_reads():
        runner = ModelRunner(smollm2_path, num_kv_blocks=32, block_size=16, device="cpu",
                             dtype="float32", lora=lora)  # fmt: skip
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=256,
                          num_kv_blocks=32, block_size=16, max_loras_per_batch=1)  # fmt: skip
    engine = LLMEngine(runner, smollm2_tokenizer, config)
    engine.start()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

    async def run(adapter_id: int) -> list[Result]:
        streams = []
        for index, prompt in enumerate(prompts):
            stream = GenerationStream()
            request = engine.new_request(f"{adapter_id}-{index}", prompt, params,
                                         adapter_id=adapter_id)  # fmt: skip
            engine.add_request(request, stream)
            streams.append(stream)
        return list(await asyncio.gather(*map(collect, streams)))

    try:
        with torch_threads(1):
            answers = {
                LORA_ADAPTER: [r.text for r in asyncio.run(run(entry.adapter_id))],
                None: [r.text for r in asyncio.run(run(0))],
            }
    finally:
        engine.stop()
    return answers


async def complete_all(url: str, models: list[str], prompts: list[list[int]]) -> list[Any]:
    """Greedy completions of every prompt under every model, all sent at once (one batch)."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        bodies = [{"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                   "ignore_eos": True} for model in models for prompt in prompts]  # fmt: skip
        return list(await asyncio.gather(*(client.post("/completions", json=b) for b in bodies)))


def texts(responses: list[Any]) -> list[str]:
    for response in responses:
        assert response.status_code == 200, response.text
    return [response.json()["choices"][0]["text"] for response in responses]


def test_greedy_answers_match_conveyors_engine_with_and_without_the_adapter(
    server: Server, prompts: list[list[int]], conveyors_answers: dict[str | None, list[str]]
) -> None:
    # Adapter and base requests together: vLLM runs them in the same steps.
    answers = texts(asyncio.run(complete_all(server.api, [LORA_ADAPTER, VLLM_MODEL_NAME], prompts)))
    with_adapter, base = answers[: len(prompts)], answers[len(prompts) :]
    assert with_adapter == conveyors_answers[LORA_ADAPTER]
    assert base == conveyors_answers[None]  # the base is untouched by the adapter
    # The adapter changes what the model says, or this test could not fail.
    assert sum(a != b for a, b in zip(with_adapter, base, strict=True)) >= 2, answers


def test_a_run_time_adapter_serves_until_unloaded_then_is_a_404(
    client: httpx.Client, vllm_adapter_root: Path, prompts: list[list[int]],
    conveyors_answers: dict[str | None, list[str]],
) -> None:  # fmt: skip
    load = {"lora_name": "again", "lora_path": str(vllm_adapter_root / LORA_ADAPTER)}
    loaded = client.post("/load_lora_adapter", json=load)
    assert loaded.status_code == 200, loaded.text
    parents = {m["id"]: m.get("parent") for m in client.get("/models").json()["data"]}
    assert parents == {
        VLLM_MODEL_NAME: None,
        LORA_ADAPTER: VLLM_MODEL_NAME,
        "again": VLLM_MODEL_NAME,
    }
    body = {"prompt": prompts[0], "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    answer = client.post("/completions", json={"model": "again", **body})
    assert texts([answer]) == conveyors_answers[LORA_ADAPTER][:1]
    # The same checks as on Conveyor's engine: a path outside load_roots, a taken name.
    outside = client.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": "/etc"})
    assert outside.status_code == 400 and outside.json()["error"]["message"] == REFUSAL
    assert client.post("/load_lora_adapter", json=load).status_code == 400  # taken
    assert client.post("/unload_lora_adapter", json={"lora_name": "again"}).status_code == 200
    gone = client.post("/completions", json={"model": "again", **body})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    assert client.post("/unload_lora_adapter", json={"lora_name": "again"}).status_code == 404
    # The configured adapter and the base serve on.
    models = (LORA_ADAPTER, VLLM_MODEL_NAME)
    answers = texts([client.post("/completions", json={"model": m, **body}) for m in models])
    assert answers == [conveyors_answers[LORA_ADAPTER][0], conveyors_answers[None][0]]
