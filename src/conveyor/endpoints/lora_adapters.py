"""Loading and unloading LoRA adapters at run time (vLLM's ``/v1/load_lora_adapter`` shapes).

No HTTP here: the route parses the body and checks the caller may do it. An adapter goes
to the generative model that has ``lora`` configured (``base_model`` picks one when
several do), from a directory under that model's ``lora.load_roots`` only (see
``engine.model.lora.files``); reading it runs off the event loop. On ``engine: vllm`` the
model's registry is followed by vLLM's own table (``adapter_sync``: ``add_lora``,
``remove_lora``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from conveyor.engine.model.lora.files import resolve_under
from conveyor.errors import InvalidRequest, ModelNotFound, PermissionDenied

if TYPE_CHECKING:  # named in annotations only
    from conveyor.engine.generator import HostedGenerator
    from conveyor.engine.model.lora.registry import AdapterEntry
    from conveyor.host.service import Service

__all__ = [
    "LoadLoraAdapterRequest",
    "UnloadLoraAdapterRequest",
    "adapter_entries",
    "load_adapter",
    "unload_adapter",
]

_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"


class LoadLoraAdapterRequest(BaseModel):
    """``{lora_name, lora_path}``; ``base_model`` only when several models take adapters."""

    model_config = ConfigDict(extra="ignore")

    lora_name: str = Field(min_length=1, max_length=200, pattern=_NAME_PATTERN)
    lora_path: str = Field(min_length=1, max_length=4096)
    base_model: str | None = None


class UnloadLoraAdapterRequest(BaseModel):
    """``{lora_name}`` (vLLM also accepts ``lora_int_id``; it is ignored here)."""

    model_config = ConfigDict(extra="ignore")

    lora_name: str = Field(min_length=1, max_length=200)


def _lora_models(service: Service) -> list[HostedGenerator]:
    """Generative models configured to serve adapters."""
    return [g for g in service.generators.values() if g.lora is not None]


def _target(service: Service, base_model: str | None) -> HostedGenerator:
    """The model a new adapter goes to: the only one with ``lora``, or ``base_model``."""
    candidates = _lora_models(service)
    if base_model is not None:
        candidates = [g for g in candidates if g.config.name == base_model]
        if not candidates:
            raise InvalidRequest(
                f"the model {base_model!r} does not serve LoRA adapters", param="base_model"
            )
    if not candidates:
        raise InvalidRequest("no model here serves LoRA adapters (configure lora: on one)")
    if len(candidates) > 1:
        names = ", ".join(sorted(g.config.name for g in candidates))
        raise InvalidRequest(f"several models take adapters; name base_model ({names})")
    return candidates[0]


def _is_taken(service: Service, name: str) -> bool:
    """Whether a model or an adapter already answers to ``name``."""
    if service.config.model(name) is not None or name in service.generators:
        return True
    return any(name in g.adapter_names() for g in _lora_models(service))


async def load_adapter(service: Service, body: LoadLoraAdapterRequest) -> str:
    """Read and register an adapter; 400 for a taken name or an adapter that cannot run."""
    target = _target(service, body.base_model)
    if _is_taken(service, body.lora_name):
        raise InvalidRequest(
            f"the name {body.lora_name!r} is already a model or an adapter", param="lora_name"
        )
    entry = await asyncio.to_thread(_read_into, target, body)
    if target.adapter_sync is not None:
        try:
            await target.adapter_sync.add_adapter(entry)
        except BaseException:
            if target.lora is not None and target.lora.get(entry.name) == entry:
                target.lora.unload(entry.name)  # the engine refused it: not served at all
            raise
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


def _read_into(target: HostedGenerator, body: LoadLoraAdapterRequest) -> AdapterEntry:
    """Blocking: register the adapter at ``lora_path`` if it lies under the model's roots.

    403 when the model allows no run-time loads; one 400 for any path it will not read.
    """
    settings, registry = target.config.lora, target.lora
    assert settings is not None and registry is not None  # _target picks models with lora
    if not settings.load_roots:
        raise PermissionDenied(
            f"the model {target.config.name!r} loads no LoRA adapters at run time: list the "
            "directories they may come from in its lora.load_roots"
        )
    return registry.load(body.lora_name, resolve_under(body.lora_path, settings.load_roots))


async def unload_adapter(service: Service, body: UnloadLoraAdapterRequest) -> str:
    """Forget an adapter (404 if none has that name); queued requests for it still run."""
    for generator in _lora_models(service):
        if generator.lora is not None and body.lora_name in generator.lora:
            entry = generator.lora.unload(body.lora_name)
            if generator.adapter_sync is not None:
                await generator.adapter_sync.remove_adapter(entry)
            return f"Success: LoRA adapter '{body.lora_name}' removed successfully."
    raise ModelNotFound(f"no LoRA adapter named {body.lora_name!r} is loaded", param="lora_name")


def adapter_entries(service: Service) -> list[dict[str, object]]:
    """One OpenAI model object per adapter, with ``parent`` its base (as vLLM lists them)."""
    return [
        {
            "id": name,
            "object": "model",
            "created": generator.created_at,
            "owned_by": "conveyor",
            "parent": generator.config.name,
        }
        for generator in _lora_models(service)
        for name in generator.adapter_names()
    ]
