"""What the job store offers, one small protocol per aggregate.

The API, the planner and the shard runners program against these: files, batches, shards
with their leases, the result cache, and stored responses. (The worker registry, which
shares the database, is the fleet's: see `conveyor.fleet.registry_store`.) `SqlJobStore`
implements all of them over SQLite or PostgreSQL; `conveyor.fakes` implements them in memory
for tests.

Calls block and are thread-safe; async code uses an async facade that runs each call in a
worker thread. Every time argument is explicit (`now`, unix seconds) so callers own the
clock. The store holds references (byte ranges, object keys), not batch prompts or outputs;
the exceptions are the result cache's bodies and stored responses (Responses API), which are
a conversation's state by design.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, Protocol, runtime_checkable

from conveyor.stores.model_records import ChunkHolder, HolderState, ManifestRecord
from conveyor.stores.records import (
    BatchRecord,
    BatchStatus,
    FileRecord,
    ShardLease,
    ShardRecord,
    ShardSpec,
    ShardStatus,
)
from conveyor.stores.response_records import ResponseStatus, StoredResponse
from conveyor.stores.tenant_records import ApiKeyRecord, UsageRow

# OpenAI's page-size limits: files list up to 10 000, batches list up to 100.
MAX_FILES_PAGE = 10_000
MAX_BATCHES_PAGE = 100

# A list's direction by creation: OpenAI's `order` query parameter (`desc` is its default).
ListOrder = Literal["asc", "desc"]


class FileStore(Protocol):
    """Uploaded and result files' records (their bytes are in the object store)."""

    def create_file(self, rec: FileRecord) -> None:
        """Insert a file record (its bytes are already in the object store)."""
        ...

    def get_file(self, tenant: str, file_id: str) -> FileRecord | None:
        """Return the tenant's file, or None (also for another tenant's file)."""
        ...

    def list_files(
        self,
        tenant: str,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = MAX_FILES_PAGE,
        *,
        order: ListOrder = "desc",
    ) -> list[FileRecord]:
        """Return the tenant's files newest first (oldest first for `asc`), after the id `after`.

        An unknown `after` id yields an empty page. Ask for `limit + 1` to learn `has_more`.
        """
        ...

    def delete_file(self, tenant: str, file_id: str) -> bool:
        """Delete the tenant's file record; return whether it existed."""
        ...

    def expired_files(self, now: float, limit: int) -> list[FileRecord]:
        """Return up to `limit` files of any tenant whose `expires_at` is at or before `now`.

        Soonest expired first; the caller deletes them (record and bytes).
        """
        ...


class BatchStore(Protocol):
    """Batches and their lifecycle (`request_counts` derive from the shards)."""

    def create_batch(self, rec: BatchRecord) -> None:
        """Insert a batch (its `request_counts` are ignored: they derive from shards)."""
        ...

    def get_batch(self, tenant: str, batch_id: str) -> BatchRecord | None:
        """Return the tenant's batch, or None (also for another tenant's batch)."""
        ...

    def get_batch_any(self, batch_id: str) -> BatchRecord | None:
        """Return a batch regardless of tenant (for workers and the planner)."""
        ...

    def list_batches(
        self,
        tenant: str,
        after: str | None = None,
        limit: int = 20,
        *,
        order: ListOrder = "desc",
        endpoint: str | None = None,
    ) -> list[BatchRecord]:
        """Return the tenant's batches newest first (oldest first for `asc`), starting after
        the batch id `after`; with `endpoint`, only the batches of that endpoint."""
        ...

    def delete_batch(self, tenant: str, batch_id: str) -> bool:
        """Delete the tenant's batch and its shards; return whether it existed.

        Its files (records and bytes) are the caller's to delete.
        """
        ...

    def transition(
        self,
        batch_id: str,
        from_statuses: Iterable[BatchStatus],
        to_status: BatchStatus,
        now: float,
        **fields: object,
    ) -> bool:
        """Compare-and-set the status, stamp the matching `*_at` (`int(now)`), apply `fields`.

        False (nothing changed) when the batch is missing or not in one of `from_statuses`.
        Which edges the lifecycle allows is the caller's rule (`conveyor.jobs.leases`).
        """
        ...

    def update_batch_fields(self, batch_id: str, **fields: object) -> bool:
        """Update non-status fields of a batch; return whether it exists.

        Allowed fields: metadata, model, expires_at, output_file_id, error_file_id, errors.
        """
        ...

    def batches_in_status(self, statuses: Iterable[BatchStatus]) -> list[BatchRecord]:
        """Return every batch (any tenant) in one of `statuses`, oldest first."""
        ...


class StragglerPolicy(Protocol):
    """When a running shard deserves a speculative second run (see `jobs.leases`)."""

    @property
    def min_running_s(self) -> float:
        """No shard running for less than this is a straggler."""
        ...

    def is_straggler(self, running_s: float, run_times_s: Sequence[float]) -> bool:
        """Whether a shard running for `running_s` lags its batch's committed `run_times_s`."""
        ...


class ShardStore(Protocol):
    """A batch's shards and the leases workers hold on them, fenced by attempt."""

    def add_shards(self, batch_id: str, shards: Sequence[ShardSpec]) -> None:
        """Insert all shards of a batch in one transaction."""
        ...

    def list_shards(self, batch_id: str) -> list[ShardRecord]:
        """Return the batch's shards ordered by index."""
        ...

    def claim_shard(
        self, worker_id: str, now: float, lease_s: float, batch_ids: Iterable[str] | None = None
    ) -> ShardLease | None:
        """Atomically lease one claimable shard of an in-progress batch, oldest batch first.

        Claimable: pending, or leased with an expired lease. The claim increments `attempt`
        and resets the shard's progress, fencing the previous holder out.
        """
        ...

    def claim_speculative(
        self, worker_id: str, now: float, lease_s: float, policy: StragglerPolicy
    ) -> ShardLease | None:
        """Lease a second, speculative run of a straggling shard held by another worker."""
        ...

    def renew_lease(self, lease: ShardLease, now: float, lease_s: float) -> bool:
        """Extend the lease to `now + lease_s` if this attempt still holds the shard."""
        ...

    def report_progress(self, lease: ShardLease, num_completed: int, num_failed: int) -> bool:
        """Record this attempt's progress (fenced by attempt); False for a stale attempt."""
        ...

    def commit_shard(
        self,
        lease: ShardLease,
        now: float,
        output_key: str | None,
        error_key: str | None,
        num_completed: int,
        num_failed: int,
        usage: Sequence[UsageRow] = (),
    ) -> bool:
        """Mark the shard done with its outputs, only while this attempt's lease is live.

        `usage` (its lines' per-minute usage) is added to the ledger and its tokens to the
        shard's in the same transaction: a commit never loses or repeats a line's usage.
        """
        ...

    def release_shard(self, lease: ShardLease) -> bool:
        """Give a leased shard back (pending) without finishing it, e.g. when draining."""
        ...

    def count_shards(self, batch_id: str) -> dict[ShardStatus, int]:
        """Return the number of the batch's shards in each status (all statuses present)."""
        ...


class ResultCacheStore(Protocol):
    """Response bodies under content-addressed keys; one round trip per batch of keys."""

    def cache_get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """Return the cached value of each key that has one."""
        ...

    def cache_put_many(self, entries: Mapping[str, bytes]) -> None:
        """Store values under their keys; keys already present keep their value."""
        ...


@runtime_checkable
class ApiKeyStore(Protocol):
    """API keys by hash: created by the `keys` command, read by every gateway's key ring."""

    def create_api_key(self, rec: ApiKeyRecord) -> None:
        """Insert a key record; a second key with its id or digest raises StoreError."""
        ...

    def list_api_keys(self, *, include_revoked: bool = True) -> list[ApiKeyRecord]:
        """Return the keys oldest first (revoked ones only with `include_revoked`)."""
        ...

    def revoke_api_key(self, key_id: str, now: float) -> bool:
        """Stamp the key revoked; False when it is unknown or already revoked."""
        ...

    def touch_api_keys(self, key_ids: Sequence[str], now: float) -> None:
        """Record that the keys were used at `now` (a later stamp is never moved back)."""
        ...

    def close(self) -> None:
        """Release connections; later calls raise StoreError."""
        ...


class ModelStore(Protocol):
    """Pushed models' manifests, and the tracker: which worker holds which chunk."""

    def put_manifest(self, rec: ManifestRecord) -> None:
        """Record a model's manifest under its name, replacing an older one."""
        ...

    def get_manifest(self, name: str) -> ManifestRecord | None:
        """Return the model's manifest, or None."""
        ...

    def list_manifests(self) -> list[ManifestRecord]:
        """Return every pushed model, by name."""
        ...

    def delete_manifest(self, name: str) -> bool:
        """Forget a model's manifest; return whether it existed."""
        ...

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
        ...

    def forget_chunks(self, worker_id: str, digests: Sequence[str] | None = None) -> int:
        """Drop the worker's holds on these chunks (None: on all); return how many."""
        ...

    def touch_chunks(self, worker_id: str, now: float) -> int:
        """Stamp every hold of the worker with `now` (its liveness); return how many."""
        ...

    def chunk_holders(self, digests: Sequence[str]) -> list[ChunkHolder]:
        """Return every hold on these chunks, by digest then worker id."""
        ...


class UsageStore(Protocol):
    """The usage ledger: per tenant, model and minute, summed on write."""

    def add_usage(self, rows: Sequence[UsageRow]) -> None:
        """Add each row to the ledger's row of its key (created at zero), in one transaction."""
        ...

    def list_usage(
        self, start_s: int, end_s: int | None = None, tenant: str | None = None
    ) -> list[UsageRow]:
        """Rows with `start_s <= minute_start < end_s` (of `tenant`, or all), oldest first."""
        ...


class ResponseStore(Protocol):
    """Stored responses (Responses API), per tenant; background runs leased by attempt."""

    def create_response(self, rec: StoredResponse) -> None:
        """Insert a response; a second one with its id raises StoreError."""
        ...

    def get_response(self, tenant: str, response_id: str) -> StoredResponse | None:
        """Return the tenant's response, or None (also for another tenant's)."""
        ...

    def delete_response(self, tenant: str, response_id: str) -> bool:
        """Delete the tenant's response; return whether it existed."""
        ...

    def claimable_responses(self, now: float, limit: int) -> list[tuple[str, str]]:
        """Return up to `limit` background responses runnable at `now`, oldest first, as
        (id, model) pairs: queued, or in progress under a lease expired by `now`."""
        ...

    def claim_response(
        self, response_id: str, worker_id: str, now: float, lease_s: float
    ) -> StoredResponse | None:
        """Atomically lease a claimable response to `worker_id` until `now + lease_s`, with
        `attempt` one higher (fencing the previous holder out); the claimed row, or None."""
        ...

    def renew_response(self, rec: StoredResponse, now: float, lease_s: float) -> bool:
        """Extend the lease of the claimed `rec` while its attempt holds the run."""
        ...

    def finish_response(
        self, rec: StoredResponse, status: ResponseStatus, body: str, usage: Sequence[UsageRow] = ()
    ) -> bool:
        """End the claimed run with `status` and `body` (its job and lease dropped), adding
        `usage` to the ledger in the same transaction, only while its attempt holds it."""
        ...

    def release_response(self, rec: StoredResponse) -> bool:
        """Give the claimed run back (queued again) while its attempt holds it."""
        ...

    def cancel_response(self, tenant: str, response_id: str, body: str) -> bool:
        """Move the tenant's queued or running response to cancelled with `body`."""
        ...


class JobStore(
    FileStore,
    BatchStore,
    ShardStore,
    ResultCacheStore,
    ApiKeyStore,
    ModelStore,
    UsageStore,
    ResponseStore,
    Protocol,
):
    """Every aggregate of one job store database, and the means to close it."""

    def close(self) -> None:
        """Release connections; later calls raise StoreError."""
        ...
