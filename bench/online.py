"""The online benchmark: the raw model ceiling, a no-batching server and Conveyor's
dynamic batching, side by side under open-loop load, for the bundled MiniLM and for the
synthetic model, plus the HTTP ceiling of the same server stack.

Run from the repository root:

    .venv/bin/python -m bench.online                 # full run, about 5-10 minutes
    .venv/bin/python -m bench.online --smoke --out DIR   # about 30 s, for tests

Writes ``online.json`` and ``online.png`` into ``--out`` (default ``bench/results``).
See ``bench/README.md`` for what each figure means.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from bench.common import (
    CLOCK_TICKS_PER_S,
    LOCALHOST,
    REPO_ROOT,
    RESULTS_DIR,
    Curve,
    CurvePanel,
    Line,
    ServerProcess,
    http_get,
    machine_busy_ticks,
    machine_info,
    package_versions,
    python_argv,
    wait_until_quiet,
    write_json,
    write_load_png,
)
from bench.loadgen import LoadMode, LoadResult, LoadSpec, run_load_process

MINILM_MODEL = "all-MiniLM-L6-v2"
SYNTHETIC_MODEL = "synthetic"
SYNTH_BATCH_SIZE = 100
SYNTH_BATCH_MS = 20.0
SYNTH_WAIT_MS = 5.0
SYNTH_CEILING_PER_S = SYNTH_BATCH_SIZE * 1000 / SYNTH_BATCH_MS
HALF_LOAD = 0.5
HALF_LOAD_P99_BUDGET_MS = SYNTH_BATCH_MS + SYNTH_WAIT_MS + 10.0
MINILM_MIN_SHARE_OF_RAW = 0.9
MINILM_MIN_SPEEDUP = 3.0
SYNTH_MIN_SHARE_OF_LIMIT = 0.85  # issue 10, part 3
# An open-loop rate counts as sustained when nearly all of it comes back, without
# errors, and the tail stays bounded (no backlog growing for the whole run).
SUSTAINED_MIN_SHARE = 0.95
SUSTAINED_MAX_P99_MS = 1000.0
MAX_CONNECTIONS = 1024
NOBATCH_CLOSED_CLIENTS = 8
BUSY_PCT = 85.0  # a core (or all of them) counts as saturated above this share
OTHERS_MAX_PCT = 25.0  # more CPU than this taken by strangers spoils a run
SERVE_CODE = "from conveyor.cli.main import app; app()"

HTTP = "http.trivial"
MINILM_RAW = "minilm.raw"
MINILM_RAW_SERVED = "minilm.raw_served_batch"
MINILM_NOBATCH = "minilm.nobatch"
MINILM_BATCHED = "minilm.batched"
SYNTH_RAW = "synthetic.raw"
SYNTH_NOBATCH = "synthetic.nobatch"
SYNTH_BATCHED = "synthetic.batched"

FIGURE_NAMES = (
    "http.ceiling_per_s",
    "minilm.raw_ceiling_per_s",
    "minilm.raw_at_served_batch_per_s",
    "minilm.nobatch.saturation_per_s",
    "minilm.batched.saturation_per_s",
    "minilm.batched_over_nobatch",
    "minilm.batched.half_load_p50_ms",
    "minilm.batched.half_load_p99_ms",
    "synthetic.model_ceiling_per_s",
    "synthetic.raw_ceiling_per_s",
    "synthetic.limit_per_s",
    "synthetic.nobatch.saturation_per_s",
    "synthetic.batched.saturation_per_s",
    "synthetic.batched_over_nobatch",
    "synthetic.batched.half_load_p50_ms",
    "synthetic.batched.half_load_p99_ms",
)
GOAL_NAMES = (
    "minilm_served_vs_raw",
    "minilm_batched_vs_nobatch",
    "synthetic_served_vs_limit",
    "synthetic_half_load_p99",
)


# -- options -------------------------------------------------------------------
DEFAULT_FRACTIONS = (0.25, 0.5, 0.75, 0.9, 1.0)
DEFAULT_RAW_BATCH_SIZES = (1, 8, 16, 32, 64, 128)
DEFAULT_RAW_THREADS = (1, 2)


@dataclass(frozen=True, slots=True)
class Options:
    """Sizes and knobs of one benchmark run."""

    out_dir: Path
    seconds: float = 2.5
    warmup_seconds: float = 1.5
    repeats: int = 3
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    minilm_batch_size: int = 64
    minilm_wait_ms: float = 5.0
    minilm_threads: int | None = None
    raw_batch_sizes: tuple[int, ...] = DEFAULT_RAW_BATCH_SIZES
    raw_threads: tuple[int, ...] = DEFAULT_RAW_THREADS
    num_sentences: int = 1024
    quiet_threshold_pct: float = 10.0
    quiet_s: float = 2.0
    quiet_max_wait_s: float = 8.0
    is_smoke: bool = False

    def __post_init__(self) -> None:
        if self.seconds <= 0 or self.warmup_seconds <= 0:
            raise ValueError("seconds and warmup_seconds must be positive")
        if self.repeats < 1:
            raise ValueError("repeats must be at least 1")
        if not self.fractions or any(not 0 < f <= 2 for f in self.fractions):
            raise ValueError("rates are fractions of each contender's ceiling, in (0, 2]")
        if HALF_LOAD not in self.fractions:
            raise ValueError(f"rates must include {HALF_LOAD} (the half-load goal)")
        if not 1 <= self.minilm_batch_size <= 65536 or self.minilm_wait_ms < 0:
            raise ValueError("minilm_batch_size must be in 1..65536, minilm_wait_ms >= 0")
        if not self.raw_batch_sizes or not self.raw_threads or self.num_sentences < 1:
            raise ValueError("raw_batch_sizes, raw_threads and num_sentences must not be empty")

    @property
    def ramp_s(self) -> float:
        """Leading part of each load run that is not counted."""
        return min(0.5, 0.15 * self.seconds)

    @property
    def drain_s(self) -> float:
        """How long a run waits for late answers before counting them unfinished."""
        return 0.5 if self.is_smoke else max(1.0, 0.5 * self.seconds)


def smoke_options(out_dir: Path) -> Options:
    """Tiny counts: every figure gets measured once, in well under a minute."""
    return Options(
        out_dir=out_dir,
        seconds=0.5,
        warmup_seconds=0.3,
        repeats=1,
        fractions=(HALF_LOAD,),
        raw_batch_sizes=(64,),
        raw_threads=(2,),
        num_sentences=128,
        quiet_s=0.1,
        quiet_max_wait_s=0.3,
        is_smoke=True,
    )


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.split(",") if part.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def parse_options(argv: Sequence[str] | None = None) -> Options:
    """Options from the command line (``--smoke`` ignores the sizing options)."""
    parser = argparse.ArgumentParser(description="Conveyor online benchmark.")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for the results")
    parser.add_argument("--smoke", action="store_true", help="tiny run (seconds) for tests")
    parser.add_argument("--seconds", type=float, default=2.5, help="length of each counted run")
    parser.add_argument("--warmup-seconds", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=3, help="counted runs per figure")
    parser.add_argument(
        "--rates",
        type=_floats,
        default=DEFAULT_FRACTIONS,
        help="offered rates as fractions of each contender's ceiling, e.g. 0.1,0.5,0.9",
    )
    parser.add_argument("--minilm-batch-size", type=int, default=64)
    parser.add_argument("--minilm-wait-ms", type=float, default=5.0)
    parser.add_argument("--minilm-threads", type=int, default=None, help="torch threads")
    parser.add_argument("--raw-batch-sizes", type=_ints, default=DEFAULT_RAW_BATCH_SIZES)
    parser.add_argument("--raw-threads", type=_ints, default=DEFAULT_RAW_THREADS)
    parser.add_argument("--quiet-max-wait-s", type=float, default=8.0)
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke_options(args.out)
    return Options(
        out_dir=args.out,
        seconds=args.seconds,
        warmup_seconds=args.warmup_seconds,
        repeats=args.repeats,
        fractions=tuple(sorted(set(args.rates))),
        minilm_batch_size=args.minilm_batch_size,
        minilm_wait_ms=args.minilm_wait_ms,
        minilm_threads=args.minilm_threads,
        raw_batch_sizes=args.raw_batch_sizes,
        raw_threads=args.raw_threads,
        quiet_max_wait_s=args.quiet_max_wait_s,
    )


# -- inputs --------------------------------------------------------------------
def _phrases(text: str) -> tuple[str, ...]:
    return tuple(text.split("|"))


# Short phrase lists; one pick from each makes a sentence (10,000 combinations).
_SUBJECTS = _phrases(
    "the new engineer|our search service|a small support team|the nightly job|this quarterly "
    "report|every mobile user|the night shift|my project manager|the old database|a patient "
    "customer"
)
_VERBS = _phrases(
    "measured|reviewed|rewrote|shipped|explained|tested|delayed|planned|checked|described"
)
_OBJECTS = _phrases(
    "the latency numbers|a quick security fix|the weekly travel budget|its search results "
    "page|the broken login page|a simple memory cache|the billing code|two open design "
    "questions|the flaky test suite|the product launch plan"
)
_TAILS = _phrases(
    "before lunch|after the outage|for the board meeting|with great care|in one "
    "afternoon|during the big storm|without any help|on friday morning|at the "
    "last minute|for the third time"
)


def make_sentences(count: int, *, seed: int = 7) -> list[str]:
    """Varied English sentences of about 14 MiniLM tokens (special tokens included)."""
    rng = random.Random(seed)
    return [
        f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} "
        f"{rng.choice(_OBJECTS)} {rng.choice(_TAILS)}."
        for _ in range(count)
    ]


def write_bodies(path: Path, model: str, sentences: Sequence[str]) -> Path:
    """One JSON request body per sentence (the load generator cycles through them)."""
    bodies = [
        json.dumps({"model": model, "input": text, "encoding_format": "float"})
        for text in sentences
    ]
    path.write_text(json.dumps(bodies))
    return path


# -- contenders ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ServerContender:
    """A server under test: Conveyor with one model entry, or the trivial app (no entry)."""

    key: str
    label: str
    model_entry: dict[str, Any] | None
    closed_clients: int
    bodies_path: Path


def minilm_entry(opts: Options, *, is_batched: bool) -> dict[str, Any]:
    """The served MiniLM: batched as configured, or one input per batch."""
    entry: dict[str, Any] = {
        "name": MINILM_MODEL,
        "kind": "embedding",
        "max_batch_size": opts.minilm_batch_size if is_batched else 1,
        "max_wait_ms": opts.minilm_wait_ms if is_batched else 0.0,
        "max_queue": 8192,
    }
    if opts.minilm_threads is not None:
        entry["threads"] = opts.minilm_threads
    return entry


def synthetic_entry(*, is_batched: bool) -> dict[str, Any]:
    """The classic setting: up to 100 inputs per batch, 20 ms per batch."""
    return {
        "name": SYNTHETIC_MODEL,
        "kind": "synthetic",
        "max_batch_size": SYNTH_BATCH_SIZE if is_batched else 1,
        "max_wait_ms": SYNTH_WAIT_MS,
        "batch_latency_ms": SYNTH_BATCH_MS,
        "per_item_ms": 0.0,
        "dim": 8,
        "max_queue": 1_000_000,
    }


def build_contenders(
    opts: Options, work_dir: Path, sentences: Sequence[str]
) -> dict[str, ServerContender]:
    """Every server contender, keyed by its figure prefix."""
    minilm_bodies = write_bodies(work_dir / "minilm-bodies.json", MINILM_MODEL, sentences)
    synth_bodies = write_bodies(work_dir / "synthetic-bodies.json", SYNTHETIC_MODEL, sentences)
    batched_clients = 2 * opts.minilm_batch_size + 8
    synth_clients = 2 * SYNTH_BATCH_SIZE + 56
    contenders = [
        ServerContender(HTTP, "trivial FastAPI app", None, synth_clients, synth_bodies),
        ServerContender(
            MINILM_NOBATCH,
            "MiniLM, no batching",
            minilm_entry(opts, is_batched=False),
            NOBATCH_CLOSED_CLIENTS,
            minilm_bodies,
        ),
        ServerContender(
            MINILM_BATCHED,
            f"MiniLM, Conveyor (batch {opts.minilm_batch_size}, wait {opts.minilm_wait_ms:g} ms)",
            minilm_entry(opts, is_batched=True),
            batched_clients,
            minilm_bodies,
        ),
        ServerContender(
            SYNTH_NOBATCH,
            "synthetic, no batching",
            synthetic_entry(is_batched=False),
            NOBATCH_CLOSED_CLIENTS,
            synth_bodies,
        ),
        ServerContender(
            SYNTH_BATCHED,
            "synthetic, Conveyor (batch 100, wait 5 ms)",
            synthetic_entry(is_batched=True),
            synth_clients,
            synth_bodies,
        ),
    ]
    return {contender.key: contender for contender in contenders}


def _server_argv(contender: ServerContender, work_dir: Path) -> Callable[[int], list[str]]:
    if contender.model_entry is None:
        return lambda port: python_argv("-m", "bench.trivial_app", f"--port={port}")
    config = {
        "host": LOCALHOST,
        "log_level": "warning",
        "data_dir": str(work_dir / f"{contender.key}-data"),
        "models": [contender.model_entry],
    }
    config_path = work_dir / f"{contender.key}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    return lambda port: python_argv(
        "-c", SERVE_CODE, "serve", f"--config={config_path}", f"--port={port}"
    )


def launch_servers(
    stack: contextlib.ExitStack, contenders: dict[str, ServerContender], work_dir: Path
) -> dict[str, ServerProcess]:
    """Launch every server at once, so their models load in parallel (not ready yet)."""
    servers: dict[str, ServerProcess] = {}
    for key, contender in contenders.items():
        log_path = work_dir / f"{key}.log"
        server = ServerProcess(key, _server_argv(contender, work_dir), log_path=log_path)
        stack.enter_context(server)
        server.start()
        servers[key] = server
    return servers


# -- raw ceilings (the model called in-process, no server) ---------------------------
class RawModel(Protocol):
    """A model measured in-process at a given batch size."""

    def inputs_per_s(self, batch_size: int, seconds: float, threads: int | None) -> float:
        """Inputs per second running batches of ``batch_size`` back to back."""
        ...


def time_batches(
    run: Callable[[list[Any]], object], payloads: Sequence[Any], batch_size: int, seconds: float
) -> float:
    """Run batches back to back for about ``seconds`` (after one untimed batch)."""

    def batch_at(offset: int) -> list[Any]:
        return [payloads[(offset + k) % len(payloads)] for k in range(batch_size)]

    run(batch_at(0))
    num_inputs, offset = 0, batch_size
    started = time.perf_counter()
    while True:
        run(batch_at(offset))
        offset += batch_size
        num_inputs += batch_size
        elapsed_s = time.perf_counter() - started
        if elapsed_s >= seconds and num_inputs >= 2 * batch_size:
            return num_inputs / elapsed_s


class MiniLMRaw:
    """The bundled MiniLM in this process, on pre-tokenised sentences (as the server's
    model thread sees them: tokenising happens on its event loop, not in the batch)."""

    def __init__(self, sentences: Sequence[str]) -> None:
        import torch

        from conveyor.config.model_config import EmbeddingModelConfig
        from conveyor.models.embedding import SentenceEmbeddingModel

        self._torch = torch
        self.default_threads = torch.get_num_threads()
        config = EmbeddingModelConfig(name=MINILM_MODEL, kind="embedding")
        self._model = SentenceEmbeddingModel(config)
        encoded = self._model.encode(list(sentences), truncate=False)
        self.payloads = [item.payload for item in encoded]
        self.mean_tokens = sum(item.num_tokens for item in encoded) / len(encoded)

    def inputs_per_s(self, batch_size: int, seconds: float, threads: int | None) -> float:
        """Throughput at ``batch_size`` with ``threads`` torch threads (None: default)."""
        self._torch.set_num_threads(threads or self.default_threads)
        try:
            return time_batches(self._model.embed_batch, self.payloads, batch_size, seconds)
        finally:
            self._torch.set_num_threads(self.default_threads)


class SyntheticRaw:
    """The synthetic model in this process (its batch time is a sleep)."""

    def __init__(self, sentences: Sequence[str]) -> None:
        from conveyor.config.model_config import SyntheticModelConfig
        from conveyor.models.synthetic import SyntheticModel

        self._model = SyntheticModel(
            SyntheticModelConfig.model_validate(synthetic_entry(is_batched=True))
        )
        self.payloads = list(sentences)

    def inputs_per_s(self, batch_size: int, seconds: float, threads: int | None) -> float:
        """Throughput at ``batch_size`` (threads do not matter for a sleep)."""
        return time_batches(self._model.embed_batch, self.payloads, batch_size, seconds)


# -- one run ---------------------------------------------------------------------
@dataclass(slots=True)
class RunRecord:
    """One measured run. ``rep`` -1 is the warm-up (discarded)."""

    rep: int
    contender: str
    mode: str
    throughput_per_s: float
    fraction: float | None = None
    offered_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    is_sustained: bool = True
    details: dict[str, Any] = field(default_factory=dict)


def is_sustained(result: LoadResult) -> bool:
    """Did the server keep up with this open-loop rate?"""
    offered = result.offered_per_s or 0.0
    return (
        result.num_errors == 0
        and result.num_unfinished == 0
        and result.p99_ms is not None
        and result.p99_ms <= SUSTAINED_MAX_P99_MS
        and result.throughput_per_s >= SUSTAINED_MIN_SHARE * offered
    )


_METRIC = re.compile(
    r"^(conveyor_batch_size_inputs_sum|conveyor_batch_size_inputs_count|"
    r"conveyor_batches_total)\{([^}]*)\} (\S+)$"
)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def batch_counters(port: int, model: str) -> dict[str, float]:
    """Conveyor's own batch counters for ``model``, read from /metrics."""
    _, body = http_get(port, "/metrics")
    counters: dict[str, float] = {}
    for line in body.decode().splitlines():
        match = _METRIC.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match.group(2)))
        if labels.get("model") != model:
            continue
        name = match.group(1).removeprefix("conveyor_")
        key = f"{name}.{labels['reason']}" if "reason" in labels else name
        counters[key] = float(match.group(3))
    return counters


def batch_summary(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Mean batch size and why batches closed, over one run."""
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    num_batches = delta.get("batch_size_inputs_count", 0.0)
    closed = {k.split(".", 1)[1]: v for k, v in delta.items() if k.startswith("batches_total.")}
    return {
        "num_batches": num_batches,
        "mean_batch_size": delta.get("batch_size_inputs_sum", 0.0) / num_batches
        if num_batches
        else None,
        "closed_by": closed,
    }


@dataclass(frozen=True, slots=True)
class _ServerMark:
    at_s: float
    total_ticks: int
    loop_ticks: int
    machine_ticks: int
    counters: dict[str, float]


def _mark(server: ServerProcess, contender: ServerContender) -> _ServerMark:
    model = (contender.model_entry or {}).get("name")
    counters = batch_counters(server.port, model) if model else {}
    return _ServerMark(
        time.monotonic(),
        server.total_ticks(),
        server.main_thread_ticks(),
        machine_busy_ticks(),
        counters,
    )


def server_usage(before: _ServerMark, after: _ServerMark, result: LoadResult) -> dict[str, Any]:
    """Where the server's CPU went during a run: the event loop (main thread) and the rest."""
    wall_s = max(1e-9, after.at_s - before.at_s)
    total_s = (after.total_ticks - before.total_ticks) / CLOCK_TICKS_PER_S
    loop_s = (after.loop_ticks - before.loop_ticks) / CLOCK_TICKS_PER_S
    machine_s = (after.machine_ticks - before.machine_ticks) / CLOCK_TICKS_PER_S
    loadgen_s = result.loadgen_cpu_pct / 100 * result.wall_s
    num_answers = max(1, result.num_ok + result.num_errors)
    return {
        "machine_cpu_pct": round(100 * machine_s / wall_s, 1),
        "others_cpu_pct": round(100 * max(0.0, machine_s - total_s - loadgen_s) / wall_s, 1),
        "cpu_pct": round(100 * total_s / wall_s, 1),
        "loop_cpu_pct": round(100 * loop_s / wall_s, 1),
        "other_threads_cpu_pct": round(100 * (total_s - loop_s) / wall_s, 1),
        "cpu_us_per_request": round(1e6 * total_s / num_answers, 1),
        "loop_cpu_us_per_request": round(1e6 * loop_s / num_answers, 1),
    }


@dataclass(frozen=True, slots=True)
class RateTarget:
    """What a contender's offered rates are fractions of, and its pool-sizing latency."""

    reference_per_s: float
    expected_latency_ms: float


@dataclass(slots=True)
class References:
    """The raw scan's best setting, and the rate targets used in each counted rep."""

    targets_by_rep: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)
    minilm_best_batch_size: int = 1
    minilm_best_threads: int | None = None
    minilm_raw_scan: list[dict[str, Any]] = field(default_factory=list)


class Campaign:
    """Runs the contenders, records every run, waits for a quiet machine before each
    counted one."""

    def __init__(
        self,
        opts: Options,
        contenders: dict[str, ServerContender],
        servers: dict[str, ServerProcess],
        raws: dict[str, RawModel],
    ) -> None:
        self.opts = opts
        self.contenders = contenders
        self.servers = servers
        self.raws = raws
        self.records: list[RunRecord] = []
        self.refs = References()
        self._started_at = time.monotonic()

    def _quiet(self, rep: int) -> dict[str, Any] | None:
        if rep < 0:
            return None
        report = wait_until_quiet(
            threshold_pct=self.opts.quiet_threshold_pct,
            quiet_s=self.opts.quiet_s,
            max_wait_s=self.opts.quiet_max_wait_s,
        )
        return report.to_dict()

    def _keep(self, record: RunRecord) -> RunRecord:
        self.records.append(record)
        _log_run(record, time.monotonic() - self._started_at)
        return record

    def raw_run(
        self, rep: int, key: str, batch_size: int, threads: int | None, seconds: float
    ) -> RunRecord:
        """Measure a model in-process at one batch size."""
        quiet = self._quiet(rep)
        per_s = self.raws[key.split(".")[0]].inputs_per_s(batch_size, seconds, threads)
        details = {"batch_size": batch_size, "threads": threads, "quiet": quiet}
        return self._keep(RunRecord(rep, key, "raw", per_s, details=details))

    def closed_run(self, rep: int, key: str, seconds: float) -> RunRecord:
        """Saturate a server with its closed-loop clients."""
        contender = self.contenders[key]
        spec = LoadSpec(
            LoadMode.CLOSED,
            seconds,
            num_clients=contender.closed_clients,
            max_connections=MAX_CONNECTIONS,
            ramp_s=min(0.5, 0.15 * seconds),
            drain_s=self.opts.drain_s,
        )
        return self._load_run(rep, contender, spec, None)

    def open_run(self, rep: int, key: str, fraction: float, target: RateTarget) -> RunRecord:
        """Offer ``fraction`` of the target's reference rate on a fixed schedule."""
        contender = self.contenders[key]
        spec = LoadSpec(
            LoadMode.OPEN,
            self.opts.seconds,
            rate_per_s=fraction * target.reference_per_s,
            expected_latency_ms=target.expected_latency_ms,
            max_connections=MAX_CONNECTIONS,
            ramp_s=self.opts.ramp_s,
            drain_s=self.opts.drain_s,
        )
        return self._load_run(rep, contender, spec, fraction)

    def _load_run(
        self, rep: int, contender: ServerContender, spec: LoadSpec, fraction: float | None
    ) -> RunRecord:
        quiet = self._quiet(rep)
        server = self.servers[contender.key]
        before = _mark(server, contender)
        result = run_load_process(spec, server.port, contender.bodies_path)
        after = _mark(server, contender)
        details: dict[str, Any] = {
            "quiet": quiet,
            "load": result.to_dict(),
            "server": server_usage(before, after, result),
        }
        if contender.model_entry is not None:
            details["batches"] = batch_summary(before.counters, after.counters)
        mode = spec.mode.value
        sustained = is_sustained(result) if spec.mode is LoadMode.OPEN else result.num_errors == 0
        record = RunRecord(
            rep,
            contender.key,
            mode,
            result.throughput_per_s,
            fraction,
            result.offered_per_s,
            result.p50_ms,
            result.p99_ms,
            sustained,
            details,
        )
        return self._keep(record)


def _log_run(record: RunRecord, elapsed_s: float) -> None:
    rep = "warm-up" if record.rep < 0 else f"run {record.rep + 1}"
    offered = f" at {record.offered_per_s:,.0f}/s" if record.offered_per_s else ""
    latency = (
        f", p50 {record.p50_ms} ms, p99 {record.p99_ms} ms" if record.p99_ms is not None else ""
    )
    flag = "" if record.is_sustained else " (not sustained)"
    print(
        f"{elapsed_s:6.1f}s [{rep}] {record.contender} {record.mode}{offered}: "
        f"{record.throughput_per_s:,.0f}/s{latency}{flag}",
        file=sys.stderr,
        flush=True,
    )


# -- the schedule ------------------------------------------------------------------
def warm_up(campaign: Campaign) -> None:
    """Discarded runs: scan MiniLM's batch sizes and thread counts for its raw ceiling,
    then touch every model and saturate every server once."""
    opts, refs = campaign.opts, campaign.refs
    best: RunRecord | None = None
    for threads in opts.raw_threads:
        for batch_size in opts.raw_batch_sizes:
            record = campaign.raw_run(-1, MINILM_RAW, batch_size, threads, opts.warmup_seconds)
            refs.minilm_raw_scan.append(
                {"batch_size": batch_size, "threads": threads, "per_s": record.throughput_per_s}
            )
            if best is None or record.throughput_per_s > best.throughput_per_s:
                best = record
    if best is None:
        raise RuntimeError("the raw scan measured nothing")
    refs.minilm_best_batch_size = int(best.details["batch_size"])
    refs.minilm_best_threads = best.details["threads"]
    campaign.raw_run(
        -1, MINILM_RAW_SERVED, opts.minilm_batch_size, opts.minilm_threads, opts.warmup_seconds
    )
    campaign.raw_run(-1, SYNTH_RAW, SYNTH_BATCH_SIZE, None, opts.warmup_seconds)
    for key in campaign.contenders:
        campaign.closed_run(-1, key, opts.warmup_seconds)


def run_rep(campaign: Campaign, rep: int) -> None:
    """One counted run of every contender. Offered rates are fractions of ceilings
    measured earlier in the same rep, so half load is half of this run's ceiling."""
    opts, refs = campaign.opts, campaign.refs
    http_per_s = campaign.closed_run(rep, HTTP, opts.seconds).throughput_per_s
    raw = campaign.raw_run(
        rep, MINILM_RAW, refs.minilm_best_batch_size, refs.minilm_best_threads, opts.seconds
    )
    served = campaign.raw_run(
        rep, MINILM_RAW_SERVED, opts.minilm_batch_size, opts.minilm_threads, opts.seconds
    )
    served_batch_ms = 1000 * opts.minilm_batch_size / max(served.throughput_per_s, 1e-9)
    minilm = RateTarget(raw.throughput_per_s, 2 * (served_batch_ms + opts.minilm_wait_ms))
    _run_pair(campaign, rep, MINILM_NOBATCH, MINILM_BATCHED, minilm)
    campaign.raw_run(rep, SYNTH_RAW, SYNTH_BATCH_SIZE, None, opts.seconds)
    synthetic = RateTarget(
        min(SYNTH_CEILING_PER_S, http_per_s), 2 * (SYNTH_BATCH_MS + SYNTH_WAIT_MS)
    )
    _run_pair(campaign, rep, SYNTH_NOBATCH, SYNTH_BATCHED, synthetic)


def _run_pair(
    campaign: Campaign, rep: int, nobatch: str, batched: str, batched_target: RateTarget
) -> None:
    """Saturate both servers, then sweep rates, alternating them (order flips each rep)."""
    order = (batched, nobatch) if rep % 2 else (nobatch, batched)
    closed = {key: campaign.closed_run(rep, key, campaign.opts.seconds) for key in order}
    nobatch_per_s = closed[nobatch].throughput_per_s
    # Pools sized for a few service times; the load generator opens more if needed.
    nobatch_latency_ms = min(1000.0, max(5.0, 4000 / max(nobatch_per_s, 1e-9)))
    targets = {nobatch: RateTarget(nobatch_per_s, nobatch_latency_ms), batched: batched_target}
    campaign.refs.targets_by_rep.setdefault(rep, {}).update(
        {key: asdict(target) for key, target in targets.items()}
    )
    _sweep(campaign, rep, order, targets)


def _sweep(
    campaign: Campaign, rep: int, order: Sequence[str], targets: dict[str, RateTarget]
) -> None:
    """Increasing rates; past its first unsustained rate a contender skips the rest
    (except rates up to half load, which the goals need)."""
    stopped = {key for key in order if targets[key].reference_per_s <= 0}
    for fraction in campaign.opts.fractions:
        for key in order:
            if key in stopped and (fraction > HALF_LOAD or targets[key].reference_per_s <= 0):
                continue
            if not campaign.open_run(rep, key, fraction, targets[key]).is_sustained:
                stopped.add(key)


# -- aggregation -------------------------------------------------------------------
def _counted(records: Sequence[RunRecord], key: str, mode: str) -> list[RunRecord]:
    return [r for r in records if r.rep >= 0 and r.contender == key and r.mode == mode]


def saturation_by_rep(records: Sequence[RunRecord], key: str) -> dict[int, float]:
    """Per rep: the best of the closed-loop throughput and every sustained open-loop rate."""
    best: dict[int, float] = {}
    for record in records:
        if record.rep < 0 or record.contender != key or record.mode == "raw":
            continue
        if record.mode == "open" and not record.is_sustained:
            continue
        best[record.rep] = max(best.get(record.rep, 0.0), record.throughput_per_s)
    return best


def raw_by_rep(records: Sequence[RunRecord], key: str) -> dict[int, float]:
    """Per rep: the in-process throughput."""
    return {r.rep: r.throughput_per_s for r in _counted(records, key, "raw")}


def half_load_by_rep(records: Sequence[RunRecord], key: str, attr: str) -> dict[int, float]:
    """Per rep: a latency percentile of the half-load open-loop run."""
    values: dict[int, float] = {}
    for record in _counted(records, key, "open"):
        value = getattr(record, attr)
        if record.fraction == HALF_LOAD and value is not None:
            values[record.rep] = float(value)
    return values


def spread(values: Sequence[float]) -> dict[str, float] | None:
    """Median, min and max (None when nothing was measured)."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def figure(
    values: dict[int, float],
    unit: str,
    *,
    reference: str | None = None,
    ref_values: dict[int, float] | None = None,
) -> dict[str, Any]:
    """A figure: median and spread over counted runs, and its ratio to a reference
    measured in the same runs (paired run by run)."""
    reps = sorted(values)
    stats: dict[str, float | None] = {"median": None, "min": None, "max": None}
    stats.update(spread([values[rep] for rep in reps]) or {})
    ratio = None
    if ref_values is not None:
        ratios = [values[rep] / ref_values[rep] for rep in reps if ref_values.get(rep)]
        ratio = spread(ratios)
    return {
        "unit": unit,
        **stats,
        "num_runs": len(reps),
        "runs": [values[r] for r in reps],
        "reference": reference,
        "ratio": ratio,
    }


def _paired_ratio(top: dict[int, float], bottom: dict[int, float]) -> dict[int, float]:
    return {rep: top[rep] / bottom[rep] for rep in top if bottom.get(rep)}


def build_figures(records: Sequence[RunRecord]) -> dict[str, dict[str, Any]]:
    """Every figure of FIGURE_NAMES, from the counted runs."""
    http = saturation_by_rep(records, HTTP)
    m_raw, m_served = raw_by_rep(records, MINILM_RAW), raw_by_rep(records, MINILM_RAW_SERVED)
    m_nob, m_bat = (
        saturation_by_rep(records, MINILM_NOBATCH),
        saturation_by_rep(records, MINILM_BATCHED),
    )
    s_model = {rep: SYNTH_CEILING_PER_S for rep in http}
    s_raw = raw_by_rep(records, SYNTH_RAW)
    s_limit = {rep: min(SYNTH_CEILING_PER_S, value) for rep, value in http.items()}
    s_nob, s_bat = (
        saturation_by_rep(records, SYNTH_NOBATCH),
        saturation_by_rep(records, SYNTH_BATCHED),
    )
    budget = {rep: HALF_LOAD_P99_BUDGET_MS for rep in http}
    ips = "inputs/s"
    figures = {
        "http.ceiling_per_s": figure(
            http, ips, reference="synthetic.model_ceiling_per_s", ref_values=s_model
        ),
        "minilm.raw_ceiling_per_s": figure(m_raw, ips),
        "minilm.raw_at_served_batch_per_s": figure(
            m_served, ips, reference="minilm.raw_ceiling_per_s", ref_values=m_raw
        ),
        "minilm.nobatch.saturation_per_s": figure(
            m_nob, ips, reference="minilm.raw_ceiling_per_s", ref_values=m_raw
        ),
        "minilm.batched.saturation_per_s": figure(
            m_bat, ips, reference="minilm.raw_ceiling_per_s", ref_values=m_raw
        ),
        "minilm.batched_over_nobatch": figure(_paired_ratio(m_bat, m_nob), "x"),
        "minilm.batched.half_load_p50_ms": figure(
            half_load_by_rep(records, MINILM_BATCHED, "p50_ms"), "ms"
        ),
        "minilm.batched.half_load_p99_ms": figure(
            half_load_by_rep(records, MINILM_BATCHED, "p99_ms"), "ms"
        ),
        "synthetic.model_ceiling_per_s": figure(s_model, ips),
        "synthetic.raw_ceiling_per_s": figure(
            s_raw, ips, reference="synthetic.model_ceiling_per_s", ref_values=s_model
        ),
        "synthetic.limit_per_s": figure(
            s_limit, ips, reference="synthetic.model_ceiling_per_s", ref_values=s_model
        ),
        "synthetic.nobatch.saturation_per_s": figure(
            s_nob, ips, reference="synthetic.limit_per_s", ref_values=s_limit
        ),
        "synthetic.batched.saturation_per_s": figure(
            s_bat, ips, reference="synthetic.limit_per_s", ref_values=s_limit
        ),
        "synthetic.batched_over_nobatch": figure(_paired_ratio(s_bat, s_nob), "x"),
        "synthetic.batched.half_load_p50_ms": figure(
            half_load_by_rep(records, SYNTH_BATCHED, "p50_ms"), "ms"
        ),
        "synthetic.batched.half_load_p99_ms": figure(
            half_load_by_rep(records, SYNTH_BATCHED, "p99_ms"),
            "ms",
            reference="half-load p99 budget (35 ms)",
            ref_values=budget,
        ),
    }
    return figures


@dataclass(frozen=True, slots=True)
class Goal:
    """A goal from the issue, evaluated on this run's medians."""

    name: str
    description: str
    value: float | None
    target: float
    is_at_most: bool

    @property
    def passed(self) -> bool:
        """True when measured and on the right side of the target."""
        if self.value is None:
            return False
        return self.value <= self.target if self.is_at_most else self.value >= self.target

    @property
    def margin(self) -> float | None:
        """How far inside (positive) or outside (negative) the target."""
        if self.value is None:
            return None
        return self.target - self.value if self.is_at_most else self.value - self.target

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self), "passed": self.passed, "margin": self.margin}


def _median(fig: dict[str, Any], *, of_ratio: bool = False) -> float | None:
    source = fig.get("ratio") if of_ratio else fig
    return None if source is None else source.get("median")


def evaluate_goals(figures: dict[str, dict[str, Any]]) -> list[Goal]:
    """The issue's four goals, on the medians of paired ratios."""
    return [
        Goal(
            "minilm_served_vs_raw",
            "MiniLM served throughput / raw ceiling",
            _median(figures["minilm.batched.saturation_per_s"], of_ratio=True),
            MINILM_MIN_SHARE_OF_RAW,
            False,
        ),
        Goal(
            "minilm_batched_vs_nobatch",
            "MiniLM batched / no-batching server",
            _median(figures["minilm.batched_over_nobatch"]),
            MINILM_MIN_SPEEDUP,
            False,
        ),
        Goal(
            "synthetic_served_vs_limit",
            "synthetic served / min(5,000/s, HTTP ceiling)",
            _median(figures["synthetic.batched.saturation_per_s"], of_ratio=True),
            SYNTH_MIN_SHARE_OF_LIMIT,
            False,
        ),
        Goal(
            "synthetic_half_load_p99",
            "synthetic p99 at half load (ms)",
            _median(figures["synthetic.batched.half_load_p99_ms"]),
            HALF_LOAD_P99_BUDGET_MS,
            True,
        ),
    ]


def build_curves(
    records: Sequence[RunRecord], fractions: Sequence[float]
) -> dict[str, list[dict[str, Any]]]:
    """Per server contender and offered rate: medians and spreads over counted runs."""
    curves: dict[str, list[dict[str, Any]]] = {}
    for key in (MINILM_NOBATCH, MINILM_BATCHED, SYNTH_NOBATCH, SYNTH_BATCHED):
        points = []
        for fraction in fractions:
            runs = [r for r in _counted(records, key, "open") if r.fraction == fraction]
            if runs:
                points.append(_curve_point(fraction, runs))
        curves[key] = points
    return curves


def _curve_point(fraction: float, runs: Sequence[RunRecord]) -> dict[str, Any]:
    offered = [r.offered_per_s for r in runs if r.offered_per_s is not None]
    return {
        "fraction": fraction,
        "num_runs": len(runs),
        "num_sustained": sum(r.is_sustained for r in runs),
        "offered_per_s": statistics.median(offered) if offered else None,
        "throughput_per_s": _spread_of(runs, lambda r: r.throughput_per_s),
        "p50_ms": _spread_of(runs, lambda r: r.p50_ms),
        "p99_ms": _spread_of(runs, lambda r: r.p99_ms),
        "server_cpu_pct": _spread_of(runs, lambda r: r.details["server"]["cpu_pct"]),
        "loop_cpu_pct": _spread_of(runs, lambda r: r.details["server"]["loop_cpu_pct"]),
        "mean_batch_size": _spread_of(
            runs, lambda r: r.details.get("batches", {}).get("mean_batch_size")
        ),
        "loadgen_cpu_pct": _spread_of(runs, lambda r: r.details["load"]["loadgen_cpu_pct"]),
        "others_cpu_pct": _spread_of(runs, lambda r: r.details["server"]["others_cpu_pct"]),
    }


def _spread_of(
    runs: Sequence[RunRecord], pick: Callable[[RunRecord], Any]
) -> dict[str, float] | None:
    return spread([float(value) for value in map(pick, runs) if value is not None])


def saturation_details(records: Sequence[RunRecord]) -> dict[str, dict[str, Any]]:
    """For each server's closed-loop runs: where its CPU went (the physical limit check)."""
    details: dict[str, dict[str, Any]] = {}
    for key in (HTTP, MINILM_NOBATCH, MINILM_BATCHED, SYNTH_NOBATCH, SYNTH_BATCHED):
        runs = _counted(records, key, "closed")
        details[key] = {
            "throughput_per_s": _spread_of(runs, lambda r: r.throughput_per_s),
            "p50_ms": _spread_of(runs, lambda r: r.p50_ms),
            "p99_ms": _spread_of(runs, lambda r: r.p99_ms),
            "server_cpu_pct": _spread_of(runs, lambda r: r.details["server"]["cpu_pct"]),
            "loop_cpu_pct": _spread_of(runs, lambda r: r.details["server"]["loop_cpu_pct"]),
            "loop_cpu_us_per_request": _spread_of(
                runs, lambda r: r.details["server"]["loop_cpu_us_per_request"]
            ),
            "cpu_us_per_request": _spread_of(
                runs, lambda r: r.details["server"]["cpu_us_per_request"]
            ),
            "mean_batch_size": _spread_of(
                runs, lambda r: r.details.get("batches", {}).get("mean_batch_size")
            ),
            "loadgen_cpu_pct": _spread_of(runs, lambda r: r.details["load"]["loadgen_cpu_pct"]),
            "others_cpu_pct": _spread_of(runs, lambda r: r.details["server"]["others_cpu_pct"]),
        }
        details[key]["limited_by"] = limit_verdict(details[key], os.cpu_count() or 1)
    return details


def limit_verdict(detail: dict[str, Any], num_cpus: int) -> str:
    """Which resource ran out at saturation, from median CPU shares."""

    def median(name: str) -> float:
        stats = detail.get(name)
        return 0.0 if stats is None else float(stats["median"])

    if median("others_cpu_pct") >= OTHERS_MAX_PCT:
        return "other processes: they took CPU during the runs (not a clean measurement)"
    if median("loop_cpu_pct") >= BUSY_PCT:
        return "event loop: its one core is saturated"
    if median("server_cpu_pct") + median("loadgen_cpu_pct") >= BUSY_PCT * num_cpus:
        return "machine CPU: every core is busy (model threads, event loop, load generator)"
    return "not CPU: the server waits (model time, batching)"


def quiet_summary(records: Sequence[RunRecord]) -> dict[str, Any]:
    """Whether the machine was busy during counted runs."""
    reports = [r.details["quiet"] for r in records if r.rep >= 0 and r.details.get("quiet")]
    busy = [report for report in reports if report["is_busy"]]
    return {
        "num_counted_runs": len(reports),
        "num_busy": len(busy),
        "was_busy": bool(busy),
        "max_busiest_pct": max((report["busiest_pct"] for report in reports), default=None),
        "busy_culprits": sorted({report["busiest_name"] for report in busy}),
        "total_wait_s": round(sum(report["waited_s"] for report in reports), 1),
    }


# -- output ------------------------------------------------------------------------
def _curve(label: str, points: Sequence[dict[str, Any]]) -> Curve:
    def median(point: dict[str, Any], name: str) -> float | None:
        stats = point[name]
        return None if stats is None else float(stats["median"])

    return Curve(
        label=label,
        offered_per_s=[float(p["offered_per_s"]) for p in points],
        throughput_per_s=[median(p, "throughput_per_s") or 0.0 for p in points],
        p50_ms=[median(p, "p50_ms") for p in points],
        p99_ms=[median(p, "p99_ms") for p in points],
    )


def write_png(path: Path, result: dict[str, Any]) -> None:
    """Throughput and latency against offered load, MiniLM on top, synthetic below."""
    curves, figures = result["curves"], result["figures"]
    labels = {key: entry["label"] for key, entry in result["inputs"]["contenders"].items()}

    def line(label: str, name: str) -> list[Line]:
        value = figures[name]["median"]
        return [] if value is None else [Line(label, float(value))]

    minilm = CurvePanel(
        "MiniLM",
        [_curve(labels[k], curves[k]) for k in (MINILM_NOBATCH, MINILM_BATCHED)],
        line("raw ceiling (in-process)", "minilm.raw_ceiling_per_s"),
    )
    synthetic = CurvePanel(
        "synthetic (100 per batch, 20 ms)",
        [_curve(labels[k], curves[k]) for k in (SYNTH_NOBATCH, SYNTH_BATCHED)],
        line("model ceiling", "synthetic.model_ceiling_per_s")
        + line("HTTP ceiling (trivial app)", "http.ceiling_per_s"),
        [Line("half-load p99 budget", HALF_LOAD_P99_BUDGET_MS)],
    )
    quiet = result["quiet"]
    title = (
        f"machine busy during {quiet['num_busy']} of {quiet['num_counted_runs']} counted runs"
        if quiet["was_busy"]
        else ""
    )
    write_load_png(path, [minilm, synthetic], title=title)


def _fmt(stats: dict[str, Any] | None, digits: int = 0) -> str:
    if stats is None or stats.get("median") is None:
        return "-"
    return f"{stats['median']:,.{digits}f} [{stats['min']:,.{digits}f}-{stats['max']:,.{digits}f}]"


def _saturation_table(saturation: dict[str, dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="Closed loop (saturation): where the CPU goes (medians, % of one core)")
    columns = (
        "server",
        "inputs/s",
        "p99 ms",
        "loop CPU",
        "server CPU",
        "loop us/req",
        "loadgen CPU",
        "others CPU",
        "batch",
        "limited by",
    )
    for column in columns:
        table.add_column(column)
    for key, detail in saturation.items():

        def median(name: str, digits: int = 0, d: dict[str, Any] = detail) -> str:
            stats = d[name]
            return "-" if stats is None else f"{stats['median']:,.{digits}f}"

        table.add_row(
            key,
            median("throughput_per_s"),
            median("p99_ms", 1),
            median("loop_cpu_pct"),
            median("server_cpu_pct"),
            median("loop_cpu_us_per_request"),
            median("loadgen_cpu_pct"),
            median("others_cpu_pct"),
            median("mean_batch_size", 1),
            detail["limited_by"],
        )
    return table


def print_report(result: dict[str, Any]) -> None:
    """The compact tables and the goal verdicts."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    figures = result["figures"]
    table = Table(
        title=f"Figures: median [min-max] of {result['inputs']['repeats']} counted run(s)"
    )
    for column in ("figure", "value", "unit", "ratio to reference", "reference"):
        table.add_column(column)
    for name in FIGURE_NAMES:
        fig = figures[name]
        digits = 0 if fig["unit"] == "inputs/s" else 2
        table.add_row(
            name, _fmt(fig, digits), fig["unit"], _fmt(fig["ratio"], 3), fig["reference"] or ""
        )
    console.print(table)
    curves = Table(title="Open loop: throughput and latency against offered load (medians)")
    for column in (
        "contender",
        "offered/s",
        "achieved/s",
        "p50 ms",
        "p99 ms",
        "sustained",
        "batch",
    ):
        curves.add_column(column)
    for key, points in result["curves"].items():
        for p in points:
            batch = p["mean_batch_size"]
            curves.add_row(
                key,
                f"{p['offered_per_s']:,.0f}",
                _fmt(p["throughput_per_s"]),
                _fmt(p["p50_ms"], 1),
                _fmt(p["p99_ms"], 1),
                f"{p['num_sustained']}/{p['num_runs']}",
                "-" if batch is None else f"{batch['median']:.1f}",
            )
    console.print(curves)
    console.print(_saturation_table(result["saturation"]))
    for goal in result["goals"]:
        verdict = "[green]PASS[/green]" if goal["passed"] else "[red]MISS[/red]"
        sign = "<=" if goal["is_at_most"] else ">="
        value = "not measured" if goal["value"] is None else f"{goal['value']:.3f}"
        margin = "" if goal["margin"] is None else f", margin {goal['margin']:+.3f}"
        console.print(
            f"{verdict} {goal['description']}: {value} (goal {sign} {goal['target']:g}{margin})"
        )
    quiet = result["quiet"]
    if quiet["was_busy"]:
        console.print(
            f"[yellow]machine busy during {quiet['num_busy']} of "
            f"{quiet['num_counted_runs']} counted runs: {quiet['busy_culprits']}[/yellow]"
        )


# -- main ----------------------------------------------------------------------------
def _display_path(path: Path) -> str:
    """The path relative to the repository when inside it (results travel with the repo)."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return path.name


def run_benchmark(opts: Options) -> dict[str, Any]:
    """Start everything, warm up, run the counted reps, return the result document."""
    started_at = datetime.datetime.now(datetime.UTC)
    wall_started = time.monotonic()
    sentences = make_sentences(opts.num_sentences)
    with (
        tempfile.TemporaryDirectory(prefix="conveyor-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        work_dir = Path(tmp)
        contenders = build_contenders(opts, work_dir, sentences)
        servers = launch_servers(stack, contenders, work_dir)
        minilm_raw = MiniLMRaw(sentences)  # loads while the servers load theirs
        for server in servers.values():
            server.wait_ready(timeout_s=300)
        raws: dict[str, RawModel] = {"minilm": minilm_raw, "synthetic": SyntheticRaw(sentences)}
        campaign = Campaign(opts, contenders, servers, raws)
        warm_up(campaign)
        for rep in range(opts.repeats):
            run_rep(campaign, rep)
    records = campaign.records
    figures = build_figures(records)
    inputs = {
        **asdict(opts),
        "out_dir": _display_path(opts.out_dir),
        "ramp_s": opts.ramp_s,
        "drain_s": opts.drain_s,
        "max_connections": MAX_CONNECTIONS,
        "sustained_rule": {
            "min_share_of_offered": SUSTAINED_MIN_SHARE,
            "max_p99_ms": SUSTAINED_MAX_P99_MS,
            "errors": 0,
            "unfinished": 0,
        },
        "sentences": {
            "count": len(sentences),
            "mean_minilm_tokens": minilm_raw.mean_tokens,
            "examples": sentences[:3],
        },
        "torch_default_threads": minilm_raw.default_threads,
        "contenders": {
            k: {"label": c.label, "model_entry": c.model_entry, "closed_clients": c.closed_clients}
            for k, c in contenders.items()
        },
        "references": asdict(campaign.refs),
    }
    return {
        "name": "online",
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - wall_started, 1),
        "meets_house_rules": opts.repeats >= 3,
        "inputs": inputs,
        "versions": package_versions(),
        "machine": machine_info(),
        "quiet": quiet_summary(records),
        "figures": figures,
        "goals": [goal.to_dict() for goal in evaluate_goals(figures)],
        "saturation": saturation_details(records),
        "curves": build_curves(records, opts.fractions),
        "runs": [asdict(record) for record in records],
    }


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry: run, write NAME.json and NAME.png, print the report."""
    opts = parse_options(argv)
    # SIGTERM unwinds like Ctrl-C, so every server child is stopped on the way out.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    result = run_benchmark(opts)
    json_path, png_path = opts.out_dir / "online.json", opts.out_dir / "online.png"
    write_json(json_path, result)
    write_png(png_path, result)
    print_report(result)
    print(f"wrote {json_path} and {png_path}")


if __name__ == "__main__":
    main()
