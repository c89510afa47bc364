"""In-memory shards and leases, and the lock and state every in-memory aggregate shares."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

from conveyor.jobs.leases import is_live
from conveyor.stores.errors import StoreError
from conveyor.stores.protocols import StragglerPolicy
from conveyor.stores.records import (
    BatchRecord,
    BatchStatus,
    FileRecord,
    ShardLease,
    ShardRecord,
    ShardSpec,
    ShardStatus,
    WorkerRecord,
)
from conveyor.stores.tenant_records import ApiKeyRecord, UsageRow

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclasses.dataclass(slots=True)
class _Shard:
    """A shard row, with the speculative holder's slot the records do not show."""

    record: ShardRecord
    spec_owner: str | None = None
    spec_expires_at: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    # The highest counts any attempt reported (a reclaim does not reset them).
    peak_completed: int = 0
    peak_failed: int = 0

    def raise_peaks(self, num_completed: int, num_failed: int) -> None:
        """Keep the highest counts reported so far."""
        self.peak_completed = max(self.peak_completed, num_completed)
        self.peak_failed = max(self.peak_failed, num_failed)


def op(method: _F) -> _F:
    """Run a store operation under the store's lock, failing once the store is closed."""

    @functools.wraps(method)
    def locked(self: MemoryBase, /, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._is_closed:
                raise StoreError("job store is closed")
            return method(self, *args, **kwargs)

    return cast(_F, locked)


class MemoryBase:
    """State shared by the in-memory aggregates: one lock, one insertion counter."""

    def __init__(self) -> None:
        """An empty store."""
        self._lock = threading.RLock()
        self._is_closed = False
        self._seq = itertools.count()
        self._files: dict[str, tuple[int, FileRecord]] = {}
        self._batches: dict[str, tuple[int, BatchRecord]] = {}
        self._shards: dict[str, dict[int, _Shard]] = {}
        self._cache: dict[str, bytes] = {}
        self._workers: dict[str, tuple[WorkerRecord, float]] = {}
        self._api_keys: dict[str, ApiKeyRecord] = {}
        self._usage: dict[tuple[str, str, int], UsageRow] = {}

    def _fold_usage(self, rows: Sequence[UsageRow]) -> None:
        """Add rows to the ledger (the caller holds the lock)."""
        for row in rows:
            held = self._usage.get(row.key)
            self._usage[row.key] = row if held is None else held.plus(row)

    def close(self) -> None:
        """Later calls raise StoreError. Safe to call twice."""
        with self._lock:
            self._is_closed = True


class MemoryShards(MemoryBase):
    """`ShardStore` in memory: the same claims, fences and expiry as the SQL store."""

    # -- shards and leases -----------------------------------------------------------------

    @op
    def add_shards(self, batch_id: str, shards: Sequence[ShardSpec]) -> None:
        """Insert all shards of a batch, or none of them."""
        indices = [s.index for s in shards]
        if len(set(indices)) != len(indices):
            raise ValueError(f"duplicate shard indices for {batch_id}: {sorted(indices)}")
        if batch_id not in self._batches:
            raise StoreError(f"cannot add shards: no batch {batch_id}")
        rows = self._shards.setdefault(batch_id, {})
        if set(indices) & set(rows):
            raise StoreError(f"batch {batch_id} already has some of shards {sorted(indices)}")
        for spec in shards:
            rows[spec.index] = _Shard(_new_shard(batch_id, spec))

    @op
    def list_shards(self, batch_id: str) -> list[ShardRecord]:
        """The batch's shards ordered by index."""
        return [s.record for _, s in sorted(self._shards.get(batch_id, {}).items())]

    @op
    def claim_shard(
        self, worker_id: str, now: float, lease_s: float, batch_ids: Iterable[str] | None = None
    ) -> ShardLease | None:
        """Lease the first claimable shard of the oldest in-progress batch, or None."""
        _check_lease(worker_id, lease_s)
        allowed = None if batch_ids is None else set(batch_ids)
        for shard in self._running_shards():
            rec = shard.record
            if allowed is not None and rec.batch_id not in allowed:
                continue
            if rec.status is ShardStatus.PENDING or (
                rec.status is ShardStatus.LEASED and not is_live(rec.lease_expires_at, now)
            ):
                shard.spec_owner = shard.spec_expires_at = None
                shard.record = dataclasses.replace(
                    rec, status=ShardStatus.LEASED, attempt=rec.attempt + 1,
                    lease_owner=worker_id, lease_expires_at=float(now) + lease_s,
                    num_completed=0, num_failed=0, output_key=None, error_key=None,
                    started_at=float(now), committed_at=None,
                )  # fmt: skip
                return _lease(shard.record, worker_id, float(now) + lease_s)
        return None

    @op
    def claim_speculative(
        self, worker_id: str, now: float, lease_s: float, policy: StragglerPolicy
    ) -> ShardLease | None:
        """Lease a speculative run of the oldest straggler on another worker, or None."""
        _check_lease(worker_id, lease_s)
        candidates = [
            s for s in self._running_shards()
            if s.record.status is ShardStatus.LEASED and s.spec_owner is None
            and is_live(s.record.lease_expires_at, now) and s.record.lease_owner != worker_id
            and (s.record.started_at or 0.0) <= now - policy.min_running_s
        ]  # fmt: skip
        batch_order = {
            b: i for i, b in enumerate(dict.fromkeys(s.record.batch_id for s in candidates))
        }
        candidates.sort(key=lambda s: (batch_order[s.record.batch_id], s.record.started_at))
        for shard in candidates:
            rec = shard.record
            if policy.is_straggler(now - (rec.started_at or 0.0), self._run_times(rec.batch_id)):
                shard.spec_owner, shard.spec_expires_at = worker_id, float(now) + lease_s
                return _lease(rec, worker_id, shard.spec_expires_at, is_speculative=True)
        return None

    @op
    def renew_lease(self, lease: ShardLease, now: float, lease_s: float) -> bool:
        """Extend a held lease to `now + lease_s`."""
        _check_lease(lease.worker_id or "-", lease_s)
        shard = self._held(lease)
        if shard is None:
            return False
        if lease.is_speculative:
            shard.spec_expires_at = float(now) + lease_s
        else:
            shard.record = dataclasses.replace(shard.record, lease_expires_at=float(now) + lease_s)
        return True

    @op
    def report_progress(self, lease: ShardLease, num_completed: int, num_failed: int) -> bool:
        """Record a held attempt's progress (a speculative run only proves it holds)."""
        _check_counts(lease, num_completed, num_failed)
        shard = self._held(lease)
        if shard is None:
            return False
        if not lease.is_speculative:
            shard.record = dataclasses.replace(
                shard.record, num_completed=num_completed, num_failed=num_failed
            )
            shard.raise_peaks(num_completed, num_failed)
        return True

    @op
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
        """Mark the shard done, only while this attempt's lease is live; add its usage."""
        _check_counts(lease, num_completed, num_failed)
        shard = self._held(lease)
        if shard is None or not is_live(_expiry(shard, lease), now):
            return False
        shard.spec_owner = shard.spec_expires_at = None
        shard.record = dataclasses.replace(
            shard.record, status=ShardStatus.DONE, output_key=output_key, error_key=error_key,
            num_completed=num_completed, num_failed=num_failed, committed_at=float(now),
            lease_expires_at=None,
        )  # fmt: skip
        shard.raise_peaks(num_completed, num_failed)
        shard.input_tokens = sum(row.input_tokens for row in usage)
        shard.output_tokens = sum(row.output_tokens for row in usage)
        self._fold_usage(usage)
        return True

    @op
    def release_shard(self, lease: ShardLease) -> bool:
        """Give a held shard back (a speculative lease frees only its slot)."""
        shard = self._held(lease)
        if shard is None:
            return False
        shard.spec_owner = shard.spec_expires_at = None
        if not lease.is_speculative:
            shard.record = dataclasses.replace(
                shard.record, status=ShardStatus.PENDING, lease_owner=None,
                lease_expires_at=None, num_completed=0, num_failed=0, started_at=None,
            )  # fmt: skip
        return True

    @op
    def count_shards(self, batch_id: str) -> dict[ShardStatus, int]:
        """The number of the batch's shards in each status."""
        counts = dict.fromkeys(ShardStatus, 0)
        for shard in self._shards.get(batch_id, {}).values():
            counts[shard.record.status] += 1
        return counts

    def _running_shards(self) -> Iterator[_Shard]:
        """Shards of in-progress batches, oldest batch first, by index."""
        for seq_rec in sorted(self._batches.values(), key=lambda x: x[0]):
            if seq_rec[1].status is BatchStatus.IN_PROGRESS:
                yield from (s for _, s in sorted(self._shards.get(seq_rec[1].id, {}).items()))

    def _run_times(self, batch_id: str) -> list[float]:
        """How long each committed shard of the batch ran."""
        done = [s.record for s in self._shards.get(batch_id, {}).values()]
        return [
            r.committed_at - r.started_at
            for r in done
            if r.status is ShardStatus.DONE
            and r.committed_at is not None
            and r.started_at is not None
        ]

    def _held(self, lease: ShardLease) -> _Shard | None:
        """The shard if `lease` (its attempt and holder) still holds it, else None."""
        shard = self._shards.get(lease.batch_id, {}).get(lease.index)
        if shard is None or shard.record.status is not ShardStatus.LEASED:
            return None
        owner = shard.spec_owner if lease.is_speculative else shard.record.lease_owner
        is_held = shard.record.attempt == lease.attempt and owner == lease.worker_id
        return shard if is_held else None


def _new_shard(batch_id: str, spec: ShardSpec) -> ShardRecord:
    """A pending shard that no attempt has run yet."""
    return ShardRecord(
        batch_id=batch_id, index=spec.index, byte_start=spec.byte_start,
        byte_end=spec.byte_end, first_line=spec.first_line, num_lines=spec.num_lines,
        status=ShardStatus.PENDING, attempt=0, lease_owner=None, lease_expires_at=None,
        output_key=None, error_key=None, num_completed=0, num_failed=0, started_at=None,
        committed_at=None,
    )  # fmt: skip


def _lease(
    rec: ShardRecord, worker_id: str, expires_at: float, *, is_speculative: bool = False
) -> ShardLease:
    """The lease `worker_id` holds on the shard's current attempt until `expires_at`."""
    return ShardLease(
        batch_id=rec.batch_id, index=rec.index, attempt=rec.attempt, worker_id=worker_id,
        lease_expires_at=expires_at, byte_start=rec.byte_start, byte_end=rec.byte_end,
        first_line=rec.first_line, num_lines=rec.num_lines, is_speculative=is_speculative,
    )  # fmt: skip


def _expiry(shard: _Shard, lease: ShardLease) -> float | None:
    """When the holder slot `lease` names expires."""
    return shard.spec_expires_at if lease.is_speculative else shard.record.lease_expires_at


def _check_lease(worker_id: str, lease_s: float) -> None:
    """Reject an empty worker id and a non-positive lease."""
    if not worker_id:
        raise ValueError("worker_id must be a non-empty string")
    if lease_s <= 0:
        raise ValueError(f"lease_s must be > 0, got {lease_s}")


def _check_counts(lease: ShardLease, num_completed: int, num_failed: int) -> None:
    """Reject negative counts and counts exceeding the shard's lines."""
    if num_completed < 0 or num_failed < 0:
        raise ValueError(f"counts must be >= 0, got {num_completed}, {num_failed}")
    if num_completed + num_failed > lease.num_lines:
        raise ValueError(f"{num_completed + num_failed} results exceed {lease.num_lines} lines")
