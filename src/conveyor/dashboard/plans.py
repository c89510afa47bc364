"""``conveyor plan``'s figures for each served model, shown beside what the model measures.

Each plan says what kind it is (``plan_kind``), where its figures come from (``source``)
and, on the page, when it was made (``planned_at``, see ``held``: a plan is held steady
until its inputs move):

- One-shot models: ``calibrated``, from the batch-time curve the batcher has measured
  itself (``source``: ``measured batch-time curve``), at the model's own
  ``max_batch_size`` and ``max_wait_ms``.
- Generative models: ``preset``, from the checkpoint's ``config.json`` and an accelerator
  preset (the roofline arithmetic of ``conveyor plan --model --gpu``), for the prompt and
  output lengths the model has served so far, the batch capped by the served model's
  ``max_num_seqs`` and KV cache. The preset is ``cpu`` on the CPU, else the one whose name
  the CUDA device carries; there is none for other devices. Preset figures are nominal,
  not measured here, and ``note`` says so (``conveyor plan --calibrate`` measures).

Latency figures are predicted at the planned utilisation: ``per_replica_qps`` is
``TARGET_UTILISATION`` of what one replica carries.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.dashboard.metrics_read import MetricReader
from conveyor.plan.curves import LinearCurve
from conveyor.plan.gpus import GPUS, GpuSpec
from conveyor.plan.planner import plan_one_shot, plan_preset
from conveyor.plan.shape import ModelShape, load_shape
from conveyor.plan.sizing import Workload

if TYPE_CHECKING:
    from conveyor.engine.generator import HostedGenerator

log = logging.getLogger(__name__)

TARGET_UTILISATION = 0.7
CALIBRATED_NOTE = "calibrated: from the batch times this model has measured itself"
PRESET_NOTE = (
    "nominal {gpu} preset figures, not measured on this server: run conveyor plan "
    "--calibrate against it for a measured plan"
)
# Lengths assumed until the model has finished a request.
DEFAULT_PROMPT_TOKENS, DEFAULT_OUTPUT_TOKENS = 256, 128
ONE_SHOT_KEYS = ("max_batch", "batch_ms_at_max", "batch_ms_fixed", "batch_ms_per_input",
                 "inputs_per_s_per_replica", "per_replica_qps", "steady_batch",
                 "predicted_p99_ms")  # fmt: skip
GENERATIVE_KEYS = ("weight_bytes", "kv_bytes_per_token", "kv_budget_bytes", "max_batch",
                   "prefill_ms", "decode_step_ms", "predicted_ttft_ms",
                   "tokens_per_s_per_replica", "requests_per_s_per_replica", "per_replica_qps",
                   "predicted_mean_ms", "predicted_p99_ms")  # fmt: skip


def one_shot_plan(
    seconds_fixed: float, seconds_per_input: float, max_batch: int, max_wait_ms: float
) -> dict[str, Any]:
    """The plan of a one-shot model from its measured batch-time curve."""
    curve = LinearCurve(seconds_fixed, seconds_per_input)
    capacity = max_batch / curve.at(max_batch)
    workload = Workload(qps=TARGET_UTILISATION * capacity, prompt_tokens=1, output_tokens=0,
                        target_utilisation=TARGET_UTILISATION)  # fmt: skip
    plan = plan_one_shot(workload, curve, max_batch, max_wait_ms)
    shown = {key: plan[key] for key in ONE_SHOT_KEYS}
    return {"plan_kind": "calibrated", "source": "measured batch-time curve",
            "note": CALIBRATED_NOTE, "max_wait_ms": max_wait_ms, **shown}  # fmt: skip


def generative_plan(
    hosted: HostedGenerator, prompt_tokens: int, output_tokens: int, is_observed: bool
) -> dict[str, Any] | None:
    """The roofline plan of a generative model at these lengths; None without a preset."""
    config = hosted.config
    gpu = preset_for(str(config.device))
    if gpu is None:
        return None
    try:
        shape = _shape(str(config.path), None if config.dtype == "auto" else config.dtype)
    except (OSError, ValueError) as exc:
        log.debug("dashboard: no plan for %s: %s", config.name, exc)
        return None
    head = {"plan_kind": "preset", "source": f"preset {gpu.name} from config.json",
            "note": PRESET_NOTE.format(gpu=gpu.name)}  # fmt: skip
    ceiling = served_max_batch(hosted, prompt_tokens + output_tokens)
    probe = Workload(qps=1.0, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
    first = plan_preset(probe, shape, gpu, 1, ceiling=ceiling)
    if first.get("fits") is False:
        return {**head, "error": f"no plan: {first['why_not']}"}
    qps = max(1e-6, TARGET_UTILISATION * first["requests_per_s_per_replica"])
    workload = Workload(qps=qps, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                        target_utilisation=TARGET_UTILISATION)  # fmt: skip
    plan = plan_preset(workload, shape, gpu, 1, ceiling=ceiling)
    return {
        **head,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "lengths": "served" if is_observed else "assumed",
        **{key: plan.get(key) for key in GENERATIVE_KEYS},
    }


def served_max_batch(hosted: HostedGenerator, context_tokens: int) -> int:
    """The most sequences the served model runs at once: its ``max_num_seqs``, and no more
    than its KV cache holds at ``context_tokens`` each."""
    engine = hosted.engine
    kv_tokens = engine.num_kv_blocks * engine.config.block_size
    return max(1, min(hosted.config.max_num_seqs, kv_tokens // max(1, context_tokens)))


def served_lengths(reader: MetricReader, model: str) -> tuple[int, int, bool]:
    """Mean prompt and output tokens of the requests finished so far (or the defaults)."""
    count = reader.value("conveyor_request_prompt_tokens_count", model)
    if count <= 0:
        return DEFAULT_PROMPT_TOKENS, DEFAULT_OUTPUT_TOKENS, False
    prompt = reader.value("conveyor_request_prompt_tokens_sum", model) / count
    output = reader.value("conveyor_request_generation_tokens_sum", model) / count
    return max(1, round(prompt)), max(1, round(output)), True


def preset_for(device: str) -> GpuSpec | None:
    """The preset for a model's device: ``cpu``, or the CUDA device's own (by name)."""
    if device == "cpu":
        return GPUS["cpu"]
    name = _cuda_name()
    if name is None:
        return GPUS["cpu"] if device == "auto" else None
    compact = name.lower().replace(" ", "").replace("-", "")
    for key, spec in GPUS.items():
        if key != "cpu" and key.split("-")[0].replace("-", "") in compact:
            return spec
    return None


@functools.cache
def _cuda_name() -> str | None:
    """The CUDA device's name when torch is loaded here and sees one (never imports it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_name(0))


@functools.lru_cache(maxsize=64)
def _shape(path: str, dtype: str | None) -> ModelShape:
    """The model's size facts (read once per checkpoint)."""
    return load_shape(Path(path), dtype, "auto")  # the engine keeps its cache at its dtype
