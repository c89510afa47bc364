"""Prefix routing at zero think time: the scenarios the docs quote, before and after, one run.

Twelve chat sessions of four turns, six at a time, through gateways to three workers
(``bench.prefix_routing``'s fleet and traffic), each follow-up sent as soon as the answer
arrives unless a scenario says otherwise. Conversations share no system prompt (what one
caches only its own later turns can use) and workers heartbeat every second, the
product's default. Each scenario runs twice on fresh workers:
``before``, the gateway routing on what workers report alone (``--affinity-routed-blocks
0``), and ``after``, with its index of the prompt blocks it routed. Scenarios:

- ``no_hint``: no session id in the body; ``prompt_cache_key``: one per conversation;
- ``think_1s``: no hint, one second between a reply and the next turn;
- ``two_gateways``: no hint, a session's turns alternate between two gateways;
- ``no_overlap``: 48 one-turn chats with no shared system prompt (nothing to reuse):
  requests per second of prefix-aware routing (after) against load-only routing, three
  runs each, alternating.

The ceiling is the same traffic on a single worker: every turn finds every block any
earlier turn of its conversation cached (replies are re-tokenized from text, so a turn
reuses its predecessor's prompt, not the reply). ``--system-prompt`` gives every
conversation the shared system prompt of ``bench.prefix_traffic`` (results in
``prefix_scenarios_system_prompt.json``).

Reported per run: the prefix-cache hit rate of prompt tokens (the workers' counters), TTFT,
requests per second, and the mean in-flight gap between workers (the load bound's check).

    python -m bench.prefix_scenarios                 # ~10 minutes on 2 cores
    python -m bench.prefix_scenarios --smoke --out DIR   # no_hint and no_overlap, once

A smoke run checks the machinery, not the figures: after the ceiling (its own worker), its
runs share one pair of workers, so later runs find earlier runs' prompts cached.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    ServerProcess,
    machine_info,
    package_versions,
    save_figure,
    write_json,
)
from bench.fleet import fresh_database
from bench.prefix_routing import MODEL_SHAPE, Options, _forget_workers, run_mode, smoke_workers
from bench.prefix_traffic import session_scripts

# Scenario -> the options it changes from the base (12 sessions x 4 turns, 6 at a time).
SCENARIOS: dict[str, dict[str, Any]] = {
    "no_hint": {"hint": "none"},
    "prompt_cache_key": {"hint": "prompt_cache_key"},
    "think_1s": {"hint": "none", "think_s": 1.0},
    "two_gateways": {"hint": "none", "num_gateways": 2},
}
NO_OVERLAP = {"hint": "none", "num_sessions": 48, "num_turns": 1, "has_system_prompt": False}
# The goals: hit rate after, per scenario; no-overlap throughput against load-only.
GOALS = {"no_hint": 0.45, "prompt_cache_key": 0.6, "think_1s": 0.6, "two_gateways": 0.4}
THROUGHPUT_TOLERANCE = 0.03
# The product's heartbeat: how stale a gateway's view of the workers' caches really gets.
HEARTBEAT_S = 1.0


def parse_options(argv: Sequence[str] | None = None) -> tuple[Options, int]:
    """The base options and the no-overlap repeats; ``--smoke`` shrinks everything."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for the results")
    parser.add_argument("--smoke", action="store_true", help="tiny run for tests")
    parser.add_argument("--repeats", type=int, default=3, help="no-overlap runs per mode")
    parser.add_argument("--system-prompt", action="store_true", help="a shared system prompt")
    args = parser.parse_args(argv)
    sessions, turns, concurrency, max_tokens = (4, 2, 2, 4) if args.smoke else (12, 4, 6, 16)
    base = Options(
        out_dir=args.out, is_smoke=args.smoke, num_sessions=sessions, num_turns=turns,
        num_workers=2 if args.smoke else 3, max_tokens=max_tokens, load_bound=4, repeats=1, seed=0,
        concurrency=concurrency, has_system_prompt=args.system_prompt, heartbeat_s=HEARTBEAT_S,
    )  # fmt: skip
    return base, 1 if args.smoke else args.repeats


def one_run(
    opts: Options, mode: str, store_url: str, work: Path, checkpoint: Path,
    workers: dict[str, ServerProcess] | None = None,
) -> Any:  # fmt: skip
    """One mode on fresh workers, the stopped workers' rows removed after (or on
    ``workers``, left running)."""
    scripts = session_scripts(opts.num_sessions, opts.num_turns, random.Random(opts.seed))
    try:
        return run_mode(opts, mode, store_url, work, checkpoint, scripts, workers)
    finally:
        if workers is None:
            _forget_workers(store_url)


def run_scenarios(base: Options, repeats: int, store_url: str, work: Path, ckpt: Path) -> Any:
    """The ceiling, every scenario before and after, then the no-overlap comparison."""
    ceiling = replace(base, hint="none", num_workers=1)
    results: dict[str, Any] = {"ceiling": one_run(ceiling, "prefix", store_url, work, ckpt)}
    with smoke_workers(base, store_url, work, ckpt) as workers:  # fresh ones unless a smoke
        for name, changes in SCENARIOS.items():
            if base.is_smoke and name != "no_hint":  # a smoke run checks the machinery, once
                continue
            opts = replace(base, **changes)
            results[name] = {
                "before": one_run(replace(opts, routed_blocks=0), "prefix", store_url, work,
                                  ckpt, workers),
                "after": one_run(opts, "prefix", store_url, work, ckpt, workers),
            }  # fmt: skip
        overlap = replace(base, **{**NO_OVERLAP, "num_sessions": 4 if base.is_smoke else 48})
        runs: dict[str, list[Any]] = {"load_only": [], "prefix": []}
        for repeat in range(repeats):
            for mode in ("load_only", "prefix") if repeat % 2 == 0 else ("prefix", "load_only"):
                runs[mode].append(one_run(overlap, mode, store_url, work, ckpt, workers))
    results["no_overlap"] = runs
    return results


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Hit rates before and after against the goals; no-overlap throughput ratio."""
    summary: dict[str, Any] = {"ceiling_hit_rate": results["ceiling"]["prefix_cache_hit_rate"]}
    for name in [n for n in SCENARIOS if n in results]:
        before, after = results[name]["before"], results[name]["after"]
        summary[name] = {
            "hit_rate_before": before["prefix_cache_hit_rate"],
            "hit_rate_after": after["prefix_cache_hit_rate"],
            "goal": GOALS[name],
            "met": after["prefix_cache_hit_rate"] >= GOALS[name],
            "ttft_p50_ms_before": before["ttft_ms"]["p50"],
            "ttft_p50_ms_after": after["ttft_ms"]["p50"],
            "mean_in_flight_gap_after": after["in_flight"]["mean_gap"],
            "routed_by_after": after["routed_by"],
        }
    runs = results["no_overlap"]
    rate = {m: statistics.median(r["requests_per_s"] for r in runs[m]) for m in runs}
    ratio = rate["prefix"] / rate["load_only"] if rate["load_only"] else None
    spread = {m: [r["requests_per_s"] for r in runs[m]] for m in runs}
    summary["no_overlap"] = {
        "requests_per_s": rate, "runs_requests_per_s": spread,
        "throughput_ratio": None if ratio is None else round(ratio, 3),
        "met": ratio is not None and ratio >= 1 - THROUGHPUT_TOLERANCE,
    }  # fmt: skip
    return summary


def write_png(path: Path, result: dict[str, Any]) -> None:
    """Hit rate before and after per scenario, with its goal; no-overlap throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    fig, (hit_ax, rate_ax) = plt.subplots(1, 2, figsize=(12, 4.2), width_ratios=[3, 1])
    names = [name for name in SCENARIOS if name in summary]
    xs = range(len(names))
    hit_ax.bar([x - 0.2 for x in xs], [summary[n]["hit_rate_before"] for n in names], 0.4,
               label="before: reported holdings only", color="tab:gray")  # fmt: skip
    hit_ax.bar([x + 0.2 for x in xs], [summary[n]["hit_rate_after"] for n in names], 0.4,
               label="after: + routing index", color="tab:blue")  # fmt: skip
    for x, name in zip(xs, names, strict=True):
        hit_ax.hlines(GOALS[name], x - 0.4, x + 0.4, colors="k", linestyles="--")
    hit_ax.axhline(summary["ceiling_hit_rate"], color="tab:green", linewidth=1,
                   label="ceiling: one worker holds everything")  # fmt: skip
    hit_ax.set_xticks(list(xs), names)
    hit_ax.set_ylim(0, 1)
    hit_ax.set_title("prefix-cache hit rate of prompt tokens (dashed: goal)", fontsize=9)
    hit_ax.legend(fontsize=8)
    rates = summary["no_overlap"]["requests_per_s"]
    rate_ax.bar(list(rates), list(rates.values()), color=["tab:gray", "tab:blue"])
    rate_ax.set_title(f"no overlap: requests/s (ratio {summary['no_overlap']['throughput_ratio']})",
                      fontsize=9)  # fmt: skip
    inputs = result["inputs"]
    save_figure(fig, path, (
        f"{inputs['num_sessions']} sessions x {inputs['num_turns']} turns, "
        f"{inputs['concurrency']} at a time, {inputs['num_workers']} workers, zero think time "
        f"unless named, {'a' if inputs['has_system_prompt'] else 'no'} shared system "
        "prompt"))  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    """Run, write prefix_scenarios.json and .png, print the summary."""
    from conveyor.fakes.checkpoints import build_tiny_llama

    base, repeats = parse_options(argv)
    base.out_dir.mkdir(parents=True, exist_ok=True)
    work = base.out_dir / "prefix-scenarios-work"
    work.mkdir(exist_ok=True)
    checkpoint = build_tiny_llama(work / "llama", **MODEL_SHAPE)
    with fresh_database() as store_url:
        results = run_scenarios(base, repeats, store_url, work, checkpoint)
    result = {
        "inputs": {**{k: v for k, v in asdict(base).items() if k != "out_dir"},
                   "model_shape": MODEL_SHAPE, "no_overlap": NO_OVERLAP,
                   "no_overlap_repeats": repeats},
        "machine": machine_info(),
        "versions": package_versions(),
        "runs": results,
        "summary": summarize(results),
    }  # fmt: skip
    name = "prefix_scenarios_system_prompt" if base.has_system_prompt else "prefix_scenarios"
    write_json(base.out_dir / f"{name}.json", result)
    write_png(base.out_dir / f"{name}.png", result)
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
