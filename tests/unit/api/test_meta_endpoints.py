"""Model lookup, version, the OpenAPI document, CORS and ``dimensions`` below the native size,
on the serve app and the gateway, through the official ``openai`` client where it has a method."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from typer.testing import CliRunner

import conveyor
from conveyor.api.app import create_app
from conveyor.api.gateway_app import create_gateway_app
from conveyor.cli.main import app as cli_app
from conveyor.config.settings import ServerConfig
from conveyor.gateway.process import GatewaySettings
from conveyor.host.service import Service
from conveyor.models.base import shorten_vectors
from conveyor.models.synthetic import synthetic_vector
from conveyor.openai_paths import PROXIED_ENDPOINTS
from conveyor.stores import open_job_store

pytestmark = pytest.mark.anyio

DIM = 8


def config(tmp_path: Path, **extra: Any) -> ServerConfig:
    models = [{"name": "syn", "kind": "synthetic", "batch_latency_ms": 0, "dim": DIM}]
    return ServerConfig.model_validate({"data_dir": str(tmp_path), "models": models, **extra})


def http(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = config(tmp_path, cors_origins=["https://app.example"])
    async with Service(settings) as service, http(create_app(settings, service=service)) as c:
        yield c


def openai_client(client: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://t/v1", api_key="unused", http_client=client, max_retries=0
    )


async def test_models_retrieve_finds_a_hosted_model_and_404s_another(
    served: httpx.AsyncClient,
) -> None:
    client = openai_client(served)
    model = await client.models.retrieve("syn")
    assert model.id == "syn" and model.object == "model" and model.owned_by == "conveyor"
    with pytest.raises(openai.NotFoundError, match="nope"):
        await client.models.retrieve("nope")


async def test_version_route_and_cli_flag(served: httpx.AsyncClient) -> None:
    assert (await served.get("/version")).json() == {"version": conveyor.__version__}
    result = CliRunner().invoke(cli_app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"conveyor {conveyor.__version__}"


async def test_dimensions_below_native_truncate_and_renormalise(
    served: httpx.AsyncClient,
) -> None:
    client = openai_client(served)
    short = await client.embeddings.create(
        model="syn", input=["a b", "c"], dimensions=3, encoding_format="float"
    )
    for text, datum in zip(["a b", "c"], short.data, strict=True):
        want = synthetic_vector(text, DIM)[:3]
        assert np.allclose(datum.embedding, want / np.linalg.norm(want), atol=1e-6)
        assert np.isclose(np.linalg.norm(datum.embedding), 1.0, atol=1e-6)
    full = await client.embeddings.create(model="syn", input="c", dimensions=DIM)
    assert len(full.data[0].embedding) == DIM
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        await client.embeddings.create(model="syn", input="c", dimensions=DIM + 1)


def test_shorten_vectors_keeps_a_zero_prefix_zero() -> None:
    zero_head = np.array([0, 0, 1], dtype=np.float32)
    (short,) = shorten_vectors([zero_head], 2)
    assert short.tolist() == [0.0, 0.0]


async def test_cors_preflight_and_headers_only_for_listed_origins(
    served: httpx.AsyncClient,
) -> None:
    preflight = await served.options(
        "/v1/embeddings",
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    other = await served.get("/v1/models", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


async def test_no_cors_headers_without_cors_origins(tmp_path: Path) -> None:
    async with http(create_app(config(tmp_path))) as client:
        answer = await client.get("/health", headers={"Origin": "https://app.example"})
    assert "access-control-allow-origin" not in answer.headers


def assert_bodies_documented(document: dict[str, Any]) -> None:
    """Every proxied POST path has its JSON body schema; the catch-all is not shown."""
    assert "/v1/{path}" not in document["paths"]
    for path in PROXIED_ENDPOINTS:
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        name = body["schema"]["$ref"].rsplit("/", 1)[1]
        assert "model" in document["components"]["schemas"][name]["properties"], path


async def test_serve_openapi_documents_every_body(served: httpx.AsyncClient) -> None:
    document = (await served.get("/openapi.json")).json()
    assert_bodies_documented(document)
    for path in ("/v1/models", "/v1/models/{model_id}", "/version", "/v1/files"):
        assert path in document["paths"], path
    assert (await served.get("/docs")).status_code == 200


async def test_gateway_documents_its_routes_and_answers_model_lookups(tmp_path: Path) -> None:
    store = open_job_store(f"sqlite://{tmp_path}/jobs.sqlite")
    store.upsert_worker("w", "http://w", ["m"], 8, {"models": {}}, time.time())
    app = create_gateway_app(GatewaySettings(store_url="unused"), config(tmp_path), store=store)
    await app.state.gateway.registry.refresh()
    async with http(app) as client:
        document = (await client.get("/openapi.json")).json()
        assert_bodies_documented(document)
        assert (await client.get("/version")).json() == {"version": conveyor.__version__}
        models = openai_client(client).models
        assert (await models.retrieve("m")).id == "m"
        with pytest.raises(openai.NotFoundError):
            await models.retrieve("nope")
    store.close()
