"""How many bytes of text one input may carry before it is tokenized: a cap, not a count.

Tokenizing megabytes only to learn they are too long takes seconds of CPU. A text's size
proves little about its tokens (a byte-level BPE text of B bytes has at most B tokens but
often far fewer), so the cap is a plain byte limit, stated as one: ``max_input_bytes``,
by default the model's token limit times ``INPUT_BYTES_PER_TOKEN`` (32: about eight times
the bytes an English token takes). Over it a text is refused before any tokenizing, or,
where the caller asked for ``truncate``, cut to it first (the cut keeps far more text than
the model's token limit, so what the model then sees is what truncating all of it gives).
"""

from __future__ import annotations

from conveyor.config.model_config import INPUT_BYTES_PER_TOKEN
from conveyor.errors import InvalidRequest

__all__ = ["check_text_bytes", "cut_to_bytes", "input_byte_limit", "utf8_size"]


def input_byte_limit(configured: int | None, max_tokens: int) -> int:
    """``max_input_bytes`` as configured, else ``max_tokens * INPUT_BYTES_PER_TOKEN``."""
    return configured if configured is not None else max_tokens * INPUT_BYTES_PER_TOKEN


def utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (no copy for ASCII, whose size is its length)."""
    if text.isascii():
        return len(text)
    # A lone surrogate (JSON allows "\ud800") counts as the 3 bytes it would take.
    return len(text.encode("utf-8", errors="surrogatepass"))


def check_text_bytes(num_bytes: int, limit: int, *, subject: str, param: str, hint: str) -> None:
    """400 naming ``param`` when ``subject`` (``"the prompt"``) is over ``limit`` bytes."""
    if num_bytes > limit:
        raise InvalidRequest(
            f"{subject} is {num_bytes} bytes, more than this model takes before tokenizing "
            f"({limit} bytes, max_input_bytes); {hint}",
            param=param,
        )


def cut_to_bytes(text: str, limit: int) -> str:
    """The longest prefix of ``text`` of at most ``limit`` UTF-8 bytes (whole characters)."""
    if utf8_size(text) <= limit:
        return text
    if text.isascii():
        return text[:limit]
    return text.encode("utf-8", errors="surrogatepass")[:limit].decode("utf-8", errors="ignore")
