"""Which cached models to delete from local disk so that another one fits: LRU, pure.

A cached model takes the bytes of its assembled files plus its chunks; chunks shared between
models count once and are only freed when no kept model uses them. Pinned models (configured
in this process, or being pulled) are never evicted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class DiskBudgetExceeded(Exception):
    """The incoming model cannot fit even after evicting every unpinned model."""


@dataclass(frozen=True, slots=True)
class CachedModel:
    """A model on local disk: its key, assembled size, chunks, last use and pin."""

    key: str
    assembled_bytes: int
    chunks: frozenset[str]
    last_used_s: float
    is_pinned: bool = False


def used_bytes(models: Sequence[CachedModel], chunk_sizes: Mapping[str, int]) -> int:
    """Bytes the models take together (each shared chunk once)."""
    chunks = set().union(*(m.chunks for m in models)) if models else set()
    return sum(m.assembled_bytes for m in models) + sum(chunk_sizes.get(c, 0) for c in chunks)


def plan_disk_eviction(
    models: Sequence[CachedModel],
    chunk_sizes: Mapping[str, int],
    budget_bytes: int,
    incoming_bytes: int,
) -> list[str]:
    """Keys of the models to evict, least recently used first, so `incoming_bytes` fits.

    `incoming_bytes` is what the model about to be pulled adds beyond what is already on
    disk. Raises DiskBudgetExceeded when evicting every unpinned model is not enough.
    """
    if budget_bytes < 1:
        raise ValueError(f"budget_bytes must be >= 1, got {budget_bytes}")
    kept = list(models)
    victims: list[str] = []
    candidates = sorted((m for m in models if not m.is_pinned), key=lambda m: m.last_used_s)
    for candidate in candidates:
        if used_bytes(kept, chunk_sizes) + incoming_bytes <= budget_bytes:
            return victims
        kept.remove(candidate)
        victims.append(candidate.key)
    if used_bytes(kept, chunk_sizes) + incoming_bytes > budget_bytes:
        raise DiskBudgetExceeded(
            f"{incoming_bytes} more bytes do not fit in the model cache's {budget_bytes} bytes "
            f"beside the models in use ({used_bytes(kept, chunk_sizes)} bytes)"
        )
    return victims
