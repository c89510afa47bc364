"""Which shard a runner claims next: fair shares across tenants, paused tenants skipped.

The runner lists the in-progress batches it may run, groups them by tenant, and tries the
tenants in the order `FairShare` ranks them, claiming only among one tenant's batches at a
time (oldest batch first within a tenant). The claimed lines are charged to the tenant, so
the next claim sees its use. A paused tenant (its monthly budget spent) is skipped: its
batches stay in progress and run again once it is no longer paused.
"""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.jobs.context import JobsContext
from conveyor.stores.records import BatchRecord, ShardLease


def batches_by_tenant(batches: Sequence[BatchRecord]) -> dict[str, list[str]]:
    """Batch ids by tenant, tenants and their batches in the given (oldest first) order."""
    grouped: dict[str, list[str]] = {}
    for batch in batches:
        grouped.setdefault(batch.tenant, []).append(batch.id)
    return grouped


async def claim_fairly(ctx: JobsContext, batches: Sequence[BatchRecord]) -> ShardLease | None:
    """Lease a shard of the neediest tenant that has one claimable, or None."""
    grouped = batches_by_tenant(batches)
    cfg = ctx.config
    now_s = ctx.clock()
    for tenant in ctx.fair_share.order(grouped, now_s):
        if ctx.is_tenant_paused is not None and await ctx.is_tenant_paused(tenant):
            continue
        lease = await ctx.store.claim_shard(ctx.worker_id, now_s, cfg.lease_s, grouped[tenant])
        if lease is not None:
            ctx.fair_share.charge(tenant, lease.num_lines, now_s)
            return lease
    return None
