"""Shards and their leases over SQL: claims, fenced renewals, commits and releases.

Every lease operation names the attempt it believes it holds (`_fence`), so a worker whose
lease was taken over can no longer change the shard. When a lease is live is written once,
in `sql_queries.live_lease`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from conveyor.stores import sql_queries as q
from conveyor.stores.errors import StoreError
from conveyor.stores.protocols import StragglerPolicy
from conveyor.stores.records import ShardLease, ShardRecord, ShardSpec, ShardStatus
from conveyor.stores.sql_base import SqlStore
from conveyor.stores.sql_queries import SqlSession
from conveyor.stores.sql_usage import ADD_SHARD_TOKENS, add_usage_rows
from conveyor.stores.tenant_records import UsageRow


class SqlShardStore(SqlStore):
    """`ShardStore` over SQL."""

    def add_shards(self, batch_id: str, shards: Sequence[ShardSpec]) -> None:
        """Insert all shards of a batch in one transaction.

        Raises ValueError for duplicate indices and StoreError when the batch does not exist
        or already has a shard with one of these indices.
        """
        indices = [s.index for s in shards]
        if len(set(indices)) != len(indices):
            raise ValueError(f"duplicate shard indices for {batch_id}: {sorted(indices)}")
        rows = [
            {
                "batch_id": batch_id,
                "shard_index": s.index,
                "byte_start": s.byte_start,
                "byte_end": s.byte_end,
                "first_line": s.first_line,
                "num_lines": s.num_lines,
            }
            for s in shards
        ]
        with self._session(is_write=True) as session:
            if not session.query(q.BATCH_EXISTS.text(self._dialect), {"id": batch_id}):
                raise StoreError(f"cannot add shards: no batch {batch_id}")
            if rows:
                session.execute_many(q.INSERT_SHARD.text(self._dialect), rows)

    def list_shards(self, batch_id: str) -> list[ShardRecord]:
        """Return the batch's shards ordered by index."""
        rows = self._rows(q.LIST_SHARDS, {"batch_id": batch_id})
        return [ShardRecord.from_row(row) for row in rows]

    def claim_shard(
        self, worker_id: str, now: float, lease_s: float, batch_ids: Iterable[str] | None = None
    ) -> ShardLease | None:
        """Atomically lease one claimable shard of an in-progress batch, oldest batch first.

        Claimable: pending, or leased with an expired lease. The claim increments `attempt`
        and resets the shard's progress, so the previous holder is fenced out and its counts
        stop contributing to the batch. `batch_ids` restricts the claim to those batches.
        Returns None when nothing is claimable (or, on PostgreSQL, when every candidate is
        being claimed by someone else at this instant).
        """
        _require_worker(worker_id)
        _check_lease_s(lease_s)
        params = {
            "worker_id": worker_id,
            "now": float(now),
            "lease_expires_at": float(now) + float(lease_s),
            "all_batches": batch_ids is None,
            "batch_ids": q.list_param(batch_ids or (), self._dialect),
        }
        with self._session(is_write=True) as session:
            rows = session.query(q.CLAIM_SHARD.text(self._dialect), params)
        return ShardLease.from_row(rows[0]) if rows else None

    def claim_speculative(
        self, worker_id: str, now: float, lease_s: float, policy: StragglerPolicy
    ) -> ShardLease | None:
        """Lease a speculative run of the oldest straggler on another worker, or None.

        The original attempt keeps its lease; both may commit and the first one wins. At most
        one speculative run per shard; a reclaim or release of the original ends it.
        """
        _require_worker(worker_id)
        _check_lease_s(lease_s)
        probe = {"worker_id": worker_id, "now": float(now)}
        probe["started_before"] = float(now) - policy.min_running_s
        with self._session(is_write=True) as session:
            candidates = session.query(q.SPECULATION_CANDIDATES.text(self._dialect), probe)
            run_times: dict[str, list[float]] = {}
            for batch_id, index, attempt, started_at in candidates:
                if batch_id not in run_times:
                    run_times[batch_id] = self._run_times(session, batch_id)
                if not policy.is_straggler(float(now) - float(started_at), run_times[batch_id]):
                    continue
                claim = {"batch_id": batch_id, "shard_index": index, "attempt": attempt}
                claim |= {"worker_id": worker_id, "lease_expires_at": float(now) + lease_s}
                rows = session.query(q.CLAIM_SPECULATIVE.text(self._dialect), claim)
                if rows:
                    return ShardLease.from_row(rows[0], is_speculative=True)
        return None

    def _run_times(self, session: SqlSession, batch_id: str) -> list[float]:
        """How long each committed shard of the batch ran, in seconds."""
        rows = session.query(q.SHARD_RUN_TIMES.text(self._dialect), {"batch_id": batch_id})
        return [float(row[0]) for row in rows]

    def renew_lease(self, lease: ShardLease, now: float, lease_s: float) -> bool:
        """Extend the lease to `now + lease_s` if this attempt still holds the shard.

        False once another attempt took the shard over or it was committed or released. An
        expired lease nobody took over yet can still be renewed: the attempt is still the
        newest, so no other worker can hold the shard.
        """
        _check_lease_s(lease_s)
        params = _fence(lease) | {"lease_expires_at": float(now) + float(lease_s)}
        query = q.RENEW_SPECULATIVE if lease.is_speculative else q.RENEW_LEASE
        return self._change(query, params) > 0

    def report_progress(self, lease: ShardLease, num_completed: int, num_failed: int) -> bool:
        """Record this attempt's progress (fenced by attempt); False for a stale attempt."""
        _check_counts(lease, num_completed, num_failed)
        if lease.is_speculative:
            # The batch's counts follow the original; a speculative run only proves it holds.
            return bool(self._rows(q.SPECULATIVE_HELD, _fence(lease)))
        params = _fence(lease) | {"num_completed": num_completed, "num_failed": num_failed}
        return self._change(q.REPORT_PROGRESS, params) > 0

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

        `usage` goes into the ledger and its tokens onto the shard in the same transaction.
        Returns False and changes nothing when the attempt is stale, the lease expired, or the
        shard was already committed or released.
        """
        _check_counts(lease, num_completed, num_failed)
        params = _fence(lease) | {
            "now": float(now),
            "output_key": output_key,
            "error_key": error_key,
            "num_completed": num_completed,
            "num_failed": num_failed,
        }
        query = q.COMMIT_SPECULATIVE if lease.is_speculative else q.COMMIT_SHARD
        with self._session(is_write=True) as session:
            if session.execute(query.text(self._dialect), params) == 0:
                return False
            tokens = {
                "batch_id": lease.batch_id,
                "shard_index": lease.index,
                "input_tokens": sum(row.input_tokens for row in usage),
                "output_tokens": sum(row.output_tokens for row in usage),
            }
            session.execute(ADD_SHARD_TOKENS.text(self._dialect), tokens)
            add_usage_rows(session, self._dialect, usage)
        return True

    def release_shard(self, lease: ShardLease) -> bool:
        """Give a leased shard back (pending) without finishing it, e.g. when draining.

        The attempt counter is kept, so the released attempt stays fenced out. Releasing a
        speculative lease only frees its slot; the original keeps running.
        """
        query = q.RELEASE_SPECULATIVE if lease.is_speculative else q.RELEASE_SHARD
        return self._change(query, _fence(lease)) > 0

    def count_shards(self, batch_id: str) -> dict[ShardStatus, int]:
        """Return the number of the batch's shards in each status (all statuses present)."""
        counts = dict.fromkeys(ShardStatus, 0)
        for status, num in self._rows(q.COUNT_SHARDS, {"batch_id": batch_id}):
            counts[ShardStatus(status)] = int(num)
        return counts


def _check_lease_s(lease_s: float) -> None:
    """Reject non-positive lease durations."""
    if lease_s <= 0:
        raise ValueError(f"lease_s must be > 0, got {lease_s}")


def _require_worker(worker_id: str) -> None:
    """Reject an empty worker id (it would make every lease look unowned)."""
    if not worker_id:
        raise ValueError("worker_id must be a non-empty string")


def _check_counts(lease: ShardLease, num_completed: int, num_failed: int) -> None:
    """Reject negative counts and counts exceeding the shard's lines."""
    if num_completed < 0 or num_failed < 0:
        raise ValueError(f"counts must be >= 0, got {num_completed}, {num_failed}")
    if num_completed + num_failed > lease.num_lines:
        raise ValueError(
            f"{num_completed} completed + {num_failed} failed exceeds the shard's "
            f"{lease.num_lines} lines"
        )


def _fence(lease: ShardLease) -> dict[str, object]:
    """Parameters identifying the exact shard attempt a lease operation applies to."""
    return {
        "batch_id": lease.batch_id,
        "shard_index": lease.index,
        "attempt": lease.attempt,
        "worker_id": lease.worker_id,
    }
