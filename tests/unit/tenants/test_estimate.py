"""What a request body asks of the buckets: estimated input, reserved output."""

from __future__ import annotations

from typing import Any

from conveyor.tenants.estimate import TokenAsk, ask_of


def ask(path: str, body: dict[str, Any]) -> TokenAsk | None:
    return ask_of(body, path, default_max_tokens=500)


def test_embeddings_reserve_no_output_and_count_token_ids_exactly() -> None:
    assert ask("/v1/embeddings", {"model": "e", "input": "abcdefgh"}) == TokenAsk("e", 2, 0)
    assert ask("/v1/embeddings", {"model": "e", "input": [[1, 2, 3], [4]]}) == TokenAsk("e", 4, 0)
    assert ask("/v1/embeddings", {"model": "e", "input": ["abcd", "abcde"]}) == TokenAsk("e", 3, 0)


def test_completions_reserve_max_tokens_per_prompt_and_choice() -> None:
    body = {"model": "g", "prompt": ["abcd", "abcd"], "max_tokens": 10, "n": 3}
    assert ask("/v1/completions", body) == TokenAsk("g", 2, 60)
    assert ask("/v1/completions", {"model": "g", "prompt": [1, 2]}) == TokenAsk("g", 2, 16)


def test_chat_reserves_max_completion_tokens_or_the_default() -> None:
    messages = [{"role": "user", "content": "abcdefgh"}]
    body = {"model": "g", "messages": messages, "max_completion_tokens": 7}
    assert ask("/v1/chat/completions", body) == TokenAsk("g", 6, 7)
    assert ask("/v1/chat/completions", {"model": "g", "messages": messages}) == TokenAsk(
        "g", 6, 500
    )


def test_a_body_without_a_model_is_left_to_the_endpoint() -> None:
    assert ask("/v1/embeddings", {"input": "x"}) is None
    assert ask("/v1/embeddings", {"model": 3, "input": "x"}) is None


def test_text_is_counted_by_its_utf8_bytes_and_odd_lists_by_their_texts() -> None:
    assert ask("/v1/embeddings", {"model": "e", "input": "é" * 4}) == TokenAsk("e", 2, 0)
    assert ask("/v1/embeddings", {"model": "e", "input": ["日本", "abcd"]}) == TokenAsk("e", 3, 0)
    assert ask("/v1/embeddings", {"model": "e", "input": [1, "abcd", None]}) == TokenAsk("e", 1, 0)
    assert ask("/v1/embeddings", {"model": "e", "input": []}) == TokenAsk("e", 0, 0)


def test_responses_count_instructions_and_items_and_reserve_max_output_tokens() -> None:
    body = {"model": "g", "instructions": "abcd", "input": "abcdefgh", "max_output_tokens": 40}
    assert ask("/v1/responses", body) == TokenAsk("g", 3, 40)
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "abcdefgh"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "abcd"},
        {"type": "function_call_output", "call_id": "c", "output": "abcd"},
        "not an item",
    ]
    assert ask("/v1/responses", {"model": "g", "input": items}) == TokenAsk("g", 3 * 4 + 4, 500)


def test_anthropic_messages_count_system_text_and_tool_results_and_reserve_max_tokens() -> None:
    body = {
        "model": "g", "max_tokens": 9, "system": [{"type": "text", "text": "abcdefgh"}],
        "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": "abcd"},
            {"type": "tool_result", "tool_use_id": "u", "content": [{"type": "text", "text": "abcd"}]},
            {"type": "text", "text": "abcd"}]}],
    }  # fmt: skip
    assert ask("/v1/messages", body) == TokenAsk("g", 4 + 3 + 2, 9)
