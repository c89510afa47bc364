"""The served models' part of the dashboard state (``conveyor serve`` and workers).

Apart from ``state`` so that a gateway, which hosts no model, never loads the plan
arithmetic (it reads checkpoint configs through the engine's config parser).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conveyor.dashboard.held import PlanBoard, board_of
from conveyor.dashboard.metrics_read import MetricReader, jsonable
from conveyor.dashboard.plans import generative_plan, one_shot_plan, served_lengths
from conveyor.dashboard.state import common_figures

if TYPE_CHECKING:
    from conveyor.engine.generator import HostedGenerator
    from conveyor.host.service import Service


def one_shot_model(
    reader: MetricReader, service: Service, name: str, board: PlanBoard
) -> dict[str, Any]:
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
        "plan": None if hosted is None else _batcher_plan(hosted, board),
    })  # fmt: skip
    return state


def _batcher_plan(hosted: Any, board: PlanBoard) -> dict[str, Any] | None:
    """The plan from the batch times this model has measured itself (None until warm),
    held until those move."""
    timing, config = hosted.batcher.timing, hosted.config
    if not timing.is_warm or timing.seconds_for(config.max_batch_size) <= 0:
        return None
    # Held while a batch of one and a full batch take about what they took (the curve's
    # split into fixed and per-input parts wanders more than either does).
    cap, wait_ms = config.max_batch_size, config.max_wait_ms
    inputs = (timing.seconds_for(1), timing.seconds_for(cap), cap, wait_ms)
    plan = board.plan(config.name, inputs, lambda: one_shot_plan(
        timing.seconds_for(0), timing.seconds_per_input(), cap, wait_ms))  # fmt: skip
    return None if plan is None else {key: jsonable(value) for key, value in plan.items()}


def generative_model(
    reader: MetricReader, name: str, hosted: HostedGenerator | None = None,
    board: PlanBoard | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A generative model's sequences, KV blocks, tokens, TTFT and TPOT, and its plan."""
    state = common_figures(reader, name, "generative")
    state.update({
        "running": reader.value("conveyor_running_sequences", name),
        "kv_blocks": {
            "used": reader.value("conveyor_kv_blocks_used", name),
            "free": reader.value("conveyor_kv_blocks_free", name),
        },
        "kv_tier": kv_tier(reader, name),
        "config": None,
        "plan": None if hosted is None else _preset_plan(reader, hosted, board or PlanBoard()),
    })  # fmt: skip
    state["queue_depth"]["waiting"] = reader.value("conveyor_waiting_sequences", name)
    histograms = state["histograms"]
    for key, family in (("ttft_s", "conveyor_time_to_first_token_seconds"),
                        ("tpot_s", "conveyor_time_per_output_token_seconds")):  # fmt: skip
        histograms[key] = reader.histogram(family, name, "online")
        histograms[f"batch_{key}"] = reader.histogram(family, name, "batch")
    return state


def kv_tier(reader: MetricReader, name: str) -> dict[str, Any]:
    """The second KV tier: blocks restored per tier, bytes moved per direction, blocks held
    (all 0 for a model without one)."""
    return {
        "hit_blocks": reader.by_label("conveyor_kv_tier_hit_blocks_total", name),
        "bytes": reader.by_label("conveyor_kv_tier_bytes_total", name),
        "blocks": reader.by_label("conveyor_kv_tier_blocks", name),
    }


def _preset_plan(
    reader: MetricReader, hosted: HostedGenerator, board: PlanBoard
) -> dict[str, Any] | None:
    """The preset plan at the lengths the model serves, held until those move."""
    prompt, output, is_observed = served_lengths(reader, hosted.config.name)
    inputs = (prompt, output, float(is_observed))
    return board.plan(hosted.config.name, inputs,
                      lambda: generative_plan(hosted, prompt, output, is_observed))  # fmt: skip


def service_models(service: Service) -> list[dict[str, Any]]:
    """Every model ``conveyor serve`` (or a worker) hosts."""
    reader = MetricReader(service.metrics.registry)
    board = board_of(service)
    models = [one_shot_model(reader, service, h.config.name, board) for h in service.models()]
    models += [
        generative_model(reader, name, service.generators[name], board)
        for name in sorted(service.generators)
    ]
    return models
