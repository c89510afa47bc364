"""N workers pull one model at once: peer to peer against the naive all-from-origin pull.

The origin is an S3-compatible server (moto) on 127.0.0.1 behind a TCP proxy that caps, in
total, what it answers (`--origin-mb-s`, as a bucket shared by a fleet would be; requests
go uncapped). The model is a tiny Llama padded with random bytes to `--model-mb` and pushed
in `--chunk-mb` chunks. Side by side in one run, alternating:
- `p2p`: N `conveyor worker` processes, each serving its verified chunks to the others;
- `naive`: N `conveyor serve` processes, each pulling every chunk from the origin.
Each round starts all N at once with empty caches and reports the bytes the origin served
(counted by the proxy, and by the workers' `conveyor_model_fetch_bytes_total`) and the time
until every process answers /ready. Writes `bench/results/distribution.json` and `.png`.

    .venv/bin/python -m bench.distribution        # 512 MiB, 6 workers, 50 MB/s, 3 repeats
    .venv/bin/python -m bench.distribution --smoke --out DIR
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.capped_proxy import CappedProxy
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

MIB = 1024 * 1024
MODEL = "dist"
BUCKET = "conveyor-bench"
S3_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
          "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
READY_TIMEOUT_S = 900.0
MODES = ("naive", "p2p")


def build_model(root: Path, model_mb: float) -> Path:
    """A tiny Llama checkpoint padded with random bytes to `model_mb` MiB in all."""
    from conveyor.fakes.checkpoints import build_tiny_llama

    directory = build_tiny_llama(root)
    have = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    left = max(0, int(model_mb * MIB) - have)
    with (directory / "padding.bin").open("wb") as out:
        while left > 0:
            piece = min(left, 4 * MIB)
            out.write(os.urandom(piece))
            left -= piece
    return directory


def s3_url(port: int) -> str:
    """The object store URL of the bench bucket behind `port`."""
    return f"s3://{BUCKET}/models?endpoint_url=http://127.0.0.1:{port}"


def push(model_dir: Path, store_url: str, moto_port: int, chunk_mb: float) -> int:
    """Create the bucket and push the model straight to moto (uncapped); its size in bytes."""
    import boto3

    from conveyor.distribution.push import push_model
    from conveyor.stores import open_job_store, open_object_store

    endpoint = f"http://127.0.0.1:{moto_port}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    store = open_job_store(store_url)
    try:
        result = push_model(
            model_dir, MODEL, store, open_object_store(s3_url(moto_port)),
            chunk_bytes=int(chunk_mb * MIB), now=time.time(),
        )  # fmt: skip
    finally:
        store.close()
    return int(result.manifest.total_bytes)


def model_entry() -> dict[str, Any]:
    """The pulled model as a config entry."""
    return {"name": MODEL, "kind": "generate", "path": f"conveyor://{MODEL}", "device": "cpu",
            "threads": 1, "kv_cache_tokens": 256, "max_model_len": 256}  # fmt: skip


def process_for(mode: str, index: int, tmp: Path, store_url: str, origin: str) -> ServerProcess:
    """One puller: a fleet worker (p2p) or a single-process `serve` (naive), fresh cache."""
    data_dir = tmp / f"{mode}-{index}-{time.monotonic_ns()}"
    config: dict[str, Any] = {"data_dir": str(data_dir), "models": [model_entry()]}
    if mode == "naive":
        config["jobs"] = {"job_store_url": store_url, "object_store_url": origin}
    config_path = data_dir.with_suffix(".yaml")
    config_path.write_text(yaml.safe_dump(config))

    def argv(port: int) -> list[str]:
        if mode == "naive":
            return python_argv("-m", "conveyor", "serve", "--config", str(config_path),
                               "--port", str(port))  # fmt: skip
        return python_argv("-m", "conveyor", "worker", "--config", str(config_path),
                           "--store", store_url, "--objects", origin, "--listen",
                           f"127.0.0.1:{port}", "--worker-id", f"w{index}",
                           "--heartbeat-s", "0.5")  # fmt: skip

    return ServerProcess(f"{mode}-{index}", argv, log_path=data_dir.with_suffix(".log"))


def fetch_bytes(port: int) -> dict[str, float]:
    """A process's `conveyor_model_fetch_bytes_total`, by source."""
    from prometheus_client.parser import text_string_to_metric_families

    _, body = http_get(port, "/metrics", timeout_s=10)
    found = {"origin": 0.0, "peer": 0.0}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == "conveyor_model_fetch_bytes_total":
                found[sample.labels["source"]] += sample.value
    return found


def wait_all_ready(procs: list[ServerProcess], started: float) -> list[float]:
    """Seconds from `started` until each process first answered /ready."""
    ready_s: dict[int, float] = {}
    deadline = started + READY_TIMEOUT_S
    while len(ready_s) < len(procs):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"not every puller was ready:\n{procs[0].log_tail()}")
        for i, proc in enumerate(procs):
            if i in ready_s:
                continue
            if proc._require_process().poll() is not None:
                raise RuntimeError(f"{proc.name} exited:\n{proc.log_tail()}")
            try:
                status, _ = http_get(proc.port, "/ready", timeout_s=1.0)
            except OSError:
                continue
            if status == 200:
                ready_s[i] = time.perf_counter() - started
        time.sleep(0.05)
    return [ready_s[i] for i in range(len(procs))]


def one_round(mode: str, args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """Start `workers` pullers of `mode` at once; time them and count the origin's bytes."""
    proxy: CappedProxy = ctx["proxy"]
    served_before = proxy.served_bytes
    procs = [process_for(mode, i, ctx["tmp"], ctx["store_url"], ctx["origin"])
             for i in range(args.workers)]  # fmt: skip
    started = time.perf_counter()
    try:
        for proc in procs:
            proc.start()
        ready_s = wait_all_ready(procs, started)
        fetched = [fetch_bytes(proc.port) for proc in procs]
    finally:
        for proc in procs:
            proc.stop(timeout_s=30)
    origin_bytes = proxy.served_bytes - served_before
    model_bytes = ctx["model_bytes"]
    return {
        "mode": mode,
        "ready_s": ready_s,
        "all_ready_s": max(ready_s),
        "proxy_origin_bytes": origin_bytes,
        "origin_x_model": origin_bytes / model_bytes,
        "fetched_origin_bytes": sum(f["origin"] for f in fetched),
        "fetched_peer_bytes": sum(f["peer"] for f in fetched),
    }


def summarize(runs: list[dict[str, Any]], inputs: dict[str, Any]) -> dict[str, Any]:
    """Medians per mode, the ratios p2p/naive, and the origin-bound floors."""
    out: dict[str, Any] = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        out[f"{mode}_origin_x_model"] = statistics.median(r["origin_x_model"] for r in mine)
        out[f"{mode}_all_ready_s"] = statistics.median(r["all_ready_s"] for r in mine)
        spread = [r["all_ready_s"] for r in mine]
        out[f"{mode}_all_ready_spread_s"] = max(spread) - min(spread)
    out["p2p_vs_naive_time"] = out["p2p_all_ready_s"] / out["naive_all_ready_s"]
    floor_s = inputs["model_bytes"] / (inputs["origin_mb_s"] * 1e6)
    out["origin_floor_p2p_s"] = floor_s
    out["origin_floor_naive_s"] = floor_s * inputs["workers"]
    return out


def write_png(path: Path, result: dict[str, Any]) -> None:
    """Two panels: origin bytes as a multiple of the model, and time until all are ready."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, inputs = result["summary"], result["inputs"]
    colors = ["#dd8452", "#4c72b0"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.bar(MODES, [s[f"{m}_origin_x_model"] for m in MODES], color=colors)
    left.axhline(1.5, color="gray", linestyle="--", label="goal: 1.5x")
    left.set_ylabel("origin bytes / model bytes")
    left.legend()
    right.bar(MODES, [s[f"{m}_all_ready_s"] for m in MODES], color=colors)
    right.set_ylabel("seconds until every worker is ready")
    fig.suptitle(f"{inputs['workers']} workers, {inputs['model_mb']} MiB model, origin capped "
                 f"at {inputs['origin_mb_s']} MB/s")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args() -> argparse.Namespace:
    """Command-line options; `--smoke` shrinks everything to seconds."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-mb", type=float, default=512.0)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--origin-mb-s", type=float, default=50.0, help="origin cap, MB/s")
    parser.add_argument("--chunk-mb", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="4 MiB, 2 workers, one round each")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    if args.smoke:
        args.model_mb, args.workers, args.chunk_mb, args.repeats = 4.0, 2, 0.5, 1
        args.origin_mb_s = 20.0
    return args


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Start the origin, push the model, run the rounds; the result document."""
    os.environ.update(S3_ENV)
    store_url = f"sqlite://{tmp / 'jobs.db'}"
    moto = ServerProcess("moto", lambda port: python_argv(
        "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)), log_path=tmp / "moto.log",
        ready_path="/moto-api/")  # fmt: skip
    with moto:
        moto.start()
        moto.wait_ready()
        model_bytes = push(build_model(tmp / "model", args.model_mb), store_url, moto.port,
                           args.chunk_mb)  # fmt: skip
        proxy = CappedProxy(moto.port, args.origin_mb_s * 1e6)
        ctx = {"proxy": proxy, "tmp": tmp, "store_url": store_url, "model_bytes": model_bytes,
               "origin": s3_url(proxy.start())}  # fmt: skip
        try:
            if not args.smoke:
                one_round("p2p", args, ctx)  # warm-up, not counted
            runs = []
            for _ in range(args.repeats):
                for mode in MODES:
                    quiet = wait_until_quiet(max_wait_s=0.0 if args.smoke else 10.0)
                    runs.append({**one_round(mode, args, ctx), "quiet": quiet.to_dict()})
        finally:
            proxy.stop()
    inputs = {"model_mb": args.model_mb, "model_bytes": model_bytes, "workers": args.workers,
              "origin_mb_s": args.origin_mb_s, "chunk_mb": args.chunk_mb,
              "repeats": args.repeats, "smoke": args.smoke}  # fmt: skip
    return {"inputs": inputs, "summary": summarize(runs, inputs), "runs": runs,
            "machine": machine_info(), "versions": package_versions()}  # fmt: skip


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        result = run(args, Path(tmp_name))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "distribution.json", result)
    write_png(args.out / "distribution.png", result)
    print(yaml.safe_dump(result["summary"], sort_keys=False))


if __name__ == "__main__":
    main()
