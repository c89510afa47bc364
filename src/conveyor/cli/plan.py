"""``conveyor plan``: size a deployment from a model config and a GPU, or a measurement."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from conveyor.plan.calibrate import GenerativeCalibration, calibrate
from conveyor.plan.gpus import gpu_spec
from conveyor.plan.planner import GenerativeCosts, plan_generative, plan_one_shot, roofline_costs
from conveyor.plan.report import render_text
from conveyor.plan.shape import load_shape
from conveyor.plan.sizing import Workload


def plan(
    qps: Annotated[float, typer.Option(help="Requests per second to carry.")],
    prompt_tokens: Annotated[int, typer.Option(help="Prompt (input) tokens per request.")],
    output_tokens: Annotated[int, typer.Option(help="Output tokens per request.")] = 0,
    model: Annotated[Path | None, typer.Option(help="config.json, checkpoint or .gguf.")] = None,
    gpu: Annotated[str | None, typer.Option(help="h100|h200|a100-80g|l4|cpu.")] = None,
    dtype: Annotated[str | None, typer.Option(help="Weight dtype (default: config's).")] = None,
    p99_ttft_ms: Annotated[float | None, typer.Option(help="p99 TTFT (one-shot: p99).")] = None,
    tpot_ms: Annotated[float | None, typer.Option(help="Time per output token target.")] = None,
    gpu_hour_usd: Annotated[float | None, typer.Option(help="Price of a GPU hour.")] = None,
    regions: Annotated[int, typer.Option(help="Regions; survive losing one.")] = 1,
    target_utilisation: Annotated[float, typer.Option(help="Headroom: load per replica.")] = 0.7,
    calibrate_url: Annotated[
        str | None, typer.Option("--calibrate", help="Measure this running Conveyor server.")
    ] = None,
    served_model: Annotated[str | None, typer.Option(help="Model name on that server.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="CONVEYOR_API_KEY")] = None,
    max_batch: Annotated[int, typer.Option(help="Largest batch a calibration probes.")] = 64,
    max_wait_ms: Annotated[float, typer.Option(help="The one-shot model's max_wait_ms.")] = 5.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Weights, KV cache, batch limits, step times, throughput, replicas and cost."""
    try:
        workload = Workload(
            qps=qps, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
            p99_ttft_ms=p99_ttft_ms, tpot_ms=tpot_ms, gpu_hour_usd=gpu_hour_usd,
            regions=regions, target_utilisation=target_utilisation,
        )  # fmt: skip
        shape = load_shape(model, dtype) if model is not None else None
        spec = gpu_spec(gpu) if gpu is not None else None
        if calibrate_url is not None:
            name = served_model or (shape.name if shape else None)
            if name is None:
                raise ValueError("--calibrate needs --served-model (or --model)")
            headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
            measured = asyncio.run(
                calibrate(calibrate_url, name, prompt_tokens, max(1, output_tokens),
                          max_probe=max_batch, headers=headers)
            )  # fmt: skip
            if isinstance(measured, GenerativeCalibration):
                costs = GenerativeCosts(measured.step, measured.prefill_s, "calibrated",
                                        measured.max_batch, measured.overhead_s,
                                        measured.tail_s, measured.overlap_s)  # fmt: skip
                result = plan_generative(workload, costs, shape, spec)
            else:
                result = plan_one_shot(workload, measured.curve, measured.max_batch, max_wait_ms)
        elif shape is None or spec is None:
            raise ValueError("give --model and --gpu, or --calibrate URL")
        else:
            result = plan_generative(workload, roofline_costs(shape, spec, workload), shape, spec)
    except (ValueError, OSError, RuntimeError, httpx.HTTPError) as exc:
        typer.echo(f"conveyor plan: {exc}", err=True)
        raise typer.Exit(code=2) from None
    _print(result, as_json)


def _print(result: dict[str, Any], as_json: bool) -> None:
    typer.echo(json.dumps(result, indent=2) if as_json else render_text(result))
