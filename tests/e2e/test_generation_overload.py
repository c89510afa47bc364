"""A generative model at ten times its capacity answers 200 or 429, never a 5xx.

A tiny Llama on a real `serve`, two seats, every request the same length: its capacity is
measured by a saturated warm-up (which is also what the engine learns its seat turnover
from), then it is offered ten times that, open loop, with a deadline a few requests long.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import httpx
import pytest

from conveyor.fakes.checkpoints import build_tiny_llama
from tests.e2e.conftest import Server
from tests.overload import burst, statuses

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
BODY = {"model": MODEL, "prompt": "one two three", "max_tokens": 24, "ignore_eos": True}
NUM_WARM_UP = 24


def saturated_rate_per_s(server: Server) -> float:
    """Requests a second the model finished while all of NUM_WARM_UP were waiting."""
    started = time.monotonic()
    with (
        httpx.Client(timeout=120) as client,
        concurrent.futures.ThreadPoolExecutor(NUM_WARM_UP) as pool,
    ):
        send = lambda _: client.post(f"{server.api}/completions", json=BODY)  # noqa: E731
        answers = list(pool.map(send, range(NUM_WARM_UP)))
    assert all(answer.status_code == 200 for answer in answers)
    return NUM_WARM_UP / (time.monotonic() - started)


def test_ten_times_capacity_is_refused_with_429s_and_never_a_5xx(
    server_factory, tmp_path: Path
) -> None:
    model = {
        "name": MODEL, "kind": "generate", "path": str(build_tiny_llama(tmp_path / "llama")),
        "device": "cpu", "kv_cache_tokens": 1024, "block_size": 16, "max_num_seqs": 2,
        "max_num_batched_tokens": 64, "max_model_len": 64,
    }  # fmt: skip
    server: Server = server_factory({"models": [model]})
    rate_per_s = saturated_rate_per_s(server)
    # A deadline long beside the event loop's own delays under the flood (as the default
    # 30 s is), and about 40 requests' worth of seats or more: many wait and make it.
    timeout_ms = max(2000.0, 40 / rate_per_s * 1000)
    answers = burst(
        f"{server.api}/completions", BODY, num_requests=int(20 * rate_per_s) + 20,
        rate_per_s=10 * rate_per_s, timeout_ms=timeout_ms,
    )  # fmt: skip
    counts = statuses(answers)
    assert set(counts) <= {200, 429} and counts[429] > 0, counts
    shed = server.metric(
        "conveyor_generation_requests_finished_total", model=MODEL, finish_reason="shed"
    )
    assert shed <= counts[429]  # refused while waiting, before their deadline, are 429s too
    assert counts[200] >= 4, counts  # it kept serving at its rate meanwhile
    refused = [answer for answer in answers if answer.status == 429]
    assert {answer.code for answer in refused} <= {"deadline_unreachable", "queue_full"}
    assert all(int(answer.retry_after or 0) >= 1 for answer in refused)
