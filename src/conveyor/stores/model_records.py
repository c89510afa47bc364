"""Records of model distribution in the job store: manifests and the chunk tracker."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class HolderState(StrEnum):
    """What a worker has of a chunk: verified on disk, or being fetched from the origin."""

    HAVE = "have"
    FETCHING = "fetching"


@dataclass(frozen=True, slots=True)
class ManifestRecord:
    """A pushed model: its name, manifest digest, size and manifest JSON."""

    name: str
    digest: str
    total_bytes: int
    manifest_json: str
    created_at: float

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> ManifestRecord:
        """Build from `name, digest, total_bytes, manifest, created_at`."""
        name, digest, total_bytes, manifest_json, created_at = row
        return cls(str(name), str(digest), int(total_bytes), str(manifest_json), float(created_at))


@dataclass(frozen=True, slots=True)
class ChunkHolder:
    """One worker's hold on one chunk, with the address its chunk server answers on."""

    digest: str
    worker_id: str
    address: str
    zone: str | None
    state: HolderState
    updated_at: float

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> ChunkHolder:
        """Build from `digest, worker_id, address, zone, state, updated_at`."""
        digest, worker_id, address, zone, state, updated_at = row
        return cls(
            str(digest), str(worker_id), str(address), zone, HolderState(state), float(updated_at)
        )
