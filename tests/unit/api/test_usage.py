"""GET /v1/usage on a real app: the ledger's sums equal the answers' usage; tenants are apart."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from conveyor.api.app import create_app
from conveyor.config.settings import ServerConfig

pytestmark = pytest.mark.anyio

KEYS = {"a": "sk-test-tenant-a", "b": "sk-test-tenant-b", "admin": "sk-test-admin-x"}


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"}


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    config = ServerConfig.model_validate({
        "data_dir": str(tmp_path),
        "models": [{"name": "syn", "kind": "synthetic"}],
        "api_keys": [
            {"key": KEYS["a"], "tenant": "a"},
            {"key": KEYS["b"], "tenant": "b"},
            {"key": KEYS["admin"], "tenant": "ops", "admin": True},
        ],
        "pricing": {"gpu_hour_usd": 3.6},
    })  # fmt: skip
    app = create_app(config)
    async with app.router.lifespan_context(app):
        yield app


async def usage(client: httpx.AsyncClient, who: str, **params: Any) -> list[dict[str, Any]]:
    """Every result of a usage page covering the last day, by `who`."""
    query = {"start_time": int(time.time()) - 3600, "bucket_width": "1d", **params}
    answer = await client.get("/v1/usage", params=query, headers=auth(who))
    assert answer.status_code == 200, answer.text
    page = answer.json()
    assert page["object"] == "page" and page["has_more"] is False
    return [r for bucket in page["data"] for r in bucket["results"]]


async def test_ledger_sums_equal_the_answers_usage_and_tenants_see_only_their_own(
    app: FastAPI,
) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        prompt_tokens = {"a": 0, "b": 0}
        for who, texts in (("a", ["one two", "three", "four five six"]), ("b", ["seven"])):
            for text in texts:
                body = {"model": "syn", "input": [text, text + " again"]}
                answer = await client.post("/v1/embeddings", json=body, headers=auth(who))
                assert answer.status_code == 200
                prompt_tokens[who] += answer.json()["usage"]["prompt_tokens"]
        assert await app.state.service.ledger.flush() > 0

        (mine,) = await usage(client, "a")
        assert mine["input_tokens"] == prompt_tokens["a"] and mine["num_model_requests"] == 3
        assert mine["output_tokens"] == 0 and mine["model_seconds"] > 0
        assert mine["cost_usd"] == pytest.approx(mine["model_seconds"] * 3.6 / 3600)
        (theirs,) = await usage(client, "b", group_by="model")
        assert theirs["input_tokens"] == prompt_tokens["b"] and theirs["model"] == "syn"

        every = await usage(client, "admin", group_by="tenant")
        by_tenant = {r["tenant"]: r["input_tokens"] for r in every}
        assert by_tenant == prompt_tokens
        refused = await client.get(
            "/v1/usage", params={"start_time": 0, "group_by": "tenant"}, headers=auth("a")
        )
        assert refused.status_code == 400


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"start_time": 0, "end_time": 64000546499826758920599123263488}, "end_time"),
        ({"start_time": -316026, "bucket_width": "1h"}, "start_time"),
        ({"page": 2**64}, "page"),
    ],
)
async def test_times_out_of_range_are_a_400_not_a_500(
    app: FastAPI, params: dict[str, Any], param: str
) -> None:
    # Found by schemathesis once the parameters were documented: the store overflowed.
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.get("/v1/usage", params=params, headers=auth("a"))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
