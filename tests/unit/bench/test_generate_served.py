"""The served benchmark's choice of load client and its command line's checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.generate_served import parse_args, uses_vllm_client


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
