"""``conveyor plan``: size a deployment from a model config and a GPU, or a measurement; and
what getting the model onto a fleet costs."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from conveyor.plan.calibrate import calibrate
from conveyor.plan.compose import Measured, Plan, PlanRequest, make_plan
from conveyor.plan.distribution import GBIT, Fleet
from conveyor.plan.gpus import gpu_spec
from conveyor.plan.pace import DEFAULT_BUDGET_S
from conveyor.plan.report import render_text
from conveyor.plan.shape import DEFAULT_KV_DTYPE, ModelShape, load_shape
from conveyor.plan.users import Users

ThinkTimeOption = Annotated[
    float | None, typer.Option(help="Seconds a user waits between answer and next ask.")
]
KvDtypeOption = Annotated[str, typer.Option(help="KV-cache dtype (auto: the weights').")]
TpOption = Annotated[
    int | None, typer.Option(help="GPUs a replica: 1, 2, 4, 8 (default: fewest GPUs in all).")
]
CalibrateOption = Annotated[
    str | None, typer.Option("--calibrate", help="Measure this running Conveyor server.")
]
BudgetOption = Annotated[float, typer.Option(help="Most seconds a calibration takes.")]
ModelBytesOption = Annotated[
    int | None, typer.Option(help="Distribution: model size (default: --model's weights).")
]


def plan(
    qps: Annotated[float | None, typer.Option(help="Requests per second to carry.")] = None,
    users: Annotated[
        int | None, typer.Option(help="Concurrent users (with --think-time-s).")
    ] = None,
    think_time_s: ThinkTimeOption = None,
    prompt_tokens: Annotated[int | None, typer.Option(help="Prompt tokens per request.")] = None,
    output_tokens: Annotated[int, typer.Option(help="Output tokens per request.")] = 0,
    model: Annotated[Path | None, typer.Option(help="config.json, checkpoint or .gguf.")] = None,
    gpu: Annotated[str | None, typer.Option(help="h100|h200|a100-80g|l4|cpu.")] = None,
    dtype: Annotated[str | None, typer.Option(help="Weight dtype (default: config's).")] = None,
    kv_cache_dtype: KvDtypeOption = DEFAULT_KV_DTYPE,
    tensor_parallel_size: TpOption = None,
    p99_ttft_ms: Annotated[float | None, typer.Option(help="p99 TTFT (one-shot: p99).")] = None,
    tpot_ms: Annotated[float | None, typer.Option(help="Time per output token target.")] = None,
    gpu_hour_usd: Annotated[float | None, typer.Option(help="Price of a GPU hour.")] = None,
    regions: Annotated[int, typer.Option(help="Regions; survive losing one.")] = 1,
    target_utilisation: Annotated[float, typer.Option(help="Headroom: load per replica.")] = 0.7,
    calibrate_url: CalibrateOption = None,
    served_model: Annotated[str | None, typer.Option(help="Model name on that server.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="CONVEYOR_API_KEY")] = None,
    max_batch: Annotated[int, typer.Option(help="Largest batch a calibration probes.")] = 64,
    calibrate_budget_s: BudgetOption = DEFAULT_BUDGET_S,
    max_wait_ms: Annotated[float, typer.Option(help="The one-shot model's max_wait_ms.")] = 5.0,
    nodes: Annotated[int | None, typer.Option(help="Distribution: nodes to load onto.")] = None,
    rack_size: Annotated[int, typer.Option(help="Distribution: nodes a rack.")] = 32,
    uplink_gbps: Annotated[float, typer.Option(help="Distribution: rack uplink, Gbit/s.")] = 100,
    origin_gbps: Annotated[float, typer.Option(help="Distribution: origin egress, Gbit/s.")] = 100,
    node_gbps: Annotated[float, typer.Option(help="Distribution: node NIC, Gbit/s.")] = 100,
    model_bytes: ModelBytesOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Weights, KV cache, batch limits, step times, throughput, replicas and cost; with
    --nodes, the time and egress of getting the model onto them."""
    try:
        shape = load_shape(model, dtype, kv_cache_dtype) if model is not None else None
        size = model_bytes if model_bytes is not None else (shape.weight_bytes if shape else None)
        fleet = None
        if nodes is not None:
            fleet = _fleet(size, nodes, rack_size, (uplink_gbps, origin_gbps, node_gbps))
        request = PlanRequest(
            prompt_tokens=prompt_tokens, output_tokens=output_tokens, qps=qps,
            users=_users(users, think_time_s), shape=shape,
            gpu=gpu_spec(gpu) if gpu is not None else None,
            tensor_parallel_size=tensor_parallel_size, p99_ttft_ms=p99_ttft_ms, tpot_ms=tpot_ms,
            gpu_hour_usd=gpu_hour_usd, regions=regions, target_utilisation=target_utilisation,
            max_wait_ms=max_wait_ms, fleet=fleet,
        )  # fmt: skip
        calibration = (calibrate_url, served_model, api_key, max_batch, calibrate_budget_s)
        result = _plan_with(request, shape, *calibration)
    except (ValueError, OSError, RuntimeError, httpx.HTTPError) as exc:
        typer.echo(f"conveyor plan: {exc}", err=True)
        raise typer.Exit(code=2) from None
    _print(result, as_json)
    if result.get("fits") is False:
        raise typer.Exit(code=2)


def _plan_with(
    request: PlanRequest, shape: ModelShape | None, calibrate_url: str | None,
    served_model: str | None, api_key: str | None, max_batch: int, budget_s: float,
) -> Plan:  # fmt: skip
    """The plan for ``request``, on figures measured at ``calibrate_url`` when given (and
    the request asks for capacity)."""
    measured = None
    if calibrate_url is not None and request.wants_capacity:
        measured = _calibrate(calibrate_url, request, shape, served_model, api_key,
                              max_batch, budget_s)  # fmt: skip
    result = make_plan(request, measured)
    if measured is not None:
        result["calibrated_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return result


def _fleet(size: int | None, nodes: int, rack_size: int, gbps: tuple[float, float, float]) -> Fleet:
    """The fleet to distribute ``size`` bytes onto; rates given as (uplink, origin, node)."""
    if size is None:
        raise ValueError("--nodes needs --model-bytes (or --model)")
    uplink, origin, node = (rate * GBIT for rate in gbps)
    return Fleet(size, nodes, rack_size, uplink, origin, node)


def _users(users: int | None, think_time_s: float | None) -> Users | None:
    """The population, when both of its flags are given."""
    if users is None and think_time_s is None:
        return None
    if users is None or think_time_s is None:
        raise ValueError("--users and --think-time-s go together")
    return Users(users, think_time_s)


def _calibrate(
    url: str, request: PlanRequest, shape: ModelShape | None, served_model: str | None,
    api_key: str | None, max_batch: int, budget_s: float,
) -> Measured:  # fmt: skip
    """Measure the served model, each step reported on stderr."""
    name = served_model or (shape.name if shape else None)
    if name is None:
        raise ValueError("--calibrate needs --served-model (or --model)")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return asyncio.run(calibrate(
        url, name, request.prompt_tokens or 1, max(1, request.output_tokens),
        max_probe=max_batch, headers=headers, budget_s=budget_s,
        report=lambda line: typer.echo(line, err=True),
    ))  # fmt: skip


def _print(result: dict[str, Any], as_json: bool) -> None:
    typer.echo(json.dumps(result, indent=2) if as_json else render_text(result))
