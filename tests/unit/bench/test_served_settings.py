"""The served benchmark's measuring points: each workload's concurrencies or rates, with
the keys the results use, and the warm-up before them."""

from __future__ import annotations

from bench.generate_served import parse_args
from bench.served_settings import CHAT, RANDOM, Point, points, warm_up_points


def test_the_random_workload_keeps_its_concurrency_keys() -> None:
    settings, _ = parse_args([])
    assert settings.workloads == (RANDOM,)
    assert [point.label for point in points(settings)] == ["c16", "c64"]


def test_the_chat_workload_runs_at_each_request_rate() -> None:
    settings, _ = parse_args(["--workload", "random,chat", "--request-rate", "0.5,2"])
    assert points(settings) == [
        Point(RANDOM, concurrency=16), Point(RANDOM, concurrency=64),
        Point(CHAT, rate=0.5), Point(CHAT, rate=2.0),
    ]  # fmt: skip
    assert [point.label for point in points(settings)][2:] == ["chat_r0.5", "chat_r2"]


def test_each_workload_is_warmed_up_on_its_first_point_with_a_few_requests() -> None:
    settings, _ = parse_args(["--workload", "chat,random", "--request-rate", "3,4"])
    assert warm_up_points(settings) == [(Point(CHAT, rate=3.0), 4),
                                        (Point(RANDOM, concurrency=16), 16)]  # fmt: skip
    small, _ = parse_args(["--num-requests", "2"])
    assert warm_up_points(small) == [(Point(RANDOM, concurrency=16), 2)]


def test_the_smoke_run_defaults_to_conveyor_but_keeps_contenders_asked_for() -> None:
    assert parse_args(["--smoke"])[0].contenders == ("conveyor",)
    settings, _ = parse_args(["--smoke", "--contenders", "conveyor,hf_static"])
    assert settings.contenders == ("conveyor", "hf_static")
    assert settings.request_rates == (8.0,)
