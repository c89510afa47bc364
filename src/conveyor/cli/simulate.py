"""``conveyor simulate SCENARIO.yaml``: run a scenario on the virtual clock and report it."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from conveyor.sim.scenario import (
    Scenario,
    load_scenario,
    scaled,
    with_decode_model,
    with_workers,
)


def simulate(
    scenario: Annotated[Path, typer.Argument(help="The scenario's YAML file.")],
    seed: Annotated[int | None, typer.Option(help="Seed (default: the scenario's).")] = None,
    out: Annotated[Path | None, typer.Option(help="Write result.json and result.png here.")] = None,
    duration_s: Annotated[
        float | None, typer.Option(help="Override the scenario's simulated seconds.")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="Override each region's workers (before --scale): a fleet-size sweep."),
    ] = None,
    scale: Annotated[
        float, typer.Option(help="Run this share of the fleet and its traffic (a slice).")
    ] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the totals as JSON.")] = False,
    decode_model: Annotated[
        str | None,
        typer.Option(help="Override engine.decode_model: exact or counted (large fleets)."),
    ] = None,
) -> None:
    """Drive Conveyor's own router, batching, scheduler, limits and leases on a virtual
    clock; print the totals, and with --out write the per-second series and plots."""
    # Imported here: the simulator loads the scheduler and batching code, which the
    # gateway's command (the same CLI) must not load.
    from conveyor.sim.output import summary, write_json, write_png

    try:
        spec = load_scenario(scenario)
        if workers is not None:
            spec = with_workers(spec, workers)
        if scale != 1.0:
            spec = scaled(spec, scale)
        if duration_s is not None:
            spec = spec.model_copy(update={"duration_s": duration_s})
        if decode_model is not None:
            spec = with_decode_model(spec, decode_model)
        with _quiet_logs():
            totals, series = _run(spec, seed)
        totals["scale"] = scale
        if spec.fleet is not None:
            totals["decode_model"] = spec.fleet.engine.decode_model
    except (ValueError, OSError, ValidationError) as exc:
        typer.echo(f"conveyor simulate: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if out is not None:
        write_json(out / "result.json", totals, series)
        if series:
            write_png(out / "result.png", f"conveyor simulate: {spec.name}", series)
    if as_json:
        typer.echo(json.dumps(totals, indent=2))
    elif "scenario" in totals and "requests" in totals:
        typer.echo(summary(totals))
    else:
        typer.echo(json.dumps(totals, indent=2))


@contextmanager
def _quiet_logs() -> Iterator[None]:
    """Conveyor's own logs at ERROR while the simulated fleet runs (its components log as
    the real ones do), then back to the level they had: the process may go on (a test)."""
    logger = logging.getLogger("conveyor")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _run(spec: Scenario, seed: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Totals and series of a serving scenario, or a distribution's figures."""
    from conveyor.sim.distribution import Pull
    from conveyor.sim.run import simulate as run_scenario

    if spec.distribution is not None:
        started, cpu_started = time.perf_counter(), time.process_time()
        figures = Pull(spec.distribution, spec.seed if seed is None else seed).run()
        figures["scenario"] = spec.name
        figures["wall_seconds"] = round(time.perf_counter() - started, 3)
        figures["cpu_seconds"] = round(time.process_time() - cpu_started, 3)
        return figures, {}
    run = run_scenario(spec, seed)
    return run.totals, run.series
