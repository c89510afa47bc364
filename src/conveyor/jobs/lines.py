"""OpenAI's batch line formats: the input request line and the output / error records.

Input:  ``{"custom_id": str, "method": "POST", "url": "/v1/...", "body": {...}}``
Output: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``

A request that ran has a `response` (200 in the output file, 4xx/5xx with an OpenAI error
body in the error file) and `error: null`; a request that never ran (cancelled, expired,
isolated) has `response: null` and `error: {"code", "message"}`.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from typing import Any

import orjson

from conveyor.errors import ConveyorError

REQUEST_ID_PREFIX = "req_"
NEWLINE = b"\n"


class StopCode(enum.StrEnum):
    """Why a request never ran; the `error.code` of its error record."""

    CANCELLED = "batch_cancelled"
    EXPIRED = "batch_expired"
    ISOLATED = "request_isolated"


STOP_MESSAGES = {
    StopCode.CANCELLED: "This request was not executed because the batch was cancelled.",
    StopCode.EXPIRED: "This request could not be executed before the completion window expired.",
    StopCode.ISOLATED: (
        "This request repeatedly crashed the worker running it; it was isolated and not run."
    ),
}


@dataclass(frozen=True, slots=True)
class RequestLine:
    """One decoded input line (the envelope was checked when the batch was validated)."""

    custom_id: str
    body: dict[str, Any]


def decode_request(raw: bytes) -> RequestLine:
    """Decode a validated input line; ValueError if it is not one after all."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("a request line must be a JSON object")
    custom_id = data.get("custom_id")
    body = data.get("body")
    if not isinstance(custom_id, str) or not isinstance(body, dict):
        raise ValueError("a request line needs a string custom_id and an object body")
    return RequestLine(custom_id, body)


Decoded = RequestLine | ValueError  # a line decoded once, or why it could not be


def decode_line(raw: bytes) -> Decoded:
    """``decode_request``, keeping the error as a value: each line is decoded once per attempt
    and the result serves the cache lookup, the run and a stop record alike."""
    try:
        return decode_request(raw)
    except ValueError as exc:
        return exc


def new_request_id() -> str:
    """A fresh per-execution request id (OpenAI's `req_...`)."""
    return REQUEST_ID_PREFIX + secrets.token_hex(12)


def response_record(
    line_id: str, custom_id: str, status_code: int, body: dict[str, Any] | orjson.Fragment
) -> bytes:
    """A record for a request that ran: one JSONL line including its newline."""
    record = {
        "id": line_id,
        "custom_id": custom_id,
        "response": {"status_code": status_code, "request_id": new_request_id(), "body": body},
        "error": None,
    }
    return orjson.dumps(record) + NEWLINE


def failure_record(line_id: str, custom_id: str, error: ConveyorError) -> bytes:
    """A record for a request the endpoint answered with an error (4xx/5xx)."""
    return response_record(line_id, custom_id, error.status_code, error.to_body())


def stopped_record(line_id: str, custom_id: str | None, code: StopCode) -> bytes:
    """A record for a request that never ran (`response: null`)."""
    record = {
        "id": line_id,
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code.value, "message": STOP_MESSAGES[code]},
    }
    return orjson.dumps(record) + NEWLINE


def custom_id_of(decoded: Decoded) -> str | None:
    """The custom_id of a decoded input line, or None if it could not be decoded."""
    return decoded.custom_id if isinstance(decoded, RequestLine) else None
