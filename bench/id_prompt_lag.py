"""How long the event loop stalls while serve takes a completions body of millions of token ids.

A prompt of ``--num-ids`` token ids (14.9 MB of JSON for 2M) far past a tiny Llama's context
is sent in process (httpx's ASGI transport) to the serve app, while a probe task on the same
event loop wakes every millisecond and records the longest gap between its wake-ups: what
any other request on that loop would have waited. Side by side, alternating, in one run:

- ``idle``: the probe alone (the loop's own jitter on this machine);
- ``parse``: the body parsed as serve parsed it before the raw-body check, on the
  large-input pool (pydantic makes the 2M ints holding the interpreter lock);
- ``serve``: the whole request through the app: refused from the body's bytes
  (``endpoints.raw_id_lists``) with the same 400.

Reports each contender's longest gap per repeat and the medians. Writes
``bench/results/id_prompt_lag.json`` and ``.png``.

    .venv/bin/python -m bench.id_prompt_lag            # 2M ids, 5 repeats
    .venv/bin/python -m bench.id_prompt_lag --smoke --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from bench.common import RESULTS_DIR, machine_info, package_versions, wait_until_quiet, write_json

PROBE_S = 0.001
CONTENDERS = ("idle", "parse", "serve")


async def longest_gap_ms(work: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """The longest time the loop left a 1 ms probe waiting (past its sleep) during ``work``."""
    done = asyncio.Event()
    longest = 0.0

    async def probe() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(PROBE_S)
            now = time.perf_counter()
            longest = max(longest, now - last - PROBE_S)
            last = now

    task = asyncio.create_task(probe())
    await asyncio.sleep(0.02)  # the probe runs before the work starts
    try:
        result = await work()
        await asyncio.sleep(0.02)  # and a little after: the loop's share of the answer
    finally:
        done.set()
        await task
    return longest * 1000, result


async def one_repeat(client: httpx.AsyncClient, body: bytes) -> dict[str, Any]:
    """The three contenders once, in order, each with its own probe."""
    from conveyor.endpoints.completions import parse_completion_request
    from conveyor.errors import InvalidRequest
    from conveyor.host.offload import run_sized

    async def idle() -> None:
        await asyncio.sleep(0.2)

    async def parse() -> str:
        try:
            await run_sized(len(body), parse_completion_request, body)
        except InvalidRequest as exc:  # more ids than the schema's checks allow: still parsed
            return str(exc)
        return "parsed"

    async def serve() -> int:
        headers = {"content-type": "application/json"}
        response = await client.post("/v1/completions", content=body, headers=headers)
        return response.status_code

    repeat: dict[str, Any] = {}
    for name, work in (("idle", idle), ("parse", parse), ("serve", serve)):
        gap_ms, outcome = await longest_gap_ms(work)
        repeat[name] = {"longest_gap_ms": gap_ms, "outcome": outcome}
    return repeat


async def measure(
    checkpoint: Path, data_dir: Path, num_ids: int, repeats: int, quiet_wait_s: float
) -> list[Any]:
    """A warm-up repeat, then ``repeats`` counted ones, each after the machine is quiet
    (waiting at most ``quiet_wait_s`` for it)."""
    from conveyor.api.app import create_app
    from conveyor.config.settings import ServerConfig
    from conveyor.host.service import Service

    tiny = {"name": "tiny", "kind": "generate", "path": str(checkpoint), "device": "cpu",
            "kv_cache_tokens": 1024, "max_model_len": 128, "threads": 1}  # fmt: skip
    config = ServerConfig.model_validate({"data_dir": str(data_dir), "models": [tiny]})
    body = orjson.dumps({"model": "tiny", "prompt": list(range(1, num_ids + 1)), "max_tokens": 2})
    runs = []
    async with Service(config) as service:
        transport = httpx.ASGITransport(app=create_app(config, service=service))
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as c:
            await one_repeat(c, body)  # warm-up, not counted
            for _ in range(repeats):
                quiet = await asyncio.to_thread(wait_until_quiet, max_wait_s=quiet_wait_s)
                runs.append({**await one_repeat(c, body), "quiet": quiet.to_dict()})
    return runs


def summary(runs: list[dict[str, Any]], num_bytes: int) -> dict[str, Any]:
    """Median and worst longest gap of each contender, and the body's size."""
    figures: dict[str, Any] = {"body_mb": num_bytes / 1e6}
    for name in CONTENDERS:
        gaps = [run[name]["longest_gap_ms"] for run in runs]
        figures[f"{name}_gap_median_ms"] = statistics.median(gaps)
        figures[f"{name}_gap_max_ms"] = max(gaps)
    return figures


def write_png(path: Path, result: dict[str, Any]) -> None:
    """Bars: each contender's median longest gap, with the worst repeat above it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["summary"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    medians = [s[f"{name}_gap_median_ms"] for name in CONTENDERS]
    worst = [s[f"{name}_gap_max_ms"] for name in CONTENDERS]
    ax.bar(CONTENDERS, worst, color="#dddddd", label="worst repeat")
    ax.bar(CONTENDERS, medians, color=["#4c72b0", "#dd8452", "#55a868"], label="median")
    ax.axhline(100, color="gray", linestyle="--", label="goal: 100 ms")
    ax.set_ylabel("longest event-loop stall (ms)")
    ax.set_title(f"{result['inputs']['num_ids']:,} token ids ({s['body_mb']:.1f} MB body)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-ids", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="200k ids, one repeat")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    num_ids, repeats = (200_000, 1) if args.smoke else (args.num_ids, args.repeats)
    quiet_wait_s = 0.0 if args.smoke else 10.0  # a smoke run checks the figures, not them
    from conveyor.fakes.checkpoints import build_tiny_llama, torch_threads

    with tempfile.TemporaryDirectory() as tmp_name, torch_threads(1):
        tmp = Path(tmp_name)
        checkpoint = build_tiny_llama(tmp / "llama")
        runs = asyncio.run(measure(checkpoint, tmp / "data", num_ids, repeats, quiet_wait_s))
    num_bytes = len(orjson.dumps(list(range(1, num_ids + 1))))
    result = {
        "inputs": {"num_ids": num_ids, "repeats": repeats, "probe_ms": PROBE_S * 1000},
        "summary": summary(runs, num_bytes),
        "runs": runs,
        "machine": machine_info(),
        "versions": package_versions(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "id_prompt_lag.json", result)
    write_png(args.out / "id_prompt_lag.png", result)
    print(yaml.safe_dump(result["summary"], sort_keys=False))


if __name__ == "__main__":
    main()
