"""The served benchmark's load clients: ``vllm bench serve``'s command line for each
workload, the chat workload's seeded arrivals and the figures of streamed tokens."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest
from bench.generate_served import parse_args
from bench.served_clients import (
    arrival_times,
    client_figures,
    pct,
    stream_figures,
    vllm_client_argv,
)
from bench.served_settings import CHAT, FIGURES, RANDOM, Point, point_seed


def test_the_chat_workload_streams_chat_requests_at_the_request_rate(tmp_path: Path) -> None:
    settings, _ = parse_args(["--workload", "chat", "--request-rate", "2", "--seed", "7"])
    argv = vllm_client_argv(tmp_path / "vllm", settings, tmp_path, 8123, Point(CHAT, rate=2.0),
                            32, tmp_path / "out.json", {"min_tokens": 128})  # fmt: skip
    text = " ".join(argv)
    assert "--backend openai-chat --endpoint /v1/chat/completions" in text
    assert "--request-rate 2 --burstiness 1" in text  # Poisson arrivals
    assert f"--seed {point_seed(7, Point(CHAT, rate=2.0), 32)}" in text
    assert "--max-concurrency" not in argv  # the rate alone decides what is in flight
    assert "--ignore-eos" in argv
    assert json.loads(argv[argv.index("--extra-body") + 1]) == {"min_tokens": 128}
    assert "--percentile-metrics ttft,tpot,itl --metric-percentiles 50,99" in text


def test_a_peers_headers_go_with_every_request_of_the_load_client(tmp_path: Path) -> None:
    settings, _ = parse_args([])
    point = Point(RANDOM, concurrency=16)
    argv = vllm_client_argv(tmp_path / "vllm", settings, tmp_path, 8123, point, 64,
                            tmp_path / "out.json", None, {"Connection": "close"})  # fmt: skip
    assert argv[argv.index("--header") + 1] == "Connection=close"
    plain = vllm_client_argv(tmp_path / "vllm", settings, tmp_path, 8123, point, 64,
                             tmp_path / "out.json")  # fmt: skip
    assert "--header" not in plain and "--extra-body" not in plain


def test_arrivals_are_a_seeded_poisson_process_at_the_rate() -> None:
    times = arrival_times(4.0, 2000, seed=3)
    assert times == arrival_times(4.0, 2000, seed=3)
    assert times != arrival_times(4.0, 2000, seed=4)
    assert times[0] == 0.0 and times == sorted(times)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.1)


def test_stream_figures_are_ttft_tpot_and_pooled_itl() -> None:
    # Two requests of 3 tokens: chunks at 0.1, 0.2, 0.4 s and 0.3, 0.4, 0.5 s; one failed.
    figures = stream_figures([[0.1, 0.2, 0.4], [0.3, 0.4, 0.5], []], 3, elapsed_s=2.0)
    assert (figures["completed"], figures["failed"]) == (2, 1)
    assert figures["output_throughput"] == pytest.approx(3.0)  # 2 x 3 tokens in 2 s
    assert figures["p50_ttft_ms"] == pytest.approx(300.0)
    assert figures["p99_ttft_ms"] == pytest.approx(300.0)
    assert figures["p50_tpot_ms"] == pytest.approx(150.0)  # (0.4 - 0.1) / 2
    assert figures["p50_itl_ms"] == pytest.approx(100.0)  # of 100, 200, 100, 100 ms
    assert figures["p99_itl_ms"] == pytest.approx(200.0)


def test_stream_figures_of_nothing_completed_are_absent() -> None:
    figures = stream_figures([[], []], 8, elapsed_s=1.0)
    assert (figures["completed"], figures["failed"], figures["output_throughput"]) == (0, 2, 0)
    assert figures["p50_ttft_ms"] is None and figures["p99_itl_ms"] is None


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (pct(values, 0.5), pct(values, 0.99), pct([5.0], 0.99)) == (51.0, 100.0, 5.0)


def test_a_client_run_where_no_request_completed_is_an_error() -> None:
    raw = {"completed": 16, "failed": 0, **dict.fromkeys(FIGURES, 1.0), "duration": 9.0}
    assert client_figures(raw) == {"completed": 16, "failed": 0, **dict.fromkeys(FIGURES, 1.0)}
    # llama-cpp-python's server once answered every request 400: zeros, not figures.
    with pytest.raises(RuntimeError, match="16 failed"):
        client_figures({**raw, "completed": 0, "failed": 16})


def test_a_detailed_result_keeps_each_requests_send_time_and_ttft_in_send_order() -> None:
    raw = {"completed": 3, "failed": 0, **dict.fromkeys(FIGURES, 1.0),
           "start_times": [100.5, 100.0, 101.25], "ttfts": [0.25, 1.5, 0.0125]}  # fmt: skip
    assert client_figures(raw)["requests"] == [[0.0, 1500.0], [0.5, 250.0], [1.25, 12.5]]


def test_no_two_runs_send_the_same_prompts(tmp_path: Path) -> None:
    """The warm-up (16 at c16), c16 and c64 (64 each) get seeds of their own: a prefix
    cache must not serve one run's prompts from another's."""
    settings, _ = parse_args(["--concurrency", "16,64", "--seed", "3"])

    def seed(concurrency: int, num: int) -> str:
        argv = vllm_client_argv(tmp_path / "vllm", settings, tmp_path, 8123,
                                Point(RANDOM, concurrency=concurrency), num, tmp_path / "o.json")  # fmt: skip
        return argv[argv.index("--seed") + 1]

    seeds = {seed(16, 16), seed(16, 64), seed(64, 64)}
    assert len(seeds) == 3
    assert seed(16, 64) == seed(16, 64)  # the same for every contender


def test_why_requests_failed_is_kept_once_per_reason() -> None:
    errors = ["ReadTimeout: timed out", "ReadTimeout: timed out", "HTTPStatusError: 503",
              "RemoteProtocolError: closed", "ConnectError: refused"]  # fmt: skip
    figures = stream_figures([[0.1, 0.2], [], [], [], [], []], 2, 1.0, errors)
    assert figures["failed"] == 5
    assert figures["errors"] == [
        "ReadTimeout: timed out",
        "HTTPStatusError: 503",
        "RemoteProtocolError: closed",
    ]  # the first MAX_ERRORS distinct reasons
    assert "errors" not in stream_figures([[0.1, 0.2]], 2, 1.0)
