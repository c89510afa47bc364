"""Messages requests on a tiny random Llama through the service: the reply, its usage, stop
sequences, a prefill and the streamed events agree with each other and with the
``anthropic`` client's types."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from pydantic import TypeAdapter

from conveyor.config.settings import ServerConfig
from conveyor.endpoints.messages.events import message_events
from conveyor.endpoints.messages.run import (
    count_tokens,
    parse_messages_request,
    prepare_messages,
)
from conveyor.host.service import Service
from conveyor.openai_paths import MESSAGES
from conveyor.priority import Priority
from tests.unit.model_helpers import run_whole

pytestmark = [pytest.mark.anyio, pytest.mark.model]

EVENTS = TypeAdapter(RawMessageStreamEvent)
CONVERSATION = [{"role": "user", "content": "Tell me a story about a fox."}]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def service(llama_path: Path) -> AsyncIterator[Service]:
    model = {"name": "tiny", "kind": "generate", "path": str(llama_path),
             "kv_cache_tokens": 4096, "max_model_len": 256, "max_num_seqs": 8}  # fmt: skip
    async with Service(ServerConfig.model_validate({"models": [model]})) as running:
        yield running


def request(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 24, "messages": CONVERSATION, "temperature": 0,
            **fields}  # fmt: skip


async def reply(service: Service, **fields: Any) -> Message:
    return Message.model_validate(await run_whole(service, MESSAGES, request(**fields)))


async def test_the_reply_is_a_message_and_counts_its_prompt_as_count_tokens_does(
    service: Service,
) -> None:
    message = await reply(service)
    assert message.role == "assistant" and message.model == "tiny"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens <= 24
    counted = MessageTokensCount.model_validate(
        await count_tokens(service, {"model": "tiny", "messages": CONVERSATION})
    )
    assert counted.input_tokens == message.usage.input_tokens


async def test_a_stop_sequence_ends_the_reply_before_it_and_is_named(service: Service) -> None:
    whole = (await reply(service, max_tokens=40)).content
    text = whole[0].text if whole and whole[0].type == "text" else ""
    words = re.findall(r"[A-Za-z]{3,}", text[4:])
    if not words:
        pytest.skip("the random model wrote no word to stop at")
    stop = words[0]
    message = await reply(service, max_tokens=40, stop_sequences=[stop])
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", stop)
    cut = message.content[0].text if message.content and message.content[0].type == "text" else ""
    assert text.startswith(cut) and stop not in cut


async def test_a_prefill_is_continued_and_counted(service: Service) -> None:
    messages = [*CONVERSATION, {"role": "assistant", "content": "Once upon"}]
    plain = await reply(service)
    prefilled = await reply(service, messages=messages)
    counted = await count_tokens(service, {"model": "tiny", "messages": messages})
    assert prefilled.usage.input_tokens == counted["input_tokens"] > plain.usage.input_tokens


async def test_the_stream_says_what_the_whole_reply_says(service: Service) -> None:
    whole = await reply(service)
    parsed = parse_messages_request(request(stream=True))
    prepared = prepare_messages(service, parsed)
    run = await prepared.start(service, priority=Priority.ONLINE, timeout_ms=None)
    try:
        events = [event async for event in message_events(run)]
    finally:
        run.close()
    for event in events:
        if event["type"] != "ping":
            EVENTS.validate_python(event)
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert [whole_text.text for whole_text in whole.content if whole_text.type == "text"] == (
        [text] if text else []
    )
    final = events[-2]
    assert final["delta"]["stop_reason"] == whole.stop_reason
    assert final["usage"]["output_tokens"] == whole.usage.output_tokens
