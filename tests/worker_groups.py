"""How ``make test`` shares the suite between its pytest-xdist workers (``--dist loadgroup``).

A group runs whole in one worker: the tests sharing a session fixture that loads a model or
starts a server, else a file's tests. The groups then start in the order of the collection,
arranged here so that the longest go first. In xdist's own order (most tests first) the
vLLM group, a few tests and about six minutes on two cores, started late: the last 4 % of a
run's tests took its last 9 minutes.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

# Session fixtures that load a model or start a server: every test using one runs in the same
# xdist worker, so each is built once per run, not once per worker.
SHARED_SESSION_FIXTURES: dict[str, str] = {
    # First: the engine: vllm tests (SmolLM2 imported once, one vLLM engine at a time).
    "smollm2_dir": "vllm",
    "smollm2_tokenizer": "smollm2",
    "smollm2_runner": "smollm2",
    "smollm2_hf": "smollm2",
    "smollm2_scorer": "smollm2",
    "default_server": "default_server",
    "main_server": "main_server",
}

# The groups that take minutes, longest first (``--durations`` of a whole run on two cores:
# vLLM about 6 minutes, lm-eval 3, the SmolLM2 parity and seed tests 3).
LONG_GROUPS_FIRST = ("vllm", "tests/e2e/test_lm_eval.py", "smollm2")


def xdist_group_of(nodeid: str, fixturenames: Collection[str]) -> str:
    """The worker group of a test: its shared session fixture's, else its file's.

    Keeping a file together keeps its module-scoped servers to one start per run.
    """
    for fixture, group in SHARED_SESSION_FIXTURES.items():
        if fixture in fixturenames:
            return group
    return file_of(nodeid)


def file_of(nodeid: str) -> str:
    """The test file of a node id (``tests/unit/test_x.py`` of ``tests/unit/test_x.py::t``)."""
    return nodeid.split("::", 1)[0]


def rank_of(nodeid: str, group: str) -> int:
    """Where a test's group starts: the long groups in their order, then the other
    integration and end-to-end tests, then the unit tests (many short files, which even
    out the two workers' ends)."""
    if group in LONG_GROUPS_FIRST:
        return LONG_GROUPS_FIRST.index(group)
    return len(LONG_GROUPS_FIRST) + nodeid.startswith("tests/unit/")


def run_order(tests: Sequence[tuple[str, str]]) -> list[int]:
    """The order (indices into ``tests``, each a node id and its group) to run them in:
    by ``rank_of``, each file ranked as its earliest-starting test so that a file's tests
    stay together (its module-scoped fixtures set up once), else as collected."""
    file_rank: dict[str, int] = {}
    for nodeid, group in tests:
        file, rank = file_of(nodeid), rank_of(nodeid, group)
        file_rank[file] = min(file_rank.get(file, rank), rank)
    return sorted(range(len(tests)), key=lambda i: file_rank[file_of(tests[i][0])])
