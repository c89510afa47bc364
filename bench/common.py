"""Helpers every benchmark shares: machine facts, waiting for a quiet machine, result
files (JSON and PNG), and server child processes on free local ports."""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "bench" / "results"
LOCALHOST = "127.0.0.1"
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
VERSIONED_PACKAGES = (
    "conveyor",
    "torch",
    "transformers",
    "sentence-transformers",
    "tokenizers",
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "orjson",
    "pydantic",
    "numpy",
    "matplotlib",
)
# /proc/stat fields that count as busy: user nice system (idle iowait) irq softirq steal.
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


# -- machine facts -----------------------------------------------------------
def package_versions(names: Sequence[str] = VERSIONED_PACKAGES) -> dict[str, str | None]:
    """Installed version of each package (None when it is not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, memory, OS, Python."""
    return {
        "cpu_model": _cpu_model(),
        "cpu_vector_flags": _cpu_vector_flags(),
        "num_cpus": os.cpu_count(),
        "num_usable_cpus": len(os.sched_getaffinity(0)),
        "mem_total_mb": _mem_total_mb(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg_1_5_15": list(os.getloadavg()),
        "clock_ticks_per_s": CLOCK_TICKS_PER_S,
        "openmp_env": openmp_env(),
    }


# How OpenMP's threads wait between ops, which moves a CPU step's time by half (see
# conveyor.cli.omp_wait), and how many there are.
OPENMP_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")


def openmp_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The OpenMP settings of this process's environment (``OPENMP_ENV``), where set."""
    source = os.environ if environ is None else environ
    return {name: source[name] for name in OPENMP_ENV if name in source}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


# The instruction sets CPU inference speed turns on (an AVX2-only host runs bfloat16
# without oneDNN's packed kernels, and several times slower than float32).
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def vector_flags(cpuinfo: str) -> list[str]:
    """Which of ``VECTOR_FLAGS`` the first ``flags`` line of ``/proc/cpuinfo`` lists."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return [flag for flag in VECTOR_FLAGS if flag in present]
    return []


def _cpu_vector_flags() -> list[str] | None:
    try:
        return vector_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return None


def _mem_total_mb() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


# -- CPU accounting from /proc --------------------------------------------------
def _parse_proc_stat(text: str) -> tuple[str, int]:
    """(name, user + system ticks) from a /proc/PID/stat line; the name may hold spaces."""
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return name, int(fields[11]) + int(fields[12])


def process_ticks(pid: int, tid: int | None = None) -> int | None:
    """CPU ticks a process (all threads) or one of its threads has used; None if gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path) as handle:
            return _parse_proc_stat(handle.read())[1]
    except (OSError, ValueError, IndexError):
        return None


def machine_busy_ticks() -> int:
    """Busy CPU ticks of the whole machine (all cores) since boot."""
    with open("/proc/stat") as handle:
        cpu_line = handle.readline().split()[1:]
    return sum(int(cpu_line[i]) for i in _BUSY_FIELDS if i < len(cpu_line))


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    """Every process's CPU ticks and the machine's busy ticks at one moment."""

    taken_at: float
    ticks_by_pid: dict[int, int]
    names: dict[int, str]
    busy_ticks: int


def take_cpu_snapshot() -> CpuSnapshot:
    """Read /proc once: ticks per process, and busy ticks of the whole machine."""
    ticks: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as handle:
                name, used = _parse_proc_stat(handle.read())
        except (OSError, ValueError, IndexError):
            continue  # the process ended while we looked
        ticks[int(entry.name)] = used
        names[int(entry.name)] = name
    return CpuSnapshot(time.monotonic(), ticks, names, machine_busy_ticks())


@dataclass(frozen=True, slots=True)
class QuietReport:
    """How the wait for a quiet machine went (percentages are of one core)."""

    is_busy: bool
    waited_s: float
    busiest_pct: float
    busiest_name: str
    others_total_pct: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def cpu_usage_between(
    earlier: CpuSnapshot, later: CpuSnapshot, exclude: set[int]
) -> tuple[float, str, float]:
    """Busiest process (percent of a core, name) and all-but-``exclude`` total percent."""
    elapsed_ticks = max(1e-9, (later.taken_at - earlier.taken_at) * CLOCK_TICKS_PER_S)
    busiest_pct, busiest_name = 0.0, ""
    excluded_ticks = 0
    for pid, ticks in later.ticks_by_pid.items():
        used = ticks - earlier.ticks_by_pid.get(pid, 0)
        if pid in exclude:
            excluded_ticks += max(0, used)
            continue
        pct = 100.0 * used / elapsed_ticks
        if pct > busiest_pct:
            busiest_pct, busiest_name = pct, later.names.get(pid, "?")
    # The machine-wide counter also sees processes that ended inside the window.
    others = later.busy_ticks - earlier.busy_ticks - excluded_ticks
    return busiest_pct, busiest_name, max(0.0, 100.0 * others / elapsed_ticks)


def wait_until_quiet(
    *,
    threshold_pct: float = 10.0,
    quiet_s: float = 2.0,
    max_wait_s: float = 10.0,
    poll_s: float = 0.25,
) -> QuietReport:
    """Wait until, over the last ``quiet_s``, no process but this one used more than
    ``threshold_pct`` of a core and all of them together less than twice that.

    Gives up after ``max_wait_s`` and says so (``is_busy``), so a busy shared machine
    slows the benchmark down but never blocks it. Our own idle servers count: a
    server still draining a backlog must not overlap the next run either. A bound
    shorter than ``quiet_s`` shortens the window to it (one poll at least): a smoke
    run's ``max_wait_s=0`` costs a poll, not ``quiet_s`` of history.
    """
    if threshold_pct <= 0 or quiet_s <= 0 or max_wait_s < 0 or poll_s <= 0:
        raise ValueError("quiet-wait settings must be positive")
    window_s = min(quiet_s, max(max_wait_s, poll_s))
    exclude = {os.getpid()}
    started = time.monotonic()
    history = [take_cpu_snapshot()]
    while True:
        time.sleep(min(poll_s, window_s))
        latest = take_cpu_snapshot()
        history.append(latest)
        # The newest snapshot at least window_s old (small slack for sleep jitter).
        cutoff = latest.taken_at - window_s + 0.02
        base = next((snap for snap in reversed(history) if snap.taken_at <= cutoff), None)
        if base is None:
            continue
        busiest, name, total = cpu_usage_between(base, latest, exclude)
        waited_s = latest.taken_at - started
        is_quiet = busiest <= threshold_pct and total <= 2 * threshold_pct
        if is_quiet or waited_s >= max_wait_s:
            return QuietReport(not is_quiet, round(waited_s, 2), busiest, name, total)


# -- result files --------------------------------------------------------------
def json_safe(value: Any) -> Any:
    """Replace NaN and infinities (not valid JSON) by None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as indented JSON, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n")


def write_results(
    out_dir: Path, name: str, result: Any, write_png: Callable[[Path, Any], None]
) -> None:
    """A benchmark's trail: ``NAME.json`` (every figure) and ``NAME.png`` into ``out_dir``."""
    write_json(out_dir / f"{name}.json", result)
    write_png(out_dir / f"{name}.png", result)


def save_figure(fig: Any, path: Path, title: str) -> None:
    """Give a finished figure its title, lay it out, write it to ``path`` and close it."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@dataclass(frozen=True, slots=True)
class Curve:
    """One contender's measured points against offered load (None where not measured)."""

    label: str
    offered_per_s: list[float]
    throughput_per_s: list[float]
    p50_ms: list[float | None]
    p99_ms: list[float | None]


@dataclass(frozen=True, slots=True)
class Line:
    """A horizontal reference line (a ceiling, a latency budget)."""

    label: str
    value: float


@dataclass(frozen=True, slots=True)
class CurvePanel:
    """One row of the figure: throughput and latency against offered load."""

    title: str
    curves: list[Curve]
    throughput_lines: list[Line] = field(default_factory=list)
    latency_lines: list[Line] = field(default_factory=list)


def write_load_png(path: Path, panels: Sequence[CurvePanel], *, title: str = "") -> None:
    """Throughput and p50/p99 latency against offered load, one row per panel."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to a file only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 2, figsize=(13, 4.6 * len(panels)), squeeze=False)
    for row, panel in enumerate(panels):
        _plot_throughput(axes[row][0], panel)
        _plot_latency(axes[row][1], panel)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_throughput(ax: Any, panel: CurvePanel) -> None:
    top = 1.0
    for curve in panel.curves:
        ax.plot(curve.offered_per_s, curve.throughput_per_s, marker="o", label=curve.label)
        top = max([top, *curve.offered_per_s, *curve.throughput_per_s])
    ax.plot(
        [1, top], [1, top], color="grey", linestyle=":", linewidth=1, label="achieved = offered"
    )
    for index, line in enumerate(panel.throughput_lines):
        ax.axhline(line.value, linestyle="--", linewidth=1, color=f"C{index + 5}", label=line.label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (inputs/s, open loop)")
    ax.set_ylabel("throughput (inputs/s)")
    ax.set_title(f"{panel.title}: throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _plot_latency(ax: Any, panel: CurvePanel) -> None:
    for index, curve in enumerate(panel.curves):
        color = f"C{index}"
        ax.plot(
            curve.offered_per_s, curve.p99_ms, marker="o", color=color, label=f"{curve.label} p99"
        )
        ax.plot(
            curve.offered_per_s, curve.p50_ms, marker=".", linestyle="--", color=color,
            label=f"{curve.label} p50",
        )  # fmt: skip
    for index, line in enumerate(panel.latency_lines):
        ax.axhline(line.value, linestyle="--", linewidth=1, color=f"C{index + 5}", label=line.label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (inputs/s, open loop)")
    ax.set_ylabel("latency from intended send (ms)")
    ax.set_title(f"{panel.title}: latency")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


# -- child processes -----------------------------------------------------------
def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our environment, with the repository root importable (for ``bench.*`` modules)."""
    env = dict(os.environ)
    parts = [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def free_port(host: str = LOCALHOST) -> int:
    """A port nobody listens on right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def http_get(port: int, path: str, *, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """GET http://127.0.0.1:PORT/PATH; (status, body); raises OSError if nobody answers."""
    url = f"http://{LOCALHOST}:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


class ServerProcess:
    """A server child process on a free port of 127.0.0.1, stopped on exit.

    ``argv_for_port`` builds the command line for a given port. If the process dies
    while starting (another process took the port first), it is started again on a
    fresh port, a bounded number of times.
    """

    MAX_START_ATTEMPTS = 3

    def __init__(
        self,
        name: str,
        argv_for_port: Callable[[int], list[str]],
        *,
        log_path: Path,
        ready_path: str = "/ready",
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.extra_env = dict(extra_env or {})
        self.log_path = log_path
        self.ready_path = ready_path
        self._argv_for_port = argv_for_port
        self._process: subprocess.Popen[bytes] | None = None
        self._port = 0
        self._num_attempts = 0

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self._require_process().pid

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self._port

    def start(self) -> None:
        """Launch the process (returns at once; call ``wait_ready`` next)."""
        self._num_attempts += 1
        self._port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self._argv_for_port(self._port),
                cwd=REPO_ROOT,
                env=child_env(self.extra_env),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Poll the readiness path until it answers 200; raise with the log tail if not."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._require_process().poll() is not None:
                if self._num_attempts < self.MAX_START_ATTEMPTS:
                    self.start()
                    continue
                raise RuntimeError(f"{self.name} exited while starting:\n{self.log_tail()}")
            try:
                status, _ = http_get(self._port, self.ready_path, timeout_s=1.0)
            except OSError:
                status = 0
            if status == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"{self.name} was not ready within {timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def main_thread_ticks(self) -> int:
        """CPU ticks of the process's main thread: the event loop for uvicorn."""
        return process_ticks(self.pid, self.pid) or 0

    def total_ticks(self) -> int:
        """CPU ticks of the whole process (every thread)."""
        return process_ticks(self.pid) or 0

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the server to stop (SIGTERM), kill it if it does not within ``timeout_s``."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)

    def log_tail(self, num_chars: int = 3000) -> str:
        """The end of the server's log, for error messages."""
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return "(no log)"

    def _require_process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._process

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def python_argv(*args: str) -> list[str]:
    """A command line running this interpreter with ``args``."""
    return [sys.executable, *args]


async def timed_stream(client: Any, url: str, body: dict[str, Any]) -> tuple[float, float]:
    """POST a streamed completion ``body`` to ``url``/v1/completions and read it to the end:
    (seconds to the first token's event, seconds in all)."""
    started = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {"):
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("no token came back")
    return first, time.perf_counter() - started
