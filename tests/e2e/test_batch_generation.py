"""Generation through the Batch API: chat and text completions on a tiny Llama checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from conveyor.fakes.checkpoints import build_tiny_llama
from tests.e2e.conftest import Server, start_server, stop_server
from tests.e2e.test_batch_api import (
    FAST_JOBS,
    assert_each_once,
    jsonl,
    records,
    results,
    submit,
    wait_until,
)

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    checkpoint = build_tiny_llama(tmp_path_factory.mktemp("batch-llama"))
    generate = {
        "name": MODEL, "kind": "generate", "path": str(checkpoint), "device": "cpu",
        "kv_cache_tokens": 4096, "max_num_seqs": 16, "max_num_batched_tokens": 256, "threads": 1,
    }  # fmt: skip
    running = start_server(tmp_path_factory.mktemp("batch-generate"),
                           {"models": [generate], "jobs": FAST_JOBS})  # fmt: skip
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)


def chat_line(index: int, temperature: float = 0.0) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"Count to {index}"}],
            "max_completion_tokens": 6, "temperature": temperature}  # fmt: skip
    return {"custom_id": f"chat-{index}", "method": "POST", "url": "/v1/chat/completions",
            "body": body}  # fmt: skip


def test_a_chat_batch_matches_online_greedy_answers(client: openai.OpenAI) -> None:
    lines = [chat_line(i) for i in range(12)]
    batch = wait_until(client, submit(client, jsonl(lines), endpoint="/v1/chat/completions").id)
    assert batch.status == "completed" and batch.request_counts.completed == 12
    outputs, errors = results(client, batch)
    assert_each_once(outputs, errors, [line["custom_id"] for line in lines])
    online = client.chat.completions.create(**lines[3]["body"])
    by_id = {r["custom_id"]: r["response"]["body"] for r in outputs}
    batch_answer = by_id["chat-3"]["choices"][0]["message"]["content"]
    assert batch_answer == online.choices[0].message.content


def test_a_completions_batch_reports_bad_lines_in_the_error_file(client: openai.OpenAI) -> None:
    lines = [{"custom_id": f"c-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": f"Story {i}", "max_tokens": 4}}
             for i in range(6)]  # fmt: skip
    lines[2]["body"]["max_tokens"] = -3
    batch = wait_until(client, submit(client, jsonl(lines), endpoint="/v1/completions").id)
    assert batch.status == "completed"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 1)
    errors = records(client, batch.error_file_id)
    assert [r["custom_id"] for r in errors] == ["c-2"]
    assert errors[0]["response"]["status_code"] == 400
