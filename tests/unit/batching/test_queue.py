"""The queue's closing rules, priority order and tombstones, on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.batching.item import ItemState, WorkItem
from conveyor.batching.queue import BatchQueue, CloseReason
from conveyor.priority import Priority


@pytest.fixture()
def loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def make(
    loop: asyncio.AbstractEventLoop, tokens: int = 1, at: float = 0.0, **kw: object
) -> WorkItem:
    priority = kw.get("priority", Priority.ONLINE)
    return WorkItem(f"p{at}", tokens, priority, at, at + 100, loop.create_future())  # type: ignore[arg-type]


def queue(size: int = 4, tokens: int | None = None, bound: int = 100) -> BatchQueue:
    return BatchQueue(max_batch_size=size, max_batch_tokens=tokens, max_queue=bound)


def test_empty_queue_is_never_ready() -> None:
    assert queue().ready_reason(now=1e9, max_wait_s=0.0, cap=4) is None


def test_closes_full_at_max_batch_size(loop: asyncio.AbstractEventLoop) -> None:
    q = queue(size=3)
    for i in range(5):
        q.put(make(loop, at=float(i)))
    assert q.ready_reason(now=0.0, max_wait_s=10.0, cap=3) is CloseReason.FULL
    batch, reason = q.take(cap=3)
    assert reason is CloseReason.FULL
    assert [item.enqueued_at for item in batch] == [0.0, 1.0, 2.0]
    assert all(item.state is ItemState.RUNNING for item in batch)
    assert q.num_queued == 2


def test_waits_until_oldest_reaches_max_wait(loop: asyncio.AbstractEventLoop) -> None:
    q = queue(size=10)
    q.put(make(loop, at=1.0))
    q.put(make(loop, at=1.25))
    assert q.ready_reason(now=1.25, max_wait_s=0.5, cap=10) is None
    assert q.ready_reason(now=1.5, max_wait_s=0.5, cap=10) is CloseReason.WAIT
    batch, reason = q.take(cap=10)
    assert len(batch) == 2 and reason is CloseReason.WAIT


def test_token_budget_counts_padding(loop: asyncio.AbstractEventLoop) -> None:
    q = queue(size=10, tokens=100)
    for tokens in (10, 20, 30, 40):
        q.put(make(loop, tokens=tokens))
    # 3 inputs padded to 30 = 90 fit; the 4th would make 4 x 40 = 160.
    assert q.full_reason(cap=10) is CloseReason.TOKENS
    batch, reason = q.take(cap=10)
    assert [i.num_tokens for i in batch] == [10, 20, 30]
    assert reason is CloseReason.TOKENS


def test_an_input_over_the_token_budget_still_runs_alone(loop: asyncio.AbstractEventLoop) -> None:
    q = queue(size=10, tokens=50)
    q.put(make(loop, tokens=80))
    q.put(make(loop, tokens=5))
    batch, reason = q.take(cap=10)
    assert [i.num_tokens for i in batch] == [80]
    assert reason is CloseReason.TOKENS


def test_online_before_batch_fifo_within_class(loop: asyncio.AbstractEventLoop) -> None:
    q = queue(size=3)
    q.put(make(loop, at=0.0, priority=Priority.BATCH))
    q.put(make(loop, at=1.0, priority=Priority.ONLINE))
    q.put(make(loop, at=2.0, priority=Priority.BATCH))
    q.put(make(loop, at=3.0, priority=Priority.ONLINE))
    batch, _ = q.take(cap=3)
    assert [(i.priority, i.enqueued_at) for i in batch] == [
        (Priority.ONLINE, 1.0),
        (Priority.ONLINE, 3.0),
        (Priority.BATCH, 0.0),
    ]
    assert q.num_ahead_of(Priority.ONLINE) == 0
    assert q.num_ahead_of(Priority.BATCH) == 1


def test_batch_priority_input_still_closes_on_wait(loop: asyncio.AbstractEventLoop) -> None:
    q = queue(size=10)
    q.put(make(loop, at=0.0, priority=Priority.BATCH))
    assert q.ready_reason(now=0.01, max_wait_s=0.005, cap=10) is CloseReason.WAIT


def test_dropped_items_are_skipped_and_not_counted(loop: asyncio.AbstractEventLoop) -> None:
    q = queue(size=2)
    first, second, third = (make(loop, at=float(i)) for i in range(3))
    for item in (first, second, third):
        q.put(item)
    assert q.drop(first) and not q.drop(first)
    assert q.num_queued == 2
    assert q.oldest_enqueued_at() == 1.0
    batch, _ = q.take(cap=2)
    assert batch == [second, third]
    assert q.num_queued == 0 and q.oldest_enqueued_at() is None


def test_bound_refuses_beyond_max_queue(loop: asyncio.AbstractEventLoop) -> None:
    q = queue(bound=2)
    q.put(make(loop))
    q.put(make(loop))
    assert not q.can_put()
    with pytest.raises(OverflowError):
        q.put(make(loop))
    # Batch work has its own bound: a full online class does not block it, nor vice versa.
    assert q.can_put(Priority.BATCH)
    q.put(make(loop, priority=Priority.BATCH))
    q.put(make(loop, priority=Priority.BATCH))
    assert not q.can_put(Priority.BATCH)


def test_cap_below_max_batch_size_limits_the_batch(loop: asyncio.AbstractEventLoop) -> None:
    q = queue(size=8)
    for i in range(8):
        q.put(make(loop, at=float(i)))
    batch, reason = q.take(cap=3)
    assert len(batch) == 3 and reason is CloseReason.FULL


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        BatchQueue(max_batch_size=0, max_batch_tokens=None, max_queue=1)
    with pytest.raises(ValueError):
        BatchQueue(max_batch_size=1, max_batch_tokens=0, max_queue=1)


def test_one_short_of_full_is_not_full(loop: asyncio.AbstractEventLoop) -> None:
    """Size closes a batch only when it really holds ``max_batch_size`` inputs."""
    q = queue(size=4)
    for i in range(3):
        q.put(make(loop, at=float(i)))
    assert q.full_reason(cap=4) is None
    batch, _ = q.take(cap=4)
    assert len(batch) == 3


@pytest.mark.parametrize(
    ("budget", "lengths", "reason"),
    [
        (10, [6], CloseReason.TOKENS),  # a second input of any length needs 12 > 10
        (10, [3, 3], None),  # a third 3-token input fits: 9 <= 10
        (9, [3, 3], None),  # exactly the budget still fits
        (8, [3, 3], CloseReason.TOKENS),
    ],
)
def test_closes_on_tokens_once_no_further_input_could_fit(
    loop: asyncio.AbstractEventLoop, budget: int, lengths: list[int], reason: CloseReason | None
) -> None:
    """With nothing left to add, the batch closes as soon as even a short input would not fit."""
    q = queue(size=8, tokens=budget)
    for i, length in enumerate(lengths):
        q.put(make(loop, tokens=length, at=float(i)))
    assert q.full_reason(cap=8) is reason


def test_a_dropped_item_is_done_and_resolves_once(loop: asyncio.AbstractEventLoop) -> None:
    """Dropping ends an item's life; only the first resolve delivers a result."""
    q = queue()
    item = make(loop)
    q.put(item)
    assert q.drop(item)
    assert item.state is ItemState.DONE and not item.is_queued
    assert not q.drop(item)
    assert item.resolve("first")
    assert not item.resolve("second")
    assert item.future.result() == "first"


def test_the_smallest_queue_and_token_budget_are_one(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchQueue(max_batch_size=4, max_batch_tokens=1, max_queue=1)
    q.put(make(loop, tokens=1))
    assert not q.can_put(Priority.ONLINE)
    batch, reason = q.take(cap=4)
    assert len(batch) == 1 and reason is CloseReason.TOKENS


@pytest.mark.parametrize("state", [ItemState.QUEUED, ItemState.RUNNING])
def test_resolving_an_item_ends_its_life(loop: asyncio.AbstractEventLoop, state: ItemState) -> None:
    """Whoever resolves an item moves it to DONE and cancels its deadline timer."""
    item = make(loop)
    item.state = state
    item.timer = loop.call_later(100, lambda: None)
    timer = item.timer
    assert item.resolve(ValueError("failed"))
    assert item.state is ItemState.DONE
    assert item.timer is None and timer.cancelled()
    assert isinstance(item.future.exception(), ValueError)
