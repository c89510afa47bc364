"""The llama.cpp server shim's one pure piece: chat content of text parts joined."""

from __future__ import annotations

from bench.llamacpp_server import text_only_messages


def test_text_parts_are_joined_and_other_contents_kept() -> None:
    image = [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "a"}]
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}],
        },
        {"role": "user", "content": image},
        {"role": "assistant", "content": None},
    ]
    assert text_only_messages(messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "user", "content": image},
        {"role": "assistant", "content": None},
    ]
    assert messages[1]["content"][0] == {"type": "text", "text": "hel"}  # not changed in place
