"""``/v1/completions`` as evaluation harnesses call it, on a tiny Llama: ``echo`` with
``logprobs`` gives the prompt tokens' logprobs (Hugging Face's, the first ``null``), then
the generated tokens'; ``max_tokens`` 0 generates nothing; ``top_logprobs`` holds the
chosen token too; usage counts a prompt once however many choices it has; a streamed token
whose text is held back still gets its chunk (the first chunk marks the first token)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch
from openai.types import Completion
from openai.types.chat import ChatCompletion

from conveyor.config.settings import ServerConfig
from conveyor.endpoints.completions import (
    completion_chunks,
    parse_completion_request,
    prepare_completion,
)
from conveyor.engine.tokenizer import Tokenizer
from conveyor.host.service import Service
from conveyor.openai_paths import CHAT_COMPLETIONS, COMPLETIONS
from conveyor.priority import Priority
from tests.unit.model_helpers import HFReference, random_prompts, run_whole

pytestmark = [pytest.mark.anyio, pytest.mark.model]

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def service(llama_path: Path) -> AsyncIterator[Service]:
    tiny = {"name": "tiny", "kind": "generate", "path": str(llama_path), "block_size": 4,
            "kv_cache_tokens": 4096, "max_model_len": 128, "max_num_seqs": 8,
            "max_num_batched_tokens": 16}  # fmt: skip
    async with Service(ServerConfig.model_validate({"models": [tiny]})) as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer(llama_path: Path) -> Tokenizer:
    return Tokenizer(llama_path)


async def completion(service: Service, **body: Any) -> Completion:
    return Completion.model_validate(
        await run_whole(service, COMPLETIONS, {"model": "tiny", **body})
    )


def hf_prompt_logprobs(reference: HFReference, prompt: list[int]) -> list[float]:
    """Hugging Face's logprob of each prompt token after the first."""
    with torch.no_grad():
        logits = reference.model(torch.tensor([prompt])).logits[0].to(torch.float32)
    log_probs = torch.log_softmax(logits, dim=-1)
    return [log_probs[i, prompt[i + 1]].item() for i in range(len(prompt) - 1)]


async def echoed(service: Service, **body: Any) -> dict[str, Any]:
    """The raw body: OpenAI's types call the first token's null logprob invalid, though
    OpenAI's legacy completions answer so (as vLLM does)."""
    return await run_whole(service, COMPLETIONS, {"model": "tiny", "echo": True, **body})


async def test_echo_with_logprobs_and_max_tokens_0_scores_the_prompt(
    service: Service, tokenizer: Tokenizer, llama_reference: HFReference
) -> None:
    prompt = random_prompts([23], 512, seed=41)[0]  # longer than a step: prefilled in chunks
    result = await echoed(service, prompt=prompt, logprobs=2, max_tokens=0)
    (choice,) = result["choices"]
    assert choice["text"] == tokenizer.decode(prompt) and choice["finish_reason"] == "length"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [tokenizer.token_piece(token)[0] for token in prompt]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    wanted = hf_prompt_logprobs(llama_reference, prompt)
    assert logprobs["token_logprobs"][1:] == pytest.approx(wanted, abs=TOLERANCE)
    for token, value, top in zip(
        logprobs["tokens"][1:], logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:],
        strict=True,
    ):  # fmt: skip
        assert top[token] == value and 2 <= len(top) <= 3  # the top 2, and the prompt token
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and len(offsets) == 23
    assert result["usage"] == {"prompt_tokens": 23, "completion_tokens": 0, "total_tokens": 23}


async def test_echo_with_generation_gives_the_prompt_then_the_output(
    service: Service, tokenizer: Tokenizer, llama_reference: HFReference
) -> None:
    prompt = random_prompts([9], 512, seed=42)[0]
    result = await echoed(service, prompt=prompt, logprobs=1, max_tokens=4, temperature=0)
    (choice,) = result["choices"]
    generated = llama_reference.generate(prompt, 4)
    prompt_text = tokenizer.decode(prompt)
    assert choice["text"] == prompt_text + tokenizer.decode(generated)
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [tokenizer.token_piece(t)[0] for t in prompt + generated]
    assert logprobs["token_logprobs"][1:9] == pytest.approx(
        hf_prompt_logprobs(llama_reference, prompt), abs=TOLERANCE
    )
    assert logprobs["text_offset"][9] == len(prompt_text)  # the output starts after the echo


async def test_logprobs_0_names_the_chosen_token(service: Service) -> None:
    result = await completion(service, prompt="hello", max_tokens=3, logprobs=0, temperature=0)
    logprobs = result.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs and logprobs.tokens
    assert logprobs.token_logprobs is not None
    assert logprobs.top_logprobs == [
        {token: value}
        for token, value in zip(logprobs.tokens, logprobs.token_logprobs, strict=True)
    ]


async def test_max_tokens_0_without_echo_generates_nothing(service: Service) -> None:
    result = await completion(service, prompt="hello there", max_tokens=0)
    assert [(c.text, c.finish_reason, c.logprobs) for c in result.choices] == [("", "length", None)]
    assert result.usage is not None and result.usage.completion_tokens == 0


async def test_streamed_echo_carries_the_prompt_logprobs_in_the_first_chunk(
    service: Service,
) -> None:
    body = {"prompt": "The quick brown fox", "logprobs": 1, "max_tokens": 3, "temperature": 0}
    expected = (await echoed(service, **body))["choices"][0]
    streamed = {"model": "tiny", "echo": True, "stream": True, **body}
    run = await prepare_completion(service, parse_completion_request(streamed)).start(
        service, priority=Priority.ONLINE, timeout_ms=None
    )
    chunks = [chunk async for chunk in completion_chunks(run, include_usage=False)]
    run.close()
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == expected["text"]
    assert chunks[0]["choices"][0]["logprobs"]["token_logprobs"][0] is None
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        pieces = [chunk["choices"][0]["logprobs"] or {} for chunk in chunks]
        assert [value for piece in pieces for value in piece.get(key, [])] == expected["logprobs"][
            key
        ], key


async def test_usage_counts_each_prompt_once_whatever_its_choices(service: Service) -> None:
    prompts = random_prompts([31, 5], 512, seed=43)
    result = await completion(service, prompt=prompts[0], n=3, max_tokens=2)
    assert result.usage is not None and result.usage.prompt_tokens == 31
    both = await completion(service, prompt=prompts, n=3, max_tokens=2, ignore_eos=True)
    assert len(both.choices) == 6 and both.usage is not None
    assert both.usage.prompt_tokens == 36 and both.usage.completion_tokens == 12
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 3,
            "max_completion_tokens": 2}  # fmt: skip
    single = ChatCompletion.model_validate(await run_whole(service, CHAT_COMPLETIONS, body))
    triple = ChatCompletion.model_validate(
        await run_whole(service, CHAT_COMPLETIONS, {**body, "n": 1})
    )
    assert single.usage is not None and triple.usage is not None
    assert single.usage.prompt_tokens == triple.usage.prompt_tokens


async def test_every_choice_of_an_echoed_prompt_carries_its_logprobs(service: Service) -> None:
    result = await echoed(
        service, prompt="one two three four", logprobs=1, max_tokens=2, n=2, ignore_eos=True
    )
    first, second = (choice["logprobs"] for choice in result["choices"])
    num_prompt = result["usage"]["prompt_tokens"]
    for key in ("tokens", "text_offset"):
        assert first[key][:num_prompt] == second[key][:num_prompt]
    # The same values up to float rounding: each choice's prompt is computed as rows of its
    # own, and a CPU's matmul may round rows in different places differently (on an AMD
    # EPYC host they differed in the seventh digit).
    one, other = first["token_logprobs"][:num_prompt], second["token_logprobs"][:num_prompt]
    assert one[0] is None and other[0] is None
    assert one[1:] == pytest.approx(other[1:], abs=TOLERANCE)
    assert len(first["tokens"]) == len(second["tokens"]) == num_prompt + 2


async def test_a_streamed_token_whose_text_is_held_back_still_gets_its_chunk(
    service: Service,
) -> None:
    body = {"prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0}
    whole = (await completion(service, logprobs=1, **body)).choices[0]
    assert whole.logprobs is not None and whole.logprobs.tokens
    # A stop string that starts with the first token's text and never occurs: that text is
    # held back after the first token, as a possible start of the stop string.
    stop = whole.logprobs.tokens[0] + "\x00never"
    streamed = {"model": "tiny", "stream": True, "stop": stop, **body}
    run = await prepare_completion(service, parse_completion_request(streamed)).start(
        service, priority=Priority.ONLINE, timeout_ms=None
    )
    chunks = [chunk async for chunk in completion_chunks(run, include_usage=False)]
    run.close()
    first = chunks[0]["choices"][0]
    assert (first["text"], first["finish_reason"]) == ("", None)
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == whole.text
