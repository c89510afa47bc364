"""``engine: vllm`` on the real SmolLM2, served by ``conveyor serve`` in vLLM's environment.

One vLLM engine, shared with the LoRA and batch modules (its start-up is most of the cost,
so it is launched first: SmolLM2's runner and transformers' model load while vLLM starts;
it has no LoRA until the batch test's restart, and these requests name no adapter).
Greedy answers match Conveyor's own engine and transformers token for token; streaming,
n > 1, logprobs, JSON-schema output, a forced tool call, the usage block and vLLM's own
metrics come through Conveyor's endpoints unchanged; a client that goes away aborts its
request inside vLLM.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from conveyor.engine.llm_engine import EngineConfig, LLMEngine
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.tokenizer import Tokenizer
from tests.e2e.conftest import Server
from tests.integration.smollm2_reference import HFScorer, parity_problems
from tests.integration.vllm_worker import (
    VLLM_MODEL_NAME,
    SharedVllmServer,
    metric_sum,
)
from tests.unit.model_helpers import generate

# vllm_launched first (usefixtures come before a test's arguments): vLLM starts up while
# the session's SmolLM2 fixtures load.
pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.timeout(1200),
              pytest.mark.usefixtures("vllm_launched")]  # fmt: skip

NEW_TOKENS = 24
QUESTIONS = (
    "What is the capital of France? Answer in one word.",
    "Write a haiku about the ocean.",
    "List three fruits.",
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def server(vllm_launched: SharedVllmServer) -> Server:
    """The vLLM server shared with the LoRA and batch modules (its adapter is not used here)."""
    return vllm_launched.ready()


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.api, timeout=600) as made:
        yield made


def chat(client: httpx.Client, question: str, **fields: Any) -> dict[str, Any]:
    """One chat completion; the response body (status checked)."""
    body = {"model": VLLM_MODEL_NAME, "messages": [{"role": "user", "content": question}]}
    response = client.post("/chat/completions", json={**body, **fields})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def pieces(entries: list[dict[str, Any]]) -> list[tuple[str, tuple[int, ...]]]:
    """Each token of an answer as its logprob entry names it: its text and bytes."""
    return [(entry["token"], tuple(entry["bytes"])) for entry in entries]


@pytest.mark.usefixtures("one_torch_thread")
def test_greedy_tokens_match_conveyors_engine_and_transformers(
    client: httpx.Client,
    smollm2_runner: ModelRunner,
    smollm2_tokenizer: Tokenizer,
    smollm2_scorer: HFScorer,
) -> None:
    greedy = {"temperature": 0, "max_tokens": NEW_TOKENS, "ignore_eos": True, "logprobs": True}
    answers = [chat(client, question, **greedy) for question in QUESTIONS]
    prompts = [
        smollm2_tokenizer.apply_chat_template([{"role": "user", "content": question}])
        for question in QUESTIONS
    ]
    engine = LLMEngine(smollm2_runner, smollm2_tokenizer, EngineConfig(
        max_num_seqs=4, max_num_batched_tokens=512, max_model_len=512,
        num_kv_blocks=smollm2_runner.num_kv_blocks, block_size=smollm2_runner.block_size,
    ))  # fmt: skip
    engine.start()
    try:
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        ours = asyncio.run(generate(engine, prompts, params))
    finally:
        engine.stop()
    problems = []
    for prompt, answer, result in zip(prompts, answers, ours, strict=True):
        assert answer["usage"]["prompt_tokens"] == len(prompt)
        entries = answer["choices"][0]["logprobs"]["content"]
        # vLLM's tokens are Conveyor's engine's, token for token...
        assert pieces(entries) == [smollm2_tokenizer.token_piece(t) for t in result.token_ids]
        assert answer["choices"][0]["message"]["content"] == result.text
        # ...which are transformers' greedy tokens, with vLLM's logprobs transformers' too.
        scored = smollm2_scorer.score(prompt, result.token_ids)
        logprobs = [entry["logprob"] for entry in entries]
        problems += parity_problems(scored, result.token_ids, logprobs)
    assert not problems, "\n".join(problems)


def test_a_stream_carries_the_same_answer_and_usage(client: httpx.Client) -> None:
    fields = {"temperature": 0, "max_tokens": 16}
    whole = chat(client, QUESTIONS[1], **fields)
    body = {"model": VLLM_MODEL_NAME, "messages": [{"role": "user", "content": QUESTIONS[1]}],
            "stream": True, "stream_options": {"include_usage": True}, **fields}  # fmt: skip
    pieces, usage, reasons = [], None, []
    with client.stream("POST", "/chat/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                pieces.append(choice["delta"].get("content") or "")
                reasons.append(choice["finish_reason"])
    assert "".join(pieces) == whole["choices"][0]["message"]["content"]
    assert usage == whole["usage"]
    assert reasons[-1] == whole["choices"][0]["finish_reason"]


def test_n_choices_with_a_seed_and_top_logprobs(client: httpx.Client) -> None:
    answer = chat(client, QUESTIONS[2], n=3, temperature=1.0, seed=7, max_tokens=8,
                  logprobs=True, top_logprobs=2)  # fmt: skip
    choices = answer["choices"]
    assert [choice["index"] for choice in choices] == [0, 1, 2]
    num_tokens = 0
    for choice in choices:
        entries = choice["logprobs"]["content"]
        num_tokens += len(entries)
        assert all(len(entry["top_logprobs"]) == 2 for entry in entries)
        for entry in entries:  # the chosen token is no likelier than the likeliest
            assert entry["logprob"] <= entry["top_logprobs"][0]["logprob"] + 1e-6
    assert answer["usage"]["completion_tokens"] == num_tokens
    again = chat(client, QUESTIONS[2], n=3, temperature=1.0, seed=7, max_tokens=8)
    assert [c["message"]["content"] for c in again["choices"]] == [
        c["message"]["content"] for c in choices
    ]  # a seed makes sampling repeatable


def test_json_schema_output_parses_and_matches(client: httpx.Client) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    answer = chat(client, "Describe the weather in Paris as JSON.", temperature=0, max_tokens=60,
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": "weather", "schema": schema}})  # fmt: skip
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop"
    value = json.loads(choice["message"]["content"])
    assert set(value) == {"city", "sunny"}
    assert isinstance(value["city"], str) and isinstance(value["sunny"], bool)


def test_a_forced_tool_call_names_the_tool_with_valid_arguments(client: httpx.Client) -> None:
    answer = chat(client, "What is the weather in Paris?", temperature=0, max_tokens=60,
                  tools=[WEATHER_TOOL],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})  # fmt: skip
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert set(json.loads(call["function"]["arguments"])) == {"city"}


def test_a_client_that_goes_away_aborts_the_request_in_vllm(
    client: httpx.Client, server: Server
) -> None:
    max_tokens = 400
    tokens_before = metric_sum(server, "vllm:generation_tokens_total")
    aborts_before = metric_sum(server, "conveyor_generation_requests_finished_total",
                               model=VLLM_MODEL_NAME, finish_reason="abort")  # fmt: skip
    body = {"model": VLLM_MODEL_NAME, "prompt": "Once upon a time", "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0, "stream": True}  # fmt: skip
    with client.stream("POST", "/completions", json=body) as response:
        lines = response.iter_lines()
        for _ in range(6):  # a few tokens in, the client hangs up
            next(lines)
    wait_for(lambda: metric_sum(server, "vllm:num_requests_running") == 0, "vLLM to go idle")
    generated = metric_sum(server, "vllm:generation_tokens_total") - tokens_before
    assert generated < max_tokens  # stopped early: aborted, not run to the end
    aborts = metric_sum(server, "conveyor_generation_requests_finished_total",
                        model=VLLM_MODEL_NAME, finish_reason="abort")  # fmt: skip
    assert aborts == aborts_before + 1


def test_vllms_own_metrics_sit_beside_conveyors(client: httpx.Client, server: Server) -> None:
    chat(client, QUESTIONS[0], max_tokens=4)
    text = httpx.get(f"{server.url}/metrics").text
    assert text.count("# TYPE vllm:num_requests_running gauge") == 1  # one family, not two
    assert f'vllm:num_requests_running{{engine="0",model_name="{VLLM_MODEL_NAME}"}}' in text
    assert metric_sum(server, "vllm:prompt_tokens_total", model_name=VLLM_MODEL_NAME) > 0
    assert metric_sum(server, "conveyor_generated_tokens_total", model=VLLM_MODEL_NAME) > 0


def wait_for(predicate: Any, what: str, timeout_s: float = 300) -> None:
    """Poll ``predicate`` until true; fail naming ``what`` after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)
