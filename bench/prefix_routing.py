"""Prefix-aware routing benchmark: multi-turn chats on 3 workers, prefix-aware vs load-only.

Three worker processes serve one small random Llama (a tiny-shape model, widened so a
prefill costs real time) behind one gateway, with a PostgreSQL registry. Sessions chat
concurrently; each turn re-sends the whole conversation (a shared system prompt, every
earlier turn and reply, and a new user message), as chat clients and agents do. The same
run measures, with fresh workers for each:

- ``load_only``: the gateway routes by load alone (``--no-affinity``);
- ``prefix``: the gateway hashes each prompt with the model's tokenizer and prefers the
  worker holding its longest cached prefix, within ``--load-bound`` of the least loaded.

Reported per mode: the prefix-cache hit rate (cached prompt tokens / prompt tokens, from
the workers' counters), time to first token p50/p99 (streamed, measured by the client),
each worker's share of the requests, and the requests in flight per worker, sampled from
the gateway every 20 ms during the run: the gap between the busiest and the idlest
worker's mean must stay within ``--load-bound``.

A smoke run (``--smoke``: 4 sessions x 3 turns on 2 workers) checks the machinery, not the
figures: its modes share one set of workers, ``prefix`` first (so it still starts on cold
caches), and ``load_only`` finds its prompts cached.

Each mode starts with a warm-up request straight to each worker and a wait for a quiet
machine (noted in the result when it never came). Turns are closed-loop per session, as a
chat is: the next turn waits for the reply (after ``--think-s``). ``--concurrency`` runs
that many sessions at a time; ``--hint`` puts the session id in ``user`` (the default),
``prompt_cache_key`` or nowhere; ``--gateways 2`` starts two gateways and sends a
session's turns to each in turn (each knows only what it routed itself);
``--no-system-prompt`` and ``--turns 1`` make traffic with no shared prefix at all;
``--heartbeat-s`` sets the workers' heartbeat (0.2 s by default here, 1 s in the product).
``--routed-blocks N`` is passed to the gateways as ``--affinity-routed-blocks`` (0: no
routing index, as before it existed); unset, the gateway's default.

``bench.prefix_scenarios`` runs the scenarios the docs quote in one go.

Needs PostgreSQL (CONVEYOR_TEST_PG_URL, default the local server's ``test`` database).

    python -m bench.prefix_routing                  # 20 sessions x 8 turns, 1 repeat
    python -m bench.prefix_routing --sessions 8 --turns 4 --repeats 3
    python -m bench.prefix_routing --sessions 12 --turns 4 --concurrency 6 --hint none
    python -m bench.prefix_routing --smoke --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.common import (
    RESULTS_DIR,
    ServerProcess,
    http_get,
    machine_info,
    package_versions,
    python_argv,
    wait_until_quiet,
    write_json,
)
from bench.fleet import fresh_database, wait_routable
from bench.prefix_traffic import (
    HINTS,
    SessionScript,
    Traffic,
    TurnResult,
    run_sessions,
    session_scripts,
)

MODEL = "llama"
MODES = ("load_only", "prefix")
# Worker heartbeats every 0.2 s and gateway refreshes every 0.1 s (below), with room.
SMOKE_THINK_S = 0.5
# Tiny-Llama's layout, wider: a 500-token prefill takes tens of ms on one core, so the
# prefix cache's savings show in TTFT, and 160 turns still fit in minutes on 2 cores.
MODEL_SHAPE = {
    "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Options:
    """Traffic shape, routing knobs and run size."""

    out_dir: Path
    is_smoke: bool
    num_sessions: int
    num_turns: int
    num_workers: int
    max_tokens: int
    load_bound: int
    repeats: int
    seed: int
    think_s: float = 0.0  # a session's pause before each follow-up turn
    concurrency: int | None = None  # sessions at once (None: all)
    hint: str = "user"  # where the session id goes (``prefix_traffic.HINTS``)
    num_gateways: int = 1
    routed_blocks: int | None = None  # the gateways' --affinity-routed-blocks (None: default)
    has_system_prompt: bool = True
    modes: tuple[str, ...] = MODES
    heartbeat_s: float = 0.2  # the workers' (1.0 is the product's default)

    def traffic(self) -> Traffic:
        """How the sessions send their turns."""
        return Traffic(self.max_tokens, self.think_s, self.hint, self.concurrency,
                       self.has_system_prompt)  # fmt: skip


def parse_options(argv: Sequence[str] | None = None) -> Options:
    """Command-line options; ``--smoke`` shrinks everything to seconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for the results")
    parser.add_argument("--smoke", action="store_true", help="tiny run for tests")
    parser.add_argument("--sessions", type=int, default=20, help="concurrent chat sessions")
    parser.add_argument("--turns", type=int, default=8, help="turns per session")
    parser.add_argument("--workers", type=int, default=3, help="worker processes")
    parser.add_argument("--max-tokens", type=int, default=16, help="reply length")
    parser.add_argument("--load-bound", type=int, default=4, help="gateway affinity bound")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each mode, alternating")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--think-s", type=float, default=0.0, help="pause before each follow-up turn"
    )
    parser.add_argument("--concurrency", type=int, default=None, help="sessions at once")
    parser.add_argument("--hint", choices=HINTS, default="user", help="where the session id goes")
    parser.add_argument("--gateways", type=int, default=1, choices=(1, 2), help="gateways")
    parser.add_argument("--routed-blocks", type=int, default=None, help="routing index size")
    parser.add_argument("--no-system-prompt", action="store_true", help="no shared prefix")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--heartbeat-s", type=float, default=0.2, help="workers' heartbeat")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sessions, args.turns, args.max_tokens, args.repeats, args.workers = 4, 3, 4, 1, 2
        # Short turns finish within one heartbeat: without a pause the gateway may not yet
        # know which worker holds a session's blocks, and nothing is routed by prefix.
        args.think_s = max(args.think_s, SMOKE_THINK_S)
    return Options(
        args.out, args.smoke, args.sessions, args.turns, args.workers, args.max_tokens,
        args.load_bound, args.repeats, args.seed, args.think_s, args.concurrency, args.hint,
        args.gateways, args.routed_blocks, not args.no_system_prompt, tuple(args.modes),
        args.heartbeat_s,
    )  # fmt: skip


class Fleet:
    """Workers and a gateway on one store; every process is stopped on exit."""

    def __init__(self, store_url: str, work_dir: Path, stack: ExitStack) -> None:
        self.store_url = store_url
        self.work_dir = work_dir
        self._stack = stack
        self.workers: dict[str, ServerProcess] = {}

    def _spawn(self, name: str, argv: Any) -> ServerProcess:
        proc = self._stack.enter_context(
            ServerProcess(name, argv, log_path=self.work_dir / f"{name}.log")
        )
        proc.start()
        return proc

    def add_workers(
        self, names: Sequence[str], checkpoint: Path, heartbeat_s: float = 0.2, *,
        wait: bool = True,
    ) -> None:  # fmt: skip
        """Start the workers together (they load in parallel); with ``wait``, wait for each."""
        model = {
            "name": MODEL, "kind": "generate", "path": str(checkpoint), "device": "cpu",
            "max_num_seqs": 32, "max_num_batched_tokens": 1024, "kv_cache_tokens": 32768,
            "block_size": 16, "max_model_len": 1024, "threads": 1, "timeout_ms": 120000,
        }  # fmt: skip
        config = self.work_dir / "worker.yaml"
        config.write_text(yaml.safe_dump({"models": [model], "log_level": "warning"}))
        for name in names:
            argv = lambda port, name=name: python_argv(  # noqa: E731
                "-m", "conveyor", "worker", "--config", str(config), "--store", self.store_url,
                "--listen", f"127.0.0.1:{port}", "--worker-id", name,
                "--heartbeat-s", str(heartbeat_s),
            )  # fmt: skip
            self.workers[name] = self._spawn(name, argv)
        for proc in self.workers.values() if wait else ():
            proc.wait_ready()

    def add_gateway(
        self, mode: str, checkpoint: Path, opts: Options, index: int = 0, *, wait: bool = True
    ) -> ServerProcess:
        """A gateway routing by ``mode``; with ``wait``, once it is ready."""
        routing = (
            ["--prefix-tokenizer", f"{MODEL}={checkpoint}", "--affinity-load-bound",
             str(opts.load_bound)] if mode == "prefix" else ["--no-affinity"]
        )  # fmt: skip
        if mode == "prefix" and opts.routed_blocks is not None:
            routing += ["--affinity-routed-blocks", str(opts.routed_blocks)]
        config = self.work_dir / "gateway.yaml"
        config.write_text(yaml.safe_dump({"log_level": "warning"}))
        argv = lambda port: python_argv(  # noqa: E731
            "-m", "conveyor", "gateway", "--config", str(config), "--store", self.store_url,
            "--port", str(port), "--stale-after-s", "2.0", "--refresh-s", "0.1", *routing,
        )  # fmt: skip
        gateway = self._spawn(f"gateway-{mode}-{index}", argv)
        if wait:
            gateway.wait_ready()
        return gateway


def worker_counters(worker: ServerProcess) -> dict[str, float]:
    """The worker's prompt, cache-hit, request and engine-step counters for the model."""
    from prometheus_client.parser import text_string_to_metric_families

    _, body = http_get(worker.port, "/metrics", timeout_s=10)
    wanted = {
        "conveyor_prompt_tokens_total": "prompt_tokens",
        "conveyor_prefix_cache_hit_tokens_total": "hit_tokens",
        "conveyor_request_prompt_tokens_count": "requests",
        "conveyor_engine_step_seconds_total": "step_s",  # every phase of every step
    }
    counters = dict.fromkeys(wanted.values(), 0.0)
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name in wanted and sample.labels.get("model") == MODEL:
                counters[wanted[sample.name]] += sample.value
    return counters


class GapSampler:
    """Samples the gateway's in-flight count per worker on a thread while the run lasts."""

    def __init__(self, gateway: ServerProcess, interval_s: float = 0.02) -> None:
        self._gateway = gateway
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.samples: list[dict[str, int]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GapSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                _, body = http_get(self._gateway.port, "/v1/fleet", timeout_s=2)
            except OSError:
                continue
            loads = {w["id"]: w["gateway_in_flight"] for w in json.loads(body)["workers"]}
            if loads:
                self.samples.append(loads)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def summarize(
    seconds: float,
    results: list[TurnResult],
    before: dict[str, dict[str, float]],
    after: dict[str, dict[str, float]],
    samples: list[dict[str, int]],
) -> dict[str, Any]:
    """One mode's figures from the client's timings, the workers' counters and the (first)
    gateway's in-flight samples."""
    delta = {w: {k: after[w][k] - before[w][k] for k in after[w]} for w in after}
    prompt = sum(d["prompt_tokens"] for d in delta.values())
    hits = sum(d["hit_tokens"] for d in delta.values())
    requests = {w: d["requests"] for w, d in delta.items()}
    total = sum(requests.values()) or 1.0
    ttft = [r.ttft_s for r in results if r.ok]
    follow_ups = [r.ttft_s for r in results if r.ok and r.turn > 0]
    return {
        "num_requests": len(results),
        "num_failed": sum(1 for r in results if not r.ok),
        "prefix_cache_hit_rate": round(hits / prompt, 4) if prompt else 0.0,
        "prompt_tokens": prompt,
        "hit_tokens": hits,
        "engine_step_s": round(sum(d["step_s"] for d in delta.values()), 3),
        "ttft_ms": {"p50": round(1000 * percentile(ttft, 0.5), 1),
                    "p99": round(1000 * percentile(ttft, 0.99), 1),
                    "mean": round(1000 * statistics.fmean(ttft), 1) if ttft else 0.0},
        "ttft_follow_up_ms": {"p50": round(1000 * percentile(follow_ups, 0.5), 1),
                              "p99": round(1000 * percentile(follow_ups, 0.99), 1)},
        "requests_per_s": round(len(results) / seconds, 3) if seconds else 0.0,
        "request_share": {w: round(n / total, 3) for w, n in sorted(requests.items())},
        "worst_share": round(max(requests.values()) / total, 3) if requests else 0.0,
        "in_flight": in_flight_figures(samples),
    }  # fmt: skip


def in_flight_figures(samples: list[dict[str, int]]) -> dict[str, Any]:
    """Mean requests in flight per worker, and the busiest-minus-idlest gap.

    The mean gap is the load-share figure the bound speaks to; the instant gap also moves
    when one worker's requests happen to finish together, under any routing.
    """
    workers = sorted({w for sample in samples for w in sample})
    means = {w: statistics.fmean(s.get(w, 0) for s in samples) if samples else 0.0
             for w in workers}  # fmt: skip
    gaps = [max(s.values()) - min(s.values()) for s in samples]
    return {
        "mean_per_worker": {w: round(m, 2) for w, m in means.items()},
        "mean_gap": round(max(means.values()) - min(means.values()), 2) if means else 0.0,
        "instant_gap": {"p50": percentile(gaps, 0.5), "p99": percentile(gaps, 0.99),
                        "max": max(gaps, default=0)},
        "num_samples": len(samples),
    }  # fmt: skip


def run_mode(
    opts: Options, mode: str, store_url: str, work_dir: Path, checkpoint: Path,
    scripts: list[SessionScript], workers: dict[str, ServerProcess] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Fresh workers (or ``workers``, left running) and gateways for ``mode``; the whole
    traffic; its summary. Gateways and workers start together; the run waits for all."""
    with ExitStack() as stack:
        fleet = Fleet(store_url, work_dir, stack)
        if workers is None:
            fleet.add_workers(worker_names(opts), checkpoint, opts.heartbeat_s, wait=False)
        else:
            fleet.workers = dict(workers)
        gateways = [fleet.add_gateway(mode, checkpoint, opts, i, wait=False)
                    for i in range(opts.num_gateways)]  # fmt: skip
        for proc in (*fleet.workers.values(), *gateways):
            proc.wait_ready()
        for gateway in gateways:
            wait_routable(gateway, set(fleet.workers))
        for proc in fleet.workers.values():
            warm_up(proc)  # the first step's one-off costs are not counted
        quiet = wait_until_quiet(max_wait_s=0.0 if opts.is_smoke else 10.0)
        before = {n: worker_counters(p) for n, p in fleet.workers.items()}
        started = time.monotonic()
        with GapSampler(gateways[0]) as sampler:
            ports = [gateway.port for gateway in gateways]
            results = asyncio.run(run_sessions(ports, MODEL, scripts, opts.traffic()))
        elapsed_s = time.monotonic() - started
        time.sleep(0.3)  # the last requests' counters
        after = {n: worker_counters(p) for n, p in fleet.workers.items()}
        routed_by: dict[str, int] = {}
        for gateway in gateways:
            _, doc = http_get(gateway.port, "/v1/fleet")
            for reason, count in json.loads(doc).get("routed_by", {}).items():
                routed_by[reason] = routed_by.get(reason, 0) + count
        # A worker gone from the registry is not in the next mode's fresh database rows.
        for proc in fleet.workers.values() if workers is None else ():
            proc.stop()
    summary = summarize(elapsed_s, results, before, after, sampler.samples)
    return {**summary, "seconds": round(elapsed_s, 2), "routed_by": routed_by,
            "quiet": quiet.to_dict()}  # fmt: skip


def worker_names(opts: Options) -> list[str]:
    """The workers' ids: w0, w1, ..."""
    return [f"w{i}" for i in range(opts.num_workers)]


@contextmanager
def shared_workers(
    opts: Options, store_url: str, work_dir: Path, checkpoint: Path
) -> Iterator[dict[str, ServerProcess]]:
    """Workers for several runs of a smoke test (started here, awaited by the first run);
    stopped and removed from the registry after."""
    with ExitStack() as stack:
        fleet = Fleet(store_url, work_dir, stack)
        fleet.add_workers(worker_names(opts), checkpoint, opts.heartbeat_s, wait=False)
        yield fleet.workers
    _forget_workers(store_url)


def smoke_workers(
    opts: Options, store_url: str, work_dir: Path, checkpoint: Path
) -> AbstractContextManager[dict[str, ServerProcess] | None]:
    """Shared workers for a smoke run; None (fresh workers each run) otherwise."""
    if opts.is_smoke:
        return shared_workers(opts, store_url, work_dir, checkpoint)
    return nullcontext(None)


def warm_up(worker: ServerProcess) -> None:
    """One short completion straight to the worker (its token ids share no prompt block)."""
    import httpx

    body = {"model": MODEL, "prompt": [3, 4, 5], "max_tokens": 2, "temperature": 0}
    response = httpx.post(f"http://127.0.0.1:{worker.port}/v1/completions", json=body, timeout=120)
    response.raise_for_status()


def evaluate(runs: dict[str, list[dict[str, Any]]], load_bound: int) -> dict[str, Any]:
    """Medians over repeats per mode, and prefix-aware against load-only (when both ran)."""

    def median(mode: str, *path: str) -> float:
        values = []
        for run in runs[mode]:
            value: Any = run
            for key in path:
                value = value[key]
            values.append(float(value))
        return round(statistics.median(values), 4)

    modes = {
        mode: {
            "prefix_cache_hit_rate": median(mode, "prefix_cache_hit_rate"),
            "ttft_p50_ms": median(mode, "ttft_ms", "p50"),
            "ttft_p99_ms": median(mode, "ttft_ms", "p99"),
            "worst_share": median(mode, "worst_share"),
            "mean_in_flight_gap": max(r["in_flight"]["mean_gap"] for r in runs[mode]),
            "requests_per_s": median(mode, "requests_per_s"),
        }
        for mode in MODES
        if runs.get(mode)
    }
    if len(modes) < len(MODES):
        ran = next(iter(modes.values()))
        return {**modes, "load_bound": load_bound,
                "gap_within_bound": ran["mean_in_flight_gap"] <= load_bound}  # fmt: skip
    aware, blind = modes["prefix"], modes["load_only"]
    return {
        **modes,
        "throughput_ratio": round(aware["requests_per_s"] / blind["requests_per_s"], 3)
        if blind["requests_per_s"] else None,
        "ttft_p50_ratio": round(aware["ttft_p50_ms"] / blind["ttft_p50_ms"], 3)
        if blind["ttft_p50_ms"] else None,
        "ttft_p99_ratio": round(aware["ttft_p99_ms"] / blind["ttft_p99_ms"], 3)
        if blind["ttft_p99_ms"] else None,
        "load_bound": load_bound,
        "gap_within_bound": aware["mean_in_flight_gap"] <= load_bound,
    }  # fmt: skip


def write_png(path: Path, result: dict[str, Any]) -> None:
    """Three panels: hit rate, TTFT p50/p99, and each worker's share, per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    modes = [mode for mode in MODES if mode in summary]
    fig, (hit_ax, ttft_ax, share_ax) = plt.subplots(1, 3, figsize=(13, 4.2))
    colors = {"load_only": "tab:gray", "prefix": "tab:blue"}
    hit_ax.bar(modes, [summary[m]["prefix_cache_hit_rate"] for m in modes],
               color=[colors[m] for m in modes])  # fmt: skip
    hit_ax.set_ylim(0, 1)
    hit_ax.set_title("prefix-cache hit rate (prompt tokens)", fontsize=9)
    width = 0.38
    for i, mode in enumerate(modes):
        values = [summary[mode]["ttft_p50_ms"], summary[mode]["ttft_p99_ms"]]
        ttft_ax.bar([x + (i - 0.5) * width for x in (0, 1)], values, width, label=mode,
                    color=colors[mode])  # fmt: skip
    ttft_ax.set_xticks([0, 1], ["p50", "p99"])
    ttft_ax.set_ylabel("ms")
    ttft_ax.set_title("time to first token", fontsize=9)
    ttft_ax.legend(fontsize=8)
    last = {mode: result["runs"][mode][-1]["request_share"] for mode in modes}
    workers = sorted(last[modes[-1]])
    for i, mode in enumerate(modes):
        share_ax.bar([x + (i - 0.5) * width for x in range(len(workers))],
                     [last[mode].get(w, 0) for w in workers], width, label=mode,
                     color=colors[mode])  # fmt: skip
    share_ax.axhline(1 / len(workers), color="k", linestyle="--", linewidth=1)
    share_ax.set_xticks(range(len(workers)), workers)
    share_ax.set_title(
        f"request share per worker (bound {summary['load_bound']}; mean in-flight gap "
        f"{summary[modes[-1]]['mean_in_flight_gap']})", fontsize=9)  # fmt: skip
    inputs = result["inputs"]
    machine = "busy machine" if summary.get("machine_was_busy") else "quiet machine"
    fig.suptitle(
        f"{inputs['num_sessions']} sessions x {inputs['num_turns']} turns on "
        f"{inputs['num_workers']} workers, medians of {inputs['repeats']} ({machine})",
        fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_benchmark(opts: Options) -> dict[str, Any]:
    """Both modes, ``repeats`` times each in alternating order, in one fresh database."""
    from conveyor.fakes.checkpoints import build_tiny_llama

    opts.out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = opts.out_dir / "prefix-routing-work"
    work_dir.mkdir(exist_ok=True)
    checkpoint = build_tiny_llama(work_dir / "llama", **MODEL_SHAPE)
    scripts = session_scripts(opts.num_sessions, opts.num_turns, random.Random(opts.seed))
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in opts.modes}
    # A smoke run's modes share workers: prefix-aware routing first, on cold caches.
    first = opts.modes[::-1] if opts.is_smoke else opts.modes
    with (
        fresh_database() as store_url,
        smoke_workers(opts, store_url, work_dir, checkpoint) as workers,
    ):
        for repeat in range(opts.repeats):
            for mode in first if repeat % 2 == 0 else first[::-1]:
                runs[mode].append(
                    run_mode(opts, mode, store_url, work_dir, checkpoint, scripts, workers)
                )
                if workers is None:
                    _forget_workers(store_url)
    return {
        "inputs": {**{k: v for k, v in asdict(opts).items() if k != "out_dir"},
                   "model_shape": MODEL_SHAPE, "block_size": 16},
        "machine": machine_info(),
        "versions": package_versions(),
        "runs": runs,
        "summary": {**evaluate(runs, opts.load_bound), "machine_was_busy": any(
            run["quiet"]["is_busy"] for mode_runs in runs.values() for run in mode_runs)},
    }  # fmt: skip


def _forget_workers(store_url: str) -> None:
    """Drop the stopped workers' rows so the next mode's gateway sees only its own."""
    from conveyor.stores import open_job_store

    store: Any = open_job_store(store_url)
    try:
        for record in store.list_workers(time.time(), 1.0):
            store.remove_worker(record.worker_id)
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Run, write prefix_routing.json and prefix_routing.png, print the summary."""
    opts = parse_options(argv)
    result = run_benchmark(opts)
    write_json(opts.out_dir / "prefix_routing.json", result)
    write_png(opts.out_dir / "prefix_routing.png", result)
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
