"""The async batcher on fake and synthetic models, held by events (no timing guesses)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from conveyor.batching.batcher import Batcher, BatcherSettings
from conveyor.config.model_config import SyntheticModelConfig
from conveyor.errors import DeadlineExceeded, InputRejected, QueueFull, ServiceUnavailable
from conveyor.models.synthetic import SyntheticModel
from conveyor.observability.metrics import Metrics
from conveyor.priority import Priority

pytestmark = pytest.mark.anyio
LONG_S = 60.0


class GatedModel:
    """Records every batch; each batch waits for ``release()`` before returning."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.started = threading.Semaphore(0)
        self._gates: list[threading.Event] = []
        self._lock = threading.Lock()
        self._is_open = threading.Event()

    def __call__(self, payloads: list[Any]) -> list[Any]:
        gate = threading.Event()
        with self._lock:
            self.batches.append(list(payloads))
            self._gates.append(gate)
        self.started.release()
        if not self._is_open.is_set():
            gate.wait(timeout=LONG_S)
        return [f"out:{p}" for p in payloads]

    async def wait_started(self, count: int = 1) -> None:
        for _ in range(count):
            await asyncio.to_thread(self.started.acquire, True, LONG_S)

    def open_forever(self) -> None:
        """Let every later batch through too (teardown)."""
        self._is_open.set()
        self.release_all()

    def release_all(self) -> None:
        with self._lock:
            for gate in self._gates:
                gate.set()


def settings(**kw: Any) -> BatcherSettings:
    base: dict[str, Any] = {
        "max_batch_size": 4,
        "max_wait_ms": LONG_S * 1000,
        "max_batch_tokens": None,
        "max_queue": 100,
    }
    base.update(kw)
    return BatcherSettings(**base)


def counter(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


@pytest.fixture()
async def make_batcher() -> AsyncIterator[Callable[..., tuple[Batcher, Metrics]]]:
    made: list[Batcher] = []

    def make(run: Callable[[list[Any]], list[Any]], **kw: Any) -> tuple[Batcher, Metrics]:
        metrics = Metrics()
        batcher = Batcher("m", run, settings(**kw), metrics.for_model("m"))
        batcher.start()
        made.append(batcher)
        return batcher, metrics

    yield make
    for batcher in made:
        opener = getattr(batcher._run_batch, "open_forever", None)
        if opener is not None:
            opener()
        await batcher.stop()


def submit(batcher: Batcher, payload: Any, priority: Priority = Priority.ONLINE, **kw: Any):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + kw.get("timeout_s", LONG_S)
    return batcher.submit(payload, kw.get("tokens", 1), priority, deadline)


async def test_closes_when_full(make_batcher) -> None:
    model = GatedModel()
    batcher, metrics = make_batcher(model, max_batch_size=3)
    items = [submit(batcher, i) for i in range(3)]
    await model.wait_started()
    model.release_all()
    assert await asyncio.gather(*(i.future for i in items)) == ["out:0", "out:1", "out:2"]
    assert model.batches == [[0, 1, 2]]
    assert counter(metrics, "conveyor_batches_total", model="m", reason="full") == 1


async def test_closes_on_max_wait_for_a_lone_input(make_batcher) -> None:
    model = GatedModel()
    model.release_all()
    batcher, metrics = make_batcher(model, max_batch_size=8, max_wait_ms=1)
    item = submit(batcher, "x")
    model_started = model.wait_started()
    await model_started
    model.release_all()
    assert await item.future == "out:x"
    assert counter(metrics, "conveyor_batches_total", model="m", reason="wait") == 1


async def test_closes_on_token_budget(make_batcher) -> None:
    model = GatedModel()
    batcher, metrics = make_batcher(model, max_batch_size=8, max_batch_tokens=10)
    items = [submit(batcher, i, tokens=5) for i in range(4)]
    await model.wait_started()
    model.release_all()
    await asyncio.gather(*(i.future for i in items[:2]))
    await model.wait_started()
    model.release_all()
    await asyncio.gather(*(i.future for i in items[2:]))
    # Two inputs of 5 tokens fill the 10-token budget: no third could fit.
    assert model.batches == [[0, 1], [2, 3]]
    assert counter(metrics, "conveyor_batches_total", model="m", reason="tokens") == 2


async def test_next_batch_collects_while_model_runs(make_batcher) -> None:
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=4)
    first = [submit(batcher, i) for i in range(4)]
    await model.wait_started()
    second = [submit(batcher, 10 + i) for i in range(4)]  # queued while batch 1 runs
    assert not any(i.future.done() for i in first + second)  # nothing finished early
    model.release_all()
    await asyncio.gather(*(i.future for i in first))
    await model.wait_started()
    model.release_all()
    await asyncio.gather(*(i.future for i in second))
    assert model.batches == [[0, 1, 2, 3], [10, 11, 12, 13]]


async def test_online_runs_before_batch(make_batcher) -> None:
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=2)
    blockers = [submit(batcher, "b0"), submit(batcher, "b1")]
    await model.wait_started()
    queued = [
        submit(batcher, "batch-1", Priority.BATCH),
        submit(batcher, "batch-2", Priority.BATCH),
        submit(batcher, "online-1"),
        submit(batcher, "online-2"),
    ]
    model.release_all()
    await asyncio.gather(*(i.future for i in blockers))
    await model.wait_started()
    model.release_all()
    await asyncio.gather(*(i.future for i in queued[2:]))
    await model.wait_started()
    model.release_all()
    await asyncio.gather(*(i.future for i in queued[:2]))
    assert model.batches[1:] == [["online-1", "online-2"], ["batch-1", "batch-2"]]


async def test_deadline_passing_in_queue_gives_504_and_never_runs(make_batcher) -> None:
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=1)
    blocker = submit(batcher, "blocker")
    await model.wait_started()
    doomed = submit(batcher, "doomed", timeout_s=0.05)
    with pytest.raises(DeadlineExceeded):
        await doomed.future
    assert batcher.queue.num_queued == 0
    model.release_all()
    await blocker.future
    later = submit(batcher, "later")
    await model.wait_started()
    model.release_all()
    await later.future
    assert ["doomed"] not in model.batches


async def test_a_predicted_wait_past_the_deadline_is_429_with_retry_after(make_batcher) -> None:
    """Refused for the load, not for a timeout: 429 with the queue's drain time, not 504."""
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=2)
    for _ in range(5):
        batcher.timing.observe(2, 1.0)  # one second per batch of two
    blocker = submit(batcher, "blocker")
    submit(batcher, "blocker-2")
    await model.wait_started()
    queued = [submit(batcher, i) for i in range(3)]
    with pytest.raises(QueueFull) as info:
        submit(batcher, "hopeless", timeout_s=0.5)
    assert info.value.status_code == 429
    assert info.value.code == "deadline_unreachable"
    # 3 queued, batches of 2 at 1 s each: 2 s to drain.
    assert info.value.headers() == {"Retry-After": "2"}
    queued.append(submit(batcher, "patient", timeout_s=30))
    model.open_forever()
    await blocker.future
    await asyncio.gather(*(i.future for i in queued))


async def test_the_running_batch_counts_in_the_predicted_wait(make_batcher) -> None:
    """An input behind a batch that just started waits for that batch and then its own."""
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=2)
    for _ in range(5):
        batcher.timing.observe(2, 1.0)  # one second per batch of two
    blocker = submit(batcher, "blocker")
    submit(batcher, "blocker-2")
    await model.wait_started()
    # Nothing is queued, but about 1 s of the running batch is left, then 1 s for its own.
    with pytest.raises(QueueFull):
        submit(batcher, "behind the running batch", timeout_s=1.5)
    patient = [submit(batcher, f"patient-{i}", timeout_s=2.5) for i in range(2)]  # one batch
    model.open_forever()
    await blocker.future
    assert await asyncio.gather(*(i.future for i in patient)) == ["out:patient-0", "out:patient-1"]


async def test_a_batch_started_behind_one_of_its_size_still_counts_as_running(
    make_batcher,
) -> None:
    """The next batch starts before the last one's results go out: delivering them must not
    clear the running count of the batch of the same size that runs now."""
    model = GatedModel()
    batcher, metrics = make_batcher(model, max_batch_size=2)
    first = [submit(batcher, i) for i in range(2)]
    await model.wait_started()
    second = [submit(batcher, 10 + i) for i in range(2)]
    model.release_all()
    await asyncio.gather(*(i.future for i in first))
    await model.wait_started()  # the second batch runs
    assert batcher.num_running == 2
    assert not batcher.is_idle
    assert counter(metrics, "conveyor_in_flight", model="m") == 2
    model.release_all()
    await asyncio.gather(*(i.future for i in second))


async def test_a_busy_loop_between_batches_counts_in_the_predicted_wait(make_batcher) -> None:
    """A batch's end waits for the event loop: that hand-off is learnt beside model time."""
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=1, max_wait_ms=0)
    for _ in range(5):
        batcher.timing.observe(1, 0.1)  # the fit says 100 ms a batch
    item = submit(batcher, "x")
    await model.wait_started()
    model.release_all()
    # Blocks the loop on purpose: it stays busy for 0.2 s while the model returns.
    time.sleep(0.2)  # noqa: ASYNC251
    await item.future
    assert batcher.timing.excess_s >= 0.05  # seen after 0.2 s: about 0.1 s past the fit


async def test_queue_full_is_429_with_retry_after_from_service_rate(make_batcher) -> None:
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=2, max_queue=4)
    for _ in range(5):
        batcher.timing.observe(2, 1.5)
    blocker = submit(batcher, "blocker")
    submit(batcher, "blocker-2")
    await model.wait_started()
    queued = [submit(batcher, i) for i in range(4)]
    with pytest.raises(QueueFull) as info:
        submit(batcher, "one too many")
    # 4 queued, batches of 2 at 1.5 s each: 3 s to drain.
    assert info.value.retry_after_s == 3
    assert info.value.headers() == {"Retry-After": "3"}
    model.open_forever()
    await blocker.future
    await asyncio.gather(*(i.future for i in queued))


@pytest.mark.parametrize(("batch_s", "retry_after"), [(1.25, "3"), (0.2, "1")])
async def test_retry_after_rounds_a_partial_second_up(
    make_batcher, batch_s: float, retry_after: str
) -> None:
    """Retry-After is whole seconds, at least 1, never earlier than the queue can drain."""
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=2, max_queue=4)
    for _ in range(5):
        batcher.timing.observe(2, batch_s)
    blocker = submit(batcher, "blocker")
    submit(batcher, "blocker-2")
    await model.wait_started()
    queued = [submit(batcher, i) for i in range(4)]
    with pytest.raises(QueueFull) as info:
        submit(batcher, "one too many")
    # 4 queued, batches of 2: 2.5 s to drain (come back in 3), or 0.4 s (in 1).
    assert info.value.headers() == {"Retry-After": retry_after}
    model.open_forever()
    await blocker.future
    await asyncio.gather(*(i.future for i in queued))


async def test_a_batch_runs_on_the_model_thread_and_is_measured(make_batcher) -> None:
    """One batch: run on the batcher's own thread, its shape and times recorded, then idle."""
    threads: list[str] = []

    def run(payloads: list[Any]) -> list[Any]:
        threads.append(threading.current_thread().name)
        return list(payloads)

    batcher, metrics = make_batcher(run, max_batch_size=4, max_wait_ms=0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    items = [submit(batcher, "a", tokens=3), submit(batcher, "b", tokens=5)]
    assert await asyncio.gather(*(i.future for i in items)) == ["a", "b"]
    elapsed_s = loop.time() - started
    assert len(threads) == 1 and threads[0].startswith("model-m")
    assert batcher.num_running == 0
    assert counter(metrics, "conveyor_in_flight", model="m") == 0
    assert counter(metrics, "conveyor_batch_size_tokens_sum", model="m") == 10  # 2 x longest
    assert counter(metrics, "conveyor_batch_fill_ratio_sum", model="m") == 0.5
    assert 0 <= counter(metrics, "conveyor_queue_wait_seconds_sum", model="m") <= 2 * elapsed_s
    assert 0 < counter(metrics, "conveyor_model_seconds_sum", model="m") <= elapsed_s


async def test_abandoned_input_never_runs(make_batcher) -> None:
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=1)
    blocker = submit(batcher, "blocker")
    await model.wait_started()
    gone = submit(batcher, "gone")
    batcher.abandon(gone)
    assert gone.future.cancelled()
    stays = submit(batcher, "stays")
    model.release_all()
    await blocker.future
    await model.wait_started()
    model.release_all()
    assert await stays.future == "out:stays"
    assert model.batches == [["blocker"], ["stays"]]


async def test_bisection_through_the_batcher(make_batcher) -> None:
    model = SyntheticModel(
        SyntheticModelConfig(name="s", kind="synthetic", batch_latency_ms=0, fail_marker="BAD")
    )
    batcher, _ = make_batcher(model.embed_batch, max_batch_size=8)
    texts = ["a", "b", "BAD c", "d", "e", "f", "BAD g", "h"]
    items = [submit(batcher, t) for t in texts]
    results = await asyncio.gather(*(i.future for i in items), return_exceptions=True)
    for text, result in zip(texts, results, strict=True):
        assert isinstance(result, InputRejected) == ("BAD" in text)


async def test_oom_halves_remembers_and_counts(make_batcher) -> None:
    model = SyntheticModel(
        SyntheticModelConfig(name="s", kind="synthetic", batch_latency_ms=0, oom_above=3)
    )
    batcher, metrics = make_batcher(model.embed_batch, max_batch_size=8)
    items = [submit(batcher, str(i)) for i in range(8)]
    results = await asyncio.gather(*(i.future for i in items))
    assert len(results) == 8
    assert batcher.governor.is_backed_off
    assert batcher.governor.cap(asyncio.get_running_loop().time()) <= 3
    assert counter(metrics, "conveyor_oom_backoffs_total", model="m") >= 1
    assert model.batch_sizes[:2] == [8, 4]  # both ran out of memory
    assert max(model.batch_sizes[2:]) <= 3


async def test_every_future_resolved_exactly_once_under_churn(make_batcher) -> None:
    model = SyntheticModel(
        SyntheticModelConfig(
            name="s", kind="synthetic", batch_latency_ms=0, fail_marker="BAD", oom_above=5
        )
    )
    batcher, _ = make_batcher(model.embed_batch, max_batch_size=16, max_wait_ms=0, max_queue=1000)
    items = []
    for i in range(300):
        items.append(submit(batcher, f"{'BAD ' if i % 37 == 0 else ''}{i}"))
        if i % 50 == 0:
            await asyncio.sleep(0)
    for item in items[::23]:
        batcher.abandon(item)
    results = await asyncio.gather(*(i.future for i in items), return_exceptions=True)
    assert len(results) == 300
    assert all(i.future.done() for i in items)
    assert sum(model.batch_sizes) >= 300 - len(items[::23])


async def test_stop_fails_queued_inputs(make_batcher) -> None:
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=1)
    blocker = submit(batcher, "blocker")
    await model.wait_started()
    queued = submit(batcher, "queued")
    model.release_all()
    await batcher.stop()
    with pytest.raises(ServiceUnavailable):
        await queued.future
    assert blocker.future.done()
    with pytest.raises(ServiceUnavailable):
        submit(batcher, "late")


async def test_an_idle_model_admits_whatever_its_batch_time_model_says(make_batcher) -> None:
    """One pathological batch (35 s, the event loop was frozen) must not refuse work."""
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=1)
    for _ in range(5):
        batcher.timing.observe(1, 40.0)  # the fit now says every batch takes 40 s
    assert batcher.is_idle
    admitted = submit(batcher, "on an idle model", timeout_s=1.0)
    await model.wait_started()
    assert not batcher.is_idle
    with pytest.raises(QueueFull):  # busy now: the prediction applies again
        submit(batcher, "behind a 40 s batch", timeout_s=1.0)
    model.open_forever()
    assert await admitted.future == "out:on an idle model"


async def test_while_online_traffic_is_present_job_batches_stay_short(make_batcher) -> None:
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=100, max_queue=1000, max_wait_ms=0)
    for _ in range(4):
        for size in (1, 50, 100):
            batcher.timing.observe(size, 0.02 + 0.0003 * size)  # 20 ms + 0.3 ms an input
    batcher.timing.observe = lambda *args: None  # keep that fit: the gated model takes ~0 s
    jobs = [submit(batcher, f"job-{i}", Priority.BATCH) for i in range(100)]
    await model.wait_started()  # no online traffic yet: a full job batch
    online = [submit(batcher, f"online-{i}") for i in range(2)]
    jobs += [submit(batcher, f"late-job-{i}", Priority.BATCH) for i in range(200)]
    model.release_all()
    await model.wait_started()
    assert model.batches[1][:2] == ["online-0", "online-1"]  # online first
    assert len(model.batches[1]) == 58  # t(58) = 37.4 ms <= (20.3 + 50 + 5) / 2
    model.release_all()
    await model.wait_started()
    assert len(model.batches[2]) == 58  # online traffic was seen within a second
    model.open_forever()
    await asyncio.gather(*(i.future for i in jobs + online))
    assert len(model.batches[0]) == 100


async def test_the_mixed_batch_slack_is_read_in_milliseconds(make_batcher) -> None:
    """3.9024 ms of slack: (20.3 + 50 + 3.9024) / 2 ms is 57.0013 inputs past the first at
    0.3 ms each, so 57 fit; 0.1% less slack and 56 would."""
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=100, max_queue=1000, max_wait_ms=0,
                              mixed_batch_slack_ms=3.9024)  # fmt: skip
    for _ in range(4):
        for size in (1, 50, 100):
            batcher.timing.observe(size, 0.02 + 0.0003 * size)
    batcher.timing.observe = lambda *args: None  # keep that fit
    online = submit(batcher, "online")
    await model.wait_started()
    jobs = [submit(batcher, f"job-{i}", Priority.BATCH) for i in range(100)]
    model.open_forever()
    await asyncio.gather(online.future, *(i.future for i in jobs))
    assert len(model.batches[1]) == 57


async def test_without_online_traffic_job_batches_are_full(make_batcher) -> None:
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=100, max_queue=1000, online_recent_s=0.0)
    for _ in range(4):
        for size in (1, 50, 100):
            batcher.timing.observe(size, 0.02 + 0.0003 * size)
    jobs = [submit(batcher, f"job-{i}", Priority.BATCH) for i in range(300)]
    model.open_forever()
    await asyncio.gather(*(i.future for i in jobs))
    assert [len(b) for b in model.batches] == [100, 100, 100]
