"""A Message Batch's inline requests as batch input lines, and the 400s of a bad body."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from conveyor.errors import InvalidRequest
from conveyor.jobs.message_batch_input import batch_input


def entry(custom_id: str, model: str = "m", **params: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "params": {"model": model, "max_tokens": 4, **params}}


def encoded(requests: Any, **extra: Any) -> bytes:
    return orjson.dumps({"requests": requests, **extra})


def test_each_request_becomes_a_messages_line_in_order() -> None:
    planned = batch_input(encoded([entry("a"), entry("b-2", temperature=0)]), max_requests=10)
    assert planned.model == "m" and planned.num_requests == 2
    lines = [orjson.loads(line) for line in planned.lines]
    assert lines[1] == {"custom_id": "b-2", "method": "POST", "url": "/v1/messages",
                        "body": {"model": "m", "max_tokens": 4, "temperature": 0}}  # fmt: skip
    assert all(line.endswith(b"\n") for line in planned.lines)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{", "not valid JSON"),
        (b"[]", "JSON object"),
        (encoded([]), "non-empty array"),
        (encoded([entry("a")], extra=1), "unrecognized request argument: 'extra'"),
        (encoded([entry("a")] * 2), "appears more than once"),
        (encoded([entry("a b")]), "custom_id must be 1 to 64"),
        (encoded([entry("x" * 65)]), "custom_id must be 1 to 64"),
        (encoded([{"custom_id": "a"}]), "custom_id and params"),
        (encoded([{"custom_id": "a", "params": []}]), "params must be an object"),
        (encoded([entry("a", model="")]), "model must be a non-empty string"),
        (encoded([entry("a"), entry("b", model="other")]), "one model"),
        (encoded([entry(str(i)) for i in range(4)]), "at most 3 requests"),
    ],
)
def test_bodies_a_batch_cannot_hold_are_400(body: bytes, fragment: str) -> None:
    with pytest.raises(InvalidRequest, match=fragment):
        batch_input(body, max_requests=3)
