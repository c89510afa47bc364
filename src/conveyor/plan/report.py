"""A plan as text for a person (``--json`` prints the dict itself)."""

from __future__ import annotations

from typing import Any

# (key, label, how to show it)
LINES: tuple[tuple[str, str, str], ...] = (
    ("source", "costs from", "str"),
    ("weight_bytes", "weights", "bytes"),
    ("kv_bytes_per_token", "KV cache per token", "bytes"),
    ("kv_budget_bytes", "KV budget left on the GPU", "bytes"),
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
    ("replicas", "replicas with N-1", "int"),
    ("usd_per_million_output_tokens", "USD per million output tokens", "num"),
    ("usd_per_million_inputs", "USD per million inputs", "num"),
)


def _show(value: Any, how: str) -> str:
    if value is None:
        return "-"
    if how == "bytes":
        return f"{value / 1e9:.2f} GB" if value >= 1e8 else f"{value / 2**20:.3f} MiB"
    if how == "ms":
        return f"{value:.2f} ms"
    if how == "num":
        return f"{value:,.2f}"
    return str(value)


def render_text(plan: dict[str, Any]) -> str:
    """One aligned line per figure the plan has."""
    rows = [(label, _show(plan[key], how)) for key, label, how in LINES if key in plan]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {shown}" for label, shown in rows)
