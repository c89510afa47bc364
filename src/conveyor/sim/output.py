"""What a run leaves behind: ``result.json`` (totals and per-second series), ``result.png``
(throughput, latency, queue and KV over time) and a one-screen text summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, totals: dict[str, Any], series: dict[str, Any]) -> None:
    """Totals and series in one file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"totals": totals, "series": series}, indent=1) + "\n",
                    encoding="utf-8")  # fmt: skip


def write_png(path: Path, title: str, series: dict[str, Any]) -> bool:
    """Four panels over simulated time; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    t = series.get("t_s", [])
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    panels = [
        (axes[0][0], "requests/s", ["arrivals", "completed", "rejected_429", "failed_5xx"]),
        (axes[0][1], "latency (ms)", ["e2e_ms_p50", "e2e_ms_p99", "ttft_ms_p99"]),
        (axes[1][0], "queued / running", ["queue_depth", "running"]),
        (axes[1][1], "KV use / workers", ["kv_use", "workers_alive"]),
    ]
    for ax, label, names in panels:
        for name in names:
            values = series.get(name)
            if values and any(v for v in values if v is not None):
                ax.plot(t, [float("nan") if v is None else v for v in values], label=name)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("simulated s")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def _ms(cut: dict[str, Any] | None) -> str:
    if not cut or cut.get("p50") is None:
        return "-"
    return f"p50 {cut['p50']:,.0f} / p99 {cut['p99']:,.0f} ms"


def summary(totals: dict[str, Any]) -> str:
    """The run on one screen."""
    lines = [
        f"scenario {totals['scenario']} (seed {totals['seed']}): {totals['workers']} workers, "
        f"{totals['gateways']} gateways",
        f"simulated {totals['sim_seconds']:,.1f} s in {totals['wall_seconds']:,.1f} s "
        f"wall ({totals['speed_x']}x; {totals.get('cpu_seconds', 0):,.1f} s CPU), "
        f"{totals['events']:,} events, "
        f"{totals['engine_steps']:,} engine steps",
        f"requests {totals['requests']:,}: completed {totals['completed']:,}, "
        f"429 {totals['rejected_429']:,}, 5xx {totals['failed_5xx']:,}, "
        f"lost {totals['lost']}, duplicated {totals['duplicated']}, "
        f"unfinished at the end {totals['unfinished_at_end']}",
        f"throughput {totals['throughput_rps']:,.1f} req/s, "
        f"{totals['output_tokens_per_s']:,.0f} output tokens/s",
        f"latency {_ms(totals['latency_ms'])}; TTFT {_ms(totals['ttft_ms'])}; "
        f"TPOT {_ms(totals['tpot_ms'])}",
        f"prefix hit ratio {totals['prefix_hit_ratio']}, preemptions {totals['preemptions']:,}, "
        f"retries {totals['retries']:,}",
    ]
    if totals["failed_5xx_by_reason"]:
        lines.append(f"5xx by reason: {totals['failed_5xx_by_reason']}")
    if totals["rejected_429"]:
        lines.append(f"Retry-After: {totals['retry_after_s']}")
    for job in totals["jobs"]:
        lines.append(
            f"job {job['batch_id']} ({job['tenant']}): {job['lines_committed']:,} of "
            f"{job['lines']:,} lines committed, finished at {job['finished_at_s']} s, "
            f"shards committed twice: {job['shards_committed_twice']}"
        )
    if totals["jobs"]:
        lines.append(f"job lines answered: {totals['job_lines_done_per_s']:,} a second")
    if totals.get("lines_wasted"):
        lines.append(f"job lines run again after a lost lease: {totals['lines_wasted']:,}")
    return "\n".join(lines)
