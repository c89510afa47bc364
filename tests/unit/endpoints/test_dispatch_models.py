"""The endpoint layer batch jobs use (``endpoints.execute``) on an in-process Service that
hosts a tiny generative model beside a synthetic embedding model. Response bodies are
checked against the official ``openai`` types."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from conveyor.config.settings import ServerConfig
from conveyor.endpoints.dispatch import execute
from conveyor.engine.tokenizer import Tokenizer
from conveyor.errors import InvalidRequest, ModelNotFound
from conveyor.host.service import Service
from conveyor.openai_paths import CHAT_COMPLETIONS, COMPLETIONS, EMBEDDINGS
from conveyor.priority import Priority
from tests.unit.model_helpers import HFReference, random_prompts, wait_idle

# `model`: runs a real (tiny) torch model, so mutation runs leave it out.
pytestmark = [pytest.mark.anyio, pytest.mark.model]

MAX_MODEL_LEN = 128


@pytest.fixture
async def service(llama_path: Path) -> AsyncIterator[Service]:
    config = ServerConfig.model_validate(
        {
            "models": [
                {
                    "name": "tiny",
                    "kind": "generate",
                    "path": str(llama_path),
                    "kv_cache_tokens": 2048,
                    "block_size": 4,
                    "max_model_len": MAX_MODEL_LEN,
                    "max_num_seqs": 8,
                    "max_num_batched_tokens": 64,
                },
                {"name": "syn", "kind": "synthetic", "batch_latency_ms": 0},
            ]
        }
    )
    async with Service(config) as running:
        yield running


async def completion(service: Service, **body: Any) -> Completion:
    result = await execute(service, COMPLETIONS, {"model": "tiny", **body})
    return Completion.model_validate(result)


async def test_completion_matches_hf_and_reports_usage(
    service: Service, llama_path: Path, llama_reference: HFReference
) -> None:
    prompt = random_prompts([10], 512, seed=21)[0]
    result = await completion(service, prompt=prompt, max_tokens=9, temperature=0)
    reference = llama_reference.generate(prompt, 9)
    (choice,) = result.choices
    assert choice.text == Tokenizer(llama_path).decode(reference)
    assert choice.finish_reason == "length"
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (10, 9)
    assert result.usage.total_tokens == 19
    assert result.object == "text_completion" and result.id.startswith("cmpl-")


async def test_several_prompts_give_one_choice_each(service: Service) -> None:
    # Sampled without a seed, so EOS may come early: ignore it to make the count exact.
    result = await completion(
        service, prompt=["hello", "the quick brown fox"], max_tokens=3, ignore_eos=True
    )
    assert [choice.index for choice in result.choices] == [0, 1]
    assert result.usage is not None and result.usage.completion_tokens == 6


async def test_completion_logprobs(service: Service) -> None:
    result = await completion(service, prompt="hello", max_tokens=4, temperature=0, logprobs=2)
    logprobs = result.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens is not None and len(logprobs.tokens) == 4
    assert logprobs.token_logprobs is not None and all(v <= 0 for v in logprobs.token_logprobs)
    assert logprobs.top_logprobs is not None and all(len(t) <= 2 for t in logprobs.top_logprobs)
    assert logprobs.text_offset is not None and logprobs.text_offset[0] == 0


async def test_chat_uses_the_template(service: Service, llama_path: Path) -> None:
    messages = [{"role": "user", "content": "hi"}]
    # Sampled without a seed, so EOS may come early: ignore it to make the count exact.
    body = {
        "model": "tiny",
        "messages": messages,
        "max_completion_tokens": 5,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": 1,
    }
    result = ChatCompletion.model_validate(
        await execute(service, CHAT_COMPLETIONS, body, priority=Priority.BATCH)
    )
    prompt = Tokenizer(llama_path).apply_chat_template(messages)
    (choice,) = result.choices
    assert choice.message.role == "assistant"
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert len(choice.logprobs.content) == 5 and choice.finish_reason == "length"
    assert result.usage is not None and result.usage.prompt_tokens == len(prompt)
    assert result.object == "chat.completion" and result.id.startswith("chatcmpl-")


async def test_chat_without_a_limit_fills_the_context(service: Service) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "ignore_eos": True,
        "temperature": 0,
    }
    result = ChatCompletion.model_validate(await execute(service, CHAT_COMPLETIONS, body))
    assert result.usage is not None
    assert result.usage.total_tokens == MAX_MODEL_LEN
    assert result.choices[0].finish_reason == "length"
    await wait_idle(service.generators["tiny"].engine)
    assert service.generators["tiny"].engine.num_used_blocks == 0


@pytest.mark.parametrize(
    ("endpoint", "body", "error", "message"),
    [
        (COMPLETIONS, {"model": "tiny", "prompt": [5] * MAX_MODEL_LEN}, InvalidRequest,
         "maximum context length is 128 tokens"),
        (COMPLETIONS, {"model": "tiny", "prompt": [5] * 100, "max_tokens": 29}, InvalidRequest,
         "you requested 129 (100 in the prompt, 29 for the output)"),
        (COMPLETIONS, {"model": "tiny", "prompt": [5, 512]}, InvalidRequest, "token ids must be"),
        (COMPLETIONS, {"model": "tiny", "prompt": "x", "stop_token_ids": [600]}, InvalidRequest,
         "below the vocabulary size"),
        (COMPLETIONS, {"model": "tiny", "prompt": "x", "stream": True}, InvalidRequest,
         "stream: true is not supported here"),
        (COMPLETIONS, {"model": "nope", "prompt": "x"}, ModelNotFound, "does not exist"),
        (COMPLETIONS, {"model": "syn", "prompt": "x"}, InvalidRequest, "is an embedding model"),
        (CHAT_COMPLETIONS, {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                            "max_tokens": 500}, InvalidRequest, "maximum context length"),
        (EMBEDDINGS, {"model": "tiny", "input": "x"}, InvalidRequest, "is a generative model"),
    ],
)  # fmt: skip
async def test_bad_requests(
    service: Service, endpoint: str, body: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        await execute(service, endpoint, body)


@pytest.fixture
async def capped(llama_path: Path) -> AsyncIterator[Service]:
    """The tiny model with a small ``max_input_bytes`` (the default is 32 bytes a token)."""
    tiny = {"name": "tiny", "kind": "generate", "path": str(llama_path), "kv_cache_tokens": 512,
            "block_size": 4, "max_model_len": MAX_MODEL_LEN, "max_num_seqs": 2,
            "max_num_batched_tokens": 64, "max_input_bytes": 300}  # fmt: skip
    async with Service(ServerConfig.model_validate({"models": [tiny]})) as running:
        yield running


def count_encodes(service: Service, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts the tiny model's tokenizer is asked to encode from now on."""
    tokenizer = service.generator("tiny").tokenizer
    encode = tokenizer.encode
    seen: list[str] = []

    def counted(text: str, **kwargs: Any) -> list[int]:
        seen.append(text)
        return encode(text, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", counted)
    return seen


async def test_text_over_max_input_bytes_is_refused_before_tokenizing(
    capped: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded = count_encodes(capped, monkeypatch)
    text = "hello " * 60  # 360 bytes, about 120 tokens: under the context, over the cap
    with pytest.raises(InvalidRequest, match="max_input_bytes") as caught:
        await execute(capped, COMPLETIONS, {"model": "tiny", "prompt": text})
    assert caught.value.param == "prompt" and "360 bytes" in caught.value.message
    chat = {"model": "tiny", "messages": [{"role": "user", "content": text}]}
    with pytest.raises(InvalidRequest, match="max_input_bytes") as caught:
        await execute(capped, CHAT_COMPLETIONS, chat)
    assert caught.value.param == "messages"
    assert encoded == []


async def test_prompts_stop_at_the_first_that_does_not_fit(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded = count_encodes(service, monkeypatch)
    too_long = "hello world " * 50  # 600 bytes, 353 tokens: only tokenizing tells
    with pytest.raises(InvalidRequest, match="maximum context length"):
        await completion(service, prompt=[too_long] + ["the quick brown fox " * 30] * 20)
    assert encoded == [too_long]


async def test_an_id_prompt_over_the_context_is_refused_before_its_ids_are_checked(
    service: Service,
) -> None:
    with pytest.raises(InvalidRequest, match="maximum context length") as caught:
        await completion(service, prompt=[10**6] * (MAX_MODEL_LEN + 1))
    assert caught.value.code == "context_length_exceeded"


async def test_an_embedding_text_over_max_input_bytes_is_refused_or_cut(service: Service) -> None:
    word = "a" * 20_000  # one word: one token to the synthetic model, 20000 bytes to the cap
    with pytest.raises(InvalidRequest, match="max_input_bytes") as caught:
        await execute(service, EMBEDDINGS, {"model": "syn", "input": ["ok", word]})
    assert caught.value.param == "input" and "input[1] is 20000 bytes" in caught.value.message
    cut = await execute(service, EMBEDDINGS, {"model": "syn", "input": word, "truncate": True})
    assert cut["usage"]["prompt_tokens"] == 1
