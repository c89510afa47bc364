"""The served benchmark's choice of load client and its command line's checks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from bench.generate_served import checkout_commit, parse_args, recorded_inputs, uses_vllm_client


def _fake_vllm(tmp_path: Path) -> str:
    vllm = tmp_path / "venv" / "bin" / "vllm"
    vllm.parent.mkdir(parents=True)
    vllm.touch()
    return str(tmp_path / "venv")


def test_vllm_bench_serve_drives_every_contender_where_vllm_is_installed(tmp_path: Path) -> None:
    venv = _fake_vllm(tmp_path)
    # Not only when the vllm contender runs: it is the load client for conveyor alone too.
    assert uses_vllm_client(parse_args(["--contenders", "conveyor", "--vllm-venv", venv])[0])
    assert not uses_vllm_client(parse_args(["--smoke", "--vllm-venv", venv])[0])
    absent = str(tmp_path / "none")
    assert not uses_vllm_client(parse_args(["--contenders", "conveyor", "--vllm-venv", absent])[0])


@pytest.mark.parametrize(
    "argv", [["--contenders", "conveyor,tgi"], ["--workload", "sharegpt"], ["--workload", ","]]
)
def test_unknown_contenders_and_workloads_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_recorded_inputs_keep_no_local_paths(tmp_path: Path) -> None:
    # The model directory by its name; a folder git does not know, by its name too.
    argv = ["--model-dir", str(tmp_path / "smollm2"), "--baseline-src", str(tmp_path / "old")]
    settings = parse_args(argv)[0]
    inputs = recorded_inputs(settings)
    assert inputs["model_dir"] == "smollm2"
    assert inputs["baseline_src"] == "old"
    assert inputs["commit"] == checkout_commit(Path("."))  # what was measured as conveyor
    assert str(tmp_path) not in json.dumps(inputs)


def test_a_baseline_checkout_is_named_by_its_commit() -> None:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    assert checkout_commit(Path(".")) == head
