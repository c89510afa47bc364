"""A model's tokenizer as ``/tokenize`` and ``/detokenize`` use it: text ↔ token ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.errors import InvalidRequest
from conveyor.input_limits import check_text_bytes, utf8_size


@dataclass(slots=True, frozen=True)
class TextTokenizer:
    """A Hugging Face tokenizer, the longest input its model takes, and its byte cap."""

    hf: Any
    max_model_len: int
    max_input_bytes: int

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Token ids of ``text``; 400 for a text over ``max_input_bytes``, untokenized."""
        check_text_bytes(
            utf8_size(text), self.max_input_bytes, subject="the prompt", param="prompt",
            hint="send it in parts",
        )  # fmt: skip
        ids = self.hf(text, add_special_tokens=add_special_tokens, truncation=False)["input_ids"]
        return [int(token) for token in ids]

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        """Each id's token as the vocabulary spells it."""
        return [str(token) for token in self.hf.convert_ids_to_tokens(list(ids))]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens included (as vLLM's ``/detokenize``)."""
        num_ids = len(self.hf)
        bad = next((token for token in ids if not 0 <= token < num_ids), None)
        if bad is not None:
            raise InvalidRequest(
                f"token id {bad} is outside this model's vocabulary (0..{num_ids - 1})",
                param="tokens",
            )
        text: str = self.hf.decode(list(ids), skip_special_tokens=False)
        return text
