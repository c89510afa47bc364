"""A plan as text for a person (``--json`` prints the dict itself)."""

from __future__ import annotations

from typing import Any

# (key, label, how to show it)
LINES: tuple[tuple[str, str, str], ...] = (
    ("source", "costs from", "str"),
    ("calibrated_at", "calibrated at", "str"),
    ("weight_bytes", "weights", "bytes"),
    ("kv_bytes_per_token", "KV cache per token", "bytes"),
    ("tensor_parallel_size", "GPUs a replica (tensor parallel)", "int"),
    ("interconnect", "link between them", "str"),
    ("kv_budget_bytes", "KV budget left on each GPU", "bytes"),
    ("max_batch", "largest batch", "int"),
    ("prefill_ms", "prefill per prompt", "ms"),
    ("decode_step_ms", "decode step at that batch", "ms"),
    ("predicted_ttft_ms", "predicted TTFT", "ms"),
    ("meets_p99_ttft", "meets the p99 TTFT target", "str"),
    ("batch_ms_at_max", "batch time at the largest batch", "ms"),
    ("inputs_per_s_per_replica", "inputs/s per replica", "num"),
    ("tokens_per_s_per_replica", "tokens/s per replica", "num"),
    ("per_replica_qps", "requests/s per replica (planned)", "num"),
    ("request_overhead_ms", "request overhead (measured)", "ms"),
    ("lone_request_tail_ms", "lone request tail (measured)", "ms"),
    ("predicted_mean_ms", "predicted mean latency there", "ms"),
    ("predicted_p99_ms", "predicted p99 latency", "ms"),
    ("recommended_max_batch_size", "max_batch_size for the p99", "str"),
    ("recommended_max_wait_ms", "max_wait_ms for the p99", "ms"),
    ("replicas_at_full_load", "replicas at 100% load", "int"),
    ("replicas_with_headroom", "replicas with headroom", "int"),
    ("replicas", "replicas to survive losing one", "int"),
    ("replicas_per_region", "replicas a region (N-1 regions carry all)", "int"),
    ("gpus", "GPUs in all (hosts for cpu)", "int"),
    ("usd_per_million_output_tokens", "USD per million output tokens", "num"),
    ("usd_per_million_inputs", "USD per million inputs", "num"),
)
# Figures only a calibration measures: a preset plan has none to show (they read 0).
MEASURED_ONLY = frozenset({"request_overhead_ms", "lone_request_tail_ms"})
TRIED_HEADER = ("GPUs", "weights/GPU", "usable/GPU", "KV/token/GPU", "KV budget/GPU", "batch")


def _show(value: Any, how: str) -> str:
    if value is None:
        return "-"
    if how == "bytes":
        return _bytes(value)
    if how == "ms":
        return f"{value:.2f} ms"
    if how == "num":
        return f"{value:,.2f}"
    return str(value)


def _bytes(value: float) -> str:
    """Decimal units from 0.1 GB up, binary below (a KV token is a few hundred KiB)."""
    for unit, scale, least in (("PB", 1e15, 1e15), ("TB", 1e12, 1e12), ("GB", 1e9, 1e8)):
        if value >= least:
            return f"{value / scale:,.2f} {unit}"
    if value <= 0:
        return "0"
    return f"{value / 2**20:.3f} MiB" if value >= 2**20 else f"{value / 2**10:.2f} KiB"


def _seconds(value: float) -> str:
    if value >= 7200:
        return f"{value / 3600:,.1f} h"
    return f"{value / 60:,.1f} min" if value >= 600 else f"{value:,.2f} s"


def _aligned(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(label) for label, _ in rows)
    return [f"{label:<{width}}  {shown}" for label, shown in rows]


def _tried(plan: dict[str, Any]) -> list[str]:
    """The tensor-parallel sizes tried, a row each, and the note on the one taken."""
    fits = plan.get("fits") is not False  # when not, the note heads the plan already
    lines = [f"tensor parallel: {plan['tensor_parallel_note']}" if fits else "sizes tried:"]
    rows = [TRIED_HEADER] + [
        (str(t["tensor_parallel_size"]), _bytes(t["weight_bytes_per_gpu"]),
         _bytes(t["usable_bytes_per_gpu"]), _bytes(t["kv_bytes_per_token_per_gpu"]),
         _bytes(t["kv_budget_bytes_per_gpu"]), str(t["max_batch"]))
        for t in plan["tensor_parallel_tried"]
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(TRIED_HEADER))]
    lines += [
        "  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    ]
    return lines


def _distribution(dist: dict[str, Any]) -> list[str]:
    """Direct from the origin against peer to peer, side by side."""
    head = (
        f"distribution: {_bytes(dist['model_bytes'])} onto {dist['nodes']:,} nodes "
        f"({dist['racks']:,} racks of {dist['rack_size']}; Gbit/s: rack uplink "
        f"{dist['uplink_gbps']:g}, origin {dist['origin_gbps']:g}, node {dist['node_gbps']:g})"
    )
    rows = []
    for key, label in (("direct", "straight from the origin"), ("peer_to_peer", "peer to peer")):
        way = dist[key]
        more = "" if key == "direct" else " or more"
        shown = (
            f"egress {_bytes(way['egress_bytes'])}, across racks "
            f"{_bytes(way['cross_rack_bytes'])}{more}, at least {_seconds(way['seconds'])} "
            f"(bound by the {way['bound_by']})"
        )
        rows.append((f"  {label}", shown))
    rows.append(("  egress saved", _bytes(dist["egress_saved_bytes"])))
    return [head, *_aligned(rows)]


def render_text(plan: dict[str, Any]) -> str:
    """One aligned line per figure the plan has, then its notes and sections."""
    lines: list[str] = []
    users = plan.get("users")
    if users is not None:
        lines.append(users["derivation"])
    if plan.get("fits") is False:
        lines.append(f"no plan: {plan['why_not']}")
    measured = plan.get("source") == "calibrated"
    rows = [
        (label, _show(plan[key], how))
        for key, label, how in LINES
        if key in plan and (measured or key not in MEASURED_ONLY)
    ]
    if rows:
        lines += _aligned(rows)
    if "tensor_parallel_tried" in plan:
        lines += _tried(plan)
    if "distribution" in plan:
        lines += _distribution(plan["distribution"])
    return "\n".join(lines)
