"""The batcher's life: names, start and stop, its thread, and failures outside the model."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from conveyor.batching import batcher as batcher_module
from conveyor.batching.batcher import Batcher
from conveyor.config.model_config import SyntheticModelConfig
from conveyor.errors import ServiceUnavailable
from conveyor.models.synthetic import SyntheticModel
from conveyor.observability.context import RequestContext, request_scope
from conveyor.observability.metrics import Metrics
from conveyor.priority import Priority
from tests.unit.batching.test_batcher import GatedModel, counter, settings, submit

pytestmark = pytest.mark.anyio
JOIN_TIMEOUT_S = 5.0


def make(run: Any, name: str = "m", **kw: Any) -> tuple[Batcher, Metrics]:
    """A batcher on ``run``, not started; ``executor`` goes to the batcher, the rest to settings."""
    executor = kw.pop("executor", None)
    metrics = Metrics()
    batcher = Batcher(name, run, settings(**kw), metrics.for_model(name), executor=executor)
    return batcher, metrics


async def test_the_loop_task_and_the_model_thread_are_named_after_the_model() -> None:
    threads: list[str] = []

    def run(payloads: list[Any]) -> list[Any]:
        threads.append(threading.current_thread().name)
        return payloads

    batcher, _ = make(run, name="embedder", max_wait_ms=0)
    batcher.start()
    try:
        assert "batcher-embedder" in {task.get_name() for task in asyncio.all_tasks()}
        assert await submit(batcher, "a").future == "a"
        assert threads[0].startswith("model-embedder")
    finally:
        await batcher.stop()


async def test_a_batcher_never_started_refuses_input_and_stops_cleanly() -> None:
    batcher, _ = make(lambda payloads: payloads)
    with pytest.raises(RuntimeError, match="not started"):
        batcher.submit("x", 1, Priority.ONLINE, deadline=0.0)
    await batcher.stop()


async def test_stop_ends_the_model_thread_the_batcher_made() -> None:
    threads: list[threading.Thread] = []

    def run(payloads: list[Any]) -> list[Any]:
        threads.append(threading.current_thread())
        return payloads

    batcher, _ = make(run, max_wait_ms=0)
    batcher.start()
    assert await submit(batcher, "a").future == "a"
    await batcher.stop()
    await asyncio.to_thread(threads[0].join, JOIN_TIMEOUT_S)
    assert not threads[0].is_alive()


async def test_the_model_runs_on_one_thread_of_the_batchers_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One batch at a time, always on the same thread: a model need not be thread-safe."""
    made: list[dict[str, Any]] = []

    def recording(*args: Any, **kwargs: Any) -> ThreadPoolExecutor:
        made.append({"args": args, **kwargs})
        return ThreadPoolExecutor(*args, **kwargs)

    monkeypatch.setattr(batcher_module, "ThreadPoolExecutor", recording)
    batcher, _ = make(lambda payloads: payloads, name="embedder")
    await batcher.stop()
    assert made == [{"args": (1,), "thread_name_prefix": "model-embedder"}]


async def test_the_batchs_span_names_its_model_and_links_its_requests() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    batcher, _ = make(lambda payloads: payloads, name="embedder", max_wait_ms=0)
    batcher.start()
    try:
        span = tracer.start_span("request")
        request = RequestContext("r-1", "/v1/embeddings", span=span, tracer=tracer)
        with request_scope(request):
            item = submit(batcher, "a")
        assert await item.future == "a"
        span.end()
    finally:
        await batcher.stop()
    (batch_span,) = [s for s in exporter.get_finished_spans() if s.name == "conveyor.model_batch"]
    assert batch_span.attributes is not None
    assert batch_span.attributes["conveyor.model"] == "embedder"
    assert list(batch_span.attributes["conveyor.request_ids"]) == ["r-1"]  # type: ignore[arg-type]


async def test_the_next_batch_starts_before_the_last_ones_results_go_out() -> None:
    """While batch N's results are handed out on the loop, batch N + 1 already runs."""
    model = GatedModel()
    first: list[Any] = []
    seen_at_launch: list[bool] = []

    class Recording(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            seen_at_launch.append(all(item.future.done() for item in first))
            return super().submit(fn, *args, **kwargs)

    executor = Recording(1)
    batcher, _ = make(model, max_batch_size=2, max_wait_ms=0, executor=executor)
    batcher.start()
    try:
        first.extend(submit(batcher, f"a{i}") for i in range(2))
        await model.wait_started()
        second = [submit(batcher, f"b{i}") for i in range(2)]
        model.open_forever()
        await asyncio.gather(*(item.future for item in first + second))
        assert seen_at_launch == [False, False]  # at each launch the first's results were not out
    finally:
        await batcher.stop()
        executor.shutdown()


async def test_stop_leaves_an_executor_the_caller_passed_in_usable() -> None:
    executor = ThreadPoolExecutor(1)
    try:
        batcher, _ = make(lambda payloads: payloads, max_wait_ms=0, executor=executor)
        batcher.start()
        assert await submit(batcher, "a").future == "a"
        await batcher.stop()
        assert executor.submit(lambda: 42).result(timeout=JOIN_TIMEOUT_S) == 42
    finally:
        executor.shutdown()


async def test_stop_gives_up_on_a_stuck_batch_after_the_drain_timeout() -> None:
    model = GatedModel()
    batcher, _ = make(model, max_batch_size=1)
    batcher.start()
    try:
        submit(batcher, "stuck")
        await model.wait_started()
        queued = submit(batcher, "queued")
        await batcher.stop(drain_timeout_s=0.05)  # returns although the model never does
        with pytest.raises(ServiceUnavailable):
            await queued.future
    finally:
        model.open_forever()


async def test_a_batch_failing_outside_the_model_fails_its_inputs_and_the_loop_goes_on() -> None:
    """A model returning no sequence breaks the batch run itself: its inputs get that error."""

    def run(payloads: list[Any]) -> Any:
        return None if payloads == ["broken"] else [f"out:{p}" for p in payloads]

    batcher, metrics = make(run, max_batch_size=1, max_wait_ms=0)
    batcher.start()
    try:
        request = RequestContext("r-1", "/v1/embeddings")
        with request_scope(request):
            broken = submit(batcher, "broken")
        with pytest.raises(TypeError):
            await broken.future
        assert counter(metrics, "conveyor_model_seconds_sum", model="m") == 0  # no model time
        assert broken.model_s == 0.0 and request.model_s == 0.0  # nor billed or logged
        assert batcher.timing.num_observations == 0  # nor a 0 s batch taught to the fit
        assert batcher.num_running == 0
        assert await submit(batcher, "fine").future == "out:fine"
    finally:
        await batcher.stop()


async def test_a_partial_batch_runs_once_its_oldest_input_waited_max_wait() -> None:
    model = GatedModel()
    model.open_forever()
    batcher, _ = make(model, max_batch_size=8, max_wait_ms=50)
    batcher.start()
    try:
        loop = asyncio.get_running_loop()
        submitted_at = loop.time()
        item = submit(batcher, "alone")
        assert await item.future == "out:alone"
        assert loop.time() - submitted_at >= 0.05
        assert model.batches == [["alone"]]
    finally:
        await batcher.stop()


async def test_the_oom_cap_probes_back_up_after_the_configured_interval() -> None:
    model = SyntheticModel(
        SyntheticModelConfig(name="s", kind="synthetic", batch_latency_ms=0, oom_above=3)
    )
    batcher, _ = make(model.embed_batch, max_batch_size=8, oom_probe_interval_s=5.0)
    batcher.start()
    try:
        items = [submit(batcher, str(i)) for i in range(8)]
        await asyncio.gather(*(i.future for i in items))
        now = asyncio.get_running_loop().time()
        backed_off = batcher.governor.cap(now)
        assert backed_off <= 3
        assert batcher.governor.cap(now + 5.0) == 2 * backed_off
    finally:
        await batcher.stop()


def test_the_mixed_batch_slack_and_the_online_window_must_not_be_negative() -> None:
    assert settings(mixed_batch_slack_ms=0).mixed_batch_slack_ms == 0
    with pytest.raises(ValueError, match="mixed_batch_slack_ms"):
        settings(mixed_batch_slack_ms=-1)
    with pytest.raises(ValueError, match="online_recent_s"):
        settings(online_recent_s=-0.5)
