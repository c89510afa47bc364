"""Decode step time at batch 1 against the weight-streaming bound.

At batch 1 a decode step must read every weight once, so it cannot beat
``weight bytes / memory bandwidth`` (the H200's 4.8 TB/s by default); the goal is a step
within 2x of that bound. One request decodes ``--output-tokens`` tokens alone through
the engine; the time per output token (median and p90 of the gaps between tokens) is the
step time, and the engine's step split says where it goes.

    python -m bench.decode_bound --checkpoint DIR --device cuda --dtype bfloat16
    python -m bench.decode_bound --smoke --out DIR    # tiny model on the CPU

Writes ``decode_bound.json`` into ``--out`` (default ``bench/results``).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench.big_checkpoint import build_checkpoint, weight_bytes
from bench.common import RESULTS_DIR, machine_info, package_versions, write_json
from bench.generate import FIRST_ORDINARY_TOKEN, BenchRequest, Settings, make_engine, run_conveyor

H200_BANDWIDTH_BYTES_PER_S = 4.8e12
MAX_RATIO_TO_BOUND = 2.0


def measure(path: Path, settings: Settings, num_prompt: int, num_output: int) -> dict[str, Any]:
    """One request alone through a warm engine: the gaps between its tokens, the split."""
    engine = make_engine(path, settings)
    try:
        warmup = BenchRequest(0, [FIRST_ORDINARY_TOKEN + 1] * 8, 8)
        run_conveyor(engine, [warmup])
        prompt = [FIRST_ORDINARY_TOKEN + (i % 97) for i in range(num_prompt)]
        timings, kv = run_conveyor(engine, [BenchRequest(1, prompt, num_output)])
    finally:
        engine.stop()
    times = timings[0].token_times_s
    gaps_ms = sorted(1000 * (b - a) for a, b in itertools.pairwise(times))
    return {
        "num_output_tokens": len(times),
        "step_ms_p50": round(statistics.median(gaps_ms), 3),
        "step_ms_p90": round(gaps_ms[int(0.9 * (len(gaps_ms) - 1))], 3),
        "step_ms_mean": round(statistics.fmean(gaps_ms), 3),
        "step_phases": kv["step_phases"],
    }


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, Settings]:
    """Command line -> options and the engine settings."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--bandwidth-tb-s", type=float, default=H200_BANDWIDTH_BYTES_PER_S / 1e12)
    parser.add_argument("--smoke", action="store_true", help="tiny model built here, few tokens")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.smoke:
        args.prompt_tokens, args.output_tokens = 16, 8
    settings = Settings(
        device=args.device, dtype=args.dtype, threads=1, model="checkpoint", num_requests=1,
        prompt_tokens=(args.prompt_tokens, args.prompt_tokens),
        output_tokens=(args.output_tokens, args.output_tokens), steady_fraction=0.0,
        steady_rate_per_s=0.0, static_batch_size=1, max_num_seqs=8,
        max_num_batched_tokens=max(256, args.prompt_tokens), kv_cache_tokens=4096,
        block_size=16, sequential_requests=1, seed=0, is_smoke=args.smoke,
    )  # fmt: skip
    return args, settings


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, compare with the bound, write the JSON."""
    args, settings = parse_args(sys.argv[1:] if argv is None else argv)
    if settings.device == "cpu":
        torch.set_num_threads(1)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="conveyor-decode-bound-") as tmp:
        path = args.checkpoint
        if path is None:
            if not args.smoke:
                raise SystemExit("give --checkpoint (see bench.big_checkpoint) or --smoke")
            path = build_checkpoint(Path(tmp), "tiny-8b-shape", device="cpu", dtype=torch.float32)
        found = measure(path, settings, args.prompt_tokens, args.output_tokens)
        num_bytes = weight_bytes(path)
    bound_ms = 1000 * num_bytes / (args.bandwidth_tb_s * 1e12)
    ratio = found["step_ms_p50"] / bound_ms
    document = {
        "benchmark": "decode_bound",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "inputs": {**asdict(settings), "checkpoint": str(args.checkpoint)},
        "versions": package_versions(),
        "machine": machine_info(),
        "weight_bytes": num_bytes,
        "bandwidth_tb_s": args.bandwidth_tb_s,
        "bound_ms": round(bound_ms, 6),
        "result": found,
        "goals": [
            {
                "name": "batch1.step_over_weight_streaming_bound",
                "value": round(ratio, 2),
                "target": MAX_RATIO_TO_BOUND,
                "passed": ratio <= MAX_RATIO_TO_BOUND,
            }
        ],
        "duration_s": round(time.perf_counter() - started, 1),
    }
    write_json(args.out / "decode_bound.json", document)
    print(
        f"batch-1 decode step p50 {found['step_ms_p50']} ms, bound {bound_ms:.3f} ms "
        f"({ratio:.2f}x; goal <= {MAX_RATIO_TO_BOUND}x); wrote {args.out / 'decode_bound.json'}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
