"""Tool calling: the prompt's tool section, the grammar that forces a call, and parsing.

A call is written as the Hermes / Qwen chat templates write it, one block per call::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

With ``tool_choice`` ``required`` or a named function, a grammar makes the output exactly
such blocks (one for a named function; one or more for ``required``) with arguments
valid for the function's ``parameters``. With ``auto`` the model writes what it likes
and blocks found in the text become ``message.tool_calls``. A block that ``max_tokens``
cut short is still a call, with the arguments as far as they got (``parse_cut_call``).

The prompt uses the chat template's own tool format when the template renders
``tools``; otherwise (the fallback) a system message lists the tools and asks for the
block format above, assistant calls in the history are rendered as such blocks, and
``tool`` results are passed as user turns wrapped in ``<tool_response>``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from conveyor.endpoints.chat_schemas import ChatCompletionRequest, ChatMessage, FunctionTool
from conveyor.endpoints.tool_schema import calls_schema
from conveyor.engine.sampling.grammar import grammar_from_lark, json_lark_rule

__all__ = [
    "CALL_END",
    "CALL_START",
    "ParsedCall",
    "held_from",
    "new_call_id",
    "parse_cut_call",
    "parse_tool_calls",
    "template_messages",
    "tool_call_grammar",
]

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
_BLOCK = re.compile(re.escape(CALL_START) + r"(.*?)" + re.escape(CALL_END), re.DOTALL)
# A block's opening as far as it got: its name (maybe cut), then maybe `"arguments": `.
_CUT_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)(")?')
_CUT_ARGUMENTS = re.compile(r'\s*,\s*"arguments"\s*:\s*')


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """One call found in the output: the function and its JSON-encoded arguments."""

    name: str
    arguments: str


def new_call_id() -> str:
    """An id in OpenAI's ``call_...`` form."""
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call_grammar(request: ChatCompletionRequest, *, name: str | None) -> str:
    """Grammar of the whole reply: one call to ``name``, or one or more calls to any tool."""
    tools = [tool for tool in request.tools or [] if name is None or tool.function.name == name]
    schema = calls_schema(tools)
    many = name is None and request.parallel_tool_calls is not False
    start = 'start: call ("\\n" call)*' if many else "start: call"
    call = f'call: "{CALL_START}\\n" {json_lark_rule(schema)} "\\n{CALL_END}"'
    return grammar_from_lark(f"{start}\n{call}\n")


def parse_tool_calls(
    text: str, names: tuple[str, ...], *, is_cut: bool = False
) -> tuple[str | None, list[ParsedCall]]:
    """Split output into content (None when empty) and the calls to known tools in it.

    A block that is not valid JSON, or names no tool, stays in the content as written.
    When ``is_cut`` (the output hit ``max_tokens``), a block left open at the end is a
    call as far as it got (see ``parse_cut_call``).
    """
    calls: list[ParsedCall] = []
    content_parts: list[str] = []
    position = 0
    for match in _BLOCK.finditer(text):
        call = parse_call_block(match.group(1), names)
        if call is None:
            continue
        content_parts.append(text[position : match.start()])
        position = match.end()
        calls.append(call)
    opened = text.find(CALL_START, position) if is_cut else -1
    cut = None if opened < 0 else parse_cut_call(text[opened + len(CALL_START) :], names)
    if cut is not None:
        content_parts.append(text[position:opened])
        calls.append(cut)
        position = len(text)
    content_parts.append(text[position:])
    content = "".join(content_parts).strip() if calls else text
    return (content or None), calls


def parse_call_block(body: str, names: tuple[str, ...]) -> ParsedCall | None:
    """The call inside one ``<tool_call>`` block, or None if it is not a call to a tool."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        return ParsedCall(value["name"], arguments)
    return ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def parse_cut_call(body: str, names: tuple[str, ...]) -> ParsedCall | None:
    """The call an open block was writing when the output was cut; None if it names none.

    A whole call (only the closing markup missing) is itself. Otherwise the name must be
    a known tool's, or the start of exactly one (cut inside the name: no arguments yet),
    and the arguments are the JSON text written so far, unfinished.
    """
    body = body[: held_from(body, CALL_END)]  # the closing markup may have begun
    whole = parse_call_block(body, names)
    if whole is not None:
        return whole
    header = _CUT_NAME.match(body)
    if header is None:
        return None
    name = header.group(1)
    if header.group(2) is None:
        candidates = [known for known in names if known.startswith(name)]
        return ParsedCall(candidates[0], "") if len(candidates) == 1 else None
    if name not in names:
        return None
    arguments = _CUT_ARGUMENTS.match(body, header.end())
    return ParsedCall(name, "" if arguments is None else body[arguments.end() :])


def held_from(text: str, marker: str) -> int:
    """Where the longest suffix of ``text`` that is a proper prefix of ``marker`` starts."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return len(text) - size
    return len(text)


def template_messages(
    request: ChatCompletionRequest, *, template_has_tools: bool
) -> list[dict[str, Any]]:
    """The conversation as chat-template dicts (with the tool fallback when needed)."""
    if template_has_tools:
        return [_native_message(message) for message in request.messages]
    messages = [_fallback_message(message) for message in request.messages]
    if request.tools and request.effective_tool_choice != "none":
        messages.insert(0, {"role": "system", "content": _tools_instruction(request.tools)})
    return messages


def template_tools(request: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """``tools`` in the form chat templates take (OpenAI's, as plain dicts)."""
    if not request.tools or request.effective_tool_choice == "none":
        return None
    return [tool.model_dump(exclude_none=True) for tool in request.tools]


def _native_message(message: ChatMessage) -> dict[str, Any]:
    """A message as tool-aware templates expect it (arguments decoded to objects)."""
    result: dict[str, Any] = {"role": message.role, "content": message.text}
    if message.name is not None:
        result["name"] = message.name
    if message.tool_call_id is not None:
        result["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        result["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": _decoded(call.function.arguments),
                },
            }
            for call in message.tool_calls
        ]
    return result


def _fallback_message(message: ChatMessage) -> dict[str, Any]:
    """A message for a template without tool support: calls and results as plain text."""
    if message.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message.text}\n</tool_response>"}
    text = message.text
    for call in message.tool_calls or []:
        block = json.dumps(
            {"name": call.function.name, "arguments": _decoded(call.function.arguments)}
        )
        text += f"{CALL_START}\n{block}\n{CALL_END}"
    result: dict[str, Any] = {"role": message.role, "content": text}
    if message.name is not None:
        result["name"] = message.name
    return result


def _tools_instruction(tools: list[FunctionTool]) -> str:
    """The fallback system message: the tools as JSON and how to call them."""
    listing = "\n".join(json.dumps(tool.model_dump(exclude_none=True)) for tool in tools)
    return (
        "You may call these functions:\n"
        f"{listing}\n"
        f"To call one, reply with {CALL_START}\n"
        '{"name": <function name>, "arguments": <arguments as a JSON object>}\n'
        f"{CALL_END}"
    )


def _decoded(arguments: str) -> Any:
    """Arguments as an object when they are JSON (templates render them), else the string."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
