"""Turn `path: conveyor://NAME` model entries into local directories before models load.

`PullingResolver` is what `Service` calls for each entry: a local path passes through, a
pushed model is pulled into the model cache first (making room under the disk budget by
evicting the least recently used models this process does not use).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from conveyor.config.model_config import ModelEntry, remote_model_name
from conveyor.config.settings import ServerConfig
from conveyor.distribution.chunk_cache import ChunkCache
from conveyor.distribution.disk_budget import DiskBudgetExceeded, plan_disk_eviction
from conveyor.distribution.errors import ModelPullFailed
from conveyor.distribution.manifest import MIB, Manifest
from conveyor.distribution.puller import ModelPuller
from conveyor.observability.metrics import DistributionMetrics
from conveyor.stores import open_job_store, open_object_store

log = logging.getLogger(__name__)

AnyModelConfig = ModelEntry


def model_cache_dir(config: ServerConfig) -> Path:
    """The local model cache: `model_cache_dir`, else `data_dir/model-cache`."""
    return config.model_cache_dir or Path(config.data_dir) / "model-cache"


def has_remote_models(config: ServerConfig) -> bool:
    """Whether any model entry names a pushed model."""
    return any(remote_model_name(getattr(m, "path", None)) for m in config.models)


class PullingResolver:
    """Pulls each `conveyor://` entry's model and points the entry at the local copy."""

    def __init__(self, puller: ModelPuller, disk_budget_bytes: int | None = None) -> None:
        """Resolve through `puller`, keeping its cache within `disk_budget_bytes`."""
        self.puller = puller
        self.disk_budget_bytes = disk_budget_bytes
        self._pinned: set[str] = set()
        self._store_to_close: object | None = None

    async def __call__(self, model: AnyModelConfig) -> AnyModelConfig:
        """The entry itself, or a copy whose `path` is the pulled model's directory."""
        name = remote_model_name(getattr(model, "path", None))
        if name is None:
            return model
        manifest = await self.puller.manifest(name)
        self._pinned.add(manifest.digest)
        await asyncio.to_thread(self._make_room, manifest)
        directory = await self.puller.pull(name)
        log.info("model %s: %s ready at %s", model.name, name, directory)
        return model.model_copy(update={"path": directory})

    def _make_room(self, manifest: Manifest) -> None:
        """Evict least recently used cached models so `manifest` fits the disk budget."""
        cache = self.puller.cache
        if self.disk_budget_bytes is None or cache.is_assembled(manifest):
            return
        sizes = cache.chunk_sizes()
        incoming = manifest.total_bytes + sum(
            c.size_bytes for c in manifest.unique_chunks() if c.digest not in sizes
        )
        models = cache.cached_models(self._pinned)
        try:
            victims = plan_disk_eviction(models, sizes, self.disk_budget_bytes, incoming)
        except DiskBudgetExceeded as exc:
            raise ModelPullFailed(f"model {manifest.name!r}: {exc}") from None
        kept = set().union(*(m.chunks for m in models if m.key not in victims))
        for victim in victims:
            log.info("model cache: evicting %s (least recently used)", victim)
            evicted = next(m.chunks for m in models if m.key == victim) - kept
            if self.puller.announcer is not None and evicted:
                self.puller.store.forget_chunks(self.puller.announcer.worker_id, sorted(evicted))
            cache.evict(victim, kept)

    def close(self) -> None:
        """Release the puller (and the stores this resolver opened itself)."""
        self.puller.close()
        close = getattr(self._store_to_close, "close", None)
        if close is not None:
            close()


def standalone_resolver(config: ServerConfig, metrics: DistributionMetrics) -> PullingResolver:
    """The resolver of a single process (`conveyor serve`): origin only, announcing nothing.

    It reads manifests from the config's job store and chunks from its object store.
    """
    jobs = config.jobs
    store = open_job_store(jobs.job_store_url_for(config.data_dir))
    objects = open_object_store(jobs.object_store_url_for(config.data_dir))
    puller = ModelPuller(store, objects, ChunkCache(model_cache_dir(config)), metrics)
    budget = config.model_cache_disk_mb
    resolver = PullingResolver(puller, None if budget is None else budget * MIB)
    resolver._store_to_close = store
    return resolver
