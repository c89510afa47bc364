"""Validation: every bad line of an input file is listed with its 1-based line number."""

from __future__ import annotations

import orjson
import pytest

from conveyor.errors import InvalidRequest
from conveyor.jobs.validation import (
    InputValidator,
    check_endpoint,
    check_metadata,
    parse_completion_window,
)
from tests.unit.jobs.fakes import ENDPOINT, MODEL, request_line


def validate(lines: list[bytes], *, max_requests: int = 100, max_listed: int = 100):
    validator = InputValidator(ENDPOINT, lambda m: m in (MODEL, "other"), max_requests, max_listed)
    for line_no, raw in enumerate(lines):
        validator.check_line(line_no, raw)
    return validator.finish()


def codes(report) -> list[tuple[int | None, str]]:
    return [(e.line, e.code) for e in report.errors]


def test_a_good_file_is_valid_and_names_its_model() -> None:
    report = validate([request_line("a", "x"), b"", request_line("b", "y")])
    assert report.is_valid and report.model == MODEL and report.num_requests == 2


def test_every_bad_line_is_listed_once_with_its_line_number() -> None:
    lines = [
        request_line("a", "x"),
        b"{not json",
        b"[1, 2]",
        orjson.dumps({"method": "POST", "url": ENDPOINT, "body": {"model": MODEL}}),
        request_line("a", "dup"),
        orjson.dumps(
            {"custom_id": "m", "method": "GET", "url": ENDPOINT, "body": {"model": MODEL}}
        ),
        request_line("u", "x", url="/v1/completions"),
        orjson.dumps({"custom_id": "nb", "method": "POST", "url": ENDPOINT, "body": "text"}),
        request_line("nm", "x", model="missing"),
        request_line("mm", "x", model="other"),
        orjson.dumps({"custom_id": "nomodel", "method": "POST", "url": ENDPOINT, "body": {}}),
    ]
    assert codes(validate(lines)) == [
        (2, "invalid_json_line"),
        (3, "invalid_request_line"),
        (4, "missing_custom_id"),
        (5, "duplicate_custom_id"),
        (6, "invalid_method"),
        (7, "mismatched_endpoint"),
        (8, "invalid_body"),
        (9, "model_not_found"),
        (10, "mismatched_model"),
        (11, "missing_model"),
    ]


def test_empty_and_blank_only_files_fail() -> None:
    assert codes(validate([])) == [(None, "empty_file")]
    assert codes(validate([b"", b"   "])) == [(None, "empty_file")]


def test_too_many_requests_is_reported_at_the_first_line_past_the_limit() -> None:
    report = validate([request_line(f"r{i}", "x") for i in range(4)], max_requests=2)
    assert codes(report) == [(3, "too_many_requests")]


def test_unlisted_errors_are_summarised() -> None:
    report = validate([b"bad"] * 5, max_listed=2)
    assert codes(report) == [(1, "invalid_json_line"), (2, "invalid_json_line"),
                             (None, "too_many_errors")]  # fmt: skip
    assert "3 further" in report.errors[-1].message


@pytest.mark.parametrize(("window", "seconds"), [("24h", 86400), ("1h", 3600), ("90m", 5400),
                                                 ("5s", 5)])  # fmt: skip
def test_completion_windows_parse(window: str, seconds: float) -> None:
    assert parse_completion_window(window, min_s=1, max_s=86400) == seconds


@pytest.mark.parametrize("window", ["", "24", "h", "0h", "1d", "-1h", "2h ", 24])
def test_bad_completion_windows_are_400(window: object) -> None:
    with pytest.raises(InvalidRequest):
        parse_completion_window(window, min_s=1, max_s=86400)


def test_windows_below_the_configured_minimum_are_400() -> None:
    with pytest.raises(InvalidRequest, match="between"):
        parse_completion_window("30m", min_s=3600, max_s=86400)


def test_endpoint_and_metadata_checks() -> None:
    assert check_endpoint("/v1/chat/completions") == "/v1/chat/completions"
    with pytest.raises(InvalidRequest):
        check_endpoint("/v1/images")
    assert check_metadata({"k": "v"}) == {"k": "v"} and check_metadata(None) is None
    for bad in ({f"k{i}": "v" for i in range(17)}, {"k": 1}, {"k" * 65: "v"}, {"k": "v" * 513}, []):
        with pytest.raises(InvalidRequest):
            check_metadata(bad)
