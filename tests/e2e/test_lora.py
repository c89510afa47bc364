"""LoRA adapters on a real ``conveyor serve`` process, with the official ``openai`` client:
adapters listed under their base, completions equal to PEFT's merged model, streamed chat,
adapters loaded and unloaded at run time, and bad adapters refused while the base serves."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from conveyor.engine.tokenizer import Tokenizer
from conveyor.fakes.checkpoints import build_lora_adapter, build_tiny_llama
from tests.e2e.conftest import Server, start_server, stop_server
from tests.polling import until

pytestmark = pytest.mark.slow

BASE = "tiny-llama"
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def adapters(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "sql": build_lora_adapter(checkpoint, root / "sql", rank=8, seed=1),
        "chat": build_lora_adapter(checkpoint, root / "chat", rank=4, seed=2),
        "big": build_lora_adapter(checkpoint, root / "big", rank=16, seed=3),
    }


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second directory run-time loads may read from."""
    return tmp_path_factory.mktemp("scratch")


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    checkpoint: Path,
    adapters: dict[str, Path],
    scratch: Path,
) -> Iterator[Server]:
    generate = {
        "name": BASE,
        "kind": "generate",
        "path": str(checkpoint),
        "device": "cpu",
        "kv_cache_tokens": 4096,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 256,
        "threads": 1,
        "lora": {
            "adapters": {"sql": str(adapters["sql"])},
            "max_rank": 8,
            "load_roots": [str(adapters["sql"].parent), str(scratch)],
        },
    }
    running = start_server(tmp_path_factory.mktemp("lora-server"), {"models": [generate]})
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)


def merged_text(checkpoint: Path, adapter: Path, prompt: str, max_new_tokens: int) -> str:
    """PEFT's merged model under Hugging Face greedy ``generate``, decoded."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tokenizer = Tokenizer(checkpoint)
    ids = tokenizer.encode(prompt)
    base: Any = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    model: Any = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload().eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens)
    return tokenizer.decode(out[0, len(ids) :].tolist())


def complete(client: openai.OpenAI, model: str) -> str:
    result = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    return result.choices[0].text


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.api}/{path}", json=body, timeout=30)


def test_adapters_are_listed_under_their_base(server: Server) -> None:
    models = httpx.get(f"{server.api}/models").json()["data"]
    parents = {model["id"]: model.get("parent") for model in models}
    assert parents == {BASE: None, "sql": BASE}


def test_lora_requests_info_under_vllms_name(server: Server, client: openai.OpenAI) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    complete(client, "sql")  # finished: no adapter runs or waits once the engine publishes

    def settled_info() -> Any:
        """The info sample once no adapter runs in it (None before)."""
        text = httpx.get(f"{server.url}/metrics").text
        (info,) = [
            sample for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "vllm:lora_requests_info"
        ]  # fmt: skip
        return info if info.labels["running_lora_adapters"] == "" else None

    # The engine publishes its gauges after the step that finished the request, which may
    # come after the client has its answer: wait for that rather than race it.
    info = until(settled_info, "the finished adapter to leave vllm:lora_requests_info")
    assert info.labels == {"max_lora": "8", "running_lora_adapters": "",
                           "waiting_lora_adapters": ""}  # fmt: skip
    assert info.value > 1.7e9  # when the engine last published it (a Unix time)
    assert server.metric("vllm:num_requests_running", model_name=BASE, engine="0") == 0


def test_a_configured_adapter_answers_like_the_merged_model(
    client: openai.OpenAI, checkpoint: Path, adapters: dict[str, Path]
) -> None:
    assert complete(client, "sql") == merged_text(checkpoint, adapters["sql"], PROMPT, 8)


def test_streamed_chat_with_an_adapter(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(
        model="sql", messages=messages, max_tokens=6, temperature=0
    )
    stream = client.chat.completions.create(
        model="sql", messages=messages, max_tokens=6, temperature=0, stream=True
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    assert whole.model == "sql"


def test_load_use_and_unload_at_run_time(
    server: Server, client: openai.OpenAI, checkpoint: Path, adapters: dict[str, Path]
) -> None:
    loaded = post(
        server, "load_lora_adapter", {"lora_name": "chat", "lora_path": str(adapters["chat"])}
    )
    assert loaded.status_code == 200, loaded.text
    assert complete(client, "chat") == merged_text(checkpoint, adapters["chat"], PROMPT, 8)
    assert post(server, "unload_lora_adapter", {"lora_name": "chat"}).status_code == 200
    with pytest.raises(openai.NotFoundError) as caught:
        complete(client, "chat")
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "model_not_found"


def test_bad_adapters_are_refused_and_the_base_serves_on(
    server: Server, client: openai.OpenAI, adapters: dict[str, Path], scratch: Path, tmp_path: Path
) -> None:
    with pytest.raises(openai.NotFoundError):
        complete(client, "no-such-adapter")
    too_big = post(
        server, "load_lora_adapter", {"lora_name": "big", "lora_path": str(adapters["big"])}
    )
    assert too_big.status_code == 400
    assert "above this model's max_rank 8" in too_big.json()["error"]["message"]
    (scratch / "adapter_config.json").write_text(json.dumps({"r": 4}))  # and no weights
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4}))  # outside the roots
    refusals = [
        post(server, "load_lora_adapter", {"lora_name": "broken", "lora_path": str(path)})
        for path in (scratch, tmp_path, tmp_path / "missing", scratch / "missing")
    ]
    assert {r.status_code for r in refusals} == {400}
    messages = {r.json()["error"]["message"] for r in refusals}
    assert len(messages) == 1 and "lora.load_roots" in messages.pop()
    assert post(server, "unload_lora_adapter", {"lora_name": "nope"}).status_code == 404
    assert complete(client, BASE)
    assert complete(client, "sql")
