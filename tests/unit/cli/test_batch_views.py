"""The Batch object's counts and capped errors, and how the ``batch`` CLI prints them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from openai.types import Batch
from typer.testing import CliRunner

from conveyor.cli import batch as cli_batch
from conveyor.cli.main import app as cli_app
from conveyor.jobs.views import MAX_LISTED_ERRORS, batch_object
from conveyor.stores.records import BatchError, BatchRecord, BatchStatus, RequestCounts


def record(status: BatchStatus, counts: RequestCounts, num_errors: int = 0) -> BatchRecord:
    errors = [BatchError("invalid_line", f"bad {i}", "body", i) for i in range(num_errors)]
    return BatchRecord(
        id="batch_1", tenant="t", endpoint="/v1/embeddings", input_file_id="file-1",
        completion_window="24h", created_at=1, expires_at=2, status=status,
        request_counts=counts, errors=errors,
    )  # fmt: skip


@pytest.mark.parametrize("status", [BatchStatus.CANCELLED, BatchStatus.EXPIRED])
def test_lines_a_cancelled_or_expired_batch_never_ran_count_as_failed(
    status: BatchStatus,
) -> None:
    body = batch_object(record(status, RequestCounts(total=10, completed=3, failed=2)))
    counts = Batch.model_validate(body).request_counts
    assert counts is not None and (counts.completed, counts.failed) == (3, 7)


def test_running_batches_count_only_what_ran() -> None:
    body = batch_object(record(BatchStatus.IN_PROGRESS, RequestCounts(10, 3, 2)))
    assert body["request_counts"] == {"total": 10, "completed": 3, "failed": 2}


@pytest.mark.parametrize(
    "status", [BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING]
)
def test_a_running_batch_shows_its_peak_counts_after_a_lost_attempt(status: BatchStatus) -> None:
    # Completed 333 were shown, then a shard lost its lease and reran: 305 live.
    peak = RequestCounts(1000, 333, 4)
    rec = dataclasses.replace(record(status, RequestCounts(1000, 305, 0)), peak_counts=peak)
    assert batch_object(rec)["request_counts"] == {"total": 1000, "completed": 333, "failed": 4}


def test_peaks_of_attempts_that_split_differently_never_exceed_the_total() -> None:
    # Attempt 1 completed 8 of 10 lines, attempt 2 failed 5 of them: 8 + 5 > 10.
    rec = dataclasses.replace(
        record(BatchStatus.IN_PROGRESS, RequestCounts(10, 5, 5)),
        peak_counts=RequestCounts(10, 8, 5),
    )
    assert batch_object(rec)["request_counts"] == {"total": 10, "completed": 8, "failed": 2}


def test_a_finished_batch_shows_its_committed_counts() -> None:
    # The lost attempt's results were not reproduced; the files hold what committed.
    rec = dataclasses.replace(
        record(BatchStatus.COMPLETED, RequestCounts(10, 7, 3)),
        peak_counts=RequestCounts(10, 8, 3),
    )
    assert batch_object(rec)["request_counts"] == {"total": 10, "completed": 7, "failed": 3}


def test_the_errors_list_is_capped_with_a_count() -> None:
    body = batch_object(record(BatchStatus.FAILED, RequestCounts(), num_errors=250))
    batch = Batch.model_validate(body)
    assert batch.errors is not None and batch.errors.data is not None
    assert len(batch.errors.data) == MAX_LISTED_ERRORS and body["errors"]["total_errors"] == 250


class FakeClient:
    """Stands in for ``BatchClient``: answers from fixed Batch objects, records downloads."""

    batch: dict[str, Any] = {}
    downloads: list[str] = []

    def __init__(self, url: str, api_key: str | None) -> None:
        pass

    def get(self, batch_id: str) -> dict[str, Any]:
        return self.batch

    def list(self, limit: int, after: str | None) -> dict[str, Any]:
        return {"data": [self.batch]}

    def download(self, file_id: str, out: Path) -> int:
        self.downloads.append(file_id)
        out.write_bytes(b"x\n")
        return 2

    def close(self) -> None:
        pass


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeClient]:
    monkeypatch.setattr(cli_batch, "BatchClient", FakeClient)
    FakeClient.downloads = []
    return FakeClient


def test_list_prints_a_header_when_piped(fake: type[FakeClient]) -> None:
    fake.batch = batch_object(record(BatchStatus.COMPLETED, RequestCounts(4, 4, 0)))
    lines = CliRunner().invoke(cli_app, ["batch", "list"]).output.splitlines()
    assert lines[0].split("\t") == [
        "id", "status", "endpoint", "total", "completed", "failed", "created"]  # fmt: skip
    assert lines[1].startswith("batch_1\tcompleted\t/v1/embeddings\t4\t4\t0\t")


def test_results_write_no_empty_error_file(fake: type[FakeClient], tmp_path: Path) -> None:
    body = batch_object(record(BatchStatus.COMPLETED, RequestCounts(1, 1, 0)))
    fake.batch = {**body, "output_file_id": "file-out", "error_file_id": None}
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    args = ["batch", "results", "batch_1", "-o", str(out), "--errors", str(errors)]
    done = CliRunner().invoke(cli_app, args)
    assert done.exit_code == 0, done.output
    assert out.read_bytes() == b"x\n" and not errors.exists()


def test_error_lines_skip_a_missing_line_number_and_cap_the_list() -> None:
    empty = {"errors": {"data": [{"code": "empty_file", "message": "no lines", "line": None}]}}
    assert cli_batch.error_lines(empty) == ["  empty_file: no lines"]
    body = batch_object(record(BatchStatus.FAILED, RequestCounts(), num_errors=250))
    lines = cli_batch.error_lines(body, limit=3)
    assert lines[0] == "  line 0: invalid_line: bad 0"
    assert lines[3:] == ["  ... and 247 more errors"]
