"""Anthropic's Message Batches through the official ``anthropic`` client, on a tiny Llama
checkpoint, with keys sent in ``x-api-key`` as the client's users may: create, retrieve,
list, results (the client follows ``results_url``), cancel, delete, tenant isolation.
Every object and result line's raw JSON validates against the client's own types."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import Message
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

from conveyor.fakes.checkpoints import build_tiny_llama
from tests.e2e.conftest import Server, start_server, stop_server
from tests.e2e.test_batch_api import FAST_JOBS
from tests.polling import until

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
KEY_A = "sk-anthropic-a-0123456789"
KEY_B = "sk-anthropic-b-0123456789"
WAIT_S = 90.0


def tiny_llama(checkpoint: Any) -> dict[str, Any]:
    """The generate model entry of a tiny Llama checkpoint, small and on one thread."""
    return {"name": MODEL, "kind": "generate", "path": str(checkpoint), "device": "cpu",
            "kv_cache_tokens": 4096, "max_num_seqs": 16, "max_num_batched_tokens": 256,
            "threads": 1}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    checkpoint = build_tiny_llama(tmp_path_factory.mktemp("anthropic-llama"))
    config = {"models": [tiny_llama(checkpoint)], "jobs": FAST_JOBS,
              "api_keys": [{"key": KEY_A, "tenant": "a"}, {"key": KEY_B, "tenant": "b"}]}  # fmt: skip
    running = start_server(tmp_path_factory.mktemp("anthropic-batches"), config)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def client(server: Server) -> anthropic.Anthropic:
    """Tenant a's client, its key in ``x-api-key`` (the client's default is a bearer token)."""
    return anthropic.Anthropic(base_url=server.url, api_key=None, max_retries=0,
                               default_headers={"x-api-key": KEY_A})  # fmt: skip


def request(custom_id: str, text: str, **params: Any) -> dict[str, Any]:
    body = {"model": MODEL, "max_tokens": 6, "temperature": 0,
            "messages": [{"role": "user", "content": text}], **params}  # fmt: skip
    return {"custom_id": custom_id, "params": body}


def create(client: anthropic.Anthropic, requests: list[dict[str, Any]]) -> MessageBatch:
    raw = client.messages.batches.with_raw_response.create(requests=requests)  # type: ignore[arg-type]
    return MessageBatch.model_validate(raw.http_response.json())


def wait_ended(client: anthropic.Anthropic, batch_id: str) -> MessageBatch:

    def ended() -> MessageBatch | None:
        raw = client.messages.batches.with_raw_response.retrieve(batch_id)
        batch = MessageBatch.model_validate(raw.http_response.json())
        return batch if batch.processing_status == "ended" else None

    return until(ended, f"batch {batch_id} to end", timeout_s=WAIT_S)


def raw_results(server: Server, batch: MessageBatch) -> list[MessageBatchIndividualResponse]:
    """The results read at ``results_url``, each line validated by the client's type."""
    assert batch.results_url is not None
    answer = httpx.get(server.url + batch.results_url, headers={"x-api-key": KEY_A})
    assert answer.status_code == 200, answer.text
    # Split on newlines only: answers may hold U+2028 and the like, which JSON leaves raw.
    lines = [json.loads(line) for line in answer.content.split(b"\n") if line]
    return [MessageBatchIndividualResponse.model_validate(line) for line in lines]


def test_a_batch_runs_to_results_the_client_reads(
    client: anthropic.Anthropic, server: Server
) -> None:
    requests = [request(f"q{i}", f"Count to {i}") for i in range(6)]
    requests[2]["params"]["max_tokens"] = 10**6  # beyond the context: this one errors
    created = create(client, requests)
    assert created.processing_status == "in_progress" and created.results_url is None
    assert created.request_counts.processing == 6
    batch = wait_ended(client, created.id)
    counts = batch.request_counts
    assert (counts.succeeded, counts.errored, counts.processing) == (5, 1, 0)
    assert next(iter(client.messages.batches.list(limit=5))).id == batch.id
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert sorted(results) == [f"q{i}" for i in range(6)]
    validated = {r.custom_id: r.result for r in raw_results(server, batch)}
    assert validated["q2"].type == "errored"
    assert validated["q2"].error.error.type == "invalid_request_error"
    answered = validated["q4"]
    assert answered.type == "succeeded"
    online = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=6, messages=requests[4]["params"]["messages"],
        extra_body={"temperature": 0},
    )  # fmt: skip
    message = Message.model_validate(online.http_response.json())
    assert answered.message.content == message.content  # a batch answers as online does


def test_another_tenant_sees_nothing_and_delete_removes_the_batch(
    client: anthropic.Anthropic, server: Server
) -> None:
    batch = wait_ended(client, create(client, [request("only", "Hello")]).id)
    other = anthropic.Anthropic(base_url=server.url, api_key=KEY_B, max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        other.messages.batches.retrieve(batch.id)
    assert list(other.messages.batches.list()) == []
    deleted = client.messages.batches.delete(batch.id)
    assert (deleted.id, deleted.type) == (batch.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)


def test_a_cancelled_batch_ends_with_each_request_once(
    client: anthropic.Anthropic, server: Server
) -> None:
    requests = [request(f"c{i}", f"Story {i}", max_tokens=32, temperature=1) for i in range(150)]
    created = create(client, requests)
    raw = client.messages.batches.with_raw_response.cancel(created.id)
    cancelling = MessageBatch.model_validate(raw.http_response.json())
    assert cancelling.processing_status in ("canceling", "ended")
    assert cancelling.cancel_initiated_at is not None
    batch = wait_ended(client, created.id)
    counts = batch.request_counts
    assert counts.canceled > 0 and counts.processing == 0
    assert counts.succeeded + counts.errored + counts.canceled == 150
    results = raw_results(server, batch)
    assert sorted(r.custom_id for r in results) == sorted(r["custom_id"] for r in requests)
    assert sum(r.result.type == "canceled" for r in results) == counts.canceled
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.delete(create(client, [request("x", "Hi")]).id)  # still running
