"""The sampler's draw at temperature 1: ``Sampler.sample`` against the exponential race.

The race is the draw the sampler used before its inverse-CDF one, kept here as the
reference: an argmax over every row, softmax, then ``argmax(p / E)`` with a uniform drawn
and logged per token (``E = -log U``). Both get the same float32 logits of bfloat16 values
(as the runner hands them over) for ``--rows`` unseeded rows of ``--vocab`` tokens, on
``--threads`` torch threads; calls alternate between the two, and each figure is the median
of ``--calls`` calls. Run it with OpenMP's passive wait, as ``serve`` runs (OpenMP reads
the policy when torch loads, before this module can set it):

    OMP_WAIT_POLICY=PASSIVE python -m bench.sampler --rows 16,64 --calls 150

Writes ``sampler.json`` into ``--out`` (default ``bench/results``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, machine_info, package_versions, write_json
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.sampling.sampler import Sampler

SMOLLM2_VOCAB = 49_152
WARMUP_CALLS = 3


def race(logits: torch.Tensor) -> list[int]:
    """The exponential race at temperature 1, as the sampler drew unseeded rows before."""
    logits = logits.to(torch.float32)
    chosen = logits.argmax(dim=-1)
    probs = torch.softmax(logits, dim=-1)
    noise = torch.rand(probs.shape).log_().neg_()
    chosen[:] = (probs / noise.clamp_min(1e-20)).argmax(dim=-1)
    return [int(token) for token in chosen.tolist()]


def time_calls(contenders: dict[str, Callable[[], object]], calls: int) -> dict[str, float]:
    """Median ms per call of each contender, the contenders alternating call by call."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(WARMUP_CALLS):
        for call in contenders.values():
            call()
    names = list(contenders)
    for index in range(calls):
        for name in names if index % 2 == 0 else reversed(names):
            started = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def measure(rows: int, vocab: int, calls: int) -> dict[str, Any]:
    """Both draws on one batch of ``rows`` x ``vocab`` logits."""
    generator = torch.Generator().manual_seed(rows)
    logits = (torch.randn(rows, vocab, generator=generator) * 3).to(torch.bfloat16)
    logits = logits.to(torch.float32)
    params = [SamplingParams(temperature=1.0)] * rows
    sampler = Sampler()
    medians = time_calls(
        {
            "race": lambda: race(logits),
            "sampler": lambda: sampler.sample(logits, params, [None] * rows),
        },
        calls,
    )
    return {
        "rows": rows,
        "race_ms": medians["race"],
        "sampler_ms": medians["sampler"],
        "speedup": medians["race"] / medians["sampler"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison, print a line per batch size, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="16,64", help="batch sizes, comma-separated")
    parser.add_argument("--vocab", type=int, default=SMOLLM2_VOCAB)
    parser.add_argument("--calls", type=int, default=150, help="timed calls of each")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few calls")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    opts = parser.parse_args(argv)
    rows = [int(value) for value in opts.rows.split(",")]
    vocab, calls = (1000, 5) if opts.smoke else (opts.vocab, opts.calls)
    torch.set_num_threads(opts.threads)
    load_before = os.getloadavg()
    results = []
    for count in rows:
        result = measure(count, vocab, calls)
        results.append(result)
        print(
            f"{count} rows x {vocab}: race {result['race_ms']:.2f} ms, "
            f"sampler {result['sampler_ms']:.2f} ms ({result['speedup']:.1f}x)"
        )
    write_json(
        opts.out / "sampler.json",
        {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "inputs": {
                "rows": rows,
                "vocab": vocab,
                "calls": calls,
                "threads": opts.threads,
                "is_smoke": opts.smoke,
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            },
            "results": results,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "machine": machine_info(),
            "versions": package_versions(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
