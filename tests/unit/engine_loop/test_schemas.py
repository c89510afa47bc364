"""Request bodies of both generation endpoints: every mistake is a 400 that says what."""

from __future__ import annotations

import re
from typing import Any

import pytest

from conveyor.endpoints.chat import parse_chat_request
from conveyor.endpoints.completions import parse_completion_request
from conveyor.errors import InvalidRequest

COMPLETION = {"model": "m", "prompt": "hi"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("extra", "message", "param"),
    [
        ({"prompt": []}, "must not be an empty list", "prompt"),
        ({"prompt": ["a", ""]}, "prompt[1] must not be empty", "prompt"),
        ({"prompt": {"text": "x"}}, "'prompt' must be a string", "prompt"),
        ({"prompt": [1, "a"]}, "'prompt' must be a string", "prompt"),
        ({"max_tokens": 0}, "greater than or equal to 1", "max_tokens"),
        ({"temperature": -0.5}, "greater than or equal to 0", "temperature"),
        ({"temperature": 2.5}, "less than or equal to 2", "temperature"),
        ({"temperature": "hot"}, "temperature", "temperature"),
        ({"top_p": 0}, "greater than 0", "top_p"),
        ({"top_k": -2}, "greater than or equal to -1", "top_k"),
        ({"n": 2}, "only n=1 is supported", "n"),
        ({"best_of": 3}, "only best_of=1", "best_of"),
        ({"echo": True}, "echo is not supported", "echo"),
        ({"suffix": "x"}, "suffix is not supported", "suffix"),
        ({"logprobs": 21}, "less than or equal to 20", "logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "at most 4 stop", "stop"),
        ({"stop": [""]}, "must not be empty", "stop"),
        ({"presence_penalty": 0.5}, "penalties are not supported", "presence_penalty"),
        ({"logit_bias": {"5": 1}}, "logit_bias is not supported", "logit_bias"),
        ({"seed": -1}, "greater than or equal to 0", "seed"),
        ({"stream_options": {"include_usage": True}}, "only allowed when stream", None),
        ({"repetition_penalty": 1.1}, "unrecognized request argument: 'repetition_penalty'",
         "repetition_penalty"),
    ],
)  # fmt: skip
def test_bad_completion_bodies(extra: dict[str, Any], message: str, param: str | None) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(message)) as caught:
        parse_completion_request({**COMPLETION, **extra})
    assert caught.value.param == param
    assert caught.value.status_code == 400


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"messages": []}, "at least 1 item"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user"}]}, "needs content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "'image_url' are not supported"),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "role"),
        ({"tools": [{"type": "function"}]}, "tools are not supported"),
        ({"tool_choice": "auto"}, "tool_choice is not supported"),
        ({"response_format": {"type": "json_object"}}, "only response_format"),
        ({"top_logprobs": 2}, "needs logprobs"),
        ({"top_logprobs": 30, "logprobs": True}, "less than or equal to 20"),
        ({"max_completion_tokens": 0}, "greater than or equal to 1"),
        ({"n": 3}, "only n=1"),
        ({"functions": []}, "unrecognized request argument: 'functions'"),
    ],
)  # fmt: skip
def test_bad_chat_bodies(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        parse_chat_request({**CHAT, **extra})


def test_malformed_json_and_missing_fields() -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        parse_completion_request(b"{nope")
    with pytest.raises(InvalidRequest, match="missing required parameter: 'prompt'"):
        parse_completion_request({"model": "m"})
    with pytest.raises(InvalidRequest, match="missing required parameter: 'messages'"):
        parse_chat_request({"model": "m"})


def test_good_bodies_normalise() -> None:
    completion = parse_completion_request(
        b'{"model": "m", "prompt": [[5, 6], [7]], "stop": "x", "stream": true,'
        b' "stream_options": {"include_usage": true}, "max_tokens": null}'
    )
    assert completion.prompts() == [[5, 6], [7]]
    assert completion.stop_strings() == ["x"]
    assert completion.include_usage and completion.max_tokens is None
    assert parse_completion_request(COMPLETION).max_tokens == 16  # OpenAI's default
    assert parse_completion_request({**COMPLETION, "prompt": [5, 6]}).prompts() == [[5, 6]]
    chat = parse_chat_request(
        {
            **CHAT,
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "be "},
                                               {"type": "text", "text": "brief"}]},
                {"role": "user", "content": "hi", "name": "ann"},
            ],
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "logprobs": True,
        }
    )  # fmt: skip
    assert [m.to_template() for m in chat.messages] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi", "name": "ann"},
    ]
    assert chat.requested_max_tokens == 7
    assert chat.num_logprobs == 0
