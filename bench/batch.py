"""The batch benchmark: the Batch API against the online path, on the same model in the same
run, for the synthetic model and the bundled MiniLM (and generation when it is wired).

Figures, per model:

- **throughput**: lines/s of a 20,000-line embeddings job through the Batch API (upload done,
  from `POST /v1/batches` to `completed`, validation and finalizing included), against the
  online endpoint's saturated throughput (closed loop, `bench.loadgen`);
- **soak**: online p99 latency at a light open-loop rate while a batch job keeps the model
  busy, against the same rate on an idle server (goal: within one batch time);
- **memory** (synthetic server only): the server's RSS while a 200 MB input file is uploaded
  and processed (goal: flat, well under the file size).

Run from the repository root:

    .venv/bin/python -m bench.batch                        # full run, a few minutes
    .venv/bin/python -m bench.batch --smoke --out DIR      # seconds, synthetic only

Writes ``batch.json`` and ``batch.png`` into ``--out`` (default ``bench/results``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import (
    LOCALHOST,
    REPO_ROOT,
    RESULTS_DIR,
    ServerProcess,
    http_get,
    machine_info,
    package_versions,
    python_argv,
    wait_until_quiet,
    write_json,
)
from bench.loadgen import LoadMode, LoadResult, LoadSpec, run_load_process
from bench.online import (
    MINILM_MODEL,
    SERVE_CODE,
    SYNTHETIC_MODEL,
    Goal,
    make_sentences,
    synthetic_entry,
    write_bodies,
)

GENERATION_MODEL = "tiny-llama"
EMBEDDINGS = "/v1/embeddings"
CHAT = "/v1/chat/completions"
TERMINAL = ("completed", "failed", "expired", "cancelled")
MIB = 1024 * 1024
MB = 1_000_000  # the memory input is sized in decimal MB: "200 MB" fits the 200 MiB limit
MEMORY_LINE_BYTES = 4096
POLL_S = 0.02
SOAK_RATE_SHARE = 0.1
# The soak job must outlast the idle run's end, the load client's start-up and drain, on a
# slow machine too; it is cancelled when the soak ends, so spare lines cost only upload.
SOAK_SPARE_S = 12.0
MIN_BATCH_SHARE = 0.9
MAX_MEMORY_SHARE = 0.25
JOBS = {"poll_every_s": 0.1, "max_requests_per_batch": 10_000_000}
CLOSED_CLIENTS = {SYNTHETIC_MODEL: 256, MINILM_MODEL: 136, GENERATION_MODEL: 32}


# -- options -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Options:
    """Sizes of one run."""

    out_dir: Path
    num_lines: int = 20_000
    repeats: int = 2
    online_seconds: float = 4.0
    soak_seconds: float = 4.0
    memory_mb: int = 200
    models: tuple[str, ...] = (SYNTHETIC_MODEL, MINILM_MODEL)
    generation_lines: int = 400
    is_generation_wanted: bool = True
    is_memory_wanted: bool = True
    quiet_max_wait_s: float = 8.0
    is_smoke: bool = False

    def __post_init__(self) -> None:
        if self.num_lines < 1 or self.repeats < 1 or self.memory_mb < 1:
            raise ValueError("num_lines, repeats and memory_mb must be positive")
        if self.online_seconds <= 0.5 or self.soak_seconds <= 0.5:
            raise ValueError("load runs must last more than 0.5 s")


def smoke_options(out_dir: Path) -> Options:
    """Seconds, not minutes: synthetic only, small job, small memory file, no generation."""
    return Options(
        out_dir=out_dir,
        num_lines=600,
        repeats=1,
        online_seconds=0.8,
        soak_seconds=0.8,
        memory_mb=4,
        models=(SYNTHETIC_MODEL,),
        is_generation_wanted=False,
        quiet_max_wait_s=0.3,
        is_smoke=True,
    )


def parse_options(argv: Sequence[str] | None = None) -> Options:
    """Options from the command line (`--smoke` ignores the sizing options)."""
    parser = argparse.ArgumentParser(description="Conveyor batch benchmark.")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for the results")
    parser.add_argument("--smoke", action="store_true", help="tiny run (seconds) for tests")
    parser.add_argument("--lines", type=int, default=20_000, help="lines of the throughput job")
    parser.add_argument("--repeats", type=int, default=2, help="throughput pairs per model")
    parser.add_argument("--memory-mb", type=int, default=200, help="size of the memory input")
    parser.add_argument("--online-seconds", type=float, default=4.0, help="each online run")
    parser.add_argument("--quiet-max-wait-s", type=float, default=8.0,
                        help="longest wait for a quiet machine before each run")  # fmt: skip
    parser.add_argument("--skip-minilm", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-generation", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke_options(args.out)
    models = (SYNTHETIC_MODEL,) if args.skip_minilm else (SYNTHETIC_MODEL, MINILM_MODEL)
    return Options(
        out_dir=args.out,
        num_lines=args.lines,
        repeats=args.repeats,
        memory_mb=args.memory_mb,
        online_seconds=args.online_seconds,
        quiet_max_wait_s=args.quiet_max_wait_s,
        models=models,
        is_generation_wanted=not args.skip_generation,
        is_memory_wanted=not args.skip_memory,
    )


# -- inputs ------------------------------------------------------------------------------------
def write_jsonl(path: Path, lines: Iterator[dict[str, Any]]) -> int:
    """Write request lines; return the file size."""
    with path.open("wb") as out:
        for line in lines:
            out.write(json.dumps(line).encode() + b"\n")
    return path.stat().st_size


def embedding_requests(model: str, sentences: Sequence[str], num: int) -> Iterator[dict[str, Any]]:
    """`num` one-sentence embeddings requests, cycling through `sentences`."""
    for i in range(num):
        body = {"model": model, "input": sentences[i % len(sentences)]}
        yield {"custom_id": f"line-{i}", "method": "POST", "url": EMBEDDINGS, "body": body}


def memory_requests(model: str, target_bytes: int) -> Iterator[dict[str, Any]]:
    """About `target_bytes` of requests whose inputs are long (~4 KiB lines)."""
    words = " ".join(f"w{i % 97}" for i in range(MEMORY_LINE_BYTES // 4))[: MEMORY_LINE_BYTES - 120]
    for i in range(max(1, target_bytes // MEMORY_LINE_BYTES)):
        body = {"model": model, "input": f"{i} {words}"}
        yield {"custom_id": f"mem-{i}", "method": "POST", "url": EMBEDDINGS, "body": body}


def chat_body(model: str, sentence: str) -> dict[str, Any]:
    """A short greedy chat request."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": sentence}],
        "max_completion_tokens": 16,
        "temperature": 0,
    }


def chat_requests(model: str, sentences: Sequence[str], num: int) -> Iterator[dict[str, Any]]:
    """`num` chat requests."""
    for i in range(num):
        body = chat_body(model, sentences[i % len(sentences)])
        yield {"custom_id": f"chat-{i}", "method": "POST", "url": CHAT, "body": body}


# -- servers and the HTTP client ---------------------------------------------------------------
def model_entry(model: str, work_dir: Path) -> dict[str, Any]:
    """The served model: the online benchmark's settings, long inputs allowed."""
    if model == SYNTHETIC_MODEL:
        return {**synthetic_entry(is_batched=True), "max_input_tokens": 100_000}
    if model == MINILM_MODEL:
        return {
            "name": MINILM_MODEL,
            "kind": "embedding",
            "max_batch_size": 64,
            "max_wait_ms": 5,
            "max_queue": 8192,
        }
    from conveyor.fakes.checkpoints import build_tiny_llama

    checkpoint = build_tiny_llama(work_dir / "tiny-llama", size="bench")
    return {
        "name": GENERATION_MODEL,
        "kind": "generate",
        "path": str(checkpoint),
        "device": "cpu",
        "max_num_seqs": 32,
        "kv_cache_tokens": 16384,
    }


def start_server(name: str, entry: dict[str, Any], work_dir: Path) -> ServerProcess:
    """A `conveyor serve` process with one model and the jobs subsystem."""
    config = {
        "host": LOCALHOST,
        "log_level": "warning",
        "data_dir": str(work_dir / f"{name}-data"),
        "models": [entry],
        "jobs": JOBS,
    }
    config_path = work_dir / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    server = ServerProcess(
        name,
        lambda port: python_argv(
            "-c", SERVE_CODE, "serve", f"--config={config_path}", f"--port={port}"
        ),
        log_path=work_dir / f"{name}.log",
    )
    server.start()
    return server


class BatchApi:
    """The Files and Batches endpoints of one server."""

    def __init__(self, port: int) -> None:
        self._http = httpx.Client(base_url=f"http://{LOCALHOST}:{port}", timeout=600)

    def close(self) -> None:
        self._http.close()

    def upload(self, path: Path) -> str:
        """Upload a file (streamed from disk); return its id."""
        with path.open("rb") as handle:
            response = self._http.post(
                "/v1/files", data={"purpose": "batch"}, files={"file": (path.name, handle)}
            )
        response.raise_for_status()
        return str(response.json()["id"])

    def create(self, file_id: str, endpoint: str) -> str:
        """Create a batch; return its id."""
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
        response = self._http.post("/v1/batches", json=body)
        response.raise_for_status()
        return str(response.json()["id"])

    def get(self, batch_id: str) -> dict[str, Any]:
        response = self._http.get(f"/v1/batches/{batch_id}")
        response.raise_for_status()
        return dict(response.json())

    def cancel(self, batch_id: str) -> None:
        """Cancel a batch unless it has already ended (a finished batch answers 400)."""
        response = self._http.post(f"/v1/batches/{batch_id}/cancel")
        if response.status_code == 400 and self.get(batch_id)["status"] in TERMINAL:
            return
        response.raise_for_status()

    def wait(self, batch_id: str, until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Poll until `until(batch)` holds or the batch ended."""
        while True:
            batch = self.get(batch_id)
            if until(batch) or batch["status"] in TERMINAL:
                return batch
            time.sleep(POLL_S)


# -- measurements ------------------------------------------------------------------------------
def online_saturation(
    server: ServerProcess, bodies: Path, model: str, seconds: float, path: str = EMBEDDINGS
) -> LoadResult:
    """The online path's saturated throughput: closed loop with many clients."""
    spec = LoadSpec(
        LoadMode.CLOSED,
        seconds,
        num_clients=CLOSED_CLIENTS[model],
        max_connections=1024,
        ramp_s=min(0.5, 0.15 * seconds),
        drain_s=1.0,
        path=path,
    )
    return run_load_process(spec, server.port, bodies)


def batch_throughput(
    api: BatchApi, input_path: Path, num_lines: int, endpoint: str
) -> dict[str, Any]:
    """Lines/s of one job, from creation to completion (the upload is done before)."""
    file_id = api.upload(input_path)
    started = time.monotonic()
    batch_id = api.create(file_id, endpoint)
    running = api.wait(batch_id, lambda b: b["status"] == "in_progress")
    running_at = time.monotonic()
    batch = api.wait(batch_id, lambda b: False)
    elapsed_s = time.monotonic() - started
    counts = batch["request_counts"]
    return {
        "status": batch["status"],
        "num_lines": num_lines,
        "seconds": round(elapsed_s, 3),
        "lines_per_s": round(num_lines / elapsed_s, 1),
        "processing_lines_per_s": round(num_lines / max(1e-9, time.monotonic() - running_at), 1),
        "validating_s": round(running_at - started, 3),
        "completed": counts["completed"],
        "failed": counts["failed"],
        "first_status": running["status"],
    }


def model_seconds(port: int, model: str) -> tuple[float, float]:
    """(sum, count) of `conveyor_model_seconds` for `model` (one sample per model batch)."""
    from prometheus_client.parser import text_string_to_metric_families

    _, body = http_get(port, "/metrics")
    found = {"sum": 0.0, "count": 0.0}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            for suffix in found:
                if sample.name == f"conveyor_model_seconds_{suffix}":
                    found[suffix] = float(sample.value)
    return found["sum"], found["count"]


def open_load(server: ServerProcess, bodies: Path, rate: float, seconds: float) -> LoadResult:
    """A light open-loop online load."""
    spec = LoadSpec(
        LoadMode.OPEN,
        seconds,
        rate_per_s=rate,
        expected_latency_ms=100,
        max_connections=1024,
        ramp_s=min(0.5, 0.15 * seconds),
        drain_s=2.0,
    )
    return run_load_process(spec, server.port, bodies)


def soak(
    server: ServerProcess,
    api: BatchApi,
    bodies: Path,
    input_path: Path,
    model: str,
    rate: float,
    seconds: float,
) -> dict[str, Any]:
    """Online p99 at `rate` on an idle server, then while a batch job runs."""
    idle = open_load(server, bodies, rate, seconds)
    batch_id = api.create(api.upload(input_path), EMBEDDINGS)
    api.wait(batch_id, lambda b: b["request_counts"]["completed"] > 0)
    before = model_seconds(server.port, model)
    soaked = open_load(server, bodies, rate, seconds)
    after = model_seconds(server.port, model)
    still_running = api.get(batch_id)["status"] == "in_progress"
    api.cancel(batch_id)
    api.wait(batch_id, lambda b: False)
    num_batches = after[1] - before[1]
    batch_ms = 1000 * (after[0] - before[0]) / num_batches if num_batches else None
    return {
        "rate_per_s": round(rate, 1),
        "idle": idle.to_dict(),
        "soak": soaked.to_dict(),
        "batch_time_ms": batch_ms,
        "was_soaking_throughout": still_running,
    }


class RssSampler:
    """Samples a process's resident set size in a background thread."""

    def __init__(self, pid: int, every_s: float = 0.05) -> None:
        self._pid = pid
        self._every_s = every_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            mb = rss_mb(self._pid)
            if mb is not None:
                self.samples.append((round(time.monotonic() - self._started, 3), mb))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def rss_mb(pid: int, field_name: str = "VmRSS") -> float | None:
    """A memory figure of a process from /proc, in MiB (None if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field_name}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def memory_run(
    server: ServerProcess, api: BatchApi, input_path: Path, num_lines: int
) -> dict[str, Any]:
    """RSS of the server while `input_path` is uploaded and processed as one job."""
    baseline = rss_mb(server.pid) or 0.0
    with RssSampler(server.pid) as sampler:
        upload_started = time.monotonic()
        file_id = api.upload(input_path)
        upload_s = time.monotonic() - upload_started
        batch = api.wait(api.create(file_id, EMBEDDINGS), lambda b: False)
        total_s = time.monotonic() - upload_started
    peak = max([baseline, *(mb for _, mb in sampler.samples)])
    file_mb = input_path.stat().st_size / MIB  # MiB, like the RSS figures
    return {
        "file_mb": round(file_mb, 1),
        "num_lines": num_lines,
        "status": batch["status"],
        "completed": batch["request_counts"]["completed"],
        "baseline_rss_mb": round(baseline, 1),
        "peak_rss_mb": round(peak, 1),
        "peak_increase_mb": round(peak - baseline, 1),
        "high_water_mb": rss_mb(server.pid, "VmHWM"),
        "upload_s": round(upload_s, 2),
        "total_s": round(total_s, 2),
        "samples": sampler.samples,
    }


# -- one model ---------------------------------------------------------------------------------
@dataclass(slots=True)
class ModelResult:
    """Everything measured for one model."""

    model: str
    online: list[dict[str, Any]] = field(default_factory=list)
    batch: list[dict[str, Any]] = field(default_factory=list)
    soak: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    skipped: str | None = None


def quiet(opts: Options) -> dict[str, Any]:
    """Wait (bounded) for a quiet machine; record how it went."""
    return wait_until_quiet(
        quiet_s=0.1 if opts.is_smoke else 1.0, max_wait_s=opts.quiet_max_wait_s
    ).to_dict()


def measure_embeddings(opts: Options, model: str, work_dir: Path) -> ModelResult:
    """Throughput pairs and the soak run for one embedding model."""
    sentences = make_sentences(1024)
    bodies = write_bodies(work_dir / f"{model}-bodies.json", model, sentences)
    job = work_dir / f"{model}-job.jsonl"
    write_jsonl(job, embedding_requests(model, sentences, opts.num_lines))
    result = ModelResult(model)
    with start_server(model, model_entry(model, work_dir), work_dir) as server:
        server.wait_ready(timeout_s=300)
        api = BatchApi(server.port)
        try:
            if not opts.is_smoke:
                online_saturation(server, bodies, model, 1.0)  # warm-up, not counted
            for rep in range(opts.repeats):
                _throughput_pair(opts, result, server, api, bodies, job, rep)
            online_per_s = statistics.median(r["throughput_per_s"] for r in result.online)
            fastest_per_s = max(
                online_per_s, max(r["processing_lines_per_s"] for r in result.batch)
            )
            soak_lines = max(
                opts.num_lines, math.ceil(fastest_per_s * (opts.soak_seconds + SOAK_SPARE_S))
            )
            soak_job = work_dir / f"{model}-soak.jsonl"
            write_jsonl(soak_job, embedding_requests(model, sentences, soak_lines))
            result.soak = soak(
                server,
                api,
                bodies,
                soak_job,
                model,
                SOAK_RATE_SHARE * online_per_s,
                opts.soak_seconds,
            )
        finally:
            api.close()
    return result


def _throughput_pair(
    opts: Options,
    result: ModelResult,
    server: ServerProcess,
    api: BatchApi,
    bodies: Path,
    job: Path,
    rep: int,
) -> None:
    """One online saturation run and one batch job, in alternating order."""

    def run_online() -> None:
        load = online_saturation(server, bodies, result.model, opts.online_seconds)
        result.online.append({"rep": rep, "quiet": quiet(opts), **load.to_dict()})

    def run_batch() -> None:
        stats = batch_throughput(api, job, opts.num_lines, EMBEDDINGS)
        result.batch.append({"rep": rep, "quiet": quiet(opts), **stats})

    first, second = (run_online, run_batch) if rep % 2 == 0 else (run_batch, run_online)
    first()
    second()
    print(
        f"  {result.model} rep {rep + 1}: online {result.online[-1]['throughput_per_s']:,.0f}/s,"
        f" batch {result.batch[-1]['lines_per_s']:,.0f} lines/s",
        flush=True,
    )


def measure_memory(opts: Options, work_dir: Path, server: ServerProcess) -> dict[str, Any]:
    """RSS of a synthetic server that did nothing else while a big input is processed."""
    path = work_dir / "memory.jsonl"
    size = write_jsonl(path, memory_requests(SYNTHETIC_MODEL, opts.memory_mb * MB))
    num_lines = max(1, opts.memory_mb * MB // MEMORY_LINE_BYTES)
    print(f"  memory: {size / MB:.0f} MB input, {num_lines} lines", flush=True)
    server.wait_ready(timeout_s=120)
    api = BatchApi(server.port)
    try:
        return memory_run(server, api, path, num_lines)
    finally:
        api.close()


def measure_generation(opts: Options, work_dir: Path) -> ModelResult:
    """Chat completions: batch against online, if the server answers them (not 501)."""
    result = ModelResult(GENERATION_MODEL)
    sentences = make_sentences(256)
    with start_server("generation", model_entry(GENERATION_MODEL, work_dir), work_dir) as server:
        server.wait_ready(timeout_s=300)
        probe = httpx.post(
            f"http://{LOCALHOST}:{server.port}{CHAT}",
            json=chat_body(GENERATION_MODEL, "hello"),
            timeout=120,
        )
        if probe.status_code != 200:
            result.skipped = f"{CHAT} answered {probe.status_code}"
            return result
        bodies = work_dir / "chat-bodies.json"
        bodies.write_text(
            json.dumps([json.dumps(chat_body(GENERATION_MODEL, s)) for s in sentences])
        )
        job = work_dir / "chat-job.jsonl"
        write_jsonl(job, chat_requests(GENERATION_MODEL, sentences, opts.generation_lines))
        api = BatchApi(server.port)
        try:
            load = online_saturation(server, bodies, GENERATION_MODEL, opts.online_seconds, CHAT)
            result.online.append({"rep": 0, **load.to_dict()})
            stats = batch_throughput(api, job, opts.generation_lines, CHAT)
            result.batch.append({"rep": 0, **stats})
        finally:
            api.close()
    return result


def _guarded(what: str, measure: Callable[[], Any]) -> Any:
    """Run one measurement; a failure is recorded (and printed), not fatal to the others."""
    try:
        return measure()
    except Exception as exc:  # a bench keeps the figures it has
        print(f"  {what} failed: {exc!r}", flush=True)
        return {"error": repr(exc)}


# -- figures and goals -------------------------------------------------------------------------
def model_figures(result: ModelResult) -> dict[str, Any]:
    """Medians of one model's runs and the paired batch/online ratio."""
    if result.skipped or not result.batch:
        return {"skipped": result.skipped}
    online = {r["rep"]: r["throughput_per_s"] for r in result.online}
    batch = {r["rep"]: r["lines_per_s"] for r in result.batch}
    ratios = [batch[rep] / online[rep] for rep in batch if online.get(rep)]
    figures: dict[str, Any] = {
        "online_saturation_per_s": statistics.median(online.values()),
        "batch_lines_per_s": statistics.median(batch.values()),
        "batch_over_online": round(statistics.median(ratios), 3) if ratios else None,
        "batch_over_online_runs": [round(r, 3) for r in ratios],
    }
    if result.soak is not None:
        idle, soaked = result.soak["idle"], result.soak["soak"]
        figures.update(
            idle_p99_ms=idle["p99_ms"],
            soak_p99_ms=soaked["p99_ms"],
            soak_p99_increase_ms=None
            if idle["p99_ms"] is None or soaked["p99_ms"] is None
            else round(soaked["p99_ms"] - idle["p99_ms"], 2),
            batch_time_ms=result.soak["batch_time_ms"],
        )
    return figures


def evaluate_goals(figures: dict[str, Any]) -> list[Goal]:
    """The issue's goals, per model, plus memory."""
    goals: list[Goal] = []
    for model, fig in figures["models"].items():
        if "batch_over_online" not in fig:
            continue
        goals.append(
            Goal(
                f"{model}_batch_vs_online",
                "batch lines/s over online saturated /s",
                fig["batch_over_online"],
                MIN_BATCH_SHARE,
                is_at_most=False,
            )
        )
        if "soak_p99_increase_ms" in fig and fig.get("batch_time_ms") is not None:
            goals.append(
                Goal(
                    f"{model}_soak_p99_within_one_batch",
                    "online p99 increase (ms)",
                    fig["soak_p99_increase_ms"],
                    round(fig["batch_time_ms"], 2),
                    is_at_most=True,
                )
            )
    memory = figures.get("memory")
    if memory and "error" not in memory:
        goals.append(
            Goal(
                "memory_peak_increase",
                "peak RSS increase / input size",
                round(memory["peak_increase_mb"] / memory["file_mb"], 3),
                MAX_MEMORY_SHARE,
                is_at_most=True,
            )
        )
    return goals


# -- the picture -------------------------------------------------------------------------------
def write_png(path: Path, result: dict[str, Any]) -> None:
    """Throughput bars, p99 bars, and the RSS trace of the memory run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = {m: f for m, f in result["figures"]["models"].items() if "batch_lines_per_s" in f}
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    names = list(models)
    _plot_throughput(axes[0], models, names)
    soaked = [m for m in names if models[m].get("soak_p99_ms") is not None]
    axes[1].bar(
        [x - 0.2 for x in range(len(soaked))],
        [models[m]["idle_p99_ms"] for m in soaked],
        0.4,
        label="idle",
    )
    axes[1].bar(
        [x + 0.2 for x in range(len(soaked))],
        [models[m]["soak_p99_ms"] for m in soaked],
        0.4,
        label="during a batch job",
    )
    for x, m in enumerate(soaked):
        if models[m].get("batch_time_ms"):
            limit = models[m]["idle_p99_ms"] + models[m]["batch_time_ms"]
            axes[1].hlines(
                limit,
                x - 0.4,
                x + 0.4,
                colors="grey",
                linestyles="--",
                label="idle p99 + one batch" if x == 0 else None,
            )
    axes[1].set_xticks(range(len(soaked)), soaked)
    axes[1].set_ylabel("online p99 latency (ms)")
    axes[1].set_title("online p99 while a batch job soaks the model")
    axes[1].legend(fontsize=8)
    _plot_memory(axes[2], result["memory"])
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_throughput(ax: Any, models: dict[str, Any], names: list[str]) -> None:
    """Batch lines/s over online requests/s per model (runs as dots), against the goal."""
    ratios = [models[m]["batch_over_online"] or 0.0 for m in names]
    ax.bar(range(len(names)), ratios, 0.6, label="median of paired runs")
    for x, model in enumerate(names):
        runs = models[model]["batch_over_online_runs"]
        ax.plot([x] * len(runs), runs, "k.", label="one run" if x == 0 else None)
        fig = models[model]
        label = f"{fig['batch_lines_per_s']:,.0f} vs {fig['online_saturation_per_s']:,.0f}/s"
        ax.annotate(label, (x, ratios[x]), ha="center", va="bottom", fontsize=8)
    ax.axhline(MIN_BATCH_SHARE, color="grey", linestyle="--", label=f"goal {MIN_BATCH_SHARE}")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("Batch API lines/s / online saturated req/s")
    ax.set_title("throughput: Batch API vs online (same model, same run)")
    ax.legend(fontsize=8)


def _plot_memory(ax: Any, memory: dict[str, Any] | None) -> None:
    """RSS over time against the input size."""
    ax.set_title("server RSS: upload and process one input")
    if not memory or not memory.get("samples"):
        return
    times, mbs = zip(*memory["samples"], strict=True)
    ax.plot(times, mbs, label="server RSS")
    ax.axhline(
        memory["baseline_rss_mb"] + memory["file_mb"],
        color="red",
        linestyle=":",
        label=f"baseline + input size ({memory['file_mb']:.0f} MiB)",
    )
    ax.axvline(memory["upload_s"], color="grey", linestyle="--", label="upload done")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)


# -- main --------------------------------------------------------------------------------------
def run_benchmark(opts: Options) -> dict[str, Any]:
    """Every measurement; the result document."""
    started_at = datetime.datetime.now(datetime.UTC)
    wall_started = time.monotonic()
    results: list[ModelResult] = []
    with (
        tempfile.TemporaryDirectory(prefix="conveyor-bench-batch-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        work_dir = Path(tmp)
        # Started now so it loads beside the first server; it stays idle until its turn.
        memory_server = stack.enter_context(
            start_server("memory", model_entry(SYNTHETIC_MODEL, work_dir), work_dir)
        )
        for model in opts.models:
            print(f"{model}:", flush=True)
            results.append(measure_embeddings(opts, model, work_dir))
        memory: dict[str, Any] = {"error": "not measured (--skip-memory)"}
        if opts.is_memory_wanted:
            print("memory:", flush=True)
            memory = _guarded("memory", lambda: measure_memory(opts, work_dir, memory_server))
        if opts.is_generation_wanted:
            print("generation:", flush=True)
            generation = _guarded("generation", lambda: measure_generation(opts, work_dir))
            if isinstance(generation, ModelResult):
                results.append(generation)
            else:
                results.append(ModelResult(GENERATION_MODEL, skipped=generation["error"]))
    figures: dict[str, Any] = {"models": {r.model: model_figures(r) for r in results}}
    figures["memory"] = {k: v for k, v in memory.items() if k != "samples"}
    if "error" in memory:
        memory = {}
    return {
        "name": "batch",
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - wall_started, 1),
        "inputs": {
            k: (_display_path(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()
        }
        | {"jobs_config": JOBS, "closed_clients": CLOSED_CLIENTS},
        "versions": package_versions(),
        "machine": machine_info(),
        "figures": figures,
        "goals": [goal.to_dict() for goal in evaluate_goals(figures)],
        "runs": {
            r.model: {"online": r.online, "batch": r.batch, "soak": r.soak, "skipped": r.skipped}
            for r in results
        },
        "memory": memory,
    }


def print_report(result: dict[str, Any]) -> None:
    """The figures and goals, as text."""
    for model, fig in result["figures"]["models"].items():
        print(f"{model}: {json.dumps(fig)}")
    print(f"memory: {json.dumps(result['figures']['memory'])}")
    for goal in result["goals"]:
        verdict = "PASS" if goal["passed"] else "FAIL"
        print(f"[{verdict}] {goal['name']}: {goal['value']} (target {goal['target']})")


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry: run, write batch.json and batch.png, print the report."""
    opts = parse_options(argv)
    signal.signal(signal.SIGTERM, _exit_on_signal)  # unwind so server children are stopped
    result = run_benchmark(opts)
    json_path, png_path = opts.out_dir / "batch.json", opts.out_dir / "batch.png"
    write_json(json_path, result)
    with contextlib.suppress(ImportError):
        write_png(png_path, result)
    print_report(result)
    print(f"wrote {json_path} and {png_path}")


def _display_path(path: Path) -> str:
    """A path as recorded in results: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    main()
