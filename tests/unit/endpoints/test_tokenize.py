"""``/tokenize`` and ``/detokenize`` (vLLM's shapes) on a tiny Llama, over HTTP in process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from conveyor.api.app import create_app
from conveyor.config.settings import ServerConfig
from conveyor.engine.tokenizer import Tokenizer
from conveyor.host.service import Service

# `model`: runs a real (tiny) torch model, so mutation runs leave it out.
pytestmark = [pytest.mark.anyio, pytest.mark.model]

MAX_MODEL_LEN = 96


@pytest.fixture
async def client(llama_path: Path, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    tiny = {
        "name": "tiny", "kind": "generate", "path": str(llama_path), "kv_cache_tokens": 512,
        "block_size": 4, "max_model_len": MAX_MODEL_LEN, "max_num_seqs": 2,
        "max_num_batched_tokens": 64,
    }  # fmt: skip
    syn = {"name": "syn", "kind": "synthetic", "batch_latency_ms": 0}
    settings = ServerConfig.model_validate({"data_dir": str(tmp_path), "models": [tiny, syn]})
    async with Service(settings) as service:
        transport = httpx.ASGITransport(app=create_app(settings, service=service))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            yield http


async def test_tokenize_a_prompt_and_detokenize_it_back(
    client: httpx.AsyncClient, llama_path: Path
) -> None:
    tokenizer = Tokenizer(llama_path)
    text = "the quick brown fox"
    body = {"model": "tiny", "prompt": text, "return_token_strs": True}
    answer = (await client.post("/tokenize", json=body)).json()
    assert answer["tokens"] == tokenizer.encode(text)
    assert answer["count"] == len(answer["tokens"]) and answer["max_model_len"] == MAX_MODEL_LEN
    assert answer["token_strs"] == tokenizer.hf.convert_ids_to_tokens(answer["tokens"])
    bare = {"model": "tiny", "prompt": text, "add_special_tokens": False}
    assert (await client.post("/tokenize", json=bare)).json()["tokens"] == tokenizer.encode(
        text, add_special_tokens=False
    )
    back = await client.post("/detokenize", json={"model": "tiny", "tokens": answer["tokens"]})
    assert back.json() == {"prompt": tokenizer.hf.decode(answer["tokens"])}
    assert back.json()["prompt"].endswith(text)


async def test_tokenize_a_chat_as_the_chat_endpoint_sends_it(
    client: httpx.AsyncClient, llama_path: Path
) -> None:
    messages = [{"role": "user", "content": "hello there"}]
    answer = (await client.post("/tokenize", json={"model": "tiny", "messages": messages})).json()
    assert answer["tokens"] == Tokenizer(llama_path).apply_chat_template(messages)
    assert answer["token_strs"] is None


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/tokenize", {"model": "tiny"}, 400, "exactly one"),
        ("/tokenize", {"model": "tiny", "prompt": "a", "messages": [{}]}, 400, "exactly one"),
        ("/tokenize", {"model": "nope", "prompt": "a"}, 404, "nope"),
        ("/tokenize", {"model": "syn", "prompt": "a"}, 400, "no tokenizer"),
        ("/tokenize", {"model": "tiny", "prompt": "a", "extra": 1}, 400, "extra"),
        # Over max_input_bytes (by default 32 bytes a token of the context): not tokenized.
        ("/tokenize", {"model": "tiny", "prompt": "x" * (32 * MAX_MODEL_LEN + 1)}, 400,
         "max_input_bytes"),
        ("/detokenize", {"model": "tiny", "tokens": [10**9]}, 400, "vocabulary"),
        ("/detokenize", {"model": "tiny"}, 400, "tokens"),
    ],
)  # fmt: skip
async def test_bad_bodies_are_400_or_404(
    client: httpx.AsyncClient, path: str, body: dict[str, object], status: int, fragment: str
) -> None:
    answer = await client.post(path, json=body)
    assert answer.status_code == status, answer.text
    assert fragment in answer.json()["error"]["message"]
