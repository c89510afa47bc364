"""The checkpoint's tokenizer, plus streaming detokenization with stop strings.

A token's text can be an incomplete UTF-8 sequence (byte-level BPE splits multi-byte
characters) or depend on its neighbours (SentencePiece's leading spaces), so
:class:`Detokenizer` decodes a short sliding window of ids and emits only text that is
complete. It also holds back text that may be the start of a stop string, so a stop string
is never streamed to the client.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.engine.model.gguf_format import find_gguf_file

__all__ = ["DetokenizedText", "Detokenizer", "Tokenizer"]

# Prompt tokens kept as left context for the first output token, so tokenizers whose
# pieces render differently at the start of a text (leading spaces) decode it as in context.
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class Tokenizer:
    """A Hugging Face tokenizer loaded from a checkpoint directory, without network access.

    For a GGUF checkpoint transformers builds the tokenizer, its special tokens and chat
    template from the file's metadata.
    """

    def __init__(self, checkpoint_dir: str | Path) -> None:
        from transformers import AutoTokenizer

        gguf_file = find_gguf_file(checkpoint_dir)
        if gguf_file is None:
            self._hf: Any = AutoTokenizer.from_pretrained(
                str(checkpoint_dir), local_files_only=True
            )
        else:
            self._hf = AutoTokenizer.from_pretrained(
                str(gguf_file.parent), gguf_file=gguf_file.name, local_files_only=True
            )
        # token id -> (text, its UTF-8 bytes): at most one entry per vocabulary id.
        self._pieces: dict[int, tuple[str, tuple[int, ...]]] = {}

    @property
    def hf(self) -> Any:
        """The underlying Hugging Face tokenizer (for libraries that wrap it)."""
        return self._hf

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's EOS id, if it has one."""
        value = self._hf.eos_token_id
        return None if value is None else int(value)

    @property
    def bos_token_id(self) -> int | None:
        """The tokenizer's BOS id, if it has one."""
        value = self._hf.bos_token_id
        return None if value is None else int(value)

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows, added tokens included."""
        return len(self._hf)

    @property
    def has_chat_template(self) -> bool:
        """Whether :meth:`apply_chat_template` can be used."""
        return bool(getattr(self._hf, "chat_template", None))

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template renders ``tools`` (else callers fall back to text)."""
        template = getattr(self._hf, "chat_template", None)
        return isinstance(template, str) and "tools" in template

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token can stand for (its vocabulary string, at least 1).

        Byte-level and SentencePiece vocabularies spell each token with at least one
        character per character of text it covers, so a text of ``n`` characters takes at
        least ``n / max_token_chars`` tokens: a bound that needs no tokenizing.
        """
        tokens = self._hf.convert_ids_to_tokens(list(range(len(self._hf))))
        return max(1, max((len(token) for token in tokens if isinstance(token, str)), default=1))

    def min_tokens(self, num_chars: int) -> int:
        """A lower bound on the tokens a text of ``num_chars`` characters encodes to."""
        return -(-num_chars // self.max_token_chars)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (with BOS etc. when the tokenizer adds them)."""
        ids: list[int] = self._hf.encode(text, add_special_tokens=add_special_tokens)
        return [int(token) for token in ids]

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``; special tokens are dropped by default."""
        text: str = self._hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        return text

    def token_piece(self, token_id: int) -> tuple[str, tuple[int, ...]]:
        """How one token reads on its own (special tokens included), and that text's bytes.

        Cached: an answer with logprobs names a token and up to 20 alternatives at every
        step, mostly the same few thousand tokens, and decoding one costs microseconds.
        Safe from any thread (a race decodes a token twice, to the same value).
        """
        piece = self._pieces.get(token_id)
        if piece is None:
            text = self.decode([token_id], skip_special_tokens=False)
            piece = self._pieces[token_id] = (text, tuple(text.encode("utf-8")))
        return piece

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of a chat, ending with the prompt for the assistant's reply."""
        if not self.has_chat_template:
            raise ValueError("this model's tokenizer has no chat template")
        ids: list[int] = self._hf.apply_chat_template(
            [dict(message) for message in messages],
            tools=None if tools is None else [dict(tool) for tool in tools],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return [int(token) for token in ids]

    def detokenizer(
        self, *, prompt_ids: Sequence[int] = (), stop: Sequence[str] = ()
    ) -> Detokenizer:
        """A fresh streaming detokenizer for one sequence."""
        return Detokenizer(self, prompt_ids=prompt_ids, stop=stop)


@dataclass(frozen=True, slots=True)
class DetokenizedText:
    """What one new token adds to the stream.

    ``text`` is safe to send now (possibly empty). When ``is_stopped``, a stop string was
    found: ``text`` ends just before it, ``stop_string`` says which, and the sequence is done.
    """

    text: str
    is_stopped: bool = False
    stop_string: str | None = None


class Detokenizer:
    """Turns one sequence's output ids into text increments, checking stop strings."""

    def __init__(
        self, tokenizer: Tokenizer, *, prompt_ids: Sequence[int] = (), stop: Sequence[str] = ()
    ) -> None:
        if any(not text for text in stop):
            raise ValueError("stop strings must be non-empty")
        self._tokenizer = tokenizer
        self._stop = tuple(stop)
        self._ids = list(prompt_ids[-_PROMPT_CONTEXT_TOKENS:])
        # ids[prefix_offset:read_offset] is already-emitted context; ids[read_offset:] is
        # pending (their text is not complete yet).
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._output = ""
        self._num_emitted_chars = 0
        self._stop_string: str | None = None

    @property
    def text(self) -> str:
        """All output text decoded so far (including any held-back tail)."""
        return self._output

    @property
    def is_stopped(self) -> bool:
        """Whether a stop string has ended the sequence."""
        return self._stop_string is not None

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the sequence, if one did."""
        return self._stop_string

    def add_token(self, token_id: int) -> DetokenizedText:
        """Feed the next output id; returns the text that may be streamed now."""
        if self._stop_string is not None:
            return DetokenizedText("", is_stopped=True, stop_string=self._stop_string)
        self._output += self._decode_next(token_id)
        return self._emit()

    def flush(self) -> str:
        """The text still held back, when the sequence ends for a reason other than a stop."""
        if self._stop_string is not None:
            return ""
        if self._read_offset < len(self._ids):
            # Incomplete bytes at the very end: emit them as the full decode would.
            self._output += self._window_delta(allow_incomplete=True)
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        rest = self._output[self._num_emitted_chars :]
        self._num_emitted_chars = len(self._output)
        return rest

    def _decode_next(self, token_id: int) -> str:
        """Text completed by ``token_id`` ("" while a character is still incomplete)."""
        self._ids.append(token_id)
        delta = self._window_delta(allow_incomplete=False)
        if delta:
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return delta

    def _window_delta(self, *, allow_incomplete: bool) -> str:
        """New text of the pending ids, decoded with the emitted context before them."""
        decode = self._tokenizer.decode
        context = decode(self._ids[self._prefix_offset : self._read_offset])
        window = decode(self._ids[self._prefix_offset :])
        if len(window) <= len(context):
            return ""
        if window.endswith(_REPLACEMENT_CHAR) and not allow_incomplete:
            return ""
        return window[len(context) :]

    def _emit(self) -> DetokenizedText:
        """Cut at the first stop string, or hold back a possible stop-string prefix."""
        start = self._num_emitted_chars
        found = self._find_stop(start)
        if found is not None:
            index, stop_string = found
            self._output = self._output[:index]
            self._num_emitted_chars = index
            self._stop_string = stop_string
            return DetokenizedText(self._output[start:], is_stopped=True, stop_string=stop_string)
        safe_end = len(self._output) - self._held_back_len()
        if safe_end <= start:
            return DetokenizedText("")
        self._num_emitted_chars = safe_end
        return DetokenizedText(self._output[start:safe_end])

    def _find_stop(self, start: int) -> tuple[int, str] | None:
        """Earliest stop string at or after ``start`` (text before it was already cleared)."""
        best: tuple[int, str] | None = None
        for stop_string in self._stop:
            index = self._output.find(stop_string, start)
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop_string)
        return best

    def _held_back_len(self) -> int:
        """Length of the longest output suffix that is a proper prefix of a stop string."""
        longest = 0
        for stop_string in self._stop:
            for size in range(min(len(stop_string) - 1, len(self._output)), longest, -1):
                if self._output.endswith(stop_string[:size]):
                    longest = size
                    break
        return longest
