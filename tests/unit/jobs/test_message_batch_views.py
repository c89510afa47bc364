"""Message Batch objects and result lines from batch records, valid for the ``anthropic``
client's own types."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import orjson
import pytest
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

from conveyor.errors import InvalidRequest
from conveyor.jobs.lines import StopCode, failure_record, response_record, stopped_record
from conveyor.jobs.message_batch_views import (
    REQUESTS_KEY,
    internal_id,
    message_batch_object,
    public_id,
    result_line,
    unplanned_result,
)
from conveyor.stores.records import BatchRecord, BatchStatus, RequestCounts

CREATED = 1_700_000_000


def record(
    status: BatchStatus, completed: int = 0, failed: int = 0, **fields: object
) -> BatchRecord:
    return BatchRecord(
        id="batch_0123abcd", tenant="t", endpoint="/v1/messages", input_file_id="file-x",
        completion_window="24h", created_at=CREATED, expires_at=CREATED + 86_400, status=status,
        metadata={REQUESTS_KEY: "10"}, request_counts=RequestCounts(10, completed, failed),
        **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def test_ids_swap_prefixes_both_ways() -> None:
    assert public_id("batch_0123abcd") == "msgbatch_0123abcd"
    assert internal_id("msgbatch_0123abcd") == "batch_0123abcd"
    assert internal_id("batch_0123abcd") is None
    assert internal_id("msgbatch_../x") is None


def test_a_running_batch_counts_every_request_as_processing() -> None:
    for status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING):
        body = message_batch_object(record(status, completed=4))
        batch = MessageBatch.model_validate(body)
        assert batch.processing_status == "in_progress" and batch.results_url is None
        assert batch.request_counts.processing == 10 and batch.request_counts.succeeded == 0
    canceling = message_batch_object(record(BatchStatus.CANCELLING, cancelling_at=CREATED + 5))
    assert MessageBatch.model_validate(canceling).processing_status == "canceling"
    assert canceling["cancel_initiated_at"] == "2023-11-14T22:13:25Z"


@pytest.mark.parametrize(
    ("status", "stamp", "counts"),
    [
        (BatchStatus.COMPLETED, "completed_at", (7, 3, 0, 0)),
        (BatchStatus.CANCELLED, "cancelled_at", (4, 1, 5, 0)),
        (BatchStatus.EXPIRED, "expired_at", (4, 1, 0, 5)),
        (BatchStatus.FAILED, "failed_at", (0, 10, 0, 0)),
    ],
)
def test_an_ended_batch_counts_each_outcome_once(
    status: BatchStatus, stamp: str, counts: tuple[int, int, int, int]
) -> None:
    ran = {"completed": 7, "failed": 3} if status is BatchStatus.COMPLETED else {}
    if status in (BatchStatus.CANCELLED, BatchStatus.EXPIRED):
        ran = {"completed": 4, "failed": 1}
    ended = dataclasses.replace(record(status, **ran), **{stamp: CREATED + 60})
    batch = MessageBatch.model_validate(message_batch_object(ended))
    c = batch.request_counts
    assert (c.succeeded, c.errored, c.canceled, c.expired, c.processing) == (*counts, 0)
    assert batch.processing_status == "ended"
    assert batch.ended_at == datetime.fromtimestamp(CREATED + 60, UTC)
    assert batch.results_url == "/v1/messages/batches/msgbatch_0123abcd/results"


def result_of(line: bytes | None) -> MessageBatchIndividualResponse:
    assert line is not None
    return MessageBatchIndividualResponse.model_validate(orjson.loads(line))


def test_records_become_results_of_each_kind() -> None:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
               "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
               "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1}}  # fmt: skip
    succeeded = result_of(result_line(response_record("l1", "a", 200, message).strip()))
    assert succeeded.custom_id == "a" and succeeded.result.type == "succeeded"
    refused = failure_record("l2", "b", InvalidRequest("max_tokens too big"))
    errored = result_of(result_line(refused))
    assert errored.result.type == "errored"
    assert errored.result.error.error.type == "invalid_request_error"
    assert errored.result.error.error.message == "max_tokens too big"
    cancelled = result_of(result_line(stopped_record("l3", "c", StopCode.CANCELLED)))
    expired = result_of(result_line(stopped_record("l4", "d", StopCode.EXPIRED)))
    isolated = result_of(result_line(stopped_record("l5", "e", StopCode.ISOLATED)))
    assert (cancelled.result.type, expired.result.type) == ("canceled", "expired")
    assert isolated.result.type == "errored" and isolated.result.error.error.type == "api_error"
    assert result_line(stopped_record("l6", None, StopCode.EXPIRED)) is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [(BatchStatus.CANCELLED, "canceled"), (BatchStatus.EXPIRED, "expired"),
     (BatchStatus.FAILED, "errored")],
)  # fmt: skip
def test_requests_of_a_batch_that_never_started_get_its_outcome(
    status: BatchStatus, kind: str
) -> None:
    line = unplanned_result(record(status), "f")
    assert result_of(line).result.type == kind
