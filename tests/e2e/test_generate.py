"""Generation on a real ``conveyor serve`` process, driven with the official ``openai``
client: completions and chat, streamed and not, cancellation (the KV pool is whole again
afterwards, read from /metrics), and bad input on both endpoints."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from conveyor.engine.tokenizer import Tokenizer
from conveyor.fakes.checkpoints import build_tiny_llama
from tests.e2e.conftest import Server, start_server, stop_server
from tests.polling import until

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
POOL_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Iterator[Server]:
    """A generative model beside a synthetic embedding model, in one process."""
    generate = {
        "name": MODEL,
        "kind": "generate",
        "path": str(checkpoint),
        "device": "cpu",
        "kv_cache_tokens": 4096,
        "block_size": 16,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 256,
        "threads": 1,
    }
    config = {"models": [generate, {"name": "syn", "kind": "synthetic", "batch_latency_ms": 0}]}
    running = start_server(tmp_path_factory.mktemp("generate-server"), config)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)


def reference_text(checkpoint: Path, prompt: str, max_new_tokens: int) -> tuple[str, int]:
    """Hugging Face greedy ``generate``: the decoded text and the number of tokens."""
    tokenizer = Tokenizer(checkpoint)
    ids = tokenizer.encode(prompt)
    model: Any = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens)
    new = out[0, len(ids) :].tolist()
    return tokenizer.decode(new), len(new)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds (the server applies aborts between steps)."""
    until(condition, what, timeout_s=POOL_TIMEOUT_S)


def pool_is_whole(server: Server) -> bool:
    """No KV block held, no sequence running or waiting."""
    return (
        server.metric("conveyor_kv_blocks_used", model=MODEL) == 0
        and server.metric("conveyor_running_sequences", model=MODEL) == 0
        and server.metric("conveyor_waiting_sequences", model=MODEL) == 0
    )


def test_models_lists_both_kinds(client: openai.OpenAI) -> None:
    assert {model.id for model in client.models.list()} == {MODEL, "syn"}


def test_completion_matches_hugging_face(client: openai.OpenAI, checkpoint: Path) -> None:
    text, num_tokens = reference_text(checkpoint, "The quick brown fox", 12)
    result = client.completions.create(
        model=MODEL, prompt="The quick brown fox", max_tokens=12, temperature=0
    )
    assert result.choices[0].text == text
    assert result.usage is not None and result.usage.completion_tokens == num_tokens
    assert result.choices[0].finish_reason == ("length" if num_tokens == 12 else "stop")


def test_streamed_completion_equals_the_whole_one(client: openai.OpenAI, server: Server) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": "Paged attention", "max_tokens": 20,
                              "temperature": 0}  # fmt: skip
    whole = client.completions.create(**kwargs)
    chunks = list(
        client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    finishing = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishing[-1] == whole.choices[0].finish_reason
    assert all(reason is None for reason in finishing[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(chunk.id == chunks[0].id for chunk in chunks)
    wait_for(lambda: pool_is_whole(server), "the pool to be whole")


def test_chat_streamed_and_not(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "hello there!"}]  # fmt: skip
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=15, temperature=0
    )
    assert whole.choices[0].message.role == "assistant"
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, max_completion_tokens=15, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].object == "chat.completion.chunk"


def test_stop_string_and_seeded_sampling(client: openai.OpenAI) -> None:
    base: dict[str, Any] = {"model": MODEL, "prompt": "Numbers 0 1 2", "max_tokens": 16}
    full = client.completions.create(**base, temperature=0).choices[0].text
    stop = next(full[i : i + 2] for i in range(1, len(full) - 2) if "\ufffd" not in full[i : i + 2])
    cut = client.completions.create(**base, temperature=0, stop=[stop]).choices[0]
    assert cut.text == full[: full.index(stop)] and cut.finish_reason == "stop"
    seeded = [client.completions.create(**base, temperature=1, seed=7).choices[0].text
              for _ in range(2)]  # fmt: skip
    assert seeded[0] == seeded[1]


def test_closing_a_stream_frees_every_block(client: openai.OpenAI, server: Server) -> None:
    before = server.metric("conveyor_generated_tokens_total", model=MODEL)
    stream = client.completions.create(
        model=MODEL, prompt="tell me a story", max_tokens=1000, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    for index, _ in enumerate(stream):
        if index == 2:
            break
    stream.close()
    wait_for(lambda: pool_is_whole(server), "the aborted stream's blocks")
    # Far fewer than the 1000 asked for: the engine stopped when the caller left.
    assert server.metric("conveyor_generated_tokens_total", model=MODEL) - before < 1000


def test_a_caller_that_gives_up_waiting_frees_every_block(server: Server) -> None:
    before = server.metric("conveyor_generated_tokens_total", model=MODEL)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 1000, "ignore_eos": True}  # fmt: skip
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.api}/chat/completions", json=body, timeout=0.5)
    wait_for(lambda: pool_is_whole(server), "the abandoned request's blocks")
    assert server.metric("conveyor_generated_tokens_total", model=MODEL) - before < 1000
    assert server.metric("conveyor_requests_total", model=MODEL, outcome="client_gone") >= 1


BAD_COMPLETIONS = [
    ({"prompt": "x " * 1100}, "maximum context length"),
    ({"prompt": "hi", "max_tokens": 5000}, "maximum context length is 1024 tokens"),
    ({"prompt": "hi", "temperature": 5}, "temperature"),
    ({"prompt": "hi", "n": 200}, "less than or equal to 128"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "logprobs": 50}, "logprobs"),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "at most 4 stop"),
    ({"prompt": "hi", "best_of": 2}, "only best_of=1"),
    ({"prompt": "hi", "frequency": 1.2}, "unrecognized request argument"),
    ({"prompt": [[]]}, "prompt[0] must not be empty"),
    ({"prompt": [1, 99999]}, "token ids must be in"),
    ({}, "missing required parameter: 'prompt'"),
]
BAD_CHATS = [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}, "context length"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools.0.function"),
    ({"messages": [{"role": "user", "content": "x"}], "audio": {"voice": "x"}},
     "unrecognized request argument: 'audio'"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 300}, "less than or equal to 128"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "fragment"), BAD_COMPLETIONS)
def test_bad_completion(server: Server, fields: dict[str, Any], fragment: str) -> None:
    assert_400(server, "completions", {"model": MODEL, **fields}, fragment)


@pytest.mark.parametrize(("fields", "fragment"), BAD_CHATS)
def test_bad_chat(server: Server, fields: dict[str, Any], fragment: str) -> None:
    assert_400(server, "chat/completions", {"model": MODEL, **fields}, fragment)


def assert_400(server: Server, path: str, body: dict[str, Any], fragment: str) -> None:
    """A 400 with OpenAI's error shape and a message that names the problem."""
    response = httpx.post(f"{server.api}/{path}", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment in error["message"]


def test_bad_input_through_the_openai_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="modalities"):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], modalities=["audio"]
        )
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x")
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.completions.create(model="syn", prompt="x")
    with pytest.raises(openai.BadRequestError, match="generative model"):
        client.embeddings.create(model=MODEL, input="x")


def test_metrics_describe_the_engine(server: Server) -> None:
    text = httpx.get(f"{server.url}/metrics").text
    for family in (
        "conveyor_kv_blocks_free", "conveyor_time_to_first_token_seconds",
        "conveyor_time_per_output_token_seconds", "conveyor_preemptions_total",
        "conveyor_prefix_cache_hit_tokens_total", "conveyor_prompt_tokens_total",
    ):  # fmt: skip
        assert family in text
    assert server.metric("conveyor_kv_blocks_free", model=MODEL) == 4096 // 16


def test_structured_output_and_tools_through_the_openai_client(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
              "required": ["ok"], "additionalProperties": False}  # fmt: skip
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "json please"}],
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
        max_completion_tokens=32,
    )
    assert isinstance(json.loads(reply.choices[0].message.content or "")["ok"], bool)
    assert reply.choices[0].message.refusal is None and reply.system_fingerprint
    tool = {"type": "function", "function": {"name": "ping", "parameters": schema}}
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "call ping"}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "ping"}},
        max_completion_tokens=64,
        stream=True,
    )
    deltas = [
        c for chunk in stream for c in chunk.choices[0].delta.tool_calls or [] if chunk.choices
    ]
    assert deltas[0].function and deltas[0].function.name == "ping"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert set(json.loads(arguments)) == {"ok"}
