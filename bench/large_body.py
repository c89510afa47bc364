"""A small request's latency while one large request is handled, and memory after.

One ``conveyor serve`` hosts a tiny random Llama and a synthetic embedding model. Side by
side in one run: one-input embeddings requests sent back to back on an idle server, then
the same while one large request is in flight. Reports the small requests' latencies in
both phases, the large request's time, and the server's resident memory before and after.

Two large requests (``--large``):

- ``body``: a chat request carrying ``--chat-mb`` megabytes of text (far longer than the
  context window, so it ends in a 400 after being tokenized). Writes
  ``bench/results/large_body.json`` and ``.png``.
- ``answer``: the largest answer a model returns by default: a chat completion with
  ``top_logprobs: 20``, ``n: 32`` and ``max_tokens: 390`` (262,080 logprob entries, just
  under ``max_logprob_entries``; chat entries carry their bytes too), EOS ignored. Writes
  ``bench/results/large_answer.json`` and ``.png``.

    .venv/bin/python -m bench.large_body                   # 10 MB chat body, 3 repeats
    .venv/bin/python -m bench.large_body --large answer    # the largest answer, 3 repeats
    .venv/bin/python -m bench.large_body --smoke --out DIR
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import (
    RESULTS_DIR,
    ServerProcess,
    machine_info,
    package_versions,
    python_argv,
    wait_until_quiet,
    write_json,
)


def rss_mb(pid: int) -> float:
    """Resident memory of a process, in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def small_latencies_ms(url: str, until: threading.Event | None, count: int) -> list[float]:
    """One-input embeddings requests back to back: ``count`` of them, or until ``until``
    (at least one: a large body refused at once may be done before the first is sent)."""
    latencies: list[float] = []
    with httpx.Client(timeout=120) as client:
        while (until is None and len(latencies) < count) or (
            until is not None and not (until.is_set() and latencies)
        ):
            sent = time.perf_counter()
            response = client.post(f"{url}/v1/embeddings", json={"model": "syn", "input": "hi"})
            response.raise_for_status()
            latencies.append((time.perf_counter() - sent) * 1000)
    return latencies


# The largest answer under the default max_logprob_entries (262,144): 32 x 390 x (1 + 20).
LARGEST_ANSWER = {"model": "llama", "messages": [{"role": "user", "content": "hello"}],
                  "n": 32, "max_tokens": 390, "logprobs": True, "top_logprobs": 20,
                  "ignore_eos": True}  # fmt: skip


def large_request(large: str, chat_bytes: int) -> tuple[str, dict[str, Any]]:
    """The path and body of the large request."""
    if large == "answer":
        return "/v1/chat/completions", LARGEST_ANSWER
    content = "hello world " * (chat_bytes // 12)
    body = {"model": "llama", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    return "/v1/chat/completions", body


def one_repeat(url: str, pid: int, request: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """Idle latencies, then latencies during one large request, and memory."""
    idle = small_latencies_ms(url, None, 20)
    before_mb = rss_mb(pid)
    path, body = request
    done = threading.Event()
    chat: dict[str, Any] = {}

    def send() -> None:
        started = time.perf_counter()
        response = httpx.post(f"{url}{path}", json=body, timeout=600)
        chat.update(status=response.status_code, seconds=time.perf_counter() - started,
                    response_mb=len(response.content) / 1e6)  # fmt: skip
        done.set()

    sender = threading.Thread(target=send)
    sender.start()
    during = small_latencies_ms(url, done, 0)
    sender.join()
    time.sleep(0.5)
    return {
        "idle_ms": idle,
        "during_ms": during,
        "chat": chat,
        "rss_before_mb": before_mb,
        "rss_after_mb": rss_mb(pid),
    }


def summary(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats of each phase's worst and median small-request latency."""

    def med(key: str, fn: Any) -> float:
        return float(statistics.median(fn(r[key]) for r in repeats))

    return {
        "idle_p50_ms": med("idle_ms", statistics.median),
        "idle_max_ms": med("idle_ms", max),
        "during_p50_ms": med("during_ms", statistics.median),
        "during_max_ms": med("during_ms", max),
        "chat_seconds": float(statistics.median(r["chat"]["seconds"] for r in repeats)),
        "response_mb": float(statistics.median(r["chat"]["response_mb"] for r in repeats)),
        "rss_growth_mb": float(
            statistics.median(r["rss_after_mb"] - r["rss_before_mb"] for r in repeats)
        ),
    }


def write_png(path: Path, result: dict[str, Any]) -> None:
    """Bars: small-request latency idle and during the large chat request."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["summary"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = ["idle p50", "idle max", "during p50", "during max"]
    values = [s["idle_p50_ms"], s["idle_max_ms"], s["during_p50_ms"], s["during_max_ms"]]
    ax.bar(labels, values, color=["#4c72b0", "#4c72b0", "#dd8452", "#dd8452"])
    ax.axhline(100, color="gray", linestyle="--", label="goal: 100 ms")
    ax.set_ylabel("one-input embeddings latency (ms)")
    inputs = result["inputs"]
    during = (
        f"a {inputs['chat_mb']} MB chat body"
        if inputs["large"] == "body"
        else f"the largest answer ({s['response_mb']:.0f} MB)"
    )
    ax.set_title(f"during {during}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure(
    url: str, pid: int, request: tuple[str, dict[str, Any]], repeats: int, max_wait_s: float
) -> list[Any]:
    """``repeats`` runs of one large request, each on a quiet machine (waiting at most
    ``max_wait_s`` for it)."""
    runs = []
    for _ in range(repeats):
        quiet = wait_until_quiet(max_wait_s=max_wait_s)
        runs.append({**one_repeat(url, pid, request), "quiet": quiet.to_dict()})
    return runs


def write_result(out: Path, large: str, chat_mb: float, runs: list[Any]) -> None:
    """JSON and PNG of one kind of large request; its summary printed."""
    result = {
        "inputs": {"large": large, "chat_mb": chat_mb, "repeats": len(runs)},
        "summary": summary(runs),
        "runs": runs,
        "machine": machine_info(),
        "versions": package_versions(),
    }
    out.mkdir(parents=True, exist_ok=True)
    name = "large_body" if large == "body" else "large_answer"
    write_json(out / f"{name}.json", result)
    write_png(out / f"{name}.png", result)
    print(yaml.safe_dump({name: result["summary"]}, sort_keys=False))


def write_config(tmp: Path) -> Path:
    """A tiny random Llama (room for 32 sequences of 400 tokens) and a synthetic model."""
    from conveyor.fakes.checkpoints import build_tiny_llama

    checkpoint = build_tiny_llama(tmp / "llama")
    config = {"data_dir": str(tmp / "data"), "models": [
        {"name": "syn", "kind": "synthetic", "batch_latency_ms": 1, "dim": 8},
        {"name": "llama", "kind": "generate", "path": str(checkpoint), "device": "cpu",
         "kv_cache_tokens": 16384, "max_num_seqs": 32, "threads": 1}]}  # fmt: skip
    path = tmp / "conveyor.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--large", choices=["body", "answer"], default="body")
    parser.add_argument("--chat-mb", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    smoke_help = "one repeat of each: a 1 MB body and a 4 x 50-token answer"
    parser.add_argument("--smoke", action="store_true", help=smoke_help)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    chat_mb, repeats = (1.0, 1) if args.smoke else (args.chat_mb, args.repeats)
    kinds = ["body", "answer"] if args.smoke else [args.large]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        config_path = str(write_config(tmp))

        def argv(port: int) -> list[str]:
            return python_argv("-m", "conveyor", "serve", "--config", config_path,
                               "--port", str(port))  # fmt: skip

        with ServerProcess("serve", argv, log_path=tmp / "serve.log") as server:
            server.start()
            server.wait_ready()
            url = f"http://127.0.0.1:{server.port}"
            one_repeat(url, server.pid, large_request("body", 100_000))  # warm-up
            for kind in kinds:
                path, body = large_request(kind, int(chat_mb * 1e6))
                if args.smoke and kind == "answer":
                    body = {**body, "n": 4, "max_tokens": 50}
                quiet_wait_s = 0.0 if args.smoke else 10.0  # a smoke run checks the figures
                runs = measure(url, server.pid, (path, body), repeats, quiet_wait_s)
                write_result(args.out, kind, chat_mb, runs)


if __name__ == "__main__":
    main()
