"""The served OpenAPI document says what the routes take and answer: the list routes' query
parameters, the LoRA bodies, each route's 4xx in OpenAI's error shape, and no 422 (Conveyor
answers a bad request with 400). List parameters are checked alike on files and batches."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.api.app import create_app
from conveyor.api.gateway_app import create_gateway_app
from conveyor.config.settings import ServerConfig
from conveyor.endpoints.dispatch import jobs_for_service
from conveyor.gateway.process import GatewaySettings
from conveyor.host.service import Service
from conveyor.stores import open_job_store

pytestmark = pytest.mark.anyio

SYNTHETIC = {"name": "syn", "kind": "synthetic", "batch_latency_ms": 0, "dim": 4}
ERROR_REF = "#/components/schemas/Error"


def config(tmp_path: Path) -> ServerConfig:
    return ServerConfig.model_validate({"models": [SYNTHETIC], "data_dir": str(tmp_path)})


@pytest.fixture
def document(tmp_path: Path) -> dict[str, Any]:
    return create_app(config(tmp_path)).openapi()


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = config(tmp_path)
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


def query(document: dict[str, Any], path: str) -> dict[str, dict[str, Any]]:
    operation = document["paths"][path]["get"]
    return {p["name"]: p for p in operation.get("parameters", []) if p["in"] == "query"}


def test_list_routes_document_their_query_parameters(document: dict[str, Any]) -> None:
    files = query(document, "/v1/files")
    assert set(files) == {"purpose", "after", "limit", "order"}
    assert files["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 10_000}
    assert files["order"]["schema"] == {"type": "string", "enum": ["asc", "desc"],
                                        "default": "desc"}  # fmt: skip
    batches = query(document, "/v1/batches")
    assert set(batches) == {"after", "limit", "order"}
    assert batches["limit"]["schema"]["maximum"] == 100
    usage = query(document, "/v1/usage")
    assert set(usage) == {"start_time", "end_time", "bucket_width", "group_by", "limit", "page"}
    assert usage["bucket_width"]["schema"]["enum"] == ["1m", "1h", "1d"]
    assert not any(p.get("required") for p in [*files.values(), *batches.values()])


def test_the_lora_routes_document_their_bodies(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    for path, name, required in [
        ("/v1/load_lora_adapter", "LoadLoraAdapterRequest", {"lora_name", "lora_path"}),
        ("/v1/unload_lora_adapter", "UnloadLoraAdapterRequest", {"lora_name"}),
    ]:
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": f"#/components/schemas/{name}"}
        assert set(schemas[name]["required"]) == required


def test_no_route_lists_a_422_and_each_lists_its_4xx(document: dict[str, Any]) -> None:
    paths = document["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], (method, path)
    assert "HTTPValidationError" not in document["components"]["schemas"]
    expected = {
        ("get", "/v1/files"): {"400", "401"},
        ("post", "/v1/files"): {"400", "401", "408", "413"},
        ("get", "/v1/files/{file_id}"): {"401", "404"},
        ("post", "/v1/batches"): {"400", "401", "404", "408", "413"},
        ("post", "/v1/batches/{batch_id}/cancel"): {"400", "401", "404"},
        ("get", "/v1/usage"): {"400", "401"},
        ("post", "/v1/load_lora_adapter"): {"400", "401", "403", "408", "413"},
        ("post", "/v1/unload_lora_adapter"): {"400", "401", "403", "404", "408", "413"},
        ("post", "/v1/embeddings"): {"400", "401", "404", "408", "413", "429"},
        ("get", "/v1/models/{model_id}"): {"401", "404"},
    }
    for (method, path), statuses in expected.items():
        responses = paths[path][method]["responses"]
        assert {s for s in responses if s.startswith("4")} == statuses, (method, path)
        for status in statuses:
            content = responses[status]["content"]["application/json"]["schema"]
            assert content == {"$ref": ERROR_REF}
    assert {s for s in paths["/health"]["get"]["responses"] if s.startswith("4")} == set()
    error = document["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
    assert set(error["properties"]["error"]["required"]) == {"message", "type", "param", "code"}


async def test_the_gateway_document_has_the_same_shapes(tmp_path: Path) -> None:
    store = open_job_store(f"sqlite://{tmp_path}/jobs.sqlite")
    app = create_gateway_app(GatewaySettings(store_url="unused"), config(tmp_path), store=store)
    try:
        document = app.openapi()
        assert set(query(document, "/v1/batches")) == {"after", "limit", "order"}
        assert not any("422" in op["responses"] for ops in document["paths"].values()
                       for op in ops.values())  # fmt: skip
    finally:
        store.close()


@pytest.mark.parametrize("path", ["/v1/files", "/v1/batches"])
async def test_a_wrong_order_is_a_400_on_every_list(http: httpx.AsyncClient, path: str) -> None:
    answer = await http.get(path, params={"order": "sideways"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "order" and error["type"] == "invalid_request_error"
    for order in ("asc", "desc"):
        assert (await http.get(path, params={"order": order})).status_code == 200
