"""The service under a model memory budget: lazy loads, LRU eviction, truthful heartbeats."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.cli.worker import DrainGate, service_load
from conveyor.config.settings import ServerConfig
from conveyor.errors import ModelNotFound, ServiceUnavailable
from conveyor.host.hosted_model import OneShotConfig
from conveyor.host.service import Service
from conveyor.models.base import EmbeddingModel
from conveyor.models.registry import build_embedding_model

pytestmark = pytest.mark.anyio


def synthetic(name: str, memory_mb: int) -> dict[str, Any]:
    """A fast synthetic model entry of the given size."""
    return {"name": name, "kind": "synthetic", "batch_latency_ms": 0, "max_wait_ms": 0,
            "memory_mb": memory_mb}  # fmt: skip


def budget_config(budget_mb: int = 100) -> ServerConfig:
    """Three models, a (40 MB), b (40 MB) and c (50 MB), under ``budget_mb``."""
    models = [synthetic("a", 40), synthetic("b", 40), synthetic("c", 50)]
    return ServerConfig.model_validate({"models": models, "model_memory_budget_mb": budget_mb})


class CountingFactory:
    """Builds real synthetic models and records every load."""

    def __init__(self) -> None:
        self.loads: list[str] = []

    def __call__(self, config: OneShotConfig) -> EmbeddingModel:
        self.loads.append(config.name)
        return build_embedding_model(config)


def loaded(service: Service) -> set[str]:
    return {hosted.config.name for hosted in service.models()}


def test_a_budget_needs_every_model_sized_to_fit() -> None:
    with pytest.raises(ValueError, match="memory_mb is required"):
        ServerConfig.model_validate(
            {"models": [{"name": "a", "kind": "synthetic"}], "model_memory_budget_mb": 10}
        )
    with pytest.raises(ValueError, match="exceeds"):
        ServerConfig.model_validate({"models": [synthetic("a", 20)], "model_memory_budget_mb": 10})


async def test_models_load_on_first_use_and_the_lru_idle_one_is_evicted() -> None:
    factory = CountingFactory()
    async with Service(budget_config(), model_factory=factory) as service:
        assert service.is_ready and loaded(service) == set() and factory.loads == []
        await service.embed("a", ["x"])
        await service.embed("b", ["x"])  # 40 + 40 fit
        assert loaded(service) == {"a", "b"}
        await service.embed("a", ["y"])  # b is now the least recently used
        await service.embed("c", ["x"])  # 50 more: evicting b alone makes room
        assert loaded(service) == {"a", "c"}
        await service.embed("b", ["z"])  # a is now the least recently used idle model
        assert loaded(service) == {"c", "b"}
        assert factory.loads == ["a", "b", "c", "b"]
        with pytest.raises(ModelNotFound):
            await service.embed("nope", ["x"])


async def test_a_model_in_use_is_never_evicted() -> None:
    async with Service(budget_config(), model_factory=CountingFactory()) as service:
        async with service.using("a"), service.using("b"):
            with pytest.raises(ServiceUnavailable):
                await service.embed("c", ["x"])  # only a or b could make room; both busy
            assert loaded(service) == {"a", "b"}
        await service.embed("c", ["x"])  # idle now: a (least recently used) makes room
        assert loaded(service) == {"b", "c"}


async def test_heartbeats_report_which_models_are_loaded() -> None:
    async with Service(budget_config(), model_factory=CountingFactory()) as service:
        gate = DrainGate(app=_unused_app)
        assert {
            m: load["is_loaded"] for m, load in service_load(service, gate)["models"].items()
        } == {
            "a": False,
            "b": False,
            "c": False,
        }
        await service.embed("b", ["x"])
        models = service_load(service, gate)["models"]
        assert {m for m, load in models.items() if load["is_loaded"]} == {"b"}
        assert set(models) == {"a", "b", "c"}


async def test_without_a_budget_every_model_loads_at_start() -> None:
    config = ServerConfig.model_validate({"models": [synthetic("a", 60), synthetic("b", 60)]})
    factory = CountingFactory()
    async with Service(config, model_factory=factory) as service:
        assert factory.loads == ["a", "b"] and service.unloaded_models() == []
        async with service.using("a") as hosted:
            assert hosted.config.name == "a"


async def _unused_app(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app the drain gate wraps; these tests never call it."""
    raise AssertionError("not called")
