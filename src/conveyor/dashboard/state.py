"""``GET /v1/dashboard/state``: what an on-call person needs, as one JSON document.

Counters are totals since the process started and histograms are cumulative buckets:
a reader derives rates and windowed p50/p99 from the difference between two polls (the
page polls every 2 s). Every field is in docs/operations/dashboard.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from conveyor.dashboard.metrics_read import MetricReader
from conveyor.jobs.stalls import STALL_CODES
from conveyor.jobs.views import reported_counts
from conveyor.stores.records import BatchRecord
from conveyor.stores.tenant_records import UsageRow

if TYPE_CHECKING:
    from conveyor.gateway.process import Gateway

USAGE_WINDOW_S = 3600
TENANTS_NOTE = (
    "usage over the last hour from the ledger; a tenant key sees its own tenant, an admin "
    "key or no keys at all everything"
)


def viewer(tenant: str, has_keys: bool) -> dict[str, Any]:
    """Who is looking and what they may see."""
    return {"tenant": tenant, "scope": "tenant" if has_keys else "all"}


def common_figures(reader: MetricReader, name: str, kind: str) -> dict[str, Any]:
    """Figures every served model has."""
    return {
        "name": name,
        "kind": kind,
        "queue_depth": reader.by_label("conveyor_queue_depth", name),
        "totals": {
            "requests": reader.by_label("conveyor_requests_total", name),
            "inputs": reader.value("conveyor_inputs_processed_total", name),
            "generated_tokens": reader.value("conveyor_generated_tokens_total", name),
            "batches": reader.value("conveyor_batch_size_inputs_count", name),
            "batch_inputs": reader.value("conveyor_batch_size_inputs_sum", name),
            "batch_fill_sum": reader.value("conveyor_batch_fill_ratio_sum", name),
        },
        "histograms": {
            "latency_s": reader.histogram("conveyor_request_latency_seconds", name, "online"),
            "batch_latency_s": reader.histogram("conveyor_request_latency_seconds", name, "batch"),
        },
    }


def gateway_models(gateway: Gateway) -> list[dict[str, Any]]:
    """Per model, what this gateway sees: its requests and the fleet's scaling signal."""
    reader = MetricReader(gateway.metrics.registry)
    return [
        {
            "name": name,
            "kind": "fleet",
            "queue_depth": {"fleet": reader.value("conveyor_fleet_queue_depth", name)},
            "running": None,
            "kv_blocks": None,
            "totals": {
                "requests": reader.by_label("conveyor_gateway_requests_total", name),
                "retries": reader.by_label("conveyor_gateway_retries_total", name),
            },
            "histograms": {
                "latency_s": reader.histogram("conveyor_gateway_request_latency_seconds", name)
            },
            "arrival_per_s": reader.value("conveyor_fleet_arrival_rate_inputs_per_second", name),
            "desired_replicas": reader.value("conveyor_desired_replicas", name),
            "config": None,
            "plan": None,
        }
        for name in sorted(reader.models())
    ]


def job_row(record: BatchRecord) -> dict[str, Any]:
    """One batch job: status and counts as the Batch object reports them (the page derives
    lines/s and ETA)."""
    counts = reported_counts(record)
    return {
        "id": record.id,
        "tenant": record.tenant,
        "status": record.status.value,
        "endpoint": record.endpoint,
        "model": record.model,
        "created_at": record.created_at,
        "in_progress_at": record.in_progress_at,
        "total": counts.total,
        "completed": counts.completed,
        "failed": counts.failed,
        "stall": stall_of(record),
    }


def stall_of(record: BatchRecord) -> dict[str, Any] | None:
    """The batch's stall note (`code`, `since`, `message`), or None when it is not stalled."""
    for error in record.errors or ():
        if error.code in STALL_CODES:
            return {"code": error.code, "since": error.since, "message": error.message}
    return None


def tenant_usage(rows: Iterable[UsageRow]) -> list[dict[str, Any]]:
    """Ledger rows summed per tenant: requests, tokens, model-seconds, cost (most cost first)."""
    totals: dict[str, dict[str, Any]] = {}
    for row in rows:
        total = totals.setdefault(row.tenant, {
            "tenant": row.tenant, "requests": 0, "input_tokens": 0, "output_tokens": 0,
            "model_seconds": 0.0, "cost_usd": 0.0,
        })  # fmt: skip
        total["requests"] += row.num_requests
        total["input_tokens"] += row.input_tokens
        total["output_tokens"] += row.output_tokens
        total["model_seconds"] += row.model_s
        total["cost_usd"] += row.cost_usd
    return sorted(totals.values(), key=lambda t: (-t["cost_usd"], t["tenant"]))


def model_pulls(reader: MetricReader, now_s: float) -> list[dict[str, Any]]:
    """Model pulls running in this process: bytes held of the total, and since when."""
    pulls = []
    for model in sorted(reader.values.get("conveyor_model_pull_bytes", {})):
        total = reader.value("conveyor_model_pull_bytes", model, "total")
        held = min(total, reader.value("conveyor_model_pull_bytes", model, "held"))
        started = reader.value("conveyor_model_pull_started_seconds", model)
        pulls.append({
            "model": model, "held_bytes": held, "total_bytes": total,
            "progress": held / total if total > 0 else None,
            "running_s": round(max(0.0, now_s - started), 3) if started > 0 else None,
        })  # fmt: skip
    return pulls


def tenant_limits(
    refusals: Iterable[tuple[str, str, float]],
    budget_refusals: dict[str, int],
    budgets: dict[str, tuple[float, float | None]],
    only: str | None = None,
) -> list[dict[str, Any]]:
    """Limits hit per tenant: 429s by limit (``rpm``, ``input_tpm``, ``output_tpm``,
    ``monthly_budget``) since the process started, and each budget against the month's cost.

    ``refusals`` are ``(tenant, limit, count)``; ``budgets`` map a tenant to its budget and
    the month's cost as last read. ``only`` keeps one tenant (a tenant key's view).
    """
    rows: dict[str, dict[str, Any]] = {}

    def row(tenant: str) -> dict[str, Any]:
        budget = budgets.get(tenant)
        return rows.setdefault(tenant, {
            "tenant": tenant, "refused": {}, "num_refused": 0,
            "budget_usd": None if budget is None else budget[0],
            "month_cost_usd": None if budget is None else budget[1],
        })  # fmt: skip

    hits = [*refusals, *((t, "monthly_budget", float(n)) for t, n in budget_refusals.items())]
    for tenant, limit, count in hits:
        if count > 0:
            entry = row(tenant)
            entry["refused"][limit] = entry["refused"].get(limit, 0) + int(count)
            entry["num_refused"] += int(count)
    for tenant in budgets:
        row(tenant)
    shown = [r for r in rows.values() if only is None or r["tenant"] == only]
    return sorted(shown, key=lambda r: (-r["num_refused"], r["tenant"]))


def document(
    role: str,
    who: dict[str, Any],
    models: list[dict[str, Any]],
    jobs: list[dict[str, Any]] | None,
    fleet: dict[str, Any] | None,
    usage: list[dict[str, Any]] | None = None,
    limits: list[dict[str, Any]] | None = None,
    pulls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The whole state document."""
    return {
        "object": "dashboard.state",
        "role": role,
        "time": time.time(),
        "viewer": who,
        "models": models,
        "fleet": fleet,
        "jobs": jobs,
        "tenants": {
            "available": usage is not None,
            "window_s": USAGE_WINDOW_S,
            "usage": usage or [],
            "limits": limits or [],
            "note": TENANTS_NOTE,
        },
        "pulls": pulls,
    }
