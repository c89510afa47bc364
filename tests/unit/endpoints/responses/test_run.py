"""Preparing and running responses on a tiny random Llama: truncation, errors in the
Responses body's words, logprobs, and the self-contained runs batch lines get."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import Response

from conveyor.config.settings import ServerConfig
from conveyor.endpoints.responses.run import prepare_response, run_response
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.endpoints.validation import parse_body
from conveyor.errors import InvalidRequest
from conveyor.host.service import Service

# `model`: runs a real (tiny) torch model, so mutation runs leave it out.
pytestmark = [pytest.mark.anyio, pytest.mark.model]

MAX_MODEL_LEN = 96


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def service(llama_path: Path) -> AsyncIterator[Service]:
    model = {"name": "tiny", "kind": "generate", "path": str(llama_path), "block_size": 4,
             "kv_cache_tokens": 4096, "max_model_len": MAX_MODEL_LEN, "max_num_seqs": 8,
             "max_num_batched_tokens": 512}  # fmt: skip
    async with Service(ServerConfig.model_validate({"models": [model]})) as running:
        yield running


def request(**fields: Any) -> ResponseRequest:
    return parse_body(ResponseRequest, {"model": "tiny", "input": "hi", **fields})


LONG = [{"role": "user", "content": f"message {i} " + "word " * 8} for i in range(12)]


async def test_auto_truncation_drops_the_oldest_messages_to_fit(service: Service) -> None:
    fields = {"input": LONG, "instructions": "Sys", "max_output_tokens": 16}
    with pytest.raises(InvalidRequest) as caught:
        await prepare_response(service, request(**fields))
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "input"
    prepared = await prepare_response(service, request(**fields, truncation="auto"))
    [prompt] = prepared.chat.prompts
    assert len(prompt) + 16 <= MAX_MODEL_LEN
    tokenizer = service.generator("tiny").tokenizer
    text = tokenizer.decode(prompt)
    assert "Sys" in text and "message 11" in text and "message 0 " not in text
    assert len(prepared.items) == len(LONG)  # the stored conversation keeps every item


async def test_errors_name_the_responses_fields(service: Service) -> None:
    with pytest.raises(InvalidRequest) as caught:
        await prepare_response(service, request(max_output_tokens=MAX_MODEL_LEN))
    assert caught.value.param == "max_output_tokens"
    assert "lower max_output_tokens" in caught.value.message
    assert "max_completion_tokens" not in caught.value.message


async def test_a_last_message_too_long_alone_is_still_a_400(service: Service) -> None:
    huge = [{"role": "user", "content": "word " * 200}]
    with pytest.raises(InvalidRequest) as caught:
        await prepare_response(service, request(input=huge, truncation="auto"))
    assert caught.value.param == "input"


async def test_a_run_is_a_valid_response_with_logprobs_when_asked(service: Service) -> None:
    body = {"model": "tiny", "input": "Count.", "max_output_tokens": 16, "temperature": 0,
            "include": ["message.output_text.logprobs"], "top_logprobs": 2}  # fmt: skip
    response = await run_response(service, body)
    Response.model_validate(response)
    part = response["output"][0]["content"][0]
    assert len(part["logprobs"]) == response["usage"]["output_tokens"] == 16
    assert all(len(entry["top_logprobs"]) == 2 for entry in part["logprobs"])
    assert response["status"] == "incomplete"


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"previous_response_id": "resp_1"}, "previous_response_id"),
     ({"background": True}, "background"), ({"stream": True}, "stream")],
)  # fmt: skip
async def test_a_run_on_its_own_refuses_what_needs_the_store(
    service: Service, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        await run_response(service, {"model": "tiny", "input": "x", **fields})
    assert caught.value.param == param
