"""The sizing arithmetic on known models and by hand-computed cases."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conveyor.cli.main import app
from conveyor.plan.calibrate import SoloTimes
from conveyor.plan.curves import LinearCurve
from conveyor.plan.gpus import GPUS, gpu_spec
from conveyor.plan.planner import GenerativeCosts, plan_generative, plan_one_shot, roofline_costs
from conveyor.plan.shape import load_shape, shape_from_hf
from conveyor.plan.sizing import (
    Z_P99,
    Workload,
    batch_for_p99,
    generative_latency_s,
    kv_budget_bytes,
    max_batch_for_kv,
    one_shot_p99_s,
    output_tokens_per_s,
    replicas_for,
    seat_wait_s,
    steady_batch,
    usd_per_million,
)

LLAMA2_7B = Path(__file__).with_name("llama2_7b_config.json")
MIB = 2**20


def test_llama2_7b_fp16_weights_and_kv_cache() -> None:
    shape = load_shape(LLAMA2_7B)
    assert shape.num_params == 6_738_415_616
    assert round(shape.weight_bytes / 1e9, 1) == 13.5
    assert shape.kv_bytes_per_token == MIB // 2


def test_grouped_query_attention_shrinks_the_kv_cache() -> None:
    raw = json.loads(LLAMA2_7B.read_text())
    llama3_8b = {**raw, "num_key_value_heads": 8, "intermediate_size": 14336,
                 "vocab_size": 128256, "torch_dtype": "bfloat16"}  # fmt: skip
    shape = shape_from_hf(llama3_8b, "llama3-8b")
    assert shape.kv_bytes_per_token == 128 * 1024
    assert shape.num_params == 8_030_261_248


def test_the_largest_batch_fits_the_kv_budget_on_an_h100() -> None:
    shape = load_shape(LLAMA2_7B)
    budget = kv_budget_bytes(GPUS["h100"].memory_bytes, shape.weight_bytes)
    assert budget == 72_000_000_000 - 13_476_831_232
    assert max_batch_for_kv(budget, shape.kv_bytes_per_token, 768) == 145


def test_replicas_with_headroom_and_the_failure_to_survive() -> None:
    one_region = Workload(qps=100, prompt_tokens=1, output_tokens=1)
    replicas = replicas_for(100, 30, one_region)
    assert (replicas.bare, replicas.with_headroom, replicas.total) == (4, 5, 6)
    three_regions = Workload(qps=100, prompt_tokens=1, output_tokens=1, regions=3)
    # 5 needed; losing a region leaves 2, each must hold ceil(5/2) = 3.
    assert replicas_for(100, 30, three_regions).total == 9
    assert replicas_for(100, 30, three_regions).per_region == 3
    assert replicas.per_region is None


def test_cost_per_million_tokens() -> None:
    # 2 replicas at 4 $/h = 8 $/h for 1000 tokens/s = 3.6 M tokens/h.
    assert usd_per_million(2, 4.0, 1000) == pytest.approx(8 / 3.6)
    assert usd_per_million(2, None, 1000) is None


def test_a_line_is_fitted_exactly_and_kept_non_negative() -> None:
    line = LinearCurve.fit([(1, 0.021), (2, 0.022), (4, 0.024)])
    assert (line.fixed_s, line.per_item_s) == pytest.approx((0.020, 0.001))
    flat = LinearCurve.fit([(8, 0.05), (8, 0.07)])
    assert (flat.fixed_s, flat.per_item_s) == pytest.approx((0.06, 0.0))
    assert LinearCurve.fit([(1, 0.03), (2, 0.02)]).per_item_s == 0.0
    with pytest.raises(ValueError):
        LinearCurve.fit([])


def test_throughput_shares_steps_and_pays_each_prefill_at_its_margin() -> None:
    step = LinearCurve(0.010, 0.001)  # 20 ms at 10 sequences
    # A step: 10 x 99/100 decodes (19.9 ms) and 10/100 admissions of 40 ms extra each
    # (50 ms prefill less the 10 ms every step pays): 23.9 ms for 10 tokens.
    assert output_tokens_per_s(10, step, 0.05, 100) == pytest.approx(10 / 0.0239)
    # One-token requests are all prefill: ten prefills are no faster than one each.
    assert output_tokens_per_s(10, step, 0.05, 1) == pytest.approx(10 / 0.41)


def test_one_shot_batches_settle_where_arrivals_fill_them() -> None:
    curve = LinearCurve(0.050, 0.001)
    # Busy: b = 100/s x t(b) -> b = 5 / 0.9.
    b = steady_batch(curve, 100, 0.005, 64)
    assert b == pytest.approx(5 / 0.9)
    assert one_shot_p99_s(curve, b, 0.005) == pytest.approx(2 * curve.at(b))
    # Light and a long window: the window decides.
    assert steady_batch(curve, 10, 0.200, 64) == pytest.approx(2.0)
    assert one_shot_p99_s(curve, 2.0, 0.200) == pytest.approx(0.252)
    assert steady_batch(curve, 2000, 0.005, 16) == 16


def test_the_batch_and_wait_that_meet_a_p99() -> None:
    curve = LinearCurve(0.020, 0.002)
    assert batch_for_p99(curve, 0.100, 64) == (15, pytest.approx(0.050))
    assert batch_for_p99(curve, 0.030, 64) is None


def test_a_one_shot_plan_from_a_curve() -> None:
    workload = Workload(qps=300, prompt_tokens=10, output_tokens=0, p99_ttft_ms=200)
    plan = plan_one_shot(workload, LinearCurve(0.050, 0.001), 16, 5.0)
    assert plan["inputs_per_s_per_replica"] == pytest.approx(16 / 0.066, rel=1e-3)
    assert plan["replicas_with_headroom"] == 2 and plan["replicas"] == 3
    assert plan["recommended_max_batch_size"] == 16


def test_a_tpot_target_caps_the_batch() -> None:
    shape = load_shape(LLAMA2_7B)
    workload = Workload(qps=5, prompt_tokens=512, output_tokens=256, tpot_ms=25)
    plan = plan_generative(workload, roofline_costs(shape, gpu_spec("h100"), workload), shape,
                           gpu_spec("h100"))  # fmt: skip
    assert (
        plan["decode_step_ms"]
        <= 25
        < roofline_costs(shape, gpu_spec("h100"), workload).step.at(plan["max_batch"] + 1) * 1000
    )


def test_every_preset_is_known_and_others_are_refused() -> None:
    assert set(GPUS) == {"h100", "h200", "a100-80g", "l4", "cpu"}
    with pytest.raises(ValueError, match="known"):
        gpu_spec("tpu")


def test_json_output_has_the_documented_keys() -> None:
    result = CliRunner().invoke(app, [
        "plan", "--model", str(LLAMA2_7B), "--gpu", "h200", "--qps", "20",
        "--prompt-tokens", "512", "--output-tokens", "256", "--gpu-hour-usd", "4", "--json",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    for key in ("weight_bytes", "kv_bytes_per_token", "max_batch", "tokens_per_s_per_replica",
                "replicas", "usd_per_million_output_tokens"):  # fmt: skip
        assert plan[key] is not None, key


def test_a_plan_without_model_or_calibration_is_refused() -> None:
    result = CliRunner().invoke(app, ["plan", "--qps", "1", "--prompt-tokens", "8"])
    assert result.exit_code == 2 and "--calibrate" in result.output


def test_a_generative_request_alone_takes_its_prefill_and_its_decode_steps() -> None:
    step = LinearCurve(0.001, 0.0001)
    mean_s, p99_s = generative_latency_s(step, 0.004, 32, 1e-9, 8)
    assert mean_s == pytest.approx(0.004 + 31 * step.at(1))
    assert p99_s == pytest.approx(mean_s, rel=1e-3)


def test_generative_latency_grows_with_load_and_the_p99_sits_above_the_mean() -> None:
    step = LinearCurve(0.001, 0.0001)
    figures = [generative_latency_s(step, 0.004, 32, rate, 8) for rate in (5, 20, 40)]
    means = [mean for mean, _ in figures]
    assert means == sorted(means) and all(p99 > mean for mean, p99 in figures)
    # At 40/s: W = (p + 31 t(1)) / (1 - rate (31 c + p - a)); others running and arriving
    # during it: rate x W each (Little's law), at their Poisson p99 for the tail.
    expected_mean = (0.004 + 31 * 0.0011) / (1 - 40 * (31 * 0.0001 + 0.003))
    assert figures[2][0] == pytest.approx(expected_mean)
    tail = 40 * expected_mean + Z_P99 * math.sqrt(40 * expected_mean)
    assert figures[2][1] == pytest.approx(0.004 + 31 * step.at(1 + tail) + 0.003 * tail)


def test_a_measured_overlap_sets_what_each_other_request_costs_the_p99() -> None:
    step = LinearCurve(0.001, 0.0001)
    mean_s, modelled = generative_latency_s(step, 0.004, 32, 40, 8)
    same = generative_latency_s(step, 0.004, 32, 40, 8, per_other_s=0.0001)
    assert same == (mean_s, modelled)  # below the engine's own cost per other: no change
    _, measured = generative_latency_s(step, 0.004, 32, 40, 8, per_other_s=0.01)
    tail = 40 * mean_s + Z_P99 * math.sqrt(40 * mean_s)
    assert measured == pytest.approx(0.004 + 31 * step.at(1) + 0.01 * tail)
    assert measured > modelled


def test_generative_latency_is_unbounded_past_what_a_replica_carries() -> None:
    step = LinearCurve(0.001, 0.0001)
    assert generative_latency_s(step, 0.004, 32, 200, 8) == (math.inf, math.inf)
    mean_s, p99_s = generative_latency_s(step, 0.004, 32, 150, 8)  # more than 8 seats
    assert math.isfinite(mean_s) and p99_s == math.inf


def test_lone_requests_give_the_overhead_beyond_the_engine_and_the_tail() -> None:
    solo = SoloTimes(caller_s=[0.050, 0.050, 0.050, 0.090], engine_s=0.046)
    assert solo.overhead_s == pytest.approx(0.014)
    assert solo.tail_s == pytest.approx(0.030)
    assert SoloTimes(caller_s=[0.01], engine_s=0.02).overhead_s == 0.0


def test_a_calibrated_plan_adds_the_overhead_and_the_lone_tail_to_its_latency() -> None:
    workload = Workload(qps=20, prompt_tokens=16, output_tokens=32)
    step = LinearCurve(0.001, 0.0001)
    bare = plan_generative(workload, GenerativeCosts(step, 0.004, "calibrated", 8), None, None)
    costs = GenerativeCosts(step, 0.004, "calibrated", 8, overhead_s=0.003, tail_s=0.010)
    measured = plan_generative(workload, costs, None, None)
    assert measured["predicted_mean_ms"] == pytest.approx(bare["predicted_mean_ms"] + 3, abs=1e-3)
    assert measured["predicted_p99_ms"] == pytest.approx(bare["predicted_p99_ms"] + 13, abs=1e-3)
    assert (measured["request_overhead_ms"], measured["lone_request_tail_ms"]) == (3.0, 10.0)
    assert bare["predicted_p99_ms"] > bare["predicted_mean_ms"]


def test_a_request_that_finds_every_seat_taken_waits_for_those_ahead_to_free() -> None:
    # 2.5 ahead, 8 seats each held 124 ms: a seat frees every 15.5 ms.
    assert seat_wait_s(2.5, 8, 0.124) == pytest.approx(2.5 * 0.0155)
    assert seat_wait_s(-1.0, 8, 0.124) == 0.0
