"""Pure LRU bookkeeping for models under a memory budget.

A worker may host more models than fit in memory at once. This class decides *which* models
to evict so that another fits; loading and unloading are the caller's job. Models in use
(``acquire``d and not yet ``release``d) are never evicted.
"""

from __future__ import annotations

from dataclasses import dataclass


class CacheFull(Exception):
    """The model cannot fit: the budget is too small or the other models are busy."""


@dataclass(slots=True)
class _Entry:
    size_bytes: int
    last_used: int
    num_users: int = 0


class ModelCache:
    """Which models are loaded, how much memory they take, and which to evict next."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be > 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._entries: dict[str, _Entry] = {}
        # A counter, not a clock: recency order stays exact and deterministic.
        self._tick = 0

    @property
    def used_bytes(self) -> int:
        """Memory the loaded models take."""
        return sum(entry.size_bytes for entry in self._entries.values())

    @property
    def loaded_names(self) -> list[str]:
        """Loaded models, least recently used first."""
        return sorted(self._entries, key=lambda name: self._entries[name].last_used)

    def is_loaded(self, name: str) -> bool:
        """True when ``name`` is loaded."""
        return name in self._entries

    def can_load(self, name: str, size_bytes: int) -> bool:
        """True when ``name`` is loaded or would fit after evicting idle models."""
        try:
            self.plan_load(name, size_bytes)
        except CacheFull:
            return False
        return True

    def plan_load(self, name: str, size_bytes: int) -> list[str]:
        """The idle models to evict (least recently used first) so ``name`` fits.

        Empty when ``name`` is already loaded or fits as is. Raises ``CacheFull`` when even
        evicting every idle model would not make room.
        """
        if size_bytes <= 0:
            raise ValueError(f"size_bytes must be > 0, got {size_bytes}")
        if name in self._entries:
            return []
        if size_bytes > self.budget_bytes:
            raise CacheFull(f"{name} needs {size_bytes} bytes, the budget is {self.budget_bytes}")
        free_bytes = self.budget_bytes - self.used_bytes
        victims: list[str] = []
        for candidate in self.loaded_names:
            if free_bytes >= size_bytes:
                break
            if self._entries[candidate].num_users == 0:
                victims.append(candidate)
                free_bytes += self._entries[candidate].size_bytes
        if free_bytes < size_bytes:
            raise CacheFull(f"{name} does not fit: the loaded models are in use")
        return victims

    def add(self, name: str, size_bytes: int) -> None:
        """Record ``name`` as loaded (after the caller evicted what ``plan_load`` said)."""
        if name in self._entries:
            raise ValueError(f"{name} is already loaded")
        if size_bytes <= 0:
            raise ValueError(f"size_bytes must be > 0, got {size_bytes}")
        if self.used_bytes + size_bytes > self.budget_bytes:
            raise CacheFull(f"{name} does not fit; evict first")
        self._entries[name] = _Entry(size_bytes, self._next_tick())

    def remove(self, name: str) -> None:
        """Record ``name`` as unloaded; refuses while it is in use."""
        entry = self._require(name)
        if entry.num_users:
            raise ValueError(f"{name} is in use by {entry.num_users} callers")
        del self._entries[name]

    def acquire(self, name: str) -> None:
        """Mark ``name`` in use (not evictable) and most recently used."""
        entry = self._require(name)
        entry.num_users += 1
        entry.last_used = self._next_tick()

    def release(self, name: str) -> None:
        """End one use of ``name``."""
        entry = self._require(name)
        if entry.num_users == 0:
            raise ValueError(f"{name} is not in use")
        entry.num_users -= 1

    def _require(self, name: str) -> _Entry:
        entry = self._entries.get(name)
        if entry is None:
            raise KeyError(name)
        return entry

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick
