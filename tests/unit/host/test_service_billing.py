"""Billing and exact admission on `serve` with real models: chat completions (JSON and
streams) and rerank/score calls land in the usage ledger exactly as their answers' `usage`
says, and rate limits count the tokens the model runs, reserving the context's room when no
`max_tokens` is given."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from fastapi import FastAPI

from conveyor.api.app import create_app
from conveyor.config.settings import ServerConfig
from conveyor.fakes.checkpoints import build_tiny_cross_encoder

# Each test starts a tiny Llama and a cross-encoder (the first also imports transformers).
pytestmark = [pytest.mark.anyio, pytest.mark.model, pytest.mark.timeout(60)]

KEY = "sk-test-tenant-acme"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_MODEL_LEN = 96
LIMITS = {"rpm": 1000, "input_tpm": 100_000, "output_tpm": 100_000}


@pytest.fixture(scope="module")
def ranker_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("ce"))


@pytest.fixture
async def app(llama_path: Path, ranker_path: Path, tmp_path: Path) -> AsyncIterator[FastAPI]:
    tiny = {
        "name": "tiny", "kind": "generate", "path": str(llama_path), "kv_cache_tokens": 512,
        "block_size": 4, "max_model_len": MAX_MODEL_LEN, "max_num_seqs": 4,
        "max_num_batched_tokens": 64,
    }  # fmt: skip
    ranker = {"name": "ranker", "kind": "rerank", "path": str(ranker_path), "device": "cpu",
              "max_wait_ms": 1}  # fmt: skip
    config = ServerConfig.model_validate({
        "data_dir": str(tmp_path), "models": [tiny, ranker],
        "api_keys": [{"key": KEY, "tenant": "acme"}],
        "tenants": [{"name": "acme", "limits": {"*": LIMITS}}],
    })  # fmt: skip
    app = create_app(config)
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c:
        yield c


async def ledger(app: FastAPI, http: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    """The tenant's usage today, by model, after flushing the online ledger."""
    await app.state.service.ledger.flush()
    query = {"start_time": int(time.time()) - 3600, "bucket_width": "1d", "group_by": "model"}
    page = (await http.get("/v1/usage", params=query)).json()
    return {r["model"]: r for bucket in page["data"] for r in bucket["results"]}


async def test_chat_completions_bill_the_ledger_what_their_usage_says(
    app: FastAPI, http: httpx.AsyncClient
) -> None:
    api = openai.AsyncOpenAI(base_url="http://t/v1", api_key=KEY, http_client=http,
                             max_retries=0)  # fmt: skip
    messages: Any = [{"role": "user", "content": "the quick brown fox"}]
    prompt = output = 0
    for max_tokens in (3, 5):
        done = await api.chat.completions.create(
            model="tiny", messages=messages, max_tokens=max_tokens
        )
        assert done.usage is not None
        prompt, output = prompt + done.usage.prompt_tokens, output + done.usage.completion_tokens
    stream = await api.chat.completions.create(
        model="tiny", messages=messages, max_tokens=4, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    async for chunk in stream:
        if chunk.usage is not None:
            prompt += chunk.usage.prompt_tokens
            output += chunk.usage.completion_tokens
    row = (await ledger(app, http))["tiny"]
    assert (row["input_tokens"], row["output_tokens"]) == (prompt, output)
    assert row["num_model_requests"] == 3 and row["model_seconds"] > 0


async def test_rerank_and_score_calls_are_billed(app: FastAPI, http: httpx.AsyncClient) -> None:
    rerank = {"model": "ranker", "query": "capital of france", "documents": ["paris", "a cat"]}
    score = {"model": "ranker", "text_1": "capital of france", "text_2": ["paris", "rome"]}
    answers = [await http.post("/v1/rerank", json=rerank), await http.post("/v1/score", json=score)]
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    row = (await ledger(app, http))["ranker"]
    assert row["input_tokens"] == sum(a.json()["usage"]["prompt_tokens"] for a in answers)
    assert row["num_model_requests"] == 2 and row["output_tokens"] == 0
    assert row["model_seconds"] > 0 and row["cost_usd"] > 0


async def test_serve_admits_exact_input_tokens_and_reserves_the_context_left(
    http: httpx.AsyncClient,
) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}]}
    answer = await http.post("/v1/chat/completions", json=body)  # no max_tokens
    assert answer.status_code == 200, answer.text
    num_prompt = answer.json()["usage"]["prompt_tokens"]
    # Taken at admission: the exact prompt, and the room the context leaves for output.
    assert int(answer.headers["x-ratelimit-remaining-input-tokens"]) == 100_000 - num_prompt
    reserved = MAX_MODEL_LEN - num_prompt
    assert int(answer.headers["x-ratelimit-remaining-output-tokens"]) == 100_000 - reserved
    rerank = {"model": "ranker", "query": "capital", "documents": ["paris", "rome", "oslo"]}
    ranked = await http.post("/v1/rerank", json=rerank)
    assert ranked.status_code == 200, ranked.text
    remaining = int(ranked.headers["x-ratelimit-remaining-input-tokens"])
    # The chat's input stayed taken (exact, nothing to settle); the refill adds a little.
    taken = 100_000 - num_prompt - ranked.json()["usage"]["prompt_tokens"]
    assert taken <= remaining <= taken + 100


LONG_MAX_TOKENS = 400


@pytest.fixture
async def long_app(llama_path: Path, tmp_path: Path) -> AsyncIterator[FastAPI]:
    """A tiny Llama with room for long outputs, so a stream is left well before its end."""
    tiny = {"name": "tiny", "kind": "generate", "path": str(llama_path), "block_size": 4,
            "kv_cache_tokens": 1024, "max_model_len": 512, "max_num_seqs": 2,
            "max_num_batched_tokens": 64}  # fmt: skip
    config = ServerConfig.model_validate({
        "data_dir": str(tmp_path), "models": [tiny],
        "api_keys": [{"key": KEY, "tenant": "acme"}],
        "tenants": [{"name": "acme", "limits": {"*": LIMITS}}],
    })  # fmt: skip
    app = create_app(config)
    async with app.router.lifespan_context(app):
        yield app


async def stream_then_leave(app: FastAPI, num_events: int, how: str) -> list[bytes]:
    """POST a streamed completion as raw ASGI; after `num_events` events the caller hangs
    up (`disconnect`) or its request task is cancelled (`cancel`). The events it got."""
    body = orjson.dumps({"model": "tiny", "prompt": "the quick brown fox", "stream": True,
                         "max_tokens": LONG_MAX_TOKENS, "ignore_eos": True})  # fmt: skip
    events: list[bytes] = []
    gone = asyncio.Event()
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            events.append(message["body"])
            if len(events) >= num_events:
                gone.set()

    headers = [(b"authorization", f"Bearer {KEY}".encode()), (b"host", b"t"),
               (b"content-type", b"application/json")]  # fmt: skip
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions",
             "raw_path": b"/v1/completions", "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("t", 80), "root_path": ""}  # fmt: skip
    call = asyncio.ensure_future(app(scope, receive, send))
    if how == "cancel":
        await asyncio.wait_for(gone.wait(), 30)
        call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(call, 30)
    return events


@pytest.mark.parametrize("how", ["disconnect", "cancel"])
async def test_a_stream_the_caller_leaves_settles_at_what_it_produced(
    long_app: FastAPI, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    gate = long_app.state.guards.gate
    settled: list[tuple[str, int]] = []
    real_settle = gate.limiter.settle

    def recording(key: str, name: str, capacity: int, delta: int, now_s: float) -> None:
        settled.append((name, delta))
        real_settle(key, name, capacity, delta, now_s)

    monkeypatch.setattr(gate.limiter, "settle", recording)
    events = await stream_then_leave(long_app, num_events=3, how=how)
    assert len(events) >= 3 and b"[DONE]" not in b"".join(events)  # it left mid-stream
    transport = httpx.ASGITransport(app=long_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c:
        row = (await ledger(long_app, c))["tiny"]
    produced = row["output_tokens"]
    # Billed what it produced: at least what the caller saw, far short of max_tokens.
    assert 3 <= produced < LONG_MAX_TOKENS
    # The output reserve came back but for what it produced; the input was exact.
    assert [delta for name, delta in settled if name == "output_tokens"] == [
        LONG_MAX_TOKENS - produced
    ]
    assert [name for name, _ in settled] == ["output_tokens"]
