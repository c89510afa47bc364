"""What a gateway reads from a generation request to route it by affinity.

The session hint is the ``x-conveyor-session`` header, else the body's
``prompt_cache_key`` (OpenAI's name for it), else (``/v1/responses``) the conversation its
``previous_response_id`` names (``response_ids``: every later turn of a conversation goes
where the earlier ones ran), else the body's ``user``. The prompt key
is the prompt's token ids from the gateway's own tokenizer for the model (configured per
model; ``fleet.prompt_tokens``), loaded on first use. Only ``/v1/chat/completions``,
``/v1/completions`` and ``/v1/responses`` bodies are read; anything unreadable gives no
hint, never an error (the worker validates the body).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import orjson

from conveyor.fleet.affinity import Affinity, AffinitySettings, PromptKey
from conveyor.fleet.prompt_tokens import GatewayTokenizer
from conveyor.response_ids import conversation_key

log = logging.getLogger(__name__)

__all__ = [
    "CONVERSATION_PREFIX",
    "SESSION_HEADER",
    "HintReader",
    "chat_messages",
    "completion_ids",
    "responses_messages",
    "session_of",
]

SESSION_HEADER = b"x-conveyor-session"
_CHAT_PATH = "/v1/chat/completions"
_COMPLETION_PATH = "/v1/completions"
_RESPONSES_PATH = "/v1/responses"
_HINTED_PATHS = (_CHAT_PATH, _COMPLETION_PATH, _RESPONSES_PATH)
_USER_KEY = b'"user"'
_CACHE_KEY = b'"prompt_cache_key"'
_PREVIOUS_KEY = b'"previous_response_id"'
# A Responses conversation's session hint: this and its key.
CONVERSATION_PREFIX = "conversation:"


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The messages as the engine's template gets them, or None for what is not mirrored.

    Tool conversations (``tools``, ``tool_calls``, ``tool`` messages) are left out: the
    engine rewrites them for the template, which the gateway does not repeat.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or body.get("tools"):
        return None
    result = []
    for message in messages:
        if not isinstance(message, Mapping) or message.get("tool_calls"):
            return None
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or role == "tool":
            return None
        if isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, Mapping)]
            content = "".join(p for p in parts if isinstance(p, str))
        if not isinstance(content, str):
            return None
        entry: dict[str, Any] = {"role": role, "content": content}
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        result.append(entry)
    return result


def responses_messages(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """A Responses body's prompt as the engine's template gets it, or None when it is not
    plain text: tools, function items, or a continued conversation (whose earlier turns
    only the job store knows). As the worker has it: ``instructions`` is a system message
    first, and ``developer`` messages are system messages."""
    if body.get("tools") or body.get("previous_response_id"):
        return None
    instructions, items = body.get("instructions"), body.get("input")
    messages: list[dict[str, Any]] = []
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        return None
    for item in items:
        if not isinstance(item, Mapping) or item.get("type", "message") != "message":
            return None
        role, content = item.get("role"), item.get("content")
        if isinstance(content, list):
            parts = [p.get("text", p.get("refusal")) for p in content if isinstance(p, Mapping)]
            content = "".join(p for p in parts if isinstance(p, str))
        if not isinstance(role, str) or not isinstance(content, str):
            return None
        messages.append({"role": "system" if role == "developer" else role, "content": content})
    return messages


def session_of(path: str, body: Mapping[str, Any]) -> str | None:
    """The body's session hint: its ``prompt_cache_key``, else a Responses turn's
    conversation, else its ``user``."""
    cache_key = body.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key:
        return cache_key
    if path == _RESPONSES_PATH:
        previous = body.get("previous_response_id")
        key = conversation_key(previous) if isinstance(previous, str) else None
        if key is not None:
            return CONVERSATION_PREFIX + key
    user = body.get("user")
    return user if isinstance(user, str) and user else None


def completion_ids(tokenizer: GatewayTokenizer, prompt: object) -> list[int] | None:
    """One completion prompt's ids: a string is encoded, a token list taken as it is."""
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    return None


class HintReader:
    """Builds a request's ``Affinity``; holds the per-model tokenizers (lazily loaded)."""

    def __init__(self, tokenizer_dirs: Mapping[str, str], settings: AffinitySettings) -> None:
        self._dirs = dict(tokenizer_dirs)
        self._settings = settings
        self._tokenizers: dict[str, GatewayTokenizer | None] = {}

    def tokenizer(self, model: str) -> GatewayTokenizer | None:
        """The model's tokenizer; None when none is configured or it failed to load."""
        if model not in self._tokenizers:
            directory = self._dirs.get(model)
            try:
                self._tokenizers[model] = None if directory is None else GatewayTokenizer(directory)
            except Exception as exc:  # a bad directory only turns prefix routing off for it
                log.warning("no prefix routing for %s: tokenizer in %s: %s", model, directory, exc)
                self._tokenizers[model] = None
        return self._tokenizers[model]

    def preload(self) -> None:
        """Load every configured tokenizer now (blocking: call off the event loop)."""
        for model in self._dirs:
            self.tokenizer(model)

    async def read(
        self,
        path: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        model: str,
        block_sizes: Collection[int] = (),
    ) -> Affinity | None:
        """``affinity`` without blocking the event loop on tokenizing and hashing.

        Requests that need the tokenizer run on a thread (``tokenizers`` releases the GIL
        while it encodes), with their prompt keys hashed there for ``block_sizes``.
        """
        needs_tokens = path in _HINTED_PATHS and self._settings.use_prefix
        if not needs_tokens or self.tokenizer(model) is None:
            return self.affinity(path, headers, body, model)

        def compute() -> Affinity | None:
            hint = self.affinity(path, headers, body, model)
            if hint is not None and hint.prompt is not None:
                for block_size in block_sizes:
                    hint.prompt.keys(block_size)
            return hint

        return await asyncio.to_thread(compute)

    def affinity(
        self, path: str, headers: Sequence[tuple[bytes, bytes]], body: bytes, model: str
    ) -> Affinity | None:
        """The request's hint, or None when it has none (or is not a generation request)."""
        if path not in _HINTED_PATHS:
            return None
        session = next((v.decode("latin-1") for k, v in headers if k == SESSION_HEADER), None)
        tokenizer = self.tokenizer(model) if self._settings.use_prefix else None
        has_hint = (
            _USER_KEY in body
            or _CACHE_KEY in body
            or (path == _RESPONSES_PATH and _PREVIOUS_KEY in body)
        )
        if tokenizer is None and (session or not has_hint):
            return Affinity(session=session) if session else None
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            return Affinity(session=session) if session else None
        if not isinstance(parsed, dict):
            return None
        if session is None:
            session = session_of(path, parsed)
        ids = self._prompt_ids(tokenizer, path, parsed) if tokenizer is not None else None
        prompt = PromptKey(ids, self._settings.max_prompt_blocks) if ids else None
        return Affinity(prompt, session) if prompt or session else None

    @staticmethod
    def _prompt_ids(
        tokenizer: GatewayTokenizer, path: str, body: dict[str, Any]
    ) -> list[int] | None:
        """The prompt's token ids as the engine will see them, or None."""
        try:
            if path == _COMPLETION_PATH:
                return completion_ids(tokenizer, body.get("prompt"))
            messages = chat_messages(body) if path == _CHAT_PATH else responses_messages(body)
            if messages is None or not tokenizer.has_chat_template:
                return None
            return tokenizer.encode_chat(messages)
        except Exception as exc:  # a template that rejects the chat: the worker will say so
            log.debug("no prompt key: %s", exc)
            return None
