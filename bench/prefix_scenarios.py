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
  requests per second of prefix-aware routing (after) against load-only routing, in pairs
  run back to back (the order alternating), three pairs; the ratio is the median of the
  pairs' ratios, so a drift in the machine's speed between pairs cancels.

The ceiling is the same traffic on a single worker: every turn finds every block any
earlier turn of its conversation cached (replies are re-tokenized from text, so a turn
reuses its predecessor's prompt, not the reply). ``--system-prompt`` gives every
conversation the shared system prompt of ``bench.prefix_traffic`` (results in
``prefix_scenarios_system_prompt.json``).

Reported per run: the prefix-cache hit rate of prompt tokens (the workers' counters), TTFT,
requests per second, and the mean in-flight gap between workers (the load bound's check).

    python -m bench.prefix_scenarios                 # ~10 minutes on 2 cores
    python -m bench.prefix_scenarios --smoke --out DIR   # no_hint and no_overlap, once
    python -m bench.prefix_scenarios --only-no-overlap --repeats 7 --no-overlap-sessions 192
        # the throughput pair alone, longer and more often -> prefix_no_overlap.json

A smoke run checks the machinery, not the figures: after the ceiling (its own worker), its
runs share one pair of workers, so later runs find earlier runs' prompts cached.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
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


@dataclass(frozen=True)
class NoOverlapPlan:
    """What runs beside the base options: the no-overlap pairs, and whether only they do."""

    repeats: int
    no_overlap_sessions: int
    only_no_overlap: bool = False


def parse_options(argv: Sequence[str] | None = None) -> tuple[Options, NoOverlapPlan]:
    """The base options and the no-overlap plan; ``--smoke`` shrinks everything."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for the results")
    parser.add_argument("--smoke", action="store_true", help="tiny run for tests")
    parser.add_argument("--repeats", type=int, default=3, help="no-overlap runs per mode")
    parser.add_argument("--system-prompt", action="store_true", help="a shared system prompt")
    parser.add_argument("--only-no-overlap", action="store_true", help="the throughput pair alone")
    parser.add_argument("--no-overlap-sessions", type=int, default=48,
                        help="one-turn chats per no-overlap run")  # fmt: skip
    args = parser.parse_args(argv)
    sessions, turns, concurrency, max_tokens = (4, 2, 2, 4) if args.smoke else (12, 4, 6, 16)
    base = Options(
        out_dir=args.out, is_smoke=args.smoke, num_sessions=sessions, num_turns=turns,
        num_workers=2 if args.smoke else 3, max_tokens=max_tokens, load_bound=4, repeats=1, seed=0,
        concurrency=concurrency, has_system_prompt=args.system_prompt, heartbeat_s=HEARTBEAT_S,
    )  # fmt: skip
    overlap_sessions = 4 if args.smoke else args.no_overlap_sessions
    repeats = 1 if args.smoke else args.repeats
    return base, NoOverlapPlan(repeats, overlap_sessions, args.only_no_overlap)


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


def run_scenarios(
    base: Options, plan: NoOverlapPlan, store_url: str, work: Path, ckpt: Path
) -> Any:
    """The ceiling, every scenario before and after, then the no-overlap comparison."""
    results: dict[str, Any] = {}
    if not plan.only_no_overlap:
        ceiling = replace(base, hint="none", num_workers=1)
        results["ceiling"] = one_run(ceiling, "prefix", store_url, work, ckpt)
    with smoke_workers(base, store_url, work, ckpt) as workers:  # fresh ones unless a smoke
        if not plan.only_no_overlap:
            results.update(run_hit_scenarios(base, store_url, work, ckpt, workers))
        overlap = replace(base, **{**NO_OVERLAP, "num_sessions": plan.no_overlap_sessions})
        runs: dict[str, list[Any]] = {"load_only": [], "prefix": []}
        for repeat in range(plan.repeats):
            for mode in ("load_only", "prefix") if repeat % 2 == 0 else ("prefix", "load_only"):
                runs[mode].append(one_run(overlap, mode, store_url, work, ckpt, workers))
    results["no_overlap"] = runs
    return results


def run_hit_scenarios(
    base: Options, store_url: str, work: Path, ckpt: Path,
    workers: dict[str, ServerProcess] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Every hit-rate scenario before and after its routing index (on ``workers`` if given)."""
    results: dict[str, Any] = {}
    for name, changes in SCENARIOS.items():
        if base.is_smoke and name != "no_hint":  # a smoke run checks the machinery, once
            continue
        opts = replace(base, **changes)
        results[name] = {
            "before": one_run(replace(opts, routed_blocks=0), "prefix", store_url, work, ckpt,
                              workers),
            "after": one_run(opts, "prefix", store_url, work, ckpt, workers),
        }  # fmt: skip
    return results


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Hit rates before and after against the goals; no-overlap throughput ratio."""
    summary: dict[str, Any] = {}
    if "ceiling" in results:
        summary["ceiling_hit_rate"] = results["ceiling"]["prefix_cache_hit_rate"]
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
    summary["no_overlap"] = summarize_no_overlap(results["no_overlap"])
    return summary


def summarize_no_overlap(runs: dict[str, list[Any]]) -> dict[str, Any]:
    """Each mode's median requests/s, and the median of the pairs' ratios (prefix over
    load-only, the i-th run of each) against the tolerance."""
    rate = {m: statistics.median(r["requests_per_s"] for r in runs[m]) for m in runs}
    spread = {m: [r["requests_per_s"] for r in runs[m]] for m in runs}
    pairs = [round(p / b, 3) for p, b in zip(spread["prefix"], spread["load_only"], strict=True)
             if b]  # fmt: skip
    ratio = statistics.median(pairs) if pairs else None
    return {
        "requests_per_s": rate, "runs_requests_per_s": spread, "pair_ratios": pairs,
        "throughput_ratio": None if ratio is None else round(ratio, 3),
        "met": ratio is not None and ratio >= 1 - THROUGHPUT_TOLERANCE,
    }  # fmt: skip


def write_png(path: Path, result: dict[str, Any]) -> None:
    """Hit rate before and after per scenario, with its goal; no-overlap throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    fig, (hit_ax, rate_ax) = plt.subplots(1, 2, figsize=(12, 4.2), width_ratios=[3, 1])
    if "ceiling_hit_rate" in summary:
        _plot_hit_rates(hit_ax, summary)
    else:
        hit_ax.set_axis_off()
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


def _plot_hit_rates(hit_ax: Any, summary: dict[str, Any]) -> None:
    """Per scenario, the hit rate before and after, its goal, and the ceiling."""
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


def main(argv: Sequence[str] | None = None) -> None:
    """Run, write prefix_scenarios.json and .png, print the summary."""
    from conveyor.fakes.checkpoints import build_tiny_llama

    base, plan = parse_options(argv)
    base.out_dir.mkdir(parents=True, exist_ok=True)
    work = base.out_dir / "prefix-scenarios-work"
    work.mkdir(exist_ok=True)
    checkpoint = build_tiny_llama(work / "llama", **MODEL_SHAPE)
    with fresh_database() as store_url:
        results = run_scenarios(base, plan, store_url, work, checkpoint)
    result = {
        "inputs": {**{k: v for k, v in asdict(base).items() if k != "out_dir"},
                   "model_shape": MODEL_SHAPE,
                   "no_overlap": {**NO_OVERLAP, "num_sessions": plan.no_overlap_sessions},
                   "no_overlap_repeats": plan.repeats, "only_no_overlap": plan.only_no_overlap},
        "machine": machine_info(),
        "versions": package_versions(),
        "runs": results,
        "summary": summarize(results),
    }  # fmt: skip
    name = "prefix_scenarios_system_prompt" if base.has_system_prompt else "prefix_scenarios"
    name = "prefix_no_overlap" if plan.only_no_overlap else name
    write_json(base.out_dir / f"{name}.json", result)
    write_png(base.out_dir / f"{name}.png", result)
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
