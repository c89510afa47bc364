"""The model host: the configured models loaded (at start-up, or on first use under a
memory budget), each one-shot model behind its batcher, found by name.

``host.service.Service`` builds the request doors on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, NoReturn, Self

from conveyor.batching.batcher import Batcher, BatcherSettings
from conveyor.config.model_config import GenerateModelConfig, ModelEntry
from conveyor.config.settings import ServerConfig
from conveyor.engine.cpu_threads import in_passing_thread
from conveyor.errors import InvalidRequest, ModelNotFound, ServiceUnavailable
from conveyor.host.hosted_model import HostedModel, OneShotConfig
from conveyor.host.model_cache import CacheFull, ModelCache
from conveyor.models.base import EmbeddingModel
from conveyor.models.registry import build_embedding_model, build_generator
from conveyor.models.text_tokenizer import TextTokenizer
from conveyor.observability.metrics import GeneratorMetrics, Metrics, ModelMetrics

if TYPE_CHECKING:
    from conveyor.engine.generator import HostedGenerator

log = logging.getLogger(__name__)

MIB = 1024 * 1024

ModelFactory = Callable[[OneShotConfig], EmbeddingModel]
GeneratorFactory = Callable[[GenerateModelConfig, GeneratorMetrics], "HostedGenerator"]
AnyModelConfig = ModelEntry
# Points a model entry at local weights (pulls `conveyor://NAME` models); see distribution.
ModelResolver = Callable[[AnyModelConfig], Awaitable[AnyModelConfig]]


class ModelHost:
    """Loads the configured models and finds them by name; ``Service`` adds the requests.

    With ``model_memory_budget_mb`` set, one-shot models load on first use instead of at
    start-up (in a thread, one load at a time), and the least recently used idle model is
    unloaded when the next one would not fit. Callers hold a model through ``using``.
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        metrics: Metrics | None = None,
        model_factory: ModelFactory = build_embedding_model,
        generator_factory: GeneratorFactory = build_generator,
        model_resolver: ModelResolver | None = None,
    ) -> None:
        """Models of ``config``, built by the factories (``model_resolver`` fetches remote
        weights first); nothing loads before ``start``."""
        self.config = config
        self._resolver = model_resolver
        # Models whose weights could not be fetched, with why: 503 for them, the rest serve.
        self.failed_models: dict[str, str] = {}
        self.metrics = metrics or Metrics()
        self._model_factory = model_factory
        self._generator_factory = generator_factory
        self._models: dict[str, HostedModel] = {}
        # Generative models (continuous batching), beside the one-shot ones.
        self.generators: dict[str, HostedGenerator] = {}
        self._is_ready = False
        budget_mb = config.model_memory_budget_mb
        self._cache = ModelCache(budget_mb * MIB) if budget_mb is not None else None
        self._load_lock = asyncio.Lock()
        self._started_at = int(time.time())

    @property
    def is_ready(self) -> bool:
        """True once every model is loaded and accepting inputs."""
        return self._is_ready

    async def _resolve_models(self) -> None:
        """Point `conveyor://` entries at pulled local copies; a failed pull skips its model."""
        if self._resolver is None:
            from conveyor.distribution.resolver import has_remote_models, standalone_resolver

            if not has_remote_models(self.config):
                return
            self._resolver = standalone_resolver(self.config, self.metrics.distribution)
        resolver = self._resolver
        resolved: list[AnyModelConfig] = []
        for model_config in self.config.models:
            try:
                resolved.append(await resolver(model_config))
            except ServiceUnavailable as exc:
                log.error("model %s cannot be loaded: %s", model_config.name, exc.message)
                self.failed_models[model_config.name] = exc.message
        self.config = self.config.model_copy(update={"models": resolved})

    async def start(self) -> None:
        """Load every model (off the event loop) and start its batcher."""
        await self._resolve_models()
        for model_config in self.config.models:
            started = time.perf_counter()
            if isinstance(model_config, GenerateModelConfig):
                metrics = self.metrics.for_generator(model_config.name)
                self.generators[model_config.name] = await in_passing_thread(
                    self._generator_factory, model_config, metrics
                )
            elif self._cache is not None:
                continue  # loaded on first use
            else:
                model = await in_passing_thread(self._model_factory, model_config)
                self._models[model_config.name] = self._host(model_config, model)
            log.info("loaded %s in %.1f s", model_config.name, time.perf_counter() - started)
        self._is_ready = True

    def _host(self, config: OneShotConfig, model: EmbeddingModel) -> HostedModel:
        settings = BatcherSettings(
            max_batch_size=config.max_batch_size,
            max_wait_ms=config.max_wait_ms,
            max_batch_tokens=config.max_batch_tokens,
            max_queue=config.max_queue,
            mixed_batch_slack_ms=config.mixed_batch_slack_ms,
        )
        metrics = self.metrics.for_model(config.name)
        batcher = Batcher(config.name, model.embed_batch, settings, metrics)
        batcher.start()
        return HostedModel(config, model, batcher, metrics, int(time.time()))

    async def stop(self) -> None:
        """Refuse new work, fail what is queued, release the models."""
        self._is_ready = False
        for hosted in self._models.values():
            await hosted.batcher.stop()
            hosted.model.close()
        self._models.clear()
        for generator in self.generators.values():
            await asyncio.to_thread(generator.stop)
        self.generators.clear()
        close = getattr(self._resolver, "close", None)
        if close is not None:
            await asyncio.to_thread(close)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def models(self) -> list[HostedModel]:
        """Every loaded one-shot model."""
        return list(self._models.values())

    def unloaded_models(self) -> list[OneShotConfig]:
        """Configured one-shot models not loaded now (only under a memory budget)."""
        return [
            m
            for m in self.config.models
            if not isinstance(m, GenerateModelConfig) and m.name not in self._models
        ]

    @property
    def started_at(self) -> int:
        """When this service was created (unix seconds)."""
        return self._started_at

    def model_metrics(self, name: str) -> ModelMetrics:
        """The metric children of a one-shot model, loaded or not (404/400 like ``hosted``)."""
        return self._one_shot(name)[1]

    def _one_shot(self, name: str) -> tuple[HostedModel | None, ModelMetrics]:
        """A one-shot model, resolved once: the loaded model (None while one loaded on first
        use is not loaded) and its metric children; 404/400/503 like ``hosted``."""
        hosted = self._models.get(name)
        if hosted is not None:
            return hosted, hosted.metrics
        if self._cache is not None and self._lazy_config(name) is not None:
            return None, self.metrics.for_model(name)
        self._refuse_one_shot(name)

    @asynccontextmanager
    async def using(
        self, name: str, resolved: HostedModel | None = None
    ) -> AsyncIterator[HostedModel]:
        """Hold a one-shot model for a request: loaded first if needed, not evicted meanwhile
        (``resolved``: the model ``_one_shot`` found, not looked up again)."""
        if self._cache is None:
            yield resolved if resolved is not None else self.hosted(name)
            return
        hosted = await self._acquire(name)
        try:
            yield hosted
        finally:
            if name in self._models:
                self._cache.release(name)

    def _lazy_config(self, name: str) -> OneShotConfig | None:
        """The config of a one-shot model loaded on demand, if ``name`` is one."""
        config = self.config.model(name)
        if config is None or isinstance(config, GenerateModelConfig):
            return None
        return config

    async def _acquire(self, name: str) -> HostedModel:
        """Mark ``name`` in use, loading it (and evicting idle models) when it is not loaded."""
        cache = self._cache
        if cache is None:
            raise RuntimeError("models load on first use only under a memory budget")
        if name in self._models:  # no await between the check and acquire: nothing evicts it
            cache.acquire(name)
            return self._models[name]
        config = self._lazy_config(name)
        if config is None or not self._is_ready:
            return self.hosted(name)  # raises the right error (404, 400 or 503)
        async with self._load_lock:
            if name not in self._models:
                await self._load(config, cache)
            cache.acquire(name)
            return self._models[name]

    async def _load(self, config: OneShotConfig, cache: ModelCache) -> None:
        """Evict the least recently used idle models so ``config`` fits, then load it."""
        size_bytes = (config.memory_mb or 0) * MIB
        try:
            victims = cache.plan_load(config.name, size_bytes)
        except CacheFull as exc:
            raise ServiceUnavailable(f"model {config.name!r} cannot be loaded now: {exc}") from None
        evicted = []
        for victim in victims:
            # Out of the table and the cache before any await, so no caller can pick it up.
            evicted.append(self._models.pop(victim))
            cache.remove(victim)
        for hosted in evicted:
            log.info("evicting %s (least recently used)", hosted.config.name)
            await hosted.batcher.stop()
            await asyncio.to_thread(hosted.model.close)
        started = time.perf_counter()
        model = await in_passing_thread(self._model_factory, config)
        self._models[config.name] = self._host(config, model)
        cache.add(config.name, size_bytes)
        log.info("loaded %s on demand in %.1f s", config.name, time.perf_counter() - started)

    def hosted(self, name: str) -> HostedModel:
        """The hosted model of that name, or 404."""
        hosted = self._models.get(name)
        if hosted is None:
            self._refuse_one_shot(name)
        return hosted

    def _refuse_one_shot(self, name: str) -> NoReturn:
        """The error for a one-shot model ``name`` not loaded: 503, 400 or 404."""
        self._check_failed(name)
        if name in self.generators:
            raise InvalidRequest(
                f"the model {name!r} is a generative model; use /v1/completions or "
                "/v1/chat/completions",
                param="model",
            )
        if not self._is_ready and self.config.model(name) is not None:
            raise ServiceUnavailable(f"model {name!r} is still loading")
        raise ModelNotFound(f"the model {name!r} does not exist", param="model")

    def generator(self, name: str) -> HostedGenerator:
        """The generative model of that name: 404 if unknown, 400 if it only embeds."""
        generator = self.generators.get(name)
        if generator is not None:
            return generator
        for base in self.generators.values():  # a LoRA adapter runs on its base's engine
            adapter = base.for_adapter(name)
            if adapter is not None:
                return adapter
        self._check_failed(name)
        if name in self._models:
            raise InvalidRequest(
                f"the model {name!r} is an embedding model; it does not generate text",
                param="model",
            )
        if not self._is_ready and self.config.model(name) is not None:
            raise ServiceUnavailable(f"model {name!r} is still loading")
        raise ModelNotFound(f"the model {name!r} does not exist", param="model")

    async def text_tokenizer(self, name: str) -> TextTokenizer:
        """The tokenizer of model ``name``: 404 if unknown, 400 if the model has none."""
        generator = self.generators.get(name)
        if generator is not None:
            hf, limit = generator.tokenizer.hf, generator.max_model_len
            return TextTokenizer(hf, limit, generator.max_input_bytes)
        async with self.using(name) as hosted:
            hf = getattr(hosted.model, "tokenizer", None)
            if hf is None:
                raise InvalidRequest(f"the model {name!r} has no tokenizer", param="model")
            return TextTokenizer(hf, hosted.model.max_input_tokens, hosted.text_byte_limit())

    def _check_failed(self, name: str) -> None:
        """503 naming why, for a configured model whose weights could not be fetched."""
        if name in self.failed_models:
            raise ServiceUnavailable(
                f"model {name!r} failed to load: {self.failed_models[name]}", param="model"
            )
