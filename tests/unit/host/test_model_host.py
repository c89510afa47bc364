"""The model host loads each model on a thread that ends with the load."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from conveyor.config.settings import ServerConfig
from conveyor.host.model_host import ModelHost
from conveyor.models.registry import build_embedding_model

pytestmark = pytest.mark.anyio


class FakeGenerator:
    """Stands in for a hosted generator: only ``stop`` is called here."""

    def stop(self) -> None:
        """Nothing runs."""


async def test_models_load_on_threads_that_have_ended(llama_path: Path) -> None:
    """A loading thread that lived on would keep its OpenMP team beside the engine's."""
    loaders: dict[str, threading.Thread] = {}

    def generator_factory(config: Any, metrics: Any) -> Any:
        loaders[config.name] = threading.current_thread()
        return FakeGenerator()

    def model_factory(config: Any) -> Any:
        loaders[config.name] = threading.current_thread()
        return build_embedding_model(config)

    config = ServerConfig.model_validate({"models": [
        {"name": "gen", "kind": "generate", "path": str(llama_path)},
        {"name": "emb", "kind": "synthetic", "batch_latency_ms": 0, "max_wait_ms": 0},
    ]})  # fmt: skip
    async with ModelHost(
        config, model_factory=model_factory, generator_factory=generator_factory
    ) as host:
        assert host.is_ready and set(loaders) == {"gen", "emb"}
        for thread in loaders.values():
            assert thread is not threading.current_thread() and not thread.is_alive()
            assert thread.name == "model-load"
