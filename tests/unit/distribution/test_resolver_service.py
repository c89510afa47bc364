"""`path: conveyor://NAME` in a service: pulled before loading; failures named, others serve."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from conveyor.api.app import create_app
from conveyor.cli.worker import worker_identity
from conveyor.config.model_config import EmbeddingModelConfig, SyntheticModelConfig
from conveyor.config.settings import ServerConfig
from conveyor.distribution.errors import UnknownModel
from conveyor.distribution.manifest import chunk_key
from conveyor.distribution.push import push_model
from conveyor.errors import ServiceUnavailable
from conveyor.host.hosted_model import OneShotConfig
from conveyor.host.service import Service
from conveyor.models.base import EmbeddingModel
from conveyor.models.synthetic import SyntheticModel
from conveyor.stores import open_job_store, open_object_store

pytestmark = pytest.mark.anyio


def config_for(tmp_path: Path, *names: str) -> ServerConfig:
    """A service with one pushed embedding model per name and a synthetic model."""
    models: list[object] = [
        EmbeddingModelConfig(name=n, kind="embedding", path=f"conveyor://{n}") for n in names
    ]
    models.append(SyntheticModelConfig(name="local", kind="synthetic", batch_latency_ms=0))
    return ServerConfig.model_validate({"data_dir": tmp_path / "data", "models": models})


def push(tmp_path: Path, config: ServerConfig, name: str, weights: bytes) -> list[str]:
    """Push a model directory into the config's stores; return its chunk keys."""
    directory = tmp_path / f"src-{name}"
    directory.mkdir()
    (directory / "weights.bin").write_bytes(weights)
    store = open_job_store(config.jobs.job_store_url_for(config.data_dir))
    objects = open_object_store(config.jobs.object_store_url_for(config.data_dir))
    try:
        result = push_model(directory, name, store, objects, chunk_bytes=64, now=1.0)
    finally:
        store.close()
    return [chunk_key(c.digest) for c in result.manifest.unique_chunks()]


def loaded_from(seen: dict[str, Path]) -> Callable[[OneShotConfig], EmbeddingModel]:
    """A model factory recording each model's local path, serving synthetic vectors."""

    def factory(config: OneShotConfig) -> EmbeddingModel:
        if isinstance(config, EmbeddingModelConfig):
            assert isinstance(config.path, Path)
            seen[config.name] = config.path
        synthetic = SyntheticModelConfig(name=config.name, kind="synthetic", batch_latency_ms=0)
        return SyntheticModel(synthetic)

    return factory


async def test_pushed_model_is_pulled_and_loaded_from_disk(tmp_path: Path) -> None:
    config = config_for(tmp_path, "m")
    push(tmp_path, config, "m", b"w" * 100 + b"v" * 100)
    seen: dict[str, Path] = {}
    async with Service(config, model_factory=loaded_from(seen)) as service:
        assert (seen["m"] / "weights.bin").read_bytes() == b"w" * 100 + b"v" * 100
        assert seen["m"].is_relative_to(tmp_path / "data" / "model-cache")
        assert (await service.embed("m", ["hi"])).vectors


async def test_a_chunk_missing_everywhere_fails_only_its_model(tmp_path: Path) -> None:
    config = config_for(tmp_path, "good", "broken")
    push(tmp_path, config, "good", b"g" * 100)
    keys = push(tmp_path, config, "broken", b"b" * 64 + b"c" * 64)
    (tmp_path / "data" / "objects" / keys[1]).unlink()
    async with Service(config, model_factory=loaded_from({})) as service:
        assert (await service.embed("good", ["hi"])).vectors
        assert (await service.embed("local", ["hi"])).vectors
        with pytest.raises(ServiceUnavailable, match=keys[1].rsplit("/", 1)[1]):
            await service.embed("broken", ["hi"])


async def test_unknown_pushed_name_fails_start_up_naming_it(tmp_path: Path) -> None:
    service = Service(config_for(tmp_path, "ghost"), model_factory=loaded_from({}))
    with pytest.raises(UnknownModel, match="'ghost'"):
        await service.start()
    await service.stop()


async def test_a_model_whose_chunk_fails_verification_is_not_ready_nor_advertised(
    tmp_path: Path,
) -> None:
    config = config_for(tmp_path, "good", "corrupt")
    push(tmp_path, config, "good", b"g" * 100)
    keys = push(tmp_path, config, "corrupt", b"b" * 64 + b"c" * 64)
    (tmp_path / "data" / "objects" / keys[1]).write_bytes(b"x" * 64)  # a corrupt origin
    async with Service(config, model_factory=loaded_from({})) as service:
        transport = httpx.ASGITransport(app=create_app(config, service=service))
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
            ready = await client.get("/ready")
        identity = worker_identity(service, "w1", "http://127.0.0.1:9")
    assert ready.status_code == 503
    body = ready.json()
    assert body["status"] == "failed" and list(body["failed"]) == ["corrupt"]
    assert "wrong SHA-256" in body["failed"]["corrupt"]
    assert sorted(body["models"]) == ["good", "local"]
    assert sorted(identity.models) == ["good", "local"]
    assert identity.capacity == sum(m.max_batch_size for m in config.models if m.name != "corrupt")
