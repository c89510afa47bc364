"""The gateway's own tokenizer for a model: ``tokenizers`` and a Jinja chat template, no torch.

It turns a chat or completion body into the token ids the worker's engine will see, so the
gateway can hash the prompt's blocks as the engine does (``prefix.hashing``). It reads the
checkpoint's ``tokenizer.json``, ``tokenizer_config.json`` and chat template (inline or
``chat_template.jinja``) and renders the template as Hugging Face's ``apply_chat_template``
does (sandboxed Jinja, ``trim_blocks`` and ``lstrip_blocks``, the special tokens as
variables), then encodes without adding special tokens.

Approximations (the result only steers routing; a mismatch costs a cache hit, never a
wrong answer): messages pass as ``{role, content, name}`` with content parts joined, so a
conversation with tool calls or tool results, or a body with ``tools``, gets no prompt key
(it still routes by session or load); control tokens typed inside user text are not escaped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["GatewayTokenizer"]

_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                       "cls_token", "mask_token")  # fmt: skip


def _token_text(value: object) -> str | None:
    """A special token as the config spells it: a string or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _chat_template(directory: Path, config: Mapping[str, Any]) -> str | None:
    """The default chat template: ``chat_template.jinja`` or the config's entry."""
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _compile(template: str) -> Any:
    """The template compiled in a sandbox with the helpers HF templates call."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)  # fmt: skip

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])  # fmt: skip
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class GatewayTokenizer:
    """Encodes prompts and chats as the model's engine does, from the checkpoint's files."""

    def __init__(self, directory: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(directory)
        self._backend: Any = Tokenizer.from_file(str(path / "tokenizer.json"))
        config_file = path / "tokenizer_config.json"
        config: Mapping[str, Any] = (
            json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        )
        self._special = {key: text for key in _SPECIAL_TOKEN_KEYS
                         if (text := _token_text(config.get(key))) is not None}  # fmt: skip
        template = _chat_template(path, config)
        self._template: Any = _compile(template) if template is not None else None

    @property
    def has_chat_template(self) -> bool:
        """Whether chats can be encoded."""
        return self._template is not None

    def encode(self, text: str) -> list[int]:
        """A completion prompt's ids (special tokens such as BOS added, as the engine does)."""
        return self._encode(text, add_special_tokens=True)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """A conversation's ids through the chat template, with the generation prompt."""
        if self._template is None:
            raise ValueError("this tokenizer has no chat template")
        text = self._template.render(
            messages=[dict(m) for m in messages],
            tools=None,
            documents=None,
            add_generation_prompt=True,
            **self._special,
        )
        return self._encode(text, add_special_tokens=False)

    def _encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Ids of ``text``; the batch call releases the GIL for the whole encoding."""
        (encoding,) = self._backend.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(encoding.ids)
