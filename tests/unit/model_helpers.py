"""Drive a real engine (tiny checkpoint, CPU) from async tests, and compare with HF."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from conveyor.endpoints.dispatch import execute
from conveyor.engine.core.step import StepExecutor
from conveyor.engine.llm_engine import EngineConfig, LLMEngine
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.outputs import FinishReason, GenerationOutput
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.stream import GenerationStream
from conveyor.engine.tokenizer import Tokenizer
from conveyor.fakes.checkpoints import (
    device_under_test,
    dtype_under_test,
    enforce_eager_under_test,
)
from conveyor.host.service import Service
from conveyor.priority import Priority

FIRST_ORDINARY_TOKEN = 3  # ids 0..2 are pad, BOS and EOS in the tiny tokenizer
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
IDLE_TIMEOUT_S = 30.0


def engine_config(**overrides: int) -> EngineConfig:
    """Roomy defaults; tests shrink what they exercise."""
    settings = {
        "max_num_seqs": 32,
        "max_num_batched_tokens": 512,
        "max_model_len": 128,
        "num_kv_blocks": 1024,
        "block_size": 4,
    }
    settings.update(overrides)
    return EngineConfig(**settings)


def make_runner(path: Path, config: EngineConfig) -> ModelRunner:
    """A runner (CPU unless CONVEYOR_TEST_DEVICE says otherwise) whose pool matches ``config``."""
    return ModelRunner(
        path,
        num_kv_blocks=config.num_kv_blocks,
        block_size=config.block_size,
        device=device_under_test(),
        dtype=dtype_under_test(),
        enforce_eager=enforce_eager_under_test(),
    )


@contextmanager
def running_engine(
    path: Path, config: EngineConfig, *, runner: StepExecutor | None = None
) -> Iterator[LLMEngine]:
    """A started engine on the checkpoint at ``path``; stopped on exit."""
    engine = LLMEngine(runner or make_runner(path, config), Tokenizer(path), config)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


@dataclass
class Result:
    """Everything one request streamed back."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    outputs: list[GenerationOutput] = field(default_factory=list)

    @property
    def finish_reason(self) -> FinishReason | None:
        """The last output's finish reason."""
        return self.outputs[-1].finish_reason if self.outputs else None


def submit(
    engine: LLMEngine,
    prompt: list[int],
    params: SamplingParams = GREEDY,
    *,
    request_id: str,
    priority: Priority = Priority.ONLINE,
) -> GenerationStream:
    """Queue one request on its own stream (call on the event loop)."""
    stream = GenerationStream()
    request = engine.new_request(request_id, prompt, params, priority=priority)
    stream.set_on_abort(lambda: engine.abort(request_id))
    engine.add_request(request, stream)
    return stream


async def collect(stream: GenerationStream) -> Result:
    """Read a stream to its end."""
    result = Result()
    async for output in stream:
        result.outputs.append(output)
        result.token_ids.extend(output.token_ids)
        result.text += output.text
    return result


async def generate(
    engine: LLMEngine,
    prompts: Sequence[list[int]],
    params: SamplingParams | Sequence[SamplingParams] = GREEDY,
) -> list[Result]:
    """Run every prompt concurrently (one request each) and collect the results."""
    all_params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    streams = [
        submit(engine, prompt, p, request_id=f"req-{index}")
        for index, (prompt, p) in enumerate(zip(prompts, all_params, strict=True))
    ]
    return list(await asyncio.gather(*(collect(stream) for stream in streams)))


async def wait_idle(engine: LLMEngine) -> None:
    """Until every queued abort and finish has been applied."""
    assert await asyncio.to_thread(engine.wait_until_idle, IDLE_TIMEOUT_S)


def random_prompts(lengths: Sequence[int], vocab_size: int, seed: int) -> list[list[int]]:
    """Reproducible prompts of ordinary (non-special) token ids."""
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randint(FIRST_ORDINARY_TOKEN, vocab_size, (length,), generator=generator).tolist()
        for length in lengths
    ]


class HFReference:
    """Hugging Face greedy ``generate`` of one checkpoint, memoised per prompt and length."""

    def __init__(self, checkpoint: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=dtype_under_test())
        self.model: Any = model.to(device_under_test())
        self._cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation (EOS included when hit), like the engine returns it."""
        key = (tuple(prompt), max_new_tokens)
        if key not in self._cache:
            with torch.no_grad():
                out = self.model.generate(
                    torch.tensor([list(prompt)], device=self.model.device),
                    attention_mask=torch.ones(
                        (1, len(prompt)), dtype=torch.int64, device=self.model.device
                    ),
                    do_sample=False,
                    max_new_tokens=max_new_tokens,
                )
            self._cache[key] = out[0, len(prompt) :].tolist()
        return self._cache[key]


def merged_reference(base: Path, adapter: Path) -> HFReference:
    """PEFT's merged model (``merge_and_unload``) of ``adapter`` as an HF reference."""
    from peft import PeftModel

    reference = HFReference(base)
    merged: Any = PeftModel.from_pretrained(reference.model, str(adapter))
    reference.model = merged.merge_and_unload().eval()
    return reference


async def run_whole(service: Service, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The answer to a request ``body`` at ``path``, whole, at online priority: through the
    request kinds' table a batch line takes (``endpoints.dispatch``)."""
    return await execute(service, path, body, priority=Priority.ONLINE)
