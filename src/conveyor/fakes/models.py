"""In-memory model manifests and chunk tracker: the `ModelStore` aggregate."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from conveyor.fakes.shards import MemoryBase, op
from conveyor.stores.model_records import ChunkHolder, HolderState, ManifestRecord


class MemoryModels(MemoryBase):
    """`ModelStore` in dictionaries, under the store's one lock."""

    def __init__(self) -> None:
        """An empty store."""
        super().__init__()
        self._manifests: dict[str, ManifestRecord] = {}
        self._holders: dict[tuple[str, str], ChunkHolder] = {}

    @op
    def put_manifest(self, rec: ManifestRecord) -> None:
        """Record a model's manifest under its name, replacing an older one."""
        self._manifests[rec.name] = rec

    @op
    def get_manifest(self, name: str) -> ManifestRecord | None:
        """The model's manifest, or None."""
        return self._manifests.get(name)

    @op
    def list_manifests(self) -> list[ManifestRecord]:
        """Every pushed model, by name."""
        return [self._manifests[name] for name in sorted(self._manifests)]

    @op
    def delete_manifest(self, name: str) -> bool:
        """Forget a model's manifest; whether it existed."""
        return self._manifests.pop(name, None) is not None

    @op
    def record_chunks(
        self,
        worker_id: str,
        address: str,
        zone: str | None,
        digests: Sequence[str],
        state: HolderState,
        now: float,
    ) -> None:
        """Record that the worker holds (or is fetching) these chunks."""
        if not worker_id:
            raise ValueError("worker_id must be a non-empty string")
        for digest in digests:
            holder = ChunkHolder(digest, worker_id, address, zone, HolderState(state), float(now))
            self._holders[(digest, worker_id)] = holder

    @op
    def forget_chunks(self, worker_id: str, digests: Sequence[str] | None = None) -> int:
        """Drop the worker's holds on these chunks (None: on all); how many."""
        keys = [
            key
            for key in self._holders
            if key[1] == worker_id and (digests is None or key[0] in digests)
        ]
        for key in keys:
            del self._holders[key]
        return len(keys)

    @op
    def touch_chunks(self, worker_id: str, now: float) -> int:
        """Stamp every hold of the worker with `now`; how many."""
        keys = [key for key in self._holders if key[1] == worker_id]
        for key in keys:
            self._holders[key] = dataclasses.replace(self._holders[key], updated_at=float(now))
        return len(keys)

    @op
    def chunk_holders(self, digests: Sequence[str]) -> list[ChunkHolder]:
        """Every hold on these chunks, by digest then worker id."""
        wanted = set(digests)
        return [h for key, h in sorted(self._holders.items()) if key[0] in wanted]
