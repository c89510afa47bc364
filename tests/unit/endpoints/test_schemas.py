"""Request bodies of both generation endpoints: every mistake is a 400 that says what."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ValidationError

from conveyor.endpoints.chat import parse_chat_request
from conveyor.endpoints.chat_schemas import ChatCompletionRequest
from conveyor.endpoints.completions import parse_completion_request
from conveyor.endpoints.generation_schemas import CompletionRequest
from conveyor.endpoints.rerank_schemas import RerankRequest, ScoreRequest
from conveyor.endpoints.schemas import DetokenizeRequest, EmbeddingRequest, TokenizeRequest
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
        ({"max_tokens": -1}, "greater than or equal to 0", "max_tokens"),
        ({"temperature": -0.5}, "greater than or equal to 0", "temperature"),
        ({"temperature": 2.5}, "less than or equal to 2", "temperature"),
        ({"temperature": "hot"}, "temperature", "temperature"),
        ({"top_p": 0}, "greater than 0", "top_p"),
        ({"top_k": -2}, "greater than or equal to -1", "top_k"),
        ({"n": 0}, "greater than or equal to 1", "n"),
        ({"n": 129}, "less than or equal to 128", "n"),
        ({"best_of": 3}, "only best_of=1", "best_of"),
        ({"suffix": "x"}, "suffix is not supported", "suffix"),
        ({"logprobs": 21}, "less than or equal to 20", "logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "at most 4 stop", "stop"),
        ({"stop": [""]}, "must not be empty", "stop"),
        ({"presence_penalty": 2.5}, "less than or equal to 2", "presence_penalty"),
        ({"frequency_penalty": -3}, "greater than or equal to -2", "frequency_penalty"),
        ({"logit_bias": {"x": 1}}, "keys must be token ids", "logit_bias"),
        # str.isdigit() accepts these, and int() reads the second as 12: only ASCII digits.
        ({"logit_bias": {"\u00b2": 1}}, "keys must be token ids", "logit_bias"),
        ({"logit_bias": {"\u0661\u0662": 1}}, "keys must be token ids", "logit_bias"),
        ({"logit_bias": {"1" * 5000: 1}}, "keys must be token ids", "logit_bias"),
        ({"logit_bias": {"5": 101}}, "between -100 and 100", "logit_bias"),
        ({"min_p": 1.5}, "less than or equal to 1", "min_p"),
        ({"repetition_penalty": 0}, "greater than 0", "repetition_penalty"),
        ({"seed": -1}, "greater than or equal to 0", "seed"),
        ({"stream_options": {"include_usage": True}}, "only allowed when stream", None),
        ({"frequency": 1.1}, "unrecognized request argument: 'frequency'", "frequency"),
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
        ({"messages": [{"role": "tool", "content": "x"}]}, "needs tool_call_id"),
        ({"messages": [{"role": "assistant", "tool_calls": []}]}, "needs content"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
         "only assistant messages may have tool_calls"),
        ({"tools": [{"type": "function"}]}, "tools.0.function"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "pattern"),
        ({"tool_choice": "auto"}, "tool_choice needs tools"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}},
         "unknown function 'g'"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "needs 'json_schema'"),
        ({"audio": {"voice": "x"}}, "unrecognized request argument: 'audio'"),
        ({"web_search_options": {}}, "unrecognized request argument: 'web_search_options'"),
        ({"top_logprobs": 2}, "needs logprobs"),
        ({"top_logprobs": 30, "logprobs": True}, "less than or equal to 20"),
        ({"max_completion_tokens": 0}, "greater than or equal to 1"),
        ({"n": 300}, "less than or equal to 128"),
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
    assert [(m.role, m.text, m.name) for m in chat.messages] == [
        ("system", "be brief", None),
        ("user", "hi", "ann"),
    ]
    assert chat.requested_max_tokens == 7
    assert chat.num_logprobs == 0


def test_newer_fields_that_change_nothing_are_accepted() -> None:
    ignored = {"reasoning_effort": "low", "verbosity": "low", "prompt_cache_key": "k",
               "safety_identifier": "s", "service_tier": "auto", "store": False,
               "metadata": {"a": "b"}, "user": "u", "parallel_tool_calls": True}  # fmt: skip
    assert parse_chat_request({**CHAT, **ignored}).model == "m"


def test_a_response_message_sent_back_as_history_validates() -> None:
    from openai.types.chat import ChatCompletionMessage

    message = ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": None, "refusal": None,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]}
    )  # fmt: skip
    history = [
        {"role": "user", "content": "hi"},
        message.model_dump(),
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "ok"}]},
        {"role": "assistant", "content": "done", "refusal": None},
    ]
    chat = parse_chat_request({**CHAT, "messages": history})
    assert chat.messages[1].tool_calls and chat.messages[1].tool_calls[0].id == "call_1"
    assert chat.messages[2].text == "ok"


LONG = 20_000


@pytest.mark.parametrize(
    ("model_cls", "body"),
    [
        (CompletionRequest, {**COMPLETION, "prompt": [0.5] * LONG}),
        (CompletionRequest, {**COMPLETION, "prompt": [[0.5] * LONG]}),
        (CompletionRequest, {**COMPLETION, "stop": [1] * LONG}),
        (CompletionRequest, {**COMPLETION, "stop_token_ids": [0.5] * LONG}),
        (CompletionRequest, {**COMPLETION, "logit_bias": {str(i): "x" for i in range(LONG)}}),
        (ChatCompletionRequest, {**CHAT, "messages": [1] * LONG}),
        (ChatCompletionRequest, {**CHAT, "messages": [{"role": "user", "content": [1] * LONG}]}),
        (ChatCompletionRequest, {**CHAT, "metadata": {str(i): 1 for i in range(LONG)}}),
        (EmbeddingRequest, {"model": "m", "input": [0.5] * LONG}),
        (RerankRequest, {"model": "m", "query": "q", "documents": [1] * LONG}),
        (ScoreRequest, {"model": "m", "text_1": "q", "text_2": [1] * LONG}),
        (TokenizeRequest, {"model": "m", "messages": [1] * LONG}),
        (DetokenizeRequest, {"model": "m", "tokens": [0.5] * LONG}),
    ],
)
def test_a_long_bad_list_stops_at_its_first_bad_item(
    model_cls: type[BaseModel], body: dict[str, Any]
) -> None:
    """One error per shape tried, not one per item: pydantic reports every bad item, and
    building those reports took seconds for a megabyte of floats where ids belong."""
    with pytest.raises(ValidationError) as caught:
        model_cls.model_validate_json(orjson.dumps(body))
    assert caught.value.error_count() <= 4


def test_a_body_with_thousands_of_mistakes_is_one_short_400() -> None:
    """Unknown fields cannot stop at the first: their count is reported, not each one."""
    body = {**COMPLETION, **{f"field{i}": 1 for i in range(LONG)}}
    with pytest.raises(InvalidRequest, match=f"{LONG} problems"):
        parse_completion_request(orjson.dumps(body))
