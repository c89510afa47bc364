"""The legacy completions ``logprobs`` object, the prompt's tokens first when echoed.

One entry per token in four parallel lists: its text, its logprob, the most likely tokens
at its position with theirs, and where its text starts in the choice's text. As OpenAI's
legacy completions (and vLLM) do, ``top_logprobs`` holds the chosen token too (so up to
``logprobs + 1`` entries; ``logprobs: 0`` gives the chosen token alone), and the echoed
prompt's first token, with nothing before it, has ``null`` for both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.engine.generator import HostedGenerator
from conveyor.engine.outputs import PromptLogprobs, TokenLogprobs
from conveyor.engine.tokenizer import Tokenizer

__all__ = ["legacy_logprobs", "prompt_text_offsets"]


def prompt_text_offsets(tokenizer: Tokenizer, token_ids: Sequence[int]) -> list[int]:
    """Where each prompt token's text starts in the prompt's decoded text.

    Decoded incrementally, as output is: a token that completes no character yet (part of
    a multi-byte character) starts where the character it belongs to starts.
    """
    detokenizer = tokenizer.detokenizer()
    offsets: list[int] = []
    length = 0
    for token_id in token_ids:
        offsets.append(length)
        length += len(detokenizer.add_token(token_id).text)
    return offsets


def legacy_logprobs(
    generator: HostedGenerator,
    prompt: PromptLogprobs | None,
    output: Sequence[TokenLogprobs],
    output_offsets: Sequence[int],
) -> dict[str, Any] | None:
    """The ``logprobs`` object of one choice (or chunk); None when there is nothing in it.

    ``prompt`` is the echoed prompt's (its text starts the choice's text); ``output`` the
    generated tokens', whose text starts at ``output_offsets``.
    """
    if prompt is None and not output:
        return None
    body: dict[str, list[Any]] = {
        "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []
    }  # fmt: skip
    if prompt is not None:
        offsets = prompt_text_offsets(generator.tokenizer, prompt.token_ids)
        body["tokens"].append(_text(generator, prompt.token_ids[0]))
        body["token_logprobs"].append(None)
        body["top_logprobs"].append(None)
        body["text_offset"].append(offsets[0])
        _add(generator, body, prompt.entries, offsets[1:])
    _add(generator, body, output, output_offsets)
    return body


def _add(
    generator: HostedGenerator,
    body: dict[str, list[Any]],
    entries: Sequence[TokenLogprobs],
    offsets: Sequence[int],
) -> None:
    """Append one token per entry to the four lists."""
    for entry, offset in zip(entries, offsets, strict=True):
        body["tokens"].append(_text(generator, entry.token_id))
        body["token_logprobs"].append(entry.logprob)
        body["top_logprobs"].append(_top(generator, entry))
        body["text_offset"].append(offset)


def _top(generator: HostedGenerator, entry: TokenLogprobs) -> dict[str, float]:
    """The most likely tokens at the entry's position, and the chosen token."""
    top = {_text(generator, token_id): value for token_id, value in entry.top}
    if all(token_id != entry.token_id for token_id, _ in entry.top):
        top[_text(generator, entry.token_id)] = entry.logprob
    return top


def _text(generator: HostedGenerator, token_id: int) -> str:
    """How one token reads on its own (special tokens included)."""
    return generator.tokenizer.token_piece(token_id)[0]
