"""Anthropic's routes answer errors in Anthropic's shape, whichever layer refuses (keys, the
body cap, the route), take keys in ``x-api-key``, and are documented so; other routes keep
OpenAI's shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from anthropic.types.shared import ErrorResponse
from starlette.types import Receive, Scope, Send

from conveyor.api.anthropic_errors import AnthropicErrorShape
from conveyor.api.app import create_app
from conveyor.config.settings import ServerConfig
from conveyor.endpoints.dispatch import jobs_for_service
from conveyor.host.service import Service

pytestmark = pytest.mark.anyio

KEY = "sk-anthropic-test-0123456789"
SYNTHETIC = {"name": "syn", "kind": "synthetic", "batch_latency_ms": 0, "dim": 4}
MESSAGE = {"model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = ServerConfig.model_validate({
        "models": [SYNTHETIC], "data_dir": str(tmp_path), "max_request_bytes": 4096,
        "api_keys": [{"key": KEY, "tenant": "a"}],
    })  # fmt: skip
    service = Service(settings)
    jobs = jobs_for_service(service)
    app = create_app(settings, service=service, jobs=jobs)
    await jobs.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client
    finally:
        await jobs.stop()


def anthropic_error(answer: httpx.Response, status: int, kind: str) -> str:
    """The message of an Anthropic-shaped error answer (checked with the client's type)."""
    assert answer.status_code == status, answer.text
    error = ErrorResponse.model_validate(answer.json())
    assert error.type == "error" and error.error.type == kind
    assert answer.headers["content-length"] == str(len(answer.content))
    return error.error.message


async def test_a_missing_or_wrong_key_is_an_authentication_error(http: httpx.AsyncClient) -> None:
    missing = await http.post("/v1/messages", json=MESSAGE)
    assert anthropic_error(missing, 401, "authentication_error") == "missing API key"
    wrong = await http.post("/v1/messages", json=MESSAGE, headers={"x-api-key": "sk-wrong"})
    assert "incorrect API key" in anthropic_error(wrong, 401, "authentication_error")
    openai_route = await http.post("/v1/chat/completions", json=MESSAGE)
    assert openai_route.json()["error"]["code"] == "invalid_api_key"  # OpenAI's shape there


async def test_a_key_in_x_api_key_is_accepted(http: httpx.AsyncClient) -> None:
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    listed = await http.get("/v1/messages/batches", headers=headers)
    assert listed.status_code == 200, listed.text
    assert listed.json() == {"data": [], "has_more": False, "first_id": None, "last_id": None}
    bearer = await http.get("/v1/messages/batches", headers={"Authorization": f"Bearer {KEY}"})
    assert bearer.status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "kind"),
    [
        ("POST", "/v1/messages", MESSAGE, 404, "not_found_error"),
        ("POST", "/v1/messages", {**MESSAGE, "max_tokens": 0}, 400, "invalid_request_error"),
        ("POST", "/v1/messages/count_tokens", {"model": "nope", "messages": []}, 400,
         "invalid_request_error"),
        ("POST", "/v1/messages", {**MESSAGE, "pad": "x" * 5000}, 413, "invalid_request_error"),
        ("GET", "/v1/messages/batches/msgbatch_0123", None, 404, "not_found_error"),
        ("GET", "/v1/messages/batches?limit=0", None, 400, "invalid_request_error"),
        ("POST", "/v1/messages/batches", {"requests": []}, 400, "invalid_request_error"),
        ("DELETE", "/v1/messages/batches/msgbatch_0123", None, 404, "not_found_error"),
    ],
)  # fmt: skip
async def test_each_refusal_leaves_in_anthropics_shape(
    http: httpx.AsyncClient, method: str, path: str, body: Any, status: int, kind: str
) -> None:
    answer = await http.request(method, path, json=body, headers={"x-api-key": KEY})
    anthropic_error(answer, status, kind)


async def test_the_shape_is_rewritten_only_for_json_errors_on_anthropic_paths() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        status = int(scope["path"].rsplit("/", 1)[-1])
        kind = b"text/plain" if scope["query_string"] else b"application/json"
        body = b'{"error": {"message": "boom", "type": "server_error"}}'
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", kind), (b"content-length", b"%d" % len(body))],
            }
        )
        await send({"type": "http.response.body", "body": body[:10], "more_body": True})
        await send({"type": "http.response.body", "body": body[10:]})  # fmt: skip

    transport = httpx.ASGITransport(app=AnthropicErrorShape(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        failed = await client.get("/v1/messages/batches/x/503")
        assert anthropic_error(failed, 503, "overloaded_error") == "boom"
        assert anthropic_error(await client.get("/v1/messages/500"), 500, "api_error") == "boom"
        plain = await client.get("/v1/messages/500?plain=1")
        assert plain.json()["error"]["type"] == "server_error"
        assert (await client.get("/v1/chat/completions/500")).json()["error"]["message"] == "boom"
        assert (await client.get("/v1/messages/200")).json()["error"]["type"] == "server_error"


def test_the_document_points_anthropics_errors_at_anthropics_shape(tmp_path: Path) -> None:
    settings = ServerConfig.model_validate({"models": [SYNTHETIC], "data_dir": str(tmp_path)})
    document = create_app(settings).openapi()
    paths = document["paths"]
    assert "requestBody" in paths["/v1/messages"]["post"]
    assert "requestBody" in paths["/v1/messages/batches"]["post"]
    listing = paths["/v1/messages/batches"]["get"]
    assert {p["name"] for p in listing["parameters"]} == {"limit", "after_id", "before_id"}
    results = paths["/v1/messages/batches/{message_batch_id}/results"]["get"]["responses"]
    assert {status for status in results if status.startswith("4")} == {"400", "401", "404"}
    for status in ("400", "404"):
        schema = results[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/AnthropicError"}
    assert document["components"]["schemas"]["AnthropicError"]["required"] == ["type", "error"]
    chat = paths["/v1/chat/completions"]["post"]["responses"]["400"]["content"]
    assert chat["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
