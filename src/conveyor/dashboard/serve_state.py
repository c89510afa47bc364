"""The served models' part of the dashboard state (``conveyor serve`` and workers).

Apart from ``state`` so that a gateway, which hosts no model, never loads the plan
arithmetic (it reads checkpoint configs through the engine's config parser).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conveyor.dashboard.metrics_read import MetricReader, jsonable
from conveyor.dashboard.plans import generative_plan, one_shot_plan
from conveyor.dashboard.state import common_figures

if TYPE_CHECKING:
    from conveyor.engine.generator import HostedGenerator
    from conveyor.host.service import Service


def one_shot_model(reader: MetricReader, service: Service, name: str) -> dict[str, Any]:
    """A one-shot model's queues, batches, outcomes, latency and its own capacity estimate."""
    hosted = next((h for h in service.models() if h.config.name == name), None)
    state = common_figures(reader, name, "one-shot")
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
    """The plan from the batch times this model has measured itself (None until warm)."""
    timing, cap = hosted.batcher.timing, hosted.config.max_batch_size
    if not timing.is_warm or timing.seconds_for(cap) <= 0:
        return None
    plan = one_shot_plan(timing.seconds_for(0), timing.seconds_per_input(), cap,
                         hosted.config.max_wait_ms)  # fmt: skip
    return {key: jsonable(value) for key, value in plan.items()}


def generative_model(
    reader: MetricReader, name: str, hosted: HostedGenerator | None = None
) -> dict[str, Any]:
    """A generative model's sequences, KV blocks, tokens, TTFT and TPOT, and its plan."""
    state = common_figures(reader, name, "generative")
    state.update({
        "running": reader.value("conveyor_running_sequences", name),
        "kv_blocks": {
            "used": reader.value("conveyor_kv_blocks_used", name),
            "free": reader.value("conveyor_kv_blocks_free", name),
        },
        "config": None,
        "plan": None if hosted is None else generative_plan(reader, hosted),
    })  # fmt: skip
    state["queue_depth"]["waiting"] = reader.value("conveyor_waiting_sequences", name)
    histograms = state["histograms"]
    for key, family in (("ttft_s", "conveyor_time_to_first_token_seconds"),
                        ("tpot_s", "conveyor_time_per_output_token_seconds")):  # fmt: skip
        histograms[key] = reader.histogram(family, name, "online")
        histograms[f"batch_{key}"] = reader.histogram(family, name, "batch")
    return state


def service_models(service: Service) -> list[dict[str, Any]]:
    """Every model ``conveyor serve`` (or a worker) hosts."""
    reader = MetricReader(service.metrics.registry)
    models = [one_shot_model(reader, service, h.config.name) for h in service.models()]
    models += [
        generative_model(reader, name, service.generators[name])
        for name in sorted(service.generators)
    ]
    return models
