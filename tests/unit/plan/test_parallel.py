"""Tensor parallelism, the KV cache's own dtype, and a plan that says why nothing fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conveyor.cli.main import app
from conveyor.plan.gpus import GPUS, gpu_spec
from conveyor.plan.parallel import fit_at, sizes_for, tp_prefill_s, tp_step
from conveyor.plan.planner import plan_preset, roofline_costs
from conveyor.plan.shape import dtype_bytes, load_shape, shape_from_hf
from conveyor.plan.sizing import BANDWIDTH_EFFICIENCY, FLOPS_EFFICIENCY, Workload

LLAMA3_70B = Path(__file__).with_name("llama3_70b_config.json")
WORKLOAD = Workload(qps=20, prompt_tokens=1024, output_tokens=256)
H100 = GPUS["h100"]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["plan", *args])
    return result.exit_code, result.stdout


def test_llama3_70b_in_bf16_is_141_gb_with_grouped_kv_heads() -> None:
    shape = load_shape(LLAMA3_70B)
    assert shape.num_params == 70_553_706_496 and shape.weight_bytes == 141_107_412_992
    assert shape.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2  # 320 KiB
    assert shape.kv_bytes_per_token_per_gpu(2) == 2 * 80 * 4 * 128 * 2
    assert shape.kv_bytes_per_token_per_gpu(8) == 2 * 80 * 1 * 128 * 2


def test_kv_heads_fewer_than_gpus_are_copied_not_split() -> None:
    raw = {**json.loads(LLAMA3_70B.read_text()), "num_key_value_heads": 4}
    shape = shape_from_hf(raw, "gqa4")
    assert shape.kv_bytes_per_token_per_gpu(8) == shape.kv_bytes_per_token_per_gpu(4)


def test_a_decode_step_splits_the_reads_and_pays_two_all_reduces_a_layer() -> None:
    shape = load_shape(LLAMA3_70B)
    bandwidth = H100.bandwidth_bytes_per_s * BANDWIDTH_EFFICIENCY
    link = 450e9  # NVLink each way
    step = tp_step(shape, H100, 1152, 2)
    assert step.fixed_s == pytest.approx(shape.weight_bytes / 2 / bandwidth + 160 * 10e-6)
    ring = 2 * (2 - 1) / 2 * 8192 * 2 / link  # one sequence's activations, ring of two
    kv = 2 * 80 * 4 * 128 * 2 * 1152 / bandwidth
    assert step.per_item_s == pytest.approx(kv + 160 * ring)
    # One GPU: the plain roofline, no link at all.
    alone = tp_step(shape, H100, 1152, 1)
    assert alone.fixed_s == pytest.approx(shape.weight_bytes / bandwidth)
    assert alone.per_item_s == pytest.approx(shape.kv_bytes_per_token * 1152 / bandwidth)
    flops = 2 * shape.num_params * 1024 / (4 * H100.bf16_flops_per_s * FLOPS_EFFICIENCY)
    reduce = 10e-6 + 2 * 3 / 4 * 1024 * 8192 * 2 / link
    assert tp_prefill_s(shape, H100, 1024, 4) == pytest.approx(flops + 160 * reduce)


def test_pcie_costs_more_than_nvlink_for_the_same_split() -> None:
    shape = load_shape(LLAMA3_70B, "int8")
    nvlink = tp_step(shape, GPUS["h100"], 1152, 8)
    pcie = tp_step(shape, GPUS["l4"], 1152, 8)
    assert GPUS["l4"].link is not None and GPUS["l4"].link.kind == "pcie"
    assert pcie.per_item_s > nvlink.per_item_s


def test_the_size_needing_the_fewest_gpus_in_all_is_chosen_and_said() -> None:
    plan = plan_preset(WORKLOAD, load_shape(LLAMA3_70B), H100)
    # 2 GPUs hold the weights but leave room for 7 sequences; 4 hold 358 and need far fewer.
    assert plan["fits"] is True and plan["tensor_parallel_size"] == 4
    assert plan["gpus_per_replica"] == 4 and plan["gpus"] == 4 * plan["replicas"]
    assert plan["interconnect"] == "nvlink"
    by_size = {size: plan_preset(WORKLOAD, load_shape(LLAMA3_70B), H100, size)["gpus"]
               for size in (2, 4, 8)}  # fmt: skip
    assert plan["gpus"] == min(by_size.values()) == by_size[4]
    assert plan["tensor_parallel_note"] == (
        f"4 GPU(s) a replica: the fewest GPUs in all for this load ({by_size[4]}); other sizes:"
        f" 1: the weights alone fill the memory; 2: {by_size[2]} GPUs; 8: {by_size[8]} GPUs"
    )
    tried = {t["tensor_parallel_size"]: t for t in plan["tensor_parallel_tried"]}
    assert sorted(tried) == [1, 2, 4, 8]
    assert tried[1]["weight_bytes_per_gpu"] == 141_107_412_992 and tried[1]["max_batch"] == 0
    # 72 GB usable less 70.55 GB of weights, for 1,280 tokens of 160 KiB each.
    assert tried[2]["kv_budget_bytes_per_gpu"] == 72_000_000_000 - 70_553_706_496
    assert tried[2]["max_batch"] == (72_000_000_000 - 70_553_706_496) // (163_840 * 1280)
    assert tried[8]["max_batch"] > tried[4]["max_batch"] > tried[2]["max_batch"]


def test_on_a_tie_the_smaller_size_is_chosen() -> None:
    light = Workload(qps=0.01, prompt_tokens=1024, output_tokens=256)
    plan = plan_preset(light, load_shape(LLAMA3_70B, "int8"), H100)
    # One replica and its spare at every size that fits: 1 GPU a replica needs the fewest.
    assert plan["replicas"] == 2 and plan["tensor_parallel_size"] == 1 and plan["gpus"] == 2


def test_a_given_size_is_used_and_gpu_hours_count_every_gpu() -> None:
    workload = Workload(qps=20, prompt_tokens=1024, output_tokens=256, gpu_hour_usd=2.0)
    plan = plan_preset(workload, load_shape(LLAMA3_70B), H100, 4)
    assert plan["tensor_parallel_size"] == 4 and len(plan["tensor_parallel_tried"]) == 1
    assert plan["tensor_parallel_note"] == "4 GPU(s) a replica, as given"
    tokens_per_s = 20 * 256
    usd = plan["replicas"] * 4 * 2.0 / (tokens_per_s * 3600) * 1e6
    assert plan["usd_per_million_output_tokens"] == pytest.approx(usd, rel=1e-3)


def test_sizes_are_1_2_4_8_and_a_cpu_has_no_link() -> None:
    assert sizes_for(H100, None) == (1, 2, 4, 8) and sizes_for(H100, 4) == (4,)
    assert sizes_for(GPUS["cpu"], None) == (1,)
    with pytest.raises(ValueError, match="one of"):
        sizes_for(H100, 3)
    with pytest.raises(ValueError, match="no link"):
        sizes_for(GPUS["cpu"], 2)


def test_a_tpot_target_no_size_meets_is_the_reason_given() -> None:
    shape = load_shape(LLAMA3_70B)
    workload = Workload(qps=1, prompt_tokens=1024, output_tokens=256, tpot_ms=1)
    step = roofline_costs(shape, H100, workload, 8).step
    fit = fit_at(shape, H100, workload, 8, step)
    assert fit.max_batch == 0 and fit.why_not is not None and "TPOT" in fit.why_not


def test_nothing_fits_is_explained_with_the_numbers_in_json_and_exits_2(tmp_path: Path) -> None:
    raw = {**json.loads(LLAMA3_70B.read_text()), "num_hidden_layers": 500}  # ~440 B params
    config = tmp_path / "config.json"
    config.write_text(json.dumps(raw))
    code, out = run("--model", str(config), "--gpu", "h100", "--qps", "5",
                    "--prompt-tokens", "512", "--output-tokens", "64", "--json")  # fmt: skip
    assert code == 2
    plan = json.loads(out)
    assert plan["fits"] is False and plan["why_not"].startswith("nothing fits: 1 GPU(s): ")
    assert plan["weight_bytes"] > 8 * 72e9 and plan["kv_bytes_per_token"] > 0
    assert [t["tensor_parallel_size"] for t in plan["tensor_parallel_tried"]] == [1, 2, 4, 8]
    assert all(t["kv_budget_bytes_per_gpu"] == 0 for t in plan["tensor_parallel_tried"])
    assert "replicas" not in plan  # no figures that would read as a plan
    code, text = run("--model", str(config), "--gpu", "h100", "--qps", "5",
                     "--prompt-tokens", "512", "--output-tokens", "64")  # fmt: skip
    assert code == 2 and text.startswith("no plan: nothing fits: 1 GPU(s): ")
    assert "KV/token/GPU" in text and "weights" in text


def test_the_kv_cache_dtype_is_its_own_input() -> None:
    int8 = load_shape(LLAMA3_70B, "int8")
    assert int8.weight_bytes == 70_553_706_496
    assert int8.kv_bytes_per_token == load_shape(LLAMA3_70B).kv_bytes_per_token  # bf16 KV
    assert load_shape(LLAMA3_70B, "int8", "fp8").kv_bytes_per_token == 2 * 80 * 8 * 128
    assert load_shape(LLAMA3_70B, "int8", "auto").kv_bytes_per_token == 2 * 80 * 8 * 128
    assert load_shape(LLAMA3_70B, "int4").weight_bytes == 70_553_706_496 // 2
    assert dtype_bytes("bf16") == 2 and dtype_bytes("fp8_e4m3", for_kv=True) == 1
    with pytest.raises(ValueError, match="--kv-cache-dtype"):
        dtype_bytes("int4", for_kv=True)
    code, out = run("--model", str(LLAMA3_70B), "--gpu", "h100", "--qps", "1",
                    "--prompt-tokens", "8", "--output-tokens", "8", "--dtype", "int8",
                    "--kv-cache-dtype", "fp8",
                    "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["kv_bytes_per_token"] == 2 * 80 * 8 * 128


def test_a_preset_with_one_device_a_replica_refuses_a_split() -> None:
    result = CliRunner().invoke(app, [
        "plan", "--model", str(LLAMA3_70B), "--gpu", "cpu", "--qps", "1", "--prompt-tokens", "8",
        "--output-tokens", "8", "--tensor-parallel-size", "2",
    ])  # fmt: skip
    assert result.exit_code == 2 and "no link between devices" in result.stderr
    assert gpu_spec("cpu").link is None
