"""Structured output on a tiny random Llama: whatever the model would say, the reply parses
and validates against the schema (50 random schemas from a fixed seed), and a named
tool_choice always yields a valid call to that function."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from conveyor.config.settings import ServerConfig
from conveyor.endpoints.chat import chat_chunks, parse_chat_request, prepare_chat
from conveyor.errors import InvalidRequest
from conveyor.host.service import Service
from conveyor.openai_paths import CHAT_COMPLETIONS, COMPLETIONS
from conveyor.priority import Priority
from tests.unit.model_helpers import run_whole

# `model`: runs a real (tiny) torch model, so mutation runs leave it out.
pytestmark = [pytest.mark.anyio, pytest.mark.model]

NUM_SCHEMAS = 50
SCHEMA_SEED = 20240612
MAX_TOKENS = 400


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def service(llama_path: Path) -> AsyncIterator[Service]:
    config = ServerConfig.model_validate(
        {
            "models": [
                {
                    "name": "tiny",
                    "kind": "generate",
                    "path": str(llama_path),
                    "kv_cache_tokens": 32768,
                    "block_size": 4,
                    "max_model_len": 1024,
                    "max_num_seqs": 64,
                    "max_num_batched_tokens": 1024,
                }
            ]
        }
    )
    async with Service(config) as running:
        yield running


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A strict-mode schema: objects (all required, closed), enums, arrays, bounded numbers."""
    kinds = ["integer", "number", "string", "enum", "boolean"]
    if depth < 2:
        kinds += ["object", "array", "object"]
    kind = rng.choice(kinds)
    if kind == "integer":
        low = rng.randint(-1000, 1000)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 5000)}
    if kind == "number":
        low = rng.uniform(-100, 100)
        return {"type": "number", "minimum": round(low, 2), "maximum": round(low + 50, 2)}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 12)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "a b", "ünï", "42", "x"], 3)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        size = rng.randint(0, 3)
        return {
            "type": "array",
            "items": random_schema(rng, depth + 1),
            "minItems": size,
            "maxItems": size + rng.randint(0, 2),
        }
    names = rng.sample(["id", "name", "count", "tags", "ok", "score", "child", "kind"], 3)
    properties = {name: random_schema(rng, depth + 1) for name in names[: rng.randint(1, 3)]}
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def object_schemas() -> list[dict[str, Any]]:
    rng = random.Random(SCHEMA_SEED)
    schemas = []
    while len(schemas) < NUM_SCHEMAS:
        schema = random_schema(rng)
        if schema.get("type") == "object":  # a reply is an object, as OpenAI requires
            schemas.append(schema)
    return schemas


def schema_body(schema: dict[str, Any], seed: int) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Reply in JSON."}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "reply", "schema": schema, "strict": True},
        },
        "temperature": 1.0,
        "seed": seed,
        "max_completion_tokens": MAX_TOKENS,
    }


@pytest.mark.timeout(300)
async def test_fifty_random_schemas_always_parse_and_validate(service: Service) -> None:
    schemas = object_schemas()
    replies = await asyncio.gather(
        *(
            run_whole(service, CHAT_COMPLETIONS, schema_body(schema, seed))
            for seed, schema in enumerate(schemas)
        )
    )
    for schema, reply in zip(schemas, replies, strict=True):
        completion = ChatCompletion.model_validate(reply)
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        value = json.loads(choice.message.content or "")
        assert jsonschema_rs.validator_for(schema).is_valid(value), (schema, value)
        assert choice.message.refusal is None
        assert completion.system_fingerprint


async def test_json_object_mode_gives_an_object(service: Service) -> None:
    body = {**schema_body({}, 1), "response_format": {"type": "json_object"}}
    body["max_completion_tokens"] = 480
    replies = [ChatCompletion.model_validate(await run_whole(service, CHAT_COMPLETIONS, {**body, "seed": s}))
               for s in range(3)]  # fmt: skip
    finished = [r.choices[0] for r in replies if r.choices[0].finish_reason == "stop"]
    assert finished  # a random model may run out of room inside an open-ended object
    for choice in finished:
        assert isinstance(json.loads(choice.message.content or ""), dict)


async def test_without_a_schema_the_same_seed_is_not_json(service: Service) -> None:
    body = schema_body({"type": "object"}, 3)
    del body["response_format"]
    reply = ChatCompletion.model_validate(await run_whole(service, CHAT_COMPLETIONS, body))
    with pytest.raises(ValueError):  # the grammar, not luck, made the replies above JSON
        json.loads(reply.choices[0].message.content or "")


async def test_an_invalid_schema_is_a_400_naming_response_format(service: Service) -> None:
    body = schema_body({"type": "object", "properties": {"a": {"type": "strin"}}}, 0)
    with pytest.raises(InvalidRequest, match="strin") as caught:
        await run_whole(service, CHAT_COMPLETIONS, body)
    assert caught.value.param == "response_format"


# No value satisfies these: llguidance compiles them, but their language is empty, so a
# reply could only be cut short (it was `finish_reason: "stop"` with text that is not JSON).
UNSATISFIABLE = [
    {"$ref": "#"},
    {"anyOf": [{"$ref": "#"}]},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
]


@pytest.mark.parametrize("schema", UNSATISFIABLE)
async def test_an_unsatisfiable_schema_is_a_400_naming_response_format(
    service: Service, schema: dict[str, Any]
) -> None:
    with pytest.raises(InvalidRequest, match="no output can satisfy") as caught:
        await run_whole(service, CHAT_COMPLETIONS, schema_body(schema, 0))
    assert caught.value.param == "response_format" and caught.value.status_code == 400


async def test_a_forced_tool_with_unsatisfiable_parameters_is_a_400_naming_tools(
    service: Service,
) -> None:
    tool = {"type": "function", "function": {"name": "loop", "parameters": {"$ref": "#"}}}
    body = {**tool_body("required", 0), "tools": [tool]}
    with pytest.raises(InvalidRequest, match="no output can satisfy") as caught:
        await run_whole(service, CHAT_COMPLETIONS, body)
    assert caught.value.param == "tools"


async def test_a_grammar_is_checked_off_the_event_loop(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Filling a deep schema's first mask can take a tenth of a second: not on the loop."""
    grammars = service.generator("tiny").engine.grammars
    checked_on: list[int] = []
    check = grammars.check

    def recording(grammar: str) -> None:
        checked_on.append(threading.get_ident())
        check(grammar)

    monkeypatch.setattr(grammars, "check", recording)
    await run_whole(
        service,
        CHAT_COMPLETIONS,
        {**schema_body({"type": "object"}, 0), "max_completion_tokens": 2},
    )
    assert checked_on and threading.get_ident() not in checked_on


async def test_a_grammar_compiles_once_for_all_choices_and_never_on_the_engine_thread(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked on a worker thread, the compiled grammar is what each choice's matcher
    copies: the engine thread, which every sequence's step waits on, compiles nothing."""
    cache = service.generator("tiny").engine.grammars._compiled
    compiled_on: list[str] = []
    compile_grammar = cache._compile

    def recording(grammar: str) -> Any:
        compiled_on.append(threading.current_thread().name)
        return compile_grammar(grammar)

    monkeypatch.setattr(cache, "_compile", recording)
    schema = {"type": "object", "properties": {"compiled_once": {"type": "integer"}}}
    body = {**schema_body(schema, 3), "n": 3, "max_completion_tokens": 4}
    for _ in range(2):  # the second request finds it compiled
        await run_whole(service, CHAT_COMPLETIONS, body)
    assert len(compiled_on) == 1 and not compiled_on[0].startswith("engine-")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["C", "F"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


def tool_body(choice: Any, seed: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [CLOCK, WEATHER],
        "tool_choice": choice,
        "temperature": 1.0,
        "seed": seed,
        "max_completion_tokens": MAX_TOKENS,
        **extra,
    }


@pytest.mark.timeout(120)
async def test_a_named_tool_choice_always_calls_that_function(service: Service) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    validator = jsonschema_rs.validator_for(WEATHER["function"]["parameters"])  # type: ignore[index]
    replies = await asyncio.gather(
        *(run_whole(service, CHAT_COMPLETIONS, tool_body(named, s)) for s in range(20))
    )
    for reply in replies:
        choice = ChatCompletion.model_validate(reply).choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls or []
        assert len(calls) == 1
        assert calls[0].id.startswith("call_")
        assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
        assert validator.is_valid(json.loads(calls[0].function.arguments))  # type: ignore[union-attr]


async def test_required_calls_some_tool_and_history_round_trips(service: Service) -> None:
    reply = ChatCompletion.model_validate(
        await run_whole(service, CHAT_COMPLETIONS, tool_body("required", 5))
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls and all(
        call.function.name in ("get_weather", "get_time")  # type: ignore[union-attr]
        for call in message.tool_calls
    )
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        message.model_dump(),
        *(
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"}
            for call in message.tool_calls
        ),
    ]
    body = {**tool_body("auto", 6), "messages": history, "max_completion_tokens": 8}
    follow_up = ChatCompletion.model_validate(await run_whole(service, CHAT_COMPLETIONS, body))
    assert follow_up.choices[0].message.role == "assistant"


async def test_streamed_tool_calls_assemble_like_openai(service: Service) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    request = parse_chat_request(tool_body(named, 7, stream=True))
    prepared = prepare_chat(service, request)
    run = await prepared.start(service, priority=Priority.ONLINE, timeout_ms=None)
    chunks = [
        ChatCompletionChunk.model_validate(c) async for c in chat_chunks(run, include_usage=False)
    ]
    run.close()
    deltas = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or []]
    assert deltas[0].id and deltas[0].id.startswith("call_") and deltas[0].function
    assert deltas[0].function.name == "get_weather"
    pieces = [d.function.arguments for d in deltas if d.function and d.function.arguments]
    assert len(pieces) > 1  # streamed as the model writes them, not in one delta
    assert set(json.loads("".join(pieces))) == {"city", "unit", "days"}
    assert all(d.index == 0 for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(chunk.choices[0].delta.content for chunk in chunks)


async def test_n_choices_differ_with_a_seed_and_echo_prepends_the_prompt(service: Service) -> None:
    from openai.types import Completion

    body = {"model": "tiny", "prompt": ["The quick", "A block"], "n": 3, "seed": 11,
            "temperature": 1.0, "max_tokens": 12, "echo": True}  # fmt: skip
    completion = Completion.model_validate(await run_whole(service, COMPLETIONS, body))
    assert [choice.index for choice in completion.choices] == list(range(6))
    first, second = completion.choices[:3], completion.choices[3:]
    assert all(choice.text.startswith("The quick") for choice in first)
    assert all(choice.text.startswith("A block") for choice in second)
    assert len({choice.text for choice in first}) > 1  # seed + i per choice
    chat = ChatCompletion.model_validate(
        await run_whole(service, CHAT_COMPLETIONS, {**schema_body({"type": "object"}, 2), "n": 2})
    )
    assert len(chat.choices) == 2 and completion.usage is not None


async def test_a_forced_call_cut_by_max_tokens_is_a_call_as_far_as_it_got(
    service: Service,
) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole = ChatCompletion.model_validate(
        await run_whole(service, CHAT_COMPLETIONS, tool_body(named, 8))
    )
    assert whole.usage is not None and whole.choices[0].finish_reason == "tool_calls"
    # Cut in the arguments, a few tokens before the call's end (the same seed: the same tokens).
    cut_body = tool_body(named, 8, max_completion_tokens=whole.usage.completion_tokens - 4)
    cut = ChatCompletion.model_validate(
        await run_whole(service, CHAT_COMPLETIONS, cut_body)
    ).choices[0]
    assert cut.finish_reason == "length" and cut.message.content is None
    (call,) = cut.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    arguments = call.function.arguments  # type: ignore[union-attr]
    assert arguments.startswith("{") and len(arguments) > 2
    run = await prepare_chat(service, parse_chat_request({**cut_body, "stream": True})).start(
        service, priority=Priority.ONLINE, timeout_ms=None
    )
    chunks = [
        ChatCompletionChunk.model_validate(c) async for c in chat_chunks(run, include_usage=False)
    ]
    run.close()
    deltas = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or []]
    streamed = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert streamed == arguments and chunks[-1].choices[0].finish_reason == "length"
    assert not any(chunk.choices[0].delta.content for chunk in chunks)
