"""JSON in pieces: the same bytes as orjson, no one piece much larger than a slice."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from conveyor.endpoints import large_json
from conveyor.endpoints.large_json import PIECE_ITEMS, dumps_in_pieces

ENTRY = {"token": "tok", "logprob": -0.25, "bytes": (116, 111, 107),
         "top_logprobs": [{"token": "a", "logprob": -1.5, "bytes": (97,)}] * 5}  # fmt: skip


def answer(num_choices: int, num_tokens: int) -> dict[str, Any]:
    """A chat answer's shape: choices, each with a logprobs entry per token."""
    choice = {"index": 0, "message": {"role": "assistant", "content": "x" * num_tokens},
              "logprobs": {"content": [ENTRY] * num_tokens, "refusal": None}}  # fmt: skip
    return {"id": "c", "choices": [choice] * num_choices, "usage": {"total_tokens": 7}}


@pytest.mark.parametrize(
    "value",
    [answer(3, 5 * PIECE_ITEMS + 7), answer(1, 0), {}, [], {"a": []}, [[1, 2], [3]],
     ["é", None, True, 1.5, {"k": (1, 2)}], 4, "text"],
)  # fmt: skip
def test_the_bytes_are_what_orjson_writes(value: Any) -> None:
    assert dumps_in_pieces(value) == orjson.dumps(value)


def test_a_long_list_is_written_a_slice_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each orjson call, which holds the interpreter lock throughout, stays small."""
    sizes: list[int] = []
    dumps = orjson.dumps

    def measured(value: Any) -> bytes:
        written = dumps(value)
        sizes.append(len(written))
        return written

    monkeypatch.setattr(large_json.orjson, "dumps", measured)
    value = answer(4, 20 * PIECE_ITEMS)
    whole = dumps(value)
    assert dumps_in_pieces(value) == whole
    slice_bytes = len(dumps([ENTRY] * PIECE_ITEMS))
    assert max(sizes) <= slice_bytes < len(whole) / 50
