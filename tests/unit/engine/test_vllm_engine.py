"""``VllmEngine`` over a stand-in for vLLM's ``AsyncLLM`` that replays scripted deltas:
outputs and text as Conveyor's engine builds them, stop strings ending (and aborting) the
request, a closed stream cancelling it, vLLM's errors as Conveyor's, priorities passed on;
LoRA adapters added to vLLM once and named in their requests, removed on unload."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conveyor.engine.core.engine_config import EngineConfig
from conveyor.engine.generator import HostedGenerator
from conveyor.engine.model.lora.files import AdapterError
from conveyor.engine.model.lora.registry import LoraRegistry
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
    loras: list[Any] = field(default_factory=list)  # each request's lora_request
    added: list[Any] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    refuse_adds: int = 0  # how many add_lora calls fail (as vLLM's worker failing to load)

    async def generate(
        self, prompt: Any, params: Any, request_id: str, *, priority: int, lora_request: Any
    ) -> AsyncIterator[Delta]:
        self.seen.append((request_id, priority, params))
        self.loras.append(lora_request)
        try:
            for item in self.script:
                if isinstance(item, Exception):
                    raise item
                yield item
                if self.hold is not None:
                    await self.hold.wait()
        finally:
            self.closed.append(request_id)

    async def add_lora(self, lora: Any) -> bool:
        self.added.append(lora)
        if self.refuse_adds:
            self.refuse_adds -= 1
            raise Exception("Call to add_lora method failed: No adapter found for /secret/x")
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.removed.append(lora_id)
        return True

    def shutdown(self) -> None:
        pass


def hosted(
    llama_path: Path, llm: FakeLLM, lora: LoraRegistry[None] | None = None, base_lora: Any = None
) -> HostedGenerator:
    from conveyor.config.model_config import GenerateModelConfig

    tokenizer = Tokenizer(llama_path)
    metrics = Metrics().for_generator("m")
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                          num_kv_blocks=16, block_size=16)  # fmt: skip
    engine = VllmEngine(llm, dict, tokenizer, config, eos_token_ids=frozenset({0}),
                        metrics=metrics, name="m", lora=lora, base_lora=base_lora)  # fmt: skip
    model = GenerateModelConfig(kind="generate", name="m", path=llama_path, engine="vllm")
    return HostedGenerator(model, engine, tokenizer, metrics, tokenizer.vocab_size, 0,
                           lora=lora, adapter_sync=None if lora is None else engine)  # fmt: skip


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


def registry(tmp_path: Path, *names: str) -> LoraRegistry[None]:
    """Adapters at ``tmp_path/NAME`` (the files are vLLM's to read: the loader checks none)."""
    adapters: LoraRegistry[None] = LoraRegistry(lambda path: (8, None), max_cpu_loras=2)
    for name in names:
        adapters.load(name, tmp_path / name)
    return adapters


async def run_as(generator: HostedGenerator, model: str | None) -> list[Any]:
    """One request to the base (``model`` None) or to adapter ``model``; its outputs."""
    chosen = generator if model is None else generator.for_adapter(model)
    assert chosen is not None
    return await collect(chosen, SamplingParams(max_tokens=1))


def test_an_adapter_request_carries_its_lora_request_added_once(
    llama_path: Path, tmp_path: Path
) -> None:
    llm = FakeLLM([Delta([Completion([11], "length")], True)])
    generator = hosted(llama_path, llm, registry(tmp_path, "sql", "chat"))

    async def scenario() -> None:
        for model in ("sql", None, "sql", "chat"):
            await run_as(generator, model)

    asyncio.run(scenario())
    sql, base, sql_again, chat = llm.loras
    assert base is None  # the base model runs without an adapter
    assert sql == {"lora_name": "sql", "lora_int_id": 1, "lora_path": str(tmp_path / "sql")}
    assert sql_again is sql and chat["lora_int_id"] == 2
    assert llm.added == [sql, chat]  # each added to vLLM once, before its first request


def test_an_unknown_adapter_id_is_refused_before_vllm(llama_path: Path, tmp_path: Path) -> None:
    for lora in (None, registry(tmp_path, "sql")):
        generator = hosted(llama_path, FakeLLM([]), lora)
        with pytest.raises(ValueError, match="has no LoRA adapter of id 9"):
            generator.engine.new_request("r", [1, 2], SamplingParams(), adapter_id=9)


def test_an_adapter_vllm_refuses_is_a_400_that_names_no_file(
    llama_path: Path, tmp_path: Path
) -> None:
    llm = FakeLLM([Delta([Completion([11], "length")], True)], refuse_adds=1)
    generator = hosted(llama_path, llm, registry(tmp_path, "sql"))
    with pytest.raises(AdapterError, match="vLLM cannot load the LoRA adapter 'sql'") as caught:
        asyncio.run(run_as(generator, "sql"))
    assert "secret" not in caught.value.message and not llm.seen  # never generated
    outputs = asyncio.run(run_as(generator, "sql"))  # a failed add is tried again
    assert outputs[-1].finish_reason is FinishReason.LENGTH and len(llm.added) == 2


def test_unload_removes_the_adapter_from_vllm_and_a_reload_is_new_to_it(
    llama_path: Path, tmp_path: Path
) -> None:
    llm = FakeLLM([Delta([Completion([11], "length")], True)])
    lora = registry(tmp_path, "sql")
    generator = hosted(llama_path, llm, lora)
    engine = generator.adapter_sync
    assert engine is not None

    async def scenario() -> None:
        await run_as(generator, "sql")
        await engine.remove_adapter(lora.unload("sql"))
        await engine.add_adapter(lora.load("sql", tmp_path / "sql"))  # loaded again
        await run_as(generator, "sql")

    asyncio.run(scenario())
    assert llm.removed == [1]
    first, second = llm.loras
    assert (first["lora_name"], first["lora_int_id"]) == ("sql", 1)
    assert (second["lora_name"], second["lora_int_id"]) == ("sql@2", 2)
    assert llm.added == [first, second]


def test_base_requests_run_under_the_base_adapter_when_there_is_one(
    llama_path: Path, tmp_path: Path
) -> None:
    @dataclass
    class Null:  # as vLLM's LoRARequest names its id
        lora_int_id: int = 99

    null = Null()
    llm = FakeLLM([Delta([Completion([11], "length")], True)])
    generator = hosted(llama_path, llm, registry(tmp_path, "sql"), base_lora=null)

    async def scenario() -> None:
        for model in (None, "sql", None):
            await run_as(generator, model)

    asyncio.run(scenario())
    base, sql, base_again = llm.loras
    assert base is null and base_again is null and sql["lora_name"] == "sql"
    assert llm.added == [null, sql]  # added once, like any adapter


def test_batch_requests_are_counted_apart_until_they_end(llama_path: Path) -> None:
    llm = FakeLLM([Delta([Completion([11])]), Delta([Completion([12], "length")], True)])
    generator = hosted(llama_path, llm)
    engine = generator.engine
    params = SamplingParams(max_tokens=2)

    async def run() -> tuple[int, int]:
        batch = generator.submit([[5, 6, 7]], params, priority=Priority.BATCH)
        online = generator.submit([[5, 6, 7]], params)
        counted = (engine.num_batch, engine.num_waiting + engine.num_running)
        for stream in (batch, online):
            _ = [output async for output in stream]
        return counted

    assert asyncio.run(run()) == (1, 2)
    assert engine.num_batch == 0
