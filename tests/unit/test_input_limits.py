"""The byte cap on text inputs: sizes in UTF-8, cuts on whole characters, the default."""

from __future__ import annotations

import pytest

from conveyor.config.model_config import INPUT_BYTES_PER_TOKEN
from conveyor.errors import InvalidRequest
from conveyor.input_limits import check_text_bytes, cut_to_bytes, input_byte_limit, utf8_size


def test_sizes_are_utf8_bytes() -> None:
    assert utf8_size("abc") == 3
    assert utf8_size("é€😀") == 2 + 3 + 4
    assert utf8_size("\ud800") == 3  # a lone surrogate, which JSON may carry


def test_a_cut_keeps_whole_characters_within_the_limit() -> None:
    assert cut_to_bytes("abcdef", 4) == "abcd"
    assert cut_to_bytes("€€€", 7) == "€€"  # 6 bytes: a third € would not fit
    assert cut_to_bytes("short", 100) == "short"


def test_the_default_limit_is_bytes_per_token_of_the_token_limit() -> None:
    assert input_byte_limit(None, 512) == 512 * INPUT_BYTES_PER_TOKEN
    assert input_byte_limit(1000, 512) == 1000


def test_over_the_limit_is_a_400_naming_the_param() -> None:
    check_text_bytes(10, 10, subject="the prompt", param="prompt", hint="shorten it")
    with pytest.raises(InvalidRequest, match="the prompt is 11 bytes") as caught:
        check_text_bytes(11, 10, subject="the prompt", param="prompt", hint="shorten it")
    assert caught.value.param == "prompt" and "max_input_bytes" in caught.value.message
