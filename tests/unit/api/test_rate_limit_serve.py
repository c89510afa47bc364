"""Rate limits on `serve`: requests are admitted on their exact token counts after
tokenizing (the synthetic model's tokens are whitespace words), not on a byte estimate."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.api.app import create_app
from conveyor.config.settings import ServerConfig
from tests.polling import until_async

pytestmark = pytest.mark.anyio


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    config = ServerConfig.model_validate({
        "data_dir": str(tmp_path),
        "models": [{"name": "syn", "kind": "synthetic", "batch_latency_ms": 0,
                    "fail_marker": "BOOM"}],
        "default_tenant_limits": {"rpm": 3, "input_tpm": 600},
    })  # fmt: skip
    app = create_app(config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client


async def test_input_tokens_are_counted_exactly_at_admission(http: httpx.AsyncClient) -> None:
    # 3 words, 35 bytes: the 4-bytes-a-token estimate would say 9.
    text = "incomprehensibilities extraordinary x"
    answer = await http.post("/v1/embeddings", json={"model": "syn", "input": text})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == 3
    assert answer.headers["x-ratelimit-remaining-input-tokens"] == "597"
    assert answer.headers["x-ratelimit-remaining-requests"] == "2"


async def test_a_request_over_the_exact_limit_is_400_and_costs_nothing(
    http: httpx.AsyncClient,
) -> None:
    words = " ".join(["w"] * 40)  # 80 bytes: the estimate (20) would fit; 40 x 16 = 640 not
    too_big = await http.post("/v1/embeddings", json={"model": "syn", "input": [words] * 16})
    assert too_big.status_code == 400, too_big.text
    assert too_big.json()["error"]["code"] == "tokens_exceed_rate_limit"
    bad = await http.post("/v1/embeddings", json={"model": "syn", "input": 7})
    assert bad.status_code == 400  # refused before counting: no reservation, no headers
    assert "x-ratelimit-remaining-requests" not in bad.headers
    answers = [await http.post("/v1/embeddings", json={"model": "syn", "input": "a"})
               for _ in range(4)]  # fmt: skip
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert answers[3].json()["error"]["code"] == "rate_limit_exceeded"
    assert answers[3].headers["x-ratelimit-remaining-requests"] == "0"
    assert int(answers[3].headers["retry-after"]) >= 1
    # Tenant refusals are not the model's outcomes (a full queue would read as overload).
    metrics = (await http.get("/metrics")).text
    assert 'model="syn",outcome="rejected_queue_full"} 0.0' in metrics
    assert 'model="syn",outcome="input_error"} 0.0' in metrics  # nor is the 400 above
    assert 'model="syn",outcome="ok"} 3.0' in metrics


async def test_an_admitted_request_that_fails_gives_its_tokens_back(
    http: httpx.AsyncClient,
) -> None:
    failed = await http.post("/v1/embeddings", json={"model": "syn", "input": "x y BOOM"})
    assert failed.status_code >= 400, failed.text
    assert failed.headers["x-ratelimit-remaining-input-tokens"] == "597"  # taken at admission
    answer = await http.post("/v1/embeddings", json={"model": "syn", "input": "one"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-ratelimit-remaining-input-tokens"] == "599"  # the 3 came back


async def test_batch_lines_spend_nothing_of_the_online_limits(tmp_path: Path) -> None:
    # Limits far below the batch: were its lines admitted like online requests, most would
    # fail with 429 and the buckets would be empty afterwards.
    config = ServerConfig.model_validate({
        "data_dir": str(tmp_path),
        "models": [{"name": "syn", "kind": "synthetic", "batch_latency_ms": 0}],
        "default_tenant_limits": {"rpm": 2, "input_tpm": 20},
        "jobs": {"poll_every_s": 0.02},
    })  # fmt: skip
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "syn", "input": "one two three four five"}}
        for i in range(8)
    ]  # fmt: skip
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    app = create_app(config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            upload = await client.post("/v1/files", files={"file": ("in.jsonl", data)},
                                       data={"purpose": "batch"})  # fmt: skip
            created = await client.post("/v1/batches", json={
                "input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings",
                "completion_window": "24h"})  # fmt: skip
            batch = await finished(client, created.json()["id"])
            assert batch["status"] == "completed"
            assert batch["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
            assert batch["usage"]["input_tokens"] == 8 * 5  # billed, not rate limited
            online = await client.post("/v1/embeddings", json={"model": "syn", "input": "a b"})
    assert online.status_code == 200, online.text
    assert online.headers["x-ratelimit-remaining-requests"] == "1"  # of 2: only this one
    assert online.headers["x-ratelimit-remaining-input-tokens"] == "18"  # of 20


async def finished(client: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
    """The batch once it is in a final status (polled; fails after 30 s)."""

    async def final() -> dict[str, Any] | None:
        batch: dict[str, Any] = (await client.get(f"/v1/batches/{batch_id}")).json()
        return batch if batch["status"] in ("completed", "failed", "expired", "cancelled") else None

    return await until_async(final, f"batch {batch_id} to end", timeout_s=30, interval_s=0.02)
