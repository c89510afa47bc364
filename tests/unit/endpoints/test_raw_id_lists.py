"""Token-id lists counted in a raw JSON body: what is counted, and what is left to parsing."""

from __future__ import annotations

import json

import orjson
import pytest

from conveyor.endpoints import raw_id_lists
from conveyor.endpoints.raw_id_lists import MAX_COUNTED_LISTS, count_id_lists


def body(**fields: object) -> bytes:
    return orjson.dumps({"model": "m", **fields})


def test_a_flat_list_is_counted_and_the_other_fields_are_parsed() -> None:
    counted = count_id_lists(body(prompt=list(range(1000)), max_tokens=3), "prompt")
    assert counted is not None
    assert counted.sizes == [1000]
    assert counted.fields == {"model": "m", "max_tokens": 3}


def test_each_list_of_a_list_of_lists_is_counted_in_order() -> None:
    counted = count_id_lists(body(prompt=[[1, 2, 3], [4], [], [-5, 6]]), "prompt")
    assert counted is not None and counted.sizes == [3, 1, 0, 2]


def test_an_empty_list_counts_zero() -> None:
    counted = count_id_lists(body(prompt=[]), "prompt")
    assert counted is not None and counted.sizes == [0]


@pytest.mark.parametrize("indent", [None, 2])
def test_whitespace_around_every_token_is_allowed(indent: int | None) -> None:
    text = json.dumps({"prompt": [[1, 2], [3, 4, 5]], "model": "m"}, indent=indent)
    counted = count_id_lists(text.replace(":", " :\t").encode(), "prompt")
    assert counted is not None and counted.sizes == [2, 3]
    assert counted.fields == {"model": "m"}


def test_the_top_level_field_is_counted_past_a_nested_namesake() -> None:
    raw = body(metadata={"prompt": [9, 9]}, prompt=[1, 2, 3, 4])
    counted = count_id_lists(raw, "prompt")
    assert counted is not None and counted.sizes == [4]
    assert counted.fields["metadata"] != {"prompt": [9, 9]}  # left out too: never read


@pytest.mark.parametrize(
    "raw",
    [
        body(prompt="text"),  # not a list
        body(prompt=["a", "b"]),  # strings
        body(prompt=[1.5, 2]),  # floats
        body(prompt=[[1, 2], "a"]),  # a list of lists with something else
        body(prompt=[[1, 2], [3, "a"]]),
        body(metadata={"prompt": [1, 2, 3]}, prompt="text"),  # ids only in a nested namesake
        body(note='"prompt": [1, 2, 3]'),  # the name and a list inside a string
        body(**{'a"prompt': [1, 2, 3]}),  # the name at the end of another key
        b'{"model": "m", "prompt": [1, 2, 3], "prompt": "text"}',  # the last one counts
        b'{"model": "m", "prompt": [1, 2, 3]',  # not JSON
        b'[{"prompt": [1, 2, 3]}]',  # not an object
        b'{"model": "m", "prompt": [1, 2, 3]7}',  # glued to a number
        body(prompt=[[1]] * (MAX_COUNTED_LISTS + 1)),  # more lists than are counted
        b'{"prompt": [1, 2, 3',  # never closed
        b'{"prompt": [[1, 2], [3',
    ],
)
def test_anything_else_is_left_to_the_parse(raw: bytes) -> None:
    assert count_id_lists(raw, "prompt") is None


def test_a_list_of_as_many_lists_as_are_counted_is_counted() -> None:
    counted = count_id_lists(body(prompt=[[1]] * MAX_COUNTED_LISTS), "prompt")
    assert counted is not None and counted.sizes == [1] * MAX_COUNTED_LISTS


def test_an_escaped_backslash_before_the_name_does_not_hide_it() -> None:
    raw = b'{"note": "a\\\\", "prompt": [1, 2], "model": "m"}'
    assert json.loads(raw)["note"] == "a\\"
    counted = count_id_lists(raw, "prompt")
    assert counted is not None and counted.sizes == [2]


def test_a_client_cannot_pass_its_own_number_off_as_the_list() -> None:
    """The list is replaced by a random number; a number the client wrote is not it."""
    raw = b'{"metadata": {"prompt": [1, 2, 3]}, "prompt": 12345}'
    assert count_id_lists(raw, "prompt") is None


@pytest.mark.parametrize("window_bytes", [1, 3, 7])
def test_a_list_read_a_window_at_a_time_counts_the_same(
    monkeypatch: pytest.MonkeyPatch, window_bytes: int
) -> None:
    monkeypatch.setattr(raw_id_lists, "WINDOW_BYTES", window_bytes)
    counted = count_id_lists(body(prompt=[[10, 200, 3000], [], [1] * 9]), "prompt")
    assert counted is not None and counted.sizes == [3, 0, 9]
    blank = count_id_lists(b'{"model": "m", "prompt": [        ]}', "prompt")
    assert blank is not None and blank.sizes == [0]
    assert count_id_lists(body(prompt=[1] * 20 + [1.5]), "prompt") is None  # in the last window
