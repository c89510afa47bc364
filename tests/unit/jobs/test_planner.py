"""The planner: line-aligned shard ranges that reproduce exactly the requests of the file."""

from __future__ import annotations

import itertools
import random

import pytest

from conveyor.jobs.planner import ShardPlanner, scan_lines, shard_requests
from conveyor.jobs.validation import InputValidator
from conveyor.stores.object_io import lines_of
from tests.unit.jobs.fakes import ENDPOINT, MODEL, request_line


def plan(data: bytes, lines_per_shard: int) -> list:
    validator = InputValidator(ENDPOINT, lambda m: m == MODEL, 1000, 100)
    result = scan_lines(lines_of([data]), validator, ShardPlanner(lines_per_shard), len(data))
    assert result.report.is_valid, result.report.errors
    return result.shards


def requests_in(data: bytes, shard) -> list[tuple[int, bytes]]:
    chunk = data[shard.byte_start : shard.byte_end]
    return list(shard_requests(lines_of([chunk]), shard.first_line))


def test_shards_hold_n_requests_each_and_cover_the_file() -> None:
    data = b"".join(request_line(f"c{i}", "x") + b"\n" for i in range(10))
    shards = plan(data, 4)
    assert [s.num_lines for s in shards] == [4, 4, 2]
    assert [s.first_line for s in shards] == [0, 4, 8]
    assert shards[0].byte_start == 0 and shards[-1].byte_end == len(data)
    for left, right in itertools.pairwise(shards):
        assert left.byte_end == right.byte_start


def test_blank_lines_keep_line_numbers_and_are_not_requests() -> None:
    data = b"\n" + request_line("a", "x") + b"\n\n  \n" + request_line("b", "y") + b"\n\n"
    shards = plan(data, 1)
    assert [s.num_lines for s in shards] == [1, 1]
    assert [line_no for line_no, _ in requests_in(data, shards[0])] == [1]
    assert [line_no for line_no, _ in requests_in(data, shards[1])] == [4]


def test_last_line_without_newline_is_clamped_to_the_file() -> None:
    data = request_line("a", "x") + b"\n" + request_line("b", "y")
    shards = plan(data, 10)
    assert shards[0].byte_end == len(data)
    assert [raw for _, raw in requests_in(data, shards[0])] == data.split(b"\n")


@pytest.mark.parametrize("seed", range(5))
def test_random_files_split_into_exactly_their_requests(seed: int) -> None:
    rng = random.Random(seed)
    lines = []
    for i in range(rng.randint(1, 60)):
        lines.append(request_line(f"id-{i}", "w " * rng.randint(0, 30)))
        lines.extend(b"" for _ in range(rng.choice([0, 0, 0, 1, 2])))
    data = b"\r\n".join(lines) if seed % 2 else b"\n".join(lines)
    shards = plan(data, rng.randint(1, 7))
    found = [raw.rstrip(b"\r") for s in shards for _, raw in requests_in(data, s)]
    assert found == [line for line in lines if line]
    assert sum(s.num_lines for s in shards) == len(found)


def test_planner_rejects_a_zero_shard_size() -> None:
    with pytest.raises(ValueError, match="lines_per_shard"):
        ShardPlanner(0)
