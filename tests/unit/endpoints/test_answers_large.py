"""Large answers: capped by ``max_logprob_entries`` before any work, and built off the loop.

A tiny Llama served in process with a small cap (2000 entries): an answer over it is a 400
naming the parameter; one at it is served, built and written on another thread while the
event loop goes on answering other requests.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.api import inference
from conveyor.api.app import create_app
from conveyor.config.settings import ServerConfig
from conveyor.endpoints import answers, completions, dispatch
from conveyor.endpoints.dispatch import execute, whole_generation
from conveyor.endpoints.generation import ChoiceResult, GenerationRun
from conveyor.errors import InvalidRequest
from conveyor.host.service import Service
from conveyor.openai_paths import CHAT_COMPLETIONS, COMPLETIONS

# `model`: runs a real (tiny) torch model, so mutation runs leave it out.
pytestmark = [pytest.mark.anyio, pytest.mark.model]

CAP = 2000
# 4 choices x 50 tokens x (1 + 9) = the cap exactly; estimated at 128 KB, so built off the loop.
AT_CAP = {"model": "tiny", "prompt": "hello", "n": 4, "max_tokens": 50, "logprobs": 9,
          "ignore_eos": True}  # fmt: skip


@pytest.fixture
async def service(llama_path: Path, tmp_path: Path) -> AsyncIterator[Service]:
    tiny = {"name": "tiny", "kind": "generate", "path": str(llama_path), "kv_cache_tokens": 1024,
            "block_size": 4, "max_model_len": 128, "max_num_seqs": 4,
            "max_num_batched_tokens": 64, "max_logprob_entries": CAP}  # fmt: skip
    config = ServerConfig.model_validate({"data_dir": str(tmp_path), "models": [tiny]})
    async with Service(config) as running:
        yield running


@pytest.fixture
async def client(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(service.config, service=service))
    async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as http:
        yield http


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        (COMPLETIONS, {**AT_CAP, "max_tokens": 51}, "logprobs"),
        (COMPLETIONS, {**AT_CAP, "prompt": ["a", "b"]}, "logprobs"),
        # No max_tokens: the context's room (128 less the prompt) x 21 for each choice.
        (CHAT_COMPLETIONS, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                            "logprobs": True, "top_logprobs": 20}, "top_logprobs"),
        (CHAT_COMPLETIONS, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                            "logprobs": True, "n": 20}, "logprobs"),
    ],
)  # fmt: skip
async def test_an_answer_over_max_logprob_entries_is_a_400_naming_the_parameter(
    service: Service, endpoint: str, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest, match="max_logprob_entries") as caught:
        await execute(service, endpoint, body)
    assert caught.value.param == param


async def test_with_max_tokens_the_cap_is_checked_before_tokenizing(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = service.generator("tiny").tokenizer

    def no_tokenizing(*args: Any, **kwargs: Any) -> list[int]:
        raise AssertionError("tokenized a request the cap refuses")

    monkeypatch.setattr(tokenizer, "encode", no_tokenizing)
    with pytest.raises(InvalidRequest, match="max_logprob_entries"):
        await execute(service, COMPLETIONS, {**AT_CAP, "n": 5})


async def test_a_probe_is_answered_while_the_largest_answer_is_built(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer's builder waits for a probe to be answered: on the loop it could not be."""
    building = threading.Event()
    probe_answered = threading.Event()
    saw_probe: list[bool] = []

    def waiting_body(run: GenerationRun, results: Sequence[ChoiceResult]) -> dict[str, Any]:
        building.set()
        saw_probe.append(probe_answered.wait(5))
        return completions.completion_body(run, results)

    monkeypatch.setattr(inference, "completion_body", waiting_body)
    large = asyncio.create_task(client.post("/v1/completions", json=AT_CAP))
    assert await asyncio.to_thread(building.wait, 60)
    probe = await client.get("/health")
    probe_answered.set()
    answer = await large
    assert probe.status_code == 200 and saw_probe == [True]
    assert answer.status_code == 200, answer.text
    choices = answer.json()["choices"]
    assert len(choices) == 4
    assert all(len(c["logprobs"]["token_logprobs"]) == 50 for c in choices)


async def test_batch_lines_build_a_large_answer_off_the_loop(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    built_on: list[int] = []
    make_body = completions.completion_body

    def recording(run: GenerationRun, results: Sequence[ChoiceResult]) -> dict[str, Any]:
        built_on.append(threading.get_ident())
        return make_body(run, results)

    door = (completions.parse_completion_request,
            whole_generation(completions.prepare_completion, recording))  # fmt: skip
    monkeypatch.setitem(dispatch.DOORS, COMPLETIONS, door)  # type: ignore[index]
    result = await execute(service, COMPLETIONS, AT_CAP)
    assert len(result["choices"]) == 4
    assert built_on and built_on[0] != threading.get_ident()
    small = await execute(service, COMPLETIONS, {**AT_CAP, "n": 1, "max_tokens": 2})
    assert len(small["choices"]) == 1 and built_on[-1] == threading.get_ident()


def test_the_size_estimate_counts_every_entry() -> None:
    from conveyor.engine.outputs import TokenLogprobs

    item = TokenLogprobs(1, -0.5, ((2, -1.0), (3, -2.0)))
    result = ChoiceResult(0, text="abc", logprobs=[item] * 10)
    assert answers.answer_bytes([result, result]) == 2 * (3 + answers.ENTRY_BYTES * 10 * 3)
