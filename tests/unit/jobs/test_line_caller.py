"""One line: back-pressure is waited out, transient errors retried, 4xx recorded at once."""

from __future__ import annotations

import orjson
import pytest

from conveyor.errors import DeadlineExceeded, InvalidRequest, ModelFault, QueueFull
from conveyor.jobs.keys import line_id
from conveyor.jobs.line_caller import LineCaller, LineOutcome, RetryPolicy
from conveyor.jobs.lines import custom_id_of, decode_line
from conveyor.tenants.usage import Payer
from tests.unit.jobs.fakes import ENDPOINT, FakeEndpoint, request_line

pytestmark = pytest.mark.anyio


def runner(endpoint: FakeEndpoint, delays: list[float], max_retries: int = 2) -> LineCaller:
    async def sleep(delay_s: float) -> None:
        delays.append(delay_s)

    policy = RetryPolicy(max_retries=max_retries, base_s=0.1, max_s=0.4)
    payer = Payer("tenant-a")
    return LineCaller(endpoint, ENDPOINT, "batch_x", policy, payer, sleep=sleep, jitter=lambda: 1.0)


async def test_success_is_an_output_record_in_openai_format() -> None:
    result = await runner(FakeEndpoint(), []).run(3, decode_line(request_line("c3", "hello")))
    record = orjson.loads(result.record)
    assert result.outcome is LineOutcome.COMPLETED
    assert record["id"] == line_id("batch_x", 3) and record["custom_id"] == "c3"
    assert record["error"] is None
    assert record["response"]["status_code"] == 200
    assert record["response"]["request_id"].startswith("req_")
    assert record["response"]["body"]["data"][0]["embedding"] == [5]


async def test_queue_full_is_retried_without_limit() -> None:
    endpoint, delays = FakeEndpoint(), []
    endpoint.errors["x"] = [QueueFull("full", retry_after_s=1) for _ in range(6)]
    result = await runner(endpoint, delays, max_retries=1).run(
        0, decode_line(request_line("c", "x"))
    )
    assert result.outcome is LineOutcome.COMPLETED
    assert delays == [0.1, 0.2, 0.4, 0.4, 0.4, 0.4]  # capped exponential backoff


async def test_transient_errors_are_retried_then_recorded() -> None:
    endpoint, delays = FakeEndpoint(), []
    endpoint.errors["x"] = [DeadlineExceeded("late"), ModelFault("boom"), ModelFault("boom")]
    result = await runner(endpoint, delays, max_retries=2).run(
        0, decode_line(request_line("c", "x"))
    )
    record = orjson.loads(result.record)
    assert result.outcome is LineOutcome.FAILED and len(delays) == 2
    assert record["response"]["status_code"] == 500
    assert record["response"]["body"]["error"]["code"] == "model_error"
    assert record["error"] is None


async def test_request_errors_are_not_retried() -> None:
    endpoint, delays = FakeEndpoint(), []
    endpoint.errors["x"] = [InvalidRequest("too long", param="input")]
    result = await runner(endpoint, delays).run(0, decode_line(request_line("c", "x")))
    record = orjson.loads(result.record)
    assert result.outcome is LineOutcome.FAILED and delays == [] and endpoint.calls == ["x"]
    assert record["response"]["status_code"] == 400
    assert record["response"]["body"]["error"]["param"] == "input"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b'["c", {}]', "must be a JSON object"),
        (b'{"custom_id": 7, "body": {}}', "needs a string custom_id"),
        (b'{"custom_id": "c", "body": "text"}', "an object body"),
    ],
)
async def test_a_line_that_is_no_request_after_all_is_a_failed_record(
    raw: bytes, reason: str
) -> None:
    endpoint = FakeEndpoint()
    result = await runner(endpoint, []).run(4, decode_line(raw))
    record = orjson.loads(result.record)
    assert result.outcome is LineOutcome.FAILED and endpoint.calls == []
    assert record["custom_id"] == "" and record["response"]["status_code"] == 400
    message = record["response"]["body"]["error"]["message"]
    assert message.startswith("line 5 is not a valid request: ") and reason in message
    assert custom_id_of(decode_line(raw)) is None  # what a stopped record of this line would carry


async def test_a_cached_body_is_answered_without_a_call() -> None:
    endpoint = FakeEndpoint()
    result = await runner(endpoint, []).run(
        0, decode_line(request_line("c", "x")), cached=b'{"cached":true}'
    )
    assert result.is_cache_hit and endpoint.calls == []
    assert orjson.loads(result.record)["response"]["body"] == {"cached": True}


async def test_a_computed_body_is_offered_to_the_cache() -> None:
    result = await runner(FakeEndpoint(), []).run(0, decode_line(request_line("c", "x")), key="k")
    assert result.cache_entry is not None and result.cache_entry[0] == "k"
    assert orjson.loads(result.cache_entry[1])["data"][0]["embedding"] == [1]


async def test_unexpected_exceptions_propagate() -> None:
    endpoint = FakeEndpoint()
    endpoint.crash_on.add("x")
    with pytest.raises(RuntimeError, match="crash"):
        await runner(endpoint, []).run(0, decode_line(request_line("c", "x")))


def test_retry_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1, base_s=0.1, max_s=1)
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=1, base_s=2, max_s=1)
