"""Tokenizer wrapper and the streaming Detokenizer (split characters, stop strings)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from conveyor.engine.tokenizer import Tokenizer
from conveyor.fakes.checkpoints import build_tiny_tokenizer

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

TEXT = "Café 🙂 naïve 日本語 and the quick brown fox ✨ done."


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    build_tiny_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer(tokenizer_dir)


def _stream(tokenizer: Tokenizer, ids: list[int], stop: tuple[str, ...] = ()) -> list[str]:
    detokenizer = tokenizer.detokenizer(stop=stop)
    pieces = [detokenizer.add_token(token).text for token in ids]
    pieces.append(detokenizer.flush())
    return pieces


def test_encode_adds_bos_and_matches_hugging_face(
    tokenizer: Tokenizer, tokenizer_dir: Path
) -> None:
    ids = tokenizer.encode("hello there")
    assert ids[0] == tokenizer.bos_token_id
    assert ids == AutoTokenizer.from_pretrained(str(tokenizer_dir)).encode("hello there")
    assert tokenizer.decode(ids) == "hello there"
    assert tokenizer.encode("hello there", add_special_tokens=False) == ids[1:]


def test_chat_template_ends_with_the_assistant_prompt(tokenizer: Tokenizer) -> None:
    ids = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    )
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=False) == (
        "<s>system: Be brief.</s>user: hi</s>assistant:"
    )


def test_streaming_pieces_join_to_the_full_decode(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    pieces = _stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == TEXT
    # Some tokens end mid-character and must yield nothing until the character completes.
    assert "" in pieces[:-1]
    assert all("\ufffd" not in piece for piece in pieces)


def test_special_tokens_are_not_streamed(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("hi there")  # starts with BOS
    eos = tokenizer.eos_token_id
    assert eos is not None
    assert "".join(_stream(tokenizer, [*ids, eos])) == "hi there"


def test_prompt_context_does_not_leak_into_the_output(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("user: hello")
    output = tokenizer.encode(" world", add_special_tokens=False)
    detokenizer = tokenizer.detokenizer(prompt_ids=prompt)
    text = "".join(detokenizer.add_token(token).text for token in output) + detokenizer.flush()
    assert text == " world"


def test_trailing_incomplete_character_is_flushed(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("ok 🙂", add_special_tokens=False)
    detokenizer = tokenizer.detokenizer()
    streamed = "".join(detokenizer.add_token(token).text for token in ids[:-1])
    assert "".join([streamed, detokenizer.flush()]) == tokenizer.decode(ids[:-1])


def test_stop_string_truncates_and_ends_the_stream(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    detokenizer = tokenizer.detokenizer(stop=["quick", "日本"])
    streamed = []
    for token in ids:
        step = detokenizer.add_token(token)
        streamed.append(step.text)
        if step.is_stopped:
            assert step.stop_string == "日本"  # the earlier of the two in the text
            break
    assert detokenizer.is_stopped and detokenizer.stop_string == "日本"
    assert "".join(streamed) == detokenizer.text == "Café 🙂 naïve "
    assert detokenizer.add_token(ids[0]).is_stopped
    assert detokenizer.flush() == ""


def test_stop_string_prefix_is_held_back_until_resolved(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("the quick brown fox", add_special_tokens=False)
    # "quick brown" could still become the stop string until " fox" arrives, so none of
    # it is streamed before then: nothing of a stop string ever reaches the client.
    detokenizer = tokenizer.detokenizer(stop=["quick brown cat"])
    streamed = ""
    for token in ids:
        streamed += detokenizer.add_token(token).text
        if "f" not in detokenizer.text:
            assert "q" not in streamed
    assert streamed + detokenizer.flush() == "the quick brown fox"
    assert not detokenizer.is_stopped


def test_stop_string_spanning_tokens(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("the quick brown fox", add_special_tokens=False)
    pieces = _stream(tokenizer, ids, stop=("ck br",))
    assert "".join(pieces) == "the qui"


def test_empty_stop_string_is_rejected(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="stop"):
        tokenizer.detokenizer(stop=[""])


@pytest.mark.parametrize(
    "text",
    [
        "hello world " * 50,
        "the quick brown fox jumps over the lazy dog",
        "naïve café — 東京 and 🙂🙂🙂 with accents: déjà vu",
        " " * 300,
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "<s></s><unk>" * 20,
    ],
)
def test_min_tokens_never_exceeds_the_real_count(tokenizer: Tokenizer, text: str) -> None:
    """The length bound used to refuse huge prompts untokenized is a true lower bound."""
    assert tokenizer.min_tokens(len(text)) <= len(tokenizer.encode(text, add_special_tokens=False))
    assert tokenizer.max_token_chars >= 1


def test_a_token_piece_is_decoded_once(tokenizer_dir: Path) -> None:
    """Logprobs name a token and its alternatives at every step: each is decoded once."""
    tokenizer = Tokenizer(tokenizer_dir)
    ids = tokenizer.encode(TEXT)
    expected = [tokenizer.decode([token], skip_special_tokens=False) for token in ids]
    decoded: list[list[int]] = []
    decode = tokenizer.hf.decode
    tokenizer.hf.decode = lambda ids, **kwargs: decoded.append(ids) or decode(ids, **kwargs)
    pieces = [tokenizer.token_piece(token) for token in ids + ids]
    assert [text for text, _ in pieces] == expected + expected
    assert [bytes(raw) for _, raw in pieces] == [text.encode() for text in expected * 2]
    assert len(decoded) == len(set(ids))
