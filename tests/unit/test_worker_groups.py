"""The suite's split between pytest-xdist workers (``tests/worker_groups.py``)."""

from __future__ import annotations

from pathlib import Path

from tests.worker_groups import (
    LONG_GROUPS_FIRST,
    SHARED_SESSION_FIXTURES,
    rank_of,
    run_order,
    xdist_group_of,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_shared_fixture_names_the_group_else_the_file() -> None:
    nodeid = "tests/e2e/test_x.py::test_a"
    assert xdist_group_of(nodeid, ["tmp_path", "default_server"]) == "default_server"
    assert xdist_group_of(nodeid, ["tmp_path"]) == "tests/e2e/test_x.py"
    # The vLLM group wins over SmolLM2's: its tests use both fixtures.
    assert xdist_group_of(nodeid, ["smollm2_hf", "smollm2_dir"]) == "vllm"


def test_long_groups_start_first_then_the_others_then_the_unit_tests() -> None:
    assert rank_of("tests/integration/test_v.py::t", "vllm") == 0
    assert rank_of("tests/e2e/test_lm_eval.py::t", "tests/e2e/test_lm_eval.py") == 1
    others = len(LONG_GROUPS_FIRST)
    assert rank_of("tests/e2e/test_x.py::t", "tests/e2e/test_x.py") == others
    assert rank_of("tests/unit/test_y.py::t", "tests/unit/test_y.py") == others + 1


def test_the_order_puts_long_groups_first_and_keeps_files_and_ties_together() -> None:
    tests = [
        ("tests/unit/test_a.py::t1", "tests/unit/test_a.py"),
        ("tests/e2e/test_b.py::t1", "tests/e2e/test_b.py"),
        ("tests/e2e/test_c.py::t1", "tests/e2e/test_c.py"),
        # One file, two groups: the whole file starts with its earliest group.
        ("tests/integration/test_d.py::t1", "tests/integration/test_d.py"),
        ("tests/integration/test_d.py::t2", "smollm2"),
        ("tests/integration/test_v.py::t1", "vllm"),
        ("tests/unit/test_a.py::t2", "tests/unit/test_a.py"),
    ]
    order = [tests[i][0] for i in run_order(tests)]
    assert order == [
        "tests/integration/test_v.py::t1",
        "tests/integration/test_d.py::t1",
        "tests/integration/test_d.py::t2",
        "tests/e2e/test_b.py::t1",
        "tests/e2e/test_c.py::t1",
        "tests/unit/test_a.py::t1",
        "tests/unit/test_a.py::t2",
    ]


def test_every_long_group_is_a_shared_fixtures_group_or_a_test_file_that_exists() -> None:
    # A renamed file would otherwise drop out of the long groups without a word.
    for group in LONG_GROUPS_FIRST:
        shared = group in SHARED_SESSION_FIXTURES.values()
        assert shared or (REPO_ROOT / group).is_file(), group
