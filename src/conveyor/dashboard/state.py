"""``GET /v1/dashboard/state``: what an on-call person needs, as one JSON document.

Counters are totals since the process started and histograms are cumulative buckets:
a reader derives rates and windowed p50/p99 from the difference between two polls (the
page polls every 2 s). See the README's "Dashboard" section for every field.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from conveyor.dashboard.metrics_read import MetricReader, jsonable
from conveyor.stores.records import BatchRecord
from conveyor.stores.tenant_records import UsageRow

if TYPE_CHECKING:
    from conveyor.gateway import Gateway
    from conveyor.service import Service

USAGE_WINDOW_S = 3600
TENANTS_NOTE = (
    "usage over the last hour from the ledger; a tenant key sees its own tenant, an admin "
    "key or no keys at all everything"
)


def viewer(tenant: str, has_keys: bool) -> dict[str, Any]:
    """Who is looking and what they may see."""
    return {"tenant": tenant, "scope": "tenant" if has_keys else "all"}


def one_shot_model(reader: MetricReader, service: Service, name: str) -> dict[str, Any]:
    """A one-shot model's queues, batches, outcomes, latency and its own capacity estimate."""
    hosted = next((h for h in service.models() if h.config.name == name), None)
    state = _common(reader, name, "one-shot")
    state.update({
        "running": reader.value("conveyor_in_flight", name),
        "kv_blocks": None,
        "config": None if hosted is None else {
            "max_batch_size": hosted.config.max_batch_size,
            "max_wait_ms": hosted.config.max_wait_ms,
        },
        "plan": None if hosted is None else _batcher_plan(hosted),
    })  # fmt: skip
    return state


def _batcher_plan(hosted: Any) -> dict[str, Any] | None:
    """Capacity at full batches from the batch times this model has measured itself."""
    timing, cap = hosted.batcher.timing, hosted.config.max_batch_size
    if not timing.is_warm:
        return None
    return {
        "inputs_per_s_per_replica": jsonable(round(timing.service_rate(cap), 3)),
        "batch_ms_at_max": jsonable(round(timing.seconds_for(cap) * 1000, 3)),
    }


def generative_model(reader: MetricReader, name: str) -> dict[str, Any]:
    """A generative model's sequences, KV blocks, tokens, TTFT and TPOT."""
    state = _common(reader, name, "generative")
    state.update({
        "running": reader.value("conveyor_running_sequences", name),
        "kv_blocks": {
            "used": reader.value("conveyor_kv_blocks_used", name),
            "free": reader.value("conveyor_kv_blocks_free", name),
        },
        "config": None,
        "plan": None,
    })  # fmt: skip
    state["queue_depth"]["waiting"] = reader.value("conveyor_waiting_sequences", name)
    state["histograms"]["ttft_s"] = reader.histogram("conveyor_time_to_first_token_seconds", name)
    state["histograms"]["tpot_s"] = reader.histogram("conveyor_time_per_output_token_seconds", name)
    return state


def _common(reader: MetricReader, name: str, kind: str) -> dict[str, Any]:
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
        "histograms": {"latency_s": reader.histogram("conveyor_request_latency_seconds", name)},
    }


def service_models(service: Service) -> list[dict[str, Any]]:
    """Every model ``conveyor serve`` (or a worker) hosts."""
    reader = MetricReader(service.metrics.registry)
    models = [one_shot_model(reader, service, h.config.name) for h in service.models()]
    models += [generative_model(reader, name) for name in sorted(service.generators)]
    return models


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
    """One batch job: status and counts (the page derives lines/s and ETA)."""
    counts = record.request_counts
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
    }


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


def document(
    role: str,
    who: dict[str, Any],
    models: list[dict[str, Any]],
    jobs: list[dict[str, Any]] | None,
    fleet: dict[str, Any] | None,
    usage: list[dict[str, Any]] | None = None,
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
            "note": TENANTS_NOTE,
        },
    }
