"""The Response object's fields: the request echoed with OpenAI's defaults, and error codes."""

from __future__ import annotations

import orjson
import pytest
from openai.types.responses import Response

from conveyor.endpoints.responses.output import (
    envelope,
    error_object,
    response_object,
    usage_object,
)
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.endpoints.validation import parse_body
from conveyor.errors import ConveyorError, InvalidRequest, QueueFull, ServiceUnavailable
from conveyor.gateway.limits import TAIL_BYTES, read_usage


def test_defaults_are_openai_s() -> None:
    request = parse_body(ResponseRequest, {"model": "m", "input": "hi"})
    base = envelope(request, "resp_1", 7)
    Response.model_validate(base)
    assert (base["temperature"], base["top_p"], base["tool_choice"]) == (1.0, 1.0, "auto")
    assert (base["truncation"], base["store"], base["parallel_tool_calls"]) == (
        "disabled",
        True,
        True,
    )
    assert base["text"] == {"format": {"type": "text"}} and base["metadata"] == {}


def test_the_request_is_echoed() -> None:
    body = {
        "model": "m", "input": "hi", "instructions": "Sys", "temperature": 0, "top_p": 0.5,
        "max_output_tokens": 64, "store": True, "truncation": "auto", "user": "u",
        "metadata": {"k": "v"}, "previous_response_id": "resp_0", "background": True,
        "parallel_tool_calls": False, "reasoning": {"effort": "low"},
        "tools": [{"type": "function", "name": "f", "strict": True, "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}}},
    }  # fmt: skip
    base = envelope(parse_body(ResponseRequest, body), "resp_1", 7)
    Response.model_validate(base)
    assert base["tools"] == [{"type": "function", "name": "f", "description": None,
                              "parameters": {"type": "object"}, "strict": True}]  # fmt: skip
    assert base["tool_choice"] == {"type": "function", "name": "f"}
    assert base["text"]["format"] == {
        "type": "json_schema",
        "name": "p",
        "schema": {"type": "object"},
    }
    for name in ("instructions", "max_output_tokens", "user", "metadata", "previous_response_id",
                 "truncation", "reasoning"):  # fmt: skip
        assert base[name] == body[name]
    assert (base["store"], base["background"], base["parallel_tool_calls"]) == (True, True, False)


def test_only_a_completed_response_has_completed_at() -> None:
    base = envelope(parse_body(ResponseRequest, {"model": "m", "input": "x"}), "resp_1", 7)
    done = response_object(base, status="completed", output=[], completed_at=9)
    assert done["completed_at"] == 9
    assert "completed_at" not in response_object(base, status="failed", output=[], completed_at=9)


@pytest.mark.parametrize(
    ("error", "code"),
    [(InvalidRequest("bad"), "invalid_prompt"), (QueueFull("full", retry_after_s=1), "rate_limit_exceeded"),
     (ServiceUnavailable("down"), "server_error"), (ConveyorError("boom"), "server_error")],
)  # fmt: skip
def test_errors_use_openai_s_codes_and_keep_the_message(error: ConveyorError, code: str) -> None:
    assert error_object(error) == {"code": code, "message": error.message}


def test_usage_is_the_last_field_a_gateway_reads_from_the_tail() -> None:
    metadata = {f"key{i}": "v" * 512 for i in range(16)}  # 8 kB before it would hide it
    request = parse_body(ResponseRequest, {"model": "m", "input": "x", "metadata": metadata})
    body = response_object(envelope(request, "resp_1", 7), status="completed", output=[],
                           usage=usage_object(12, 5), completed_at=9)  # fmt: skip
    assert list(body)[-1] == "usage"
    assert read_usage(orjson.dumps(body)[-TAIL_BYTES:]) == (12, 5)
