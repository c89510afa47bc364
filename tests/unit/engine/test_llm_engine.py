"""The engine loop on a real tiny model: stop conditions, aborts, out-of-memory retries,
model faults, seeded sampling, shutdown, and the hosted model's queue bound and deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from conveyor.config.model_config import GenerateModelConfig
from conveyor.engine.core.prefill_time import PrefillTime
from conveyor.engine.core.seat_turnover import SeatTurnover
from conveyor.engine.core.step import SeqChunk
from conveyor.engine.generator import HostedGenerator
from conveyor.engine.llm_engine import LLMEngine
from conveyor.engine.model.model_runner import ModelRunner, StepOutOfMemory
from conveyor.engine.outputs import FinishReason
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.tokenizer import Tokenizer
from conveyor.errors import (
    DeadlineExceeded,
    DeadlineTooShort,
    ModelFault,
    ModelOutOfMemory,
    QueueFull,
    ServiceUnavailable,
)
from conveyor.observability.metrics import STEP_PHASES, Metrics
from conveyor.priority import Priority
from tests.unit.model_helpers import (
    GREEDY,
    HFReference,
    collect,
    engine_config,
    generate,
    make_runner,
    random_prompts,
    running_engine,
    submit,
    wait_idle,
)

# `model`: runs a real (tiny) torch model, so mutation runs leave it out.
pytestmark = [pytest.mark.anyio, pytest.mark.model]

VOCAB_SIZE = 512
PROMPT = random_prompts([9], VOCAB_SIZE, seed=11)[0]


class FlakyRunner:
    """Wraps a real runner: fails the first ``num_failures`` steps with ``error``."""

    def __init__(self, runner: ModelRunner, error: Exception, num_failures: int) -> None:
        self.runner = runner
        self.error = error
        self.num_failures = num_failures
        self.num_calls = 0
        self.eos_token_ids: tuple[int, ...] = runner.eos_token_ids

    def execute(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        self.num_calls += 1
        if self.num_calls <= self.num_failures:
            raise self.error
        return self.runner.execute(chunks)


async def test_max_tokens_ends_with_length(llama_path: Path, llama_reference: HFReference) -> None:
    with running_engine(llama_path, engine_config()) as engine:
        (result,) = await generate(engine, [PROMPT], SamplingParams(temperature=0, max_tokens=7))
    assert result.token_ids == llama_reference.generate(PROMPT, 7)
    assert result.finish_reason is FinishReason.LENGTH
    assert [o.num_output_tokens for o in result.outputs] == list(range(1, 8))
    assert all(o.num_prompt_tokens == len(PROMPT) for o in result.outputs)
    assert result.outputs[0].timings.time_to_first_token_s is not None


async def test_context_length_ends_with_length(llama_path: Path) -> None:
    prompt = random_prompts([60], VOCAB_SIZE, seed=12)[0]
    config = engine_config(max_model_len=64)
    with running_engine(llama_path, config) as engine:
        (result,) = await generate(engine, [prompt], SamplingParams(temperature=0, max_tokens=50))
    assert len(result.token_ids) == 4
    assert result.finish_reason is FinishReason.LENGTH


async def test_stop_token_id_ends_the_request_without_its_text(
    llama_path: Path, llama_reference: HFReference
) -> None:
    reference = llama_reference.generate(PROMPT, 12)
    stop_id = reference[4]
    expected = reference[: reference.index(stop_id) + 1]
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_id])
    tokenizer = Tokenizer(llama_path)
    with running_engine(llama_path, engine_config()) as engine:
        (result,) = await generate(engine, [PROMPT], params)
    assert result.token_ids == expected
    assert result.finish_reason is FinishReason.STOP
    assert result.text == tokenizer.decode(expected[:-1])


async def test_stop_string_cuts_the_text(llama_path: Path) -> None:
    with running_engine(llama_path, engine_config()) as engine:
        (full,) = await generate(engine, [PROMPT], SamplingParams(temperature=0, max_tokens=12))
        start = next(
            i for i in range(2, len(full.text) - 2) if "\ufffd" not in full.text[i : i + 2]
        )
        stop = full.text[start : start + 2]
        params = SamplingParams(temperature=0, max_tokens=12, stop=[stop])
        (cut,) = await generate(engine, [PROMPT], params)
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.finish_reason is FinishReason.STOP
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]


async def test_eos_stops_unless_ignored(llama_path: Path, llama_reference: HFReference) -> None:
    reference = llama_reference.generate(PROMPT, 12)
    config = engine_config()
    runner = make_runner(llama_path, config)
    runner.eos_token_ids = (reference[3],)  # pretend the 4th greedy token is EOS
    with running_engine(llama_path, config, runner=runner) as engine:
        stopped, ignored = await generate(
            engine,
            [PROMPT, PROMPT],
            [
                SamplingParams(temperature=0, max_tokens=12),
                SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
            ],
        )
    assert stopped.token_ids == reference[: reference.index(reference[3]) + 1]
    assert stopped.finish_reason is FinishReason.STOP
    assert ignored.token_ids == reference
    assert ignored.finish_reason is FinishReason.LENGTH


async def test_logprobs_come_with_each_token(llama_path: Path) -> None:
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=3)
    with running_engine(llama_path, engine_config()) as engine:
        (result,) = await generate(engine, [PROMPT], params)
    logprobs = [lp for output in result.outputs for lp in output.logprobs]
    assert [lp.token_id for lp in logprobs] == result.token_ids
    for item in logprobs:
        assert len(item.top) == 3
        assert item.top[0][0] == item.token_id  # greedy picks the most likely token
        assert item.logprob == pytest.approx(item.top[0][1])


async def test_seeded_sampling_does_not_depend_on_the_batch(llama_path: Path) -> None:
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10, seed=1234)
    others = random_prompts([5, 17, 30], VOCAB_SIZE, seed=13)
    with running_engine(llama_path, engine_config()) as engine:
        (alone,) = await generate(engine, [PROMPT], seeded)
        batched = await generate(engine, [*others, PROMPT], [GREEDY] * 3 + [seeded])
        (reseeded,) = await generate(
            engine, [PROMPT], SamplingParams(temperature=1.0, max_tokens=10, seed=99)
        )
    assert batched[-1].token_ids == alone.token_ids
    assert reseeded.token_ids != alone.token_ids


async def test_abort_frees_every_block(llama_path: Path) -> None:
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    with running_engine(llama_path, engine_config()) as engine:
        stream = submit(engine, PROMPT, params, request_id="long")
        first = await stream.get()
        assert first is not None and not first.is_finished
        stream.close()  # as the API does when the caller goes away
        await wait_idle(engine)
        assert engine.num_used_blocks == 0
        assert engine.stats.num_aborted == 1
        assert engine.stats.num_generated_tokens < 100


async def test_abort_of_a_queued_request(llama_path: Path) -> None:
    config = engine_config()
    engine = LLMEngine(make_runner(llama_path, config), Tokenizer(llama_path), config)
    stream = submit(engine, PROMPT, GREEDY, request_id="queued")
    stream.close()  # before the engine thread ever saw it
    engine.start()
    try:
        await wait_idle(engine)
        assert engine.num_used_blocks == 0
        assert engine.stats.num_generated_tokens == 0
    finally:
        engine.stop()


async def test_out_of_memory_shrinks_the_budget_and_retries(
    llama_path: Path, llama_reference: HFReference
) -> None:
    config = engine_config()
    runner = FlakyRunner(make_runner(llama_path, config), StepOutOfMemory("boom"), 2)
    prompts = random_prompts([20, 30], VOCAB_SIZE, seed=14)
    with running_engine(llama_path, config, runner=runner) as engine:
        results = await generate(engine, prompts, SamplingParams(temperature=0, max_tokens=6))
        assert engine.stats.num_oom_retries == 2
    for prompt, result in zip(prompts, results, strict=True):
        assert result.token_ids == llama_reference.generate(prompt, 6)


async def test_out_of_memory_at_one_token_fails_only_that_step(llama_path: Path) -> None:
    config = engine_config(max_num_batched_tokens=1, max_num_seqs=1)
    runner = FlakyRunner(make_runner(llama_path, config), StepOutOfMemory("boom"), 1)
    with running_engine(llama_path, config, runner=runner) as engine:
        with pytest.raises(ModelOutOfMemory, match="one token"):
            await collect(submit(engine, PROMPT, GREEDY, request_id="doomed"))
        (after,) = await generate(engine, [PROMPT], GREEDY)
        await wait_idle(engine)
        assert engine.num_used_blocks == 0
    assert after.finish_reason is FinishReason.LENGTH


async def test_a_model_fault_fails_the_step_and_the_engine_carries_on(llama_path: Path) -> None:
    config = engine_config()
    runner = FlakyRunner(make_runner(llama_path, config), RuntimeError("bad kernel"), 1)
    with running_engine(llama_path, config, runner=runner) as engine:
        with pytest.raises(ModelFault, match="bad kernel"):
            await collect(submit(engine, PROMPT, GREEDY, request_id="unlucky"))
        (after,) = await generate(engine, [PROMPT], GREEDY)
        await wait_idle(engine)
        assert engine.num_used_blocks == 0
        assert engine.stats.num_failed == 1
    assert len(after.token_ids) == GREEDY.max_tokens


async def test_stop_fails_unfinished_requests(llama_path: Path) -> None:
    config = engine_config()
    engine = LLMEngine(make_runner(llama_path, config), Tokenizer(llama_path), config)
    stream = submit(engine, PROMPT, GREEDY, request_id="never-run")
    engine.stop()
    with pytest.raises(ServiceUnavailable):
        await collect(stream)
    with pytest.raises(ServiceUnavailable):
        submit(engine, PROMPT, GREEDY, request_id="too-late")


async def test_idle_engine_waits_without_stepping(llama_path: Path) -> None:
    with running_engine(llama_path, engine_config()) as engine:
        await generate(engine, [PROMPT])
        await wait_idle(engine)
        steps = engine.stats.num_steps
        # Idle means parked on the condition: nothing to apply, nothing stepped since.
        assert await asyncio.to_thread(engine.wait_until_idle, 0)
        assert engine.stats.num_steps == steps


def hosted(
    path: Path, *, max_queue: int, timeout_ms: float = 30_000, **engine_overrides: int
) -> HostedGenerator:
    """A hosted model whose engine is NOT started: requests stay queued."""
    config = GenerateModelConfig(
        kind="generate", name="tiny", path=path, max_queue=max_queue, timeout_ms=timeout_ms
    )
    engine_cfg = engine_config(**engine_overrides)
    engine = LLMEngine(make_runner(path, engine_cfg), Tokenizer(path), engine_cfg)
    metrics = Metrics().for_generator("tiny")
    return HostedGenerator(config, engine, Tokenizer(path), metrics, VOCAB_SIZE, created_at=0)


async def test_queue_bound_gives_429_with_retry_after(llama_path: Path) -> None:
    generator = hosted(llama_path, max_queue=3)
    generator.submit([PROMPT, PROMPT], GREEDY)
    generator.submit([PROMPT], GREEDY)
    with pytest.raises(QueueFull) as caught:
        generator.submit([PROMPT], GREEDY)
    assert int(caught.value.headers()["Retry-After"]) >= 1
    generator.stop()


async def test_n_choices_compute_their_shared_prompt_once(llama_path: Path) -> None:
    generator = hosted(llama_path, max_queue=8)
    prompt = random_prompts([17], VOCAB_SIZE, seed=5)[0]  # four full blocks of 4, one token
    generator.engine.start()
    try:
        outputs = [output async for output in generator.submit([prompt] * 3, GREEDY)]
        await wait_idle(generator.engine)
    finally:
        generator.stop()
    by_index: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for output in outputs:
        by_index[output.index].extend(output.token_ids)
    assert by_index[0] == by_index[1] == by_index[2] and len(by_index[0]) == GREEDY.max_tokens
    # The two siblings took the prompt's 16 cacheable tokens from the first one's blocks.
    assert generator.engine.stats.num_prefix_cache_hit_tokens == 2 * 16


async def test_no_first_token_by_the_deadline_is_504_and_aborts(llama_path: Path) -> None:
    generator = hosted(llama_path, max_queue=10)
    stream = generator.submit([PROMPT], GREEDY, timeout_ms=1)
    with pytest.raises(DeadlineExceeded):
        await collect(stream)
    assert stream.is_closed
    generator.engine.start()  # the queued add and its abort cancel out
    await wait_idle(generator.engine)
    assert generator.engine.stats.num_generated_tokens == 0
    assert generator.engine.num_used_blocks == 0
    generator.stop()


class FixedTurnover(SeatTurnover):
    """Seats measured to come free every ``interval_s``; the tiny model's own finishes are
    not kept (the tests are about admission, not this machine's speed)."""

    def __init__(self, interval_s: float | None) -> None:
        super().__init__()
        self.interval_s = interval_s

    @property
    def mean_interval_s(self) -> float | None:
        return self.interval_s

    def predicted_wait_s(self, num_ahead: int) -> float | None:
        return None if self.interval_s is None else (num_ahead + 1) * self.interval_s

    def on_finish(self, now_s: float, num_waiting: int) -> None:
        """Kept fixed."""


async def test_an_online_request_whose_seat_would_come_too_late_is_429(llama_path: Path) -> None:
    generator = hosted(llama_path, max_queue=10)
    generator.engine.turnover = FixedTurnover(1.0)  # a seat a second
    for _ in range(3):
        generator.submit([PROMPT], GREEDY, timeout_ms=30_000)
    with pytest.raises(QueueFull) as caught:  # three ahead: a seat in 4 s, due in 2
        generator.submit([PROMPT], GREEDY, timeout_ms=2000)
    assert caught.value.code == "deadline_unreachable"
    assert int(caught.value.headers()["Retry-After"]) >= 1
    generator.submit([PROMPT], GREEDY, timeout_ms=5000)  # a seat in 4 s: in time
    # A batch line is not refused by the wait (it waits behind online traffic anyway).
    generator.submit([PROMPT], GREEDY, priority=Priority.BATCH, timeout_ms=2000)
    generator.stop()


async def test_a_waiting_request_is_shed_with_429_once_its_seat_would_come_too_late(
    llama_path: Path,
) -> None:
    generator = hosted(llama_path, max_queue=10, max_num_seqs=1)
    engine = generator.engine
    engine.turnover = FixedTurnover(None)  # nothing measured yet: both are admitted
    long = generator.submit([PROMPT], SamplingParams(max_tokens=100, ignore_eos=True))
    late = generator.submit([PROMPT], GREEDY, timeout_ms=5000)
    engine.turnover = FixedTurnover(100.0)  # then seats turn out to come free every 100 s
    engine.start()
    try:
        with pytest.raises(QueueFull) as caught:
            await collect(late)
        assert caught.value.code == "deadline_unreachable"
        assert len((await collect(long)).token_ids) == 100  # the running one is never shed
        await wait_idle(engine)
    finally:
        generator.stop()
    assert engine.num_used_blocks == 0


class FullStepsOfTwoSeconds(PrefillTime):
    """Full 32-token steps measured at 2 s; the tiny model's own (fast) steps are not kept."""

    def __init__(self) -> None:
        super().__init__()
        super().observe(32, 32, 2.0)

    def observe(self, num_tokens: int, budget: int, seconds: float) -> None:
        """Keeps the 2 s steps: the test is about admission, not this machine's speed."""


async def test_a_prompt_whose_prefill_alone_outlasts_its_deadline_is_refused_with_400(
    llama_path: Path,
) -> None:
    """Three full steps (6 s at least) cannot meet a 1 s deadline: refused before it is
    queued, whatever the load. The same prompt from the prefix cache, or a short one, can."""
    generator = hosted(llama_path, max_queue=10, max_num_batched_tokens=32)
    engine = generator.engine
    engine.prefill_time = FullStepsOfTwoSeconds()
    cached, uncached = random_prompts([100, 100], VOCAB_SIZE, seed=21)
    engine.start()
    try:
        await collect(generator.submit([cached], GREEDY, timeout_ms=30_000))
        with pytest.raises(DeadlineTooShort):
            await collect(generator.submit([uncached], GREEDY, timeout_ms=1000))
        again = await collect(generator.submit([cached], GREEDY, timeout_ms=1000))
        short = await collect(generator.submit([PROMPT], GREEDY, timeout_ms=1000))
        await wait_idle(engine)
    finally:
        generator.stop()
    assert len(again.token_ids) == len(short.token_ids) == GREEDY.max_tokens
    assert engine.stats.num_prompt_tokens == 2 * len(cached) + len(PROMPT)  # never queued


async def test_an_engine_bug_fails_everything_and_refuses_new_work(
    llama_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = engine_config()
    engine = LLMEngine(make_runner(llama_path, config), Tokenizer(llama_path), config)

    def broken_sampler(*args: object, **kwargs: object) -> None:
        raise AssertionError("sampler bug")

    monkeypatch.setattr(engine._sampler, "sample", broken_sampler)
    engine.start()
    try:
        with pytest.raises(ModelFault, match="crashed"):
            await collect(submit(engine, PROMPT, GREEDY, request_id="victim"))
        await wait_idle(engine)
        with pytest.raises(ServiceUnavailable):
            submit(engine, PROMPT, GREEDY, request_id="after")
    finally:
        engine.stop()


async def test_step_phases_add_up_to_the_engine_threads_step_time(llama_path: Path) -> None:
    config = engine_config()
    with running_engine(llama_path, config) as engine:
        started_s = time.perf_counter()
        await generate(engine, random_prompts([9, 14], VOCAB_SIZE, seed=3), [GREEDY, GREEDY])
        await wait_idle(engine)
        elapsed_s = time.perf_counter() - started_s
        phases = dict(engine.stats.step_phase_s)
    assert set(phases) == set(STEP_PHASES)
    assert all(seconds > 0 for seconds in phases.values()), phases
    # Every phase is engine-thread time inside the run, counted once.
    assert sum(phases.values()) <= elapsed_s
