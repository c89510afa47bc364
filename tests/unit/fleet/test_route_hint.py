"""What the gateway reads from a request for affinity: session hint and prompt tokens."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

# Loaded at collection, not inside a test's short timeout (transformers' import is slow).
from transformers import AutoTokenizer

from conveyor.endpoints.responses.input import input_items
from conveyor.endpoints.responses.items import chat_messages as worker_messages
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.endpoints.validation import parse_body
from conveyor.engine.tokenizer import Tokenizer
from conveyor.fakes.checkpoints import build_tiny_tokenizer
from conveyor.fleet.affinity import AffinitySettings
from conveyor.fleet.prompt_tokens import GatewayTokenizer
from conveyor.fleet.route_hint import (
    CONVERSATION_PREFIX,
    HintReader,
    chat_messages,
    responses_messages,
    session_of,
)
from conveyor.response_ids import conversation_key, new_response_id

pytestmark = pytest.mark.model  # builds a tokenizer with transformers: not in mutation runs

CHAT = "/v1/chat/completions"
MESSAGES = [
    {"role": "system", "content": "Be brief. Café 🙂"},
    {"role": "user", "content": "hello there, tell me a story about 日本語"},
    {"role": "assistant", "content": "once upon a time"},
    {
        "role": "user",
        "content": [{"type": "text", "text": "more, "}, {"type": "text", "text": "please"}],
    },
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    build_tiny_tokenizer(directory)
    return directory


@pytest.fixture
def reader(tokenizer_dir: Path) -> HintReader:
    return HintReader({"m": str(tokenizer_dir)}, AffinitySettings())


def body(**fields: object) -> bytes:
    return orjson.dumps({"model": "m", **fields})


def test_the_gateway_tokenizer_matches_the_engines(tokenizer_dir: Path) -> None:
    engine, gateway = Tokenizer(tokenizer_dir), GatewayTokenizer(tokenizer_dir)
    plain = chat_messages({"messages": MESSAGES})
    assert plain is not None and plain[3]["content"] == "more, please"
    assert gateway.encode_chat(plain) == engine.apply_chat_template(plain)
    text = "Numbers 0 1 2 and naïve text"
    assert gateway.encode(text) == engine.encode(text)
    assert gateway.encode(text) == AutoTokenizer.from_pretrained(str(tokenizer_dir)).encode(text)


def test_a_chat_gets_its_prompt_key(reader: HintReader, tokenizer_dir: Path) -> None:
    hint = reader.affinity(CHAT, [], body(messages=MESSAGES), "m")
    assert hint is not None and hint.prompt is not None and hint.session is None
    plain = chat_messages({"messages": MESSAGES})
    assert plain is not None
    assert list(hint.prompt.token_ids) == Tokenizer(tokenizer_dir).apply_chat_template(plain)


def test_completions_take_text_or_token_ids(reader: HintReader) -> None:
    text = reader.affinity("/v1/completions", [], body(prompt="the quick brown fox"), "m")
    assert text is not None and text.prompt is not None and text.prompt.token_ids[0] == 1  # BOS
    ids = reader.affinity("/v1/completions", [], body(prompt=[[5, 6, 7, 8]]), "m")
    assert ids is not None and ids.prompt is not None and ids.prompt.token_ids == (5, 6, 7, 8)
    many = reader.affinity("/v1/completions", [], body(prompt=["a", "b"]), "m")
    assert many is None  # several prompts: no single prefix to follow


def test_the_session_header_wins_over_user(reader: HintReader) -> None:
    headers = [(b"x-conveyor-session", b"abc")]
    hint = reader.affinity(CHAT, headers, body(messages=MESSAGES, user="u1"), "m")
    assert hint is not None and hint.session == "abc"
    hint = reader.affinity(CHAT, [], body(messages=MESSAGES, user="u1"), "m")
    assert hint is not None and hint.session == "u1"


def test_prompt_cache_key_is_the_session_before_user(reader: HintReader) -> None:
    keyed = body(messages=MESSAGES, user="u1", prompt_cache_key="conv-7")
    hint = reader.affinity(CHAT, [], keyed, "m")
    assert hint is not None and hint.session == "conv-7" and hint.prompt is not None
    hint = reader.affinity(CHAT, [(b"x-conveyor-session", b"abc")], keyed, "m")
    assert hint is not None and hint.session == "abc"
    # Without a tokenizer the key alone is still a hint.
    hint = reader.affinity(CHAT, [], body(model="x", messages=MESSAGES, prompt_cache_key="k"), "x")
    assert hint is not None and hint.session == "k" and hint.prompt is None
    assert session_of(RESPONSES, {"prompt_cache_key": "k", "user": "u"}) == "k"
    assert session_of(CHAT, {"prompt_cache_key": "", "user": "u"}) == "u"


def test_without_a_tokenizer_only_the_session_counts(reader: HintReader) -> None:
    assert reader.affinity(CHAT, [], body(model="x", messages=MESSAGES), "x") is None
    hint = reader.affinity(CHAT, [], body(messages=MESSAGES, user="u1"), "x")
    assert hint is not None and hint.prompt is None and hint.session == "u1"


def test_tool_conversations_and_other_paths_get_no_prompt_key(reader: HintReader) -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert reader.affinity(CHAT, [], body(messages=MESSAGES, tools=tools), "m") is None
    calls = [*MESSAGES, {"role": "tool", "content": "42", "tool_call_id": "c"}]
    assert reader.affinity(CHAT, [], body(messages=calls), "m") is None
    assert reader.affinity("/v1/embeddings", [(b"x-conveyor-session", b"s")], b"{}", "m") is None


def test_unreadable_bodies_give_no_hint_not_an_error(reader: HintReader) -> None:
    assert reader.affinity(CHAT, [], b"{not json", "m") is None
    assert reader.affinity(CHAT, [], b"[1, 2]", "m") is None
    assert reader.affinity(CHAT, [], body(messages="hi"), "m") is None


def test_a_bad_tokenizer_directory_turns_prefix_routing_off(tmp_path: Path) -> None:
    reader = HintReader({"m": str(tmp_path / "missing")}, AffinitySettings())
    assert reader.tokenizer("m") is None
    assert reader.affinity(CHAT, [], body(messages=MESSAGES), "m") is None


@pytest.mark.anyio
async def test_read_tokenizes_off_the_loop_and_prehashes_the_block_sizes(
    reader: HintReader,
) -> None:
    reader.preload()
    hint = await reader.read(CHAT, [], body(messages=MESSAGES), "m", {4, 16})
    direct = reader.affinity(CHAT, [], body(messages=MESSAGES), "m")
    assert hint is not None and hint.prompt is not None
    assert direct is not None and direct.prompt is not None
    assert hint.prompt.token_ids == direct.prompt.token_ids
    assert set(hint.prompt._keys) == {4, 16}  # hashed on the thread, not on the loop
    session_only = await reader.read(CHAT, [(b"x-conveyor-session", b"s")], b"{}", "x")
    assert session_only is not None and session_only.session == "s"
    assert await reader.read("/v1/embeddings", [], b"{}", "m") is None


def test_prefix_tokenizer_pairs_are_parsed_strictly() -> None:
    from conveyor.gateway.process import parse_model_dirs

    assert parse_model_dirs(["a=/m/a", "b=/m/b=c"]) == {"a": "/m/a", "b": "/m/b=c"}
    for bad in ("a", "=/m", "a="):
        with pytest.raises(ValueError, match="MODEL=DIR"):
            parse_model_dirs([bad])


RESPONSES = "/v1/responses"
ITEMS = [
    {"role": "developer", "content": "Answer in French."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
    {"role": "assistant", "content": [{"type": "output_text", "text": "bonjour"}]},
    {"role": "user", "content": "and goodbye?"},
]


def test_a_responses_prompt_is_keyed_as_the_worker_templates_it(
    reader: HintReader, tokenizer_dir: Path
) -> None:
    fields = {"instructions": "Be brief.", "input": ITEMS}
    hint = reader.affinity(RESPONSES, [], body(**fields), "m")
    assert hint is not None and hint.prompt is not None and hint.session is None
    request = parse_body(ResponseRequest, {"model": "m", **fields})
    expected = worker_messages(request.instructions, input_items(request))
    assert responses_messages(fields) == expected
    engine = Tokenizer(tokenizer_dir)
    assert list(hint.prompt.token_ids) == engine.apply_chat_template(expected)
    plain = reader.affinity(RESPONSES, [], body(input="just text"), "m")
    assert plain is not None and plain.prompt is not None


def test_a_conversation_s_later_turns_share_one_session(reader: HintReader) -> None:
    first = new_response_id()
    second, third = new_response_id(first), new_response_id(new_response_id(first))
    hints = [reader.affinity(RESPONSES, [], body(input="next", previous_response_id=previous), "x")
             for previous in (first, second, third)]  # fmt: skip
    sessions = {hint.session for hint in hints if hint is not None}
    assert sessions == {CONVERSATION_PREFIX + str(conversation_key(first))}
    assert all(hint is not None and hint.prompt is None for hint in hints)  # stored turns unknown
    headers = [(b"x-conveyor-session", b"abc")]
    hint = reader.affinity(RESPONSES, headers, body(input="x", previous_response_id=first), "m")
    assert hint is not None and hint.session == "abc"
    assert session_of(RESPONSES, {"previous_response_id": "resp_foreign", "user": "u"}) == "u"
    assert session_of(CHAT, {"previous_response_id": first}) is None


def test_responses_with_tools_or_function_items_get_no_prompt_key() -> None:
    tools = [{"type": "function", "name": "f"}]
    assert responses_messages({"input": "x", "tools": tools}) is None
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    assert responses_messages({"input": [*ITEMS, call]}) is None
    assert responses_messages({"input": []}) is None
    assert responses_messages({"input": [{"role": 1, "content": "x"}]}) is None
