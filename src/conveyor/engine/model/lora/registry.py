"""The adapters one base model serves: names, ids, and an LRU of host copies.

Torch-free: reading an adapter is the ``loader``'s job (``peft_format`` in production, a
fake in tests). Each adapter gets an id that is never reused, so a name loaded again
with other weights never meets KV blocks or device slots of its predecessor. At most
``max_cpu_loras`` adapters keep their weights in host memory; the others are read from
their directory again when a request needs them. Thread-safe: the event loop loads and
unloads, the engine thread reads weights.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from conveyor.errors import InvalidRequest, ModelNotFound

__all__ = ["AdapterEntry", "LoraRegistry"]

W = TypeVar("W")


@dataclass(frozen=True, slots=True)
class AdapterEntry:
    """A registered adapter: its name, never-reused id, directory and rank."""

    adapter_id: int
    name: str
    path: Path
    rank: int


class LoraRegistry(Generic[W]):
    """Named adapters of one base model; ``loader(path)`` returns ``(rank, weights)``."""

    def __init__(self, loader: Callable[[Path], tuple[int, W]], *, max_cpu_loras: int) -> None:
        if max_cpu_loras < 1:
            raise ValueError(f"max_cpu_loras must be >= 1, got {max_cpu_loras}")
        self._loader = loader
        self._max_cpu = max_cpu_loras
        self._lock = threading.Lock()
        self._by_name: dict[str, AdapterEntry] = {}
        # Unloaded adapters stay here: requests already queued for them still run.
        self._by_id: dict[int, AdapterEntry] = {}
        self._host: OrderedDict[int, W] = OrderedDict()
        self._next_id = 1

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._by_name

    def names(self) -> list[str]:
        """Registered adapter names, in load order."""
        with self._lock:
            return list(self._by_name)

    def names_by_id(self) -> dict[int, str]:
        """Every adapter's name by id, unloaded ones included (their requests still run)."""
        with self._lock:
            return {adapter_id: entry.name for adapter_id, entry in self._by_id.items()}

    def get(self, name: str) -> AdapterEntry | None:
        """The adapter of that name, if registered."""
        with self._lock:
            return self._by_name.get(name)

    def entry(self, adapter_id: int) -> AdapterEntry | None:
        """The adapter of that id, unloaded ones included (their requests still run)."""
        with self._lock:
            return self._by_id.get(adapter_id)

    @property
    def num_host_copies(self) -> int:
        """Adapters whose weights are in host memory now."""
        with self._lock:
            return len(self._host)

    def load(self, name: str, path: Path) -> AdapterEntry:
        """Read and register an adapter (slow: call off the event loop).

        400 when the name is taken or the directory cannot be served (the loader's
        errors pass through); nothing changes then.
        """
        if name in self:
            raise InvalidRequest(
                f"a LoRA adapter named {name!r} is already loaded", param="lora_name"
            )
        rank, weights = self._loader(path)
        with self._lock:
            if name in self._by_name:
                raise InvalidRequest(
                    f"a LoRA adapter named {name!r} is already loaded", param="lora_name"
                )
            entry = AdapterEntry(self._next_id, name, path, rank)
            self._next_id += 1
            self._by_name[name] = entry
            self._by_id[entry.adapter_id] = entry
            self._keep(entry.adapter_id, weights)
        return entry

    def unload(self, name: str) -> AdapterEntry:
        """Forget the name (404 if unknown) and drop its host copy.

        Requests already queued for it still finish: their weights are read again if
        needed.
        """
        with self._lock:
            entry = self._by_name.pop(name, None)
            if entry is None:
                raise ModelNotFound(f"no LoRA adapter named {name!r} is loaded", param="lora_name")
            self._host.pop(entry.adapter_id, None)
        return entry

    def weights(self, adapter_id: int) -> W:
        """The adapter's host weights, read from its directory again when evicted."""
        with self._lock:
            weights = self._host.get(adapter_id)
            if weights is not None:
                self._host.move_to_end(adapter_id)
                return weights
            entry = self._by_id.get(adapter_id)
        if entry is None:
            raise ModelNotFound(f"no LoRA adapter has id {adapter_id}")
        _, weights = self._loader(entry.path)
        with self._lock:
            self._keep(adapter_id, weights)
        return weights

    def _keep(self, adapter_id: int, weights: W) -> None:
        """Hold a host copy, dropping the least recently used beyond the bound (lock held)."""
        self._host[adapter_id] = weights
        self._host.move_to_end(adapter_id)
        while len(self._host) > self._max_cpu:
            self._host.popitem(last=False)
