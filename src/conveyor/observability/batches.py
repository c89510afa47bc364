"""What a model batch tells the requests it served: queue wait, batch size, model time.

The batcher calls ``batch_taken`` when a batch closes and ``batch_done`` when its results
are back. Each input's request (captured by the work item) gets the figures for its log
line; traced requests get a queue-wait span, and one batch span links every request span
the batch served. Spans are written after the fact with explicit times, so nothing runs
on the model thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from conveyor.observability.context import RequestContext

if TYPE_CHECKING:
    from opentelemetry.trace import Link, Span, Tracer

    from conveyor.batching.item import WorkItem

# Request ids listed on a batch span at most (the links carry the rest).
MAX_IDS_ON_SPAN = 64


def batch_taken(batch: Sequence[WorkItem], now: float) -> None:
    """A batch closed at ``now`` (loop clock): note each request's wait and batch size."""
    for item in batch:
        item.started_at = now
        if item.origin is not None:
            item.origin.note_batch(now - item.enqueued_at, len(batch))


def batch_done(model: str, batch: Sequence[WorkItem], model_s: float, now: float) -> None:
    """The batch's results are back at ``now`` (loop clock) after ``model_s`` on the model."""
    origins = _distinct_origins(batch)
    for origin in origins:
        origin.note_model_time(model_s)
    traced = [o for o in origins if o.tracer is not None and o.span is not None]
    if not traced:
        return
    tracer = traced[0].tracer
    if tracer is None:  # narrowed above; keeps mypy honest
        return
    to_wall_ns = _wall_clock_ns(now)
    for item in batch:
        span = item.origin.span if item.origin is not None else None
        if span is not None and item.started_at is not None:
            start_ns, end_ns = to_wall_ns(item.enqueued_at), to_wall_ns(item.started_at)
            _queue_span(tracer, span, start_ns, end_ns)
    started_at = batch[0].started_at if batch[0].started_at is not None else now - model_s
    _batch_span(tracer, model, origins, traced, to_wall_ns(started_at), to_wall_ns(now))


def _distinct_origins(batch: Sequence[WorkItem]) -> list[RequestContext]:
    seen: dict[int, RequestContext] = {}
    for item in batch:
        if item.origin is not None:
            seen.setdefault(id(item.origin), item.origin)
    return list(seen.values())


def _wall_clock_ns(now: float) -> _ToWall:
    return _ToWall(time.time_ns(), now)


class _ToWall:
    """Converts event-loop times to wall-clock nanoseconds (what spans carry)."""

    def __init__(self, wall_now_ns: int, loop_now: float) -> None:
        self._wall_now_ns = wall_now_ns
        self._loop_now = loop_now

    def __call__(self, loop_time: float) -> int:
        return self._wall_now_ns - int((self._loop_now - loop_time) * 1e9)


def _queue_span(tracer: Tracer, parent: Span, start_ns: int, end_ns: int) -> None:
    from opentelemetry import trace

    context = trace.set_span_in_context(parent)
    span = tracer.start_span("conveyor.queue_wait", context=context, start_time=start_ns)
    span.end(end_time=end_ns)


def _batch_span(
    tracer: Tracer,
    model: str,
    origins: Sequence[RequestContext],
    traced: Sequence[RequestContext],
    start_ns: int,
    end_ns: int,
) -> None:
    """A root span for the batch, linked to every traced request span it served."""
    from opentelemetry.context import Context
    from opentelemetry.trace import Link

    links: list[Link] = [Link(o.span.get_span_context()) for o in traced if o.span is not None]
    ids = [o.request_id for o in origins[:MAX_IDS_ON_SPAN]]
    span = tracer.start_span(
        "conveyor.model_batch",
        context=Context(),
        links=links,
        start_time=start_ns,
        attributes={
            "conveyor.model": model,
            "conveyor.batch.num_requests": len(origins),
            "conveyor.request_ids": ids,
        },
    )
    span.end(end_time=end_ns)
