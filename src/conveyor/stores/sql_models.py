"""Model manifests and the chunk tracker over SQL: the `ModelStore` aggregate.

Its statements live here, beside the one class that runs them.
"""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.stores.model_records import ChunkHolder, HolderState, ManifestRecord
from conveyor.stores.sql_base import SqlStore
from conveyor.stores.sql_queries import Dialect, in_list, list_param, per_dialect, shared

_MANIFEST_SELECT = "SELECT name, digest, total_bytes, manifest, created_at FROM model_manifests"
_HOLDER_SELECT = "SELECT digest, worker_id, address, zone, state, updated_at FROM chunk_holders"

PUT_MANIFEST = shared(
    "put_manifest",
    "INSERT INTO model_manifests (name, digest, total_bytes, manifest, created_at) "
    "VALUES (:name, :digest, :total_bytes, :manifest, :created_at) "
    "ON CONFLICT (name) DO UPDATE SET digest = excluded.digest, "
    "total_bytes = excluded.total_bytes, manifest = excluded.manifest, "
    "created_at = excluded.created_at",
)
GET_MANIFEST = shared("get_manifest", f"{_MANIFEST_SELECT} WHERE name = :name")
LIST_MANIFESTS = shared("list_manifests", f"{_MANIFEST_SELECT} ORDER BY name")
DELETE_MANIFEST = shared("delete_manifest", "DELETE FROM model_manifests WHERE name = :name")

RECORD_CHUNK = shared(
    "record_chunk",
    "INSERT INTO chunk_holders (digest, worker_id, address, zone, state, updated_at) "
    "VALUES (:digest, :worker_id, :address, :zone, :state, :now) "
    "ON CONFLICT (digest, worker_id) DO UPDATE SET address = excluded.address, "
    "zone = excluded.zone, state = excluded.state, updated_at = excluded.updated_at",
)
FORGET_ALL_CHUNKS = shared(
    "forget_all_chunks", "DELETE FROM chunk_holders WHERE worker_id = :worker_id"
)
TOUCH_CHUNKS = shared(
    "touch_chunks", "UPDATE chunk_holders SET updated_at = :now WHERE worker_id = :worker_id"
)
FORGET_CHUNKS = per_dialect(
    "forget_chunks",
    sqlite="DELETE FROM chunk_holders WHERE worker_id = :worker_id AND "
    + in_list("digest", "digests", Dialect.SQLITE),
    postgres="DELETE FROM chunk_holders WHERE worker_id = :worker_id AND "
    + in_list("digest", "digests", Dialect.POSTGRES),
)
CHUNK_HOLDERS = per_dialect(
    "chunk_holders",
    sqlite=f"{_HOLDER_SELECT} WHERE {in_list('digest', 'digests', Dialect.SQLITE)} "
    "ORDER BY digest, worker_id",
    postgres=f"{_HOLDER_SELECT} WHERE {in_list('digest', 'digests', Dialect.POSTGRES)} "
    "ORDER BY digest, worker_id",
)


class SqlModelStore(SqlStore):
    """`ModelStore` over SQL."""

    def put_manifest(self, rec: ManifestRecord) -> None:
        """Record a model's manifest under its name, replacing an older one."""
        params = {
            "name": rec.name,
            "digest": rec.digest,
            "total_bytes": rec.total_bytes,
            "manifest": rec.manifest_json,
            "created_at": float(rec.created_at),
        }
        self._change(PUT_MANIFEST, params)

    def get_manifest(self, name: str) -> ManifestRecord | None:
        """Return the model's manifest, or None."""
        rows = self._rows(GET_MANIFEST, {"name": name})
        return ManifestRecord.from_row(rows[0]) if rows else None

    def list_manifests(self) -> list[ManifestRecord]:
        """Return every pushed model, by name."""
        return [ManifestRecord.from_row(row) for row in self._rows(LIST_MANIFESTS, {})]

    def delete_manifest(self, name: str) -> bool:
        """Forget a model's manifest; return whether it existed."""
        return self._change(DELETE_MANIFEST, {"name": name}) > 0

    def record_chunks(
        self,
        worker_id: str,
        address: str,
        zone: str | None,
        digests: Sequence[str],
        state: HolderState,
        now: float,
    ) -> None:
        """Record that the worker holds (or is fetching) these chunks, in one transaction."""
        if not worker_id:
            raise ValueError("worker_id must be a non-empty string")
        rows = [
            {
                "digest": digest, "worker_id": worker_id, "address": address, "zone": zone,
                "state": HolderState(state).value, "now": float(now),
            }
            for digest in dict.fromkeys(digests)
        ]  # fmt: skip
        if not rows:
            return
        with self._session(is_write=True) as session:
            session.execute_many(RECORD_CHUNK.text(self._dialect), rows)

    def forget_chunks(self, worker_id: str, digests: Sequence[str] | None = None) -> int:
        """Drop the worker's holds on these chunks (None: on all); return how many."""
        if digests is None:
            return self._change(FORGET_ALL_CHUNKS, {"worker_id": worker_id})
        if not digests:
            return 0
        params = {"worker_id": worker_id, "digests": list_param(digests, self._dialect)}
        return self._change(FORGET_CHUNKS, params)

    def touch_chunks(self, worker_id: str, now: float) -> int:
        """Stamp every hold of the worker with `now` (its liveness); return how many."""
        return self._change(TOUCH_CHUNKS, {"worker_id": worker_id, "now": float(now)})

    def chunk_holders(self, digests: Sequence[str]) -> list[ChunkHolder]:
        """Return every hold on these chunks, by digest then worker id."""
        if not digests:
            return []
        params = {"digests": list_param(digests, self._dialect)}
        return [ChunkHolder.from_row(row) for row in self._rows(CHUNK_HOLDERS, params)]
