"""``VllmEngine`` over a stand-in for vLLM's ``AsyncLLM`` that replays scripted deltas:
outputs and text as Conveyor's engine builds them, stop strings ending (and aborting) the
request, a closed stream cancelling it, vLLM's errors as Conveyor's, priorities passed on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conveyor.engine.core.engine_config import EngineConfig
from conveyor.engine.generator import HostedGenerator
from conveyor.engine.outputs import FinishReason
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.tokenizer import Tokenizer
from conveyor.engine.vllm_engine import VllmEngine
from conveyor.errors import InvalidRequest, ModelFault
from conveyor.observability.metrics import Metrics
from conveyor.priority import Priority


@dataclass
class Completion:
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[dict[int, Any]] | None = None


@dataclass
class Delta:
    outputs: list[Completion]
    finished: bool = False
    prompt_logprobs: Any = None


class ValueErrorFromVllm(ValueError):
    """Stands for vLLM's VLLMValidationError (a ValueError)."""


@dataclass
class FakeLLM:
    """Replays ``script`` (deltas, or an exception) for every request; records what it saw."""

    script: list[Delta | Exception]
    hold: asyncio.Event | None = None
    seen: list[tuple[str, int, Any]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    async def generate(
        self, prompt: Any, params: Any, request_id: str, *, priority: int
    ) -> AsyncIterator[Delta]:
        self.seen.append((request_id, priority, params))
        try:
            for item in self.script:
                if isinstance(item, Exception):
                    raise item
                yield item
                if self.hold is not None:
                    await self.hold.wait()
        finally:
            self.closed.append(request_id)

    def shutdown(self) -> None:
        pass


def hosted(llama_path: Path, llm: FakeLLM) -> HostedGenerator:
    from conveyor.config.model_config import GenerateModelConfig

    tokenizer = Tokenizer(llama_path)
    metrics = Metrics().for_generator("m")
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                          num_kv_blocks=16, block_size=16)  # fmt: skip
    engine = VllmEngine(llm, dict, tokenizer, config, eos_token_ids=frozenset({0}),
                        metrics=metrics, name="m")  # fmt: skip
    model = GenerateModelConfig(kind="generate", name="m", path=llama_path, engine="vllm")
    return HostedGenerator(model, engine, tokenizer, metrics, tokenizer.vocab_size, 0)


async def collect(generator: HostedGenerator, params: SamplingParams, **kw: Any) -> list[Any]:
    stream = generator.submit([[5, 6, 7]], params, **kw)
    return [output async for output in stream]


def test_deltas_become_conveyors_outputs_with_text_and_counts(llama_path: Path) -> None:
    llm = FakeLLM([Delta([Completion([11, 12])]), Delta([Completion([13], "length")], True)])
    generator = hosted(llama_path, llm)
    outputs = asyncio.run(collect(generator, SamplingParams(max_tokens=3),
                                  priority=Priority.BATCH))  # fmt: skip
    assert [o.token_ids for o in outputs] == [(11,), (12,), (13,)]
    assert outputs[-1].finish_reason is FinishReason.LENGTH
    assert outputs[-1].num_output_tokens == 3 and outputs[-1].num_prompt_tokens == 3
    decoded = Tokenizer(llama_path).decode([11, 12, 13])
    assert "".join(o.text for o in outputs) == decoded
    (_, priority, params) = llm.seen[0]
    assert priority == int(Priority.BATCH) and params["max_tokens"] == 3
    assert generator.engine.num_waiting == 0


def test_a_stop_string_ends_the_request_and_leaves_vllm(llama_path: Path) -> None:
    tokenizer = Tokenizer(llama_path)
    stop = tokenizer.decode([12])
    llm = FakeLLM([Delta([Completion([11, 12, 13])]), Delta([Completion([14])])])
    generator = hosted(llama_path, llm)
    params = SamplingParams(max_tokens=10, stop=[stop])
    outputs = asyncio.run(collect(generator, params))
    assert outputs[-1].finish_reason is FinishReason.STOP and outputs[-1].stop_string == stop
    assert len(outputs) == 2  # token 13 came in the same delta: dropped
    assert llm.closed == [llm.seen[0][0]]  # the generator was closed: vLLM aborts


def test_closing_the_stream_cancels_the_request(llama_path: Path) -> None:
    async def scenario() -> FakeLLM:
        llm = FakeLLM([Delta([Completion([11])]), Delta([Completion([12], "length")], True)])
        llm.hold = asyncio.Event()
        generator = hosted(llama_path, llm)
        stream = generator.submit([[5, 6]], SamplingParams(max_tokens=5))
        assert (await stream.get()) is not None
        stream.close()
        for _ in range(5):
            await asyncio.sleep(0)
        assert llm.closed == [llm.seen[0][0]]
        return llm

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("error", "kind"),
    [(ValueErrorFromVllm("bad grammar"), InvalidRequest), (RuntimeError("boom"), ModelFault)],
)
def test_vllms_errors_become_conveyors(
    llama_path: Path, error: Exception, kind: type[Exception]
) -> None:
    generator = hosted(llama_path, FakeLLM([error]))
    with pytest.raises(kind):
        asyncio.run(collect(generator, SamplingParams(max_tokens=3)))


def test_an_end_vllm_cannot_name_is_a_fault(llama_path: Path) -> None:
    generator = hosted(llama_path, FakeLLM([Delta([Completion([11], "abort")], True)]))
    with pytest.raises(ModelFault, match="without finishing"):
        asyncio.run(collect(generator, SamplingParams(max_tokens=3)))


def test_prompt_logprobs_only_drops_the_token_it_ran(llama_path: Path) -> None:
    @dataclass
    class Logprob:
        logprob: float
        rank: int

    positions = [None, {6: Logprob(-1.0, 1)}, {7: Logprob(-2.0, 3), 6: Logprob(-0.1, 1)}]
    llm = FakeLLM([Delta([Completion([11], "length")], True, positions)])
    generator = hosted(llama_path, llm)
    outputs = asyncio.run(collect(generator, SamplingParams(max_tokens=0, prompt_logprobs=1)))
    (only,) = outputs
    assert only.token_ids == () and only.finish_reason is FinishReason.LENGTH
    assert only.prompt_logprobs is not None
    assert [e.logprob for e in only.prompt_logprobs.entries] == [-1.0, -2.0]


def test_lora_adapters_are_refused_not_yet(llama_path: Path) -> None:
    generator = hosted(llama_path, FakeLLM([]))
    with pytest.raises(ValueError, match="not served on engine: vllm yet"):
        generator.engine.new_request("r", [1, 2], SamplingParams(), adapter_id=3)
