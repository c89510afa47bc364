"""What an inference request asks of the token buckets, read from its JSON body.

A gateway admits on this (it has no tokenizer; `serve` counts exactly, `tenants.ticket`).
Input tokens are estimated from the text (about 4 bytes a token, as OpenAI's own limiter
estimates; token-id inputs are counted exactly; a rerank or score pair counts both texts)
and corrected at settlement by the exact `usage` the model reports. Output tokens reserve
`max_tokens` per choice, else `rate_limits.default_max_output_tokens`: a gateway does not
know the model's context length (`serve` reserves the context the prompt leaves).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BYTES_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4  # role and separators, roughly
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions

EMBEDDINGS_PATH = "/v1/embeddings"
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"
RERANK_PATH = "/v1/rerank"
SCORE_PATH = "/v1/score"
MESSAGES_PATH = "/v1/messages"  # Anthropic's Messages API
# Paths that produce no output tokens (nothing is reserved for output).
ONE_SHOT_PATHS = frozenset({EMBEDDINGS_PATH, RERANK_PATH, SCORE_PATH})
LIMITED_PATHS = frozenset(
    {COMPLETIONS_PATH, CHAT_PATH, MESSAGES_PATH, RESPONSES_PATH, *ONE_SHOT_PATHS}
)


@dataclass(frozen=True, slots=True)
class TokenAsk:
    """A request's model, its input tokens (estimated) and the output tokens to reserve."""

    model: str
    input_tokens: int
    output_tokens: int


def text_tokens(text: str) -> int:
    """About how many tokens a text is (never 0 for a non-empty one)."""
    size = len(text) if text.isascii() else len(text.encode())  # its UTF-8 bytes
    return -(-size // BYTES_PER_TOKEN)


def input_tokens(value: Any) -> int:
    """Tokens of an `input` or `prompt`: a string, token ids, or a list of either."""
    if isinstance(value, str):
        return text_tokens(value)
    if not isinstance(value, list) or not value:
        return 0
    if isinstance(value[0], int) and all(isinstance(item, int) for item in value):
        return len(value)
    total = 0
    for item in value:  # a loop, not a generator: every gateway admission runs this
        total += text_tokens(item) if isinstance(item, str) else input_tokens(item)
    return total


def message_tokens(messages: Any) -> int:
    """Tokens of chat messages: their text parts plus a few per message.

    Anthropic's blocks count too: a ``tool_result``'s content as text, a ``tool_use``'s
    input is left out (the estimate is corrected at settlement).
    """
    if not isinstance(messages, list):
        return 0
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = [_part_text(part) for part in content if isinstance(part, dict)]
        total += TOKENS_PER_MESSAGE + input_tokens(content)
    return total


def item_tokens(body: dict[str, Any]) -> int:
    """Tokens of a Responses body: its instructions, then each input item's text (message
    parts, a call's arguments, a call's output) plus a few per item."""
    total = input_tokens(body.get("instructions"))
    items = body.get("input")
    if not isinstance(items, list):
        return total + input_tokens(items)
    for item in items:
        if not isinstance(item, dict):
            continue
        content = item.get("content", item.get("arguments", item.get("output")))
        if isinstance(content, list):
            content = [part.get("text", "") for part in content if isinstance(part, dict)]
        total += TOKENS_PER_MESSAGE + input_tokens(content)
    return total


def _part_text(part: dict[str, Any]) -> Any:
    """The text of a content part (a string, or text parts for a ``tool_result``)."""
    text = part.get("text")
    if text is not None:
        return text
    nested = part.get("content")
    if isinstance(nested, list):
        return [item.get("text", "") for item in nested if isinstance(item, dict)]
    return nested if isinstance(nested, str) else ""


def _positive_int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and value > 0 else default


def output_reserve(body: dict[str, Any], path: str, default_max_tokens: int) -> int:
    """Output tokens to reserve: max tokens per choice, times choices and prompts."""
    if path in ONE_SHOT_PATHS:
        return 0
    if path == COMPLETIONS_PATH:
        per_choice = _positive_int(body.get("max_tokens"), COMPLETIONS_DEFAULT_MAX_TOKENS)
        prompt = body.get("prompt")
        is_many = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)
        num_prompts = len(prompt) if is_many and isinstance(prompt, list) else 1
    elif path == RESPONSES_PATH:
        return _positive_int(body.get("max_output_tokens"), default_max_tokens)
    else:
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        per_choice = _positive_int(asked, default_max_tokens)
        num_prompts = 1
    return per_choice * _positive_int(body.get("n"), 1) * num_prompts


def ask_of(body: dict[str, Any], path: str, default_max_tokens: int) -> TokenAsk | None:
    """The ask of a parsed request body to `path`, or None when it names no model (the
    endpoint then answers 400 itself)."""
    model = body.get("model")
    if not isinstance(model, str):
        return None
    return TokenAsk(
        model, body_input_tokens(body, path), output_reserve(body, path, default_max_tokens)
    )


def pair_tokens(first: Any, second: Any) -> int:
    """Tokens of scored pairs: one text against many (repeated for each), or pairwise."""
    firsts = [first] if isinstance(first, str) else first if isinstance(first, list) else []
    seconds = [second] if isinstance(second, str) else second if isinstance(second, list) else []
    if len(firsts) == 1:
        return len(seconds) * input_tokens(firsts[0]) + input_tokens(seconds)
    return input_tokens(firsts) + input_tokens(seconds)


def body_input_tokens(body: dict[str, Any], path: str) -> int:
    """About how many input tokens a request body to `path` holds."""
    if path == CHAT_PATH:
        return message_tokens(body.get("messages"))
    if path == RESPONSES_PATH:
        return item_tokens(body)
    if path == MESSAGES_PATH:
        system = body.get("system")
        if isinstance(system, list):
            system = [_part_text(part) for part in system if isinstance(part, dict)]
        return message_tokens(body.get("messages")) + input_tokens(system)
    if path == RERANK_PATH:
        docs = body.get("documents")
        texts = [d.get("text", "") if isinstance(d, dict) else d for d in docs or []]
        return pair_tokens(body.get("query"), texts)
    if path == SCORE_PATH:
        return pair_tokens(body.get("text_1"), body.get("text_2"))
    return input_tokens(body.get("input" if path == EMBEDDINGS_PATH else "prompt"))
