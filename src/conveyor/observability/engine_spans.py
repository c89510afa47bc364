"""What the generation engine tells traced requests: queue wait and the steps that served them.

The engine calls :meth:`StepTracer.queued` when it takes a request in and :meth:`StepTracer.
stepped` after each step. A traced request (one whose server span records) gets a
``conveyor.queue_wait`` child span, from its arrival to the first step that computed it,
and every step that computed a traced request becomes a ``conveyor.engine_step`` root span
(the step's forward pass) linking the request spans it served, as a one-shot model's batch
span does. The engine writes them before it hands the step's tokens out, so a request's
spans are all written by the time its answer ends.

With no traced request live, both calls return after one check, so an engine with tracing
off pays nothing measurable. Spans are written with explicit times after the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conveyor.observability.batches import MAX_IDS_ON_SPAN
from conveyor.observability.context import RequestContext

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from opentelemetry.trace import Span, Tracer


@dataclass(slots=True)
class _Traced:
    """A live traced request: its context and whether a step has computed it yet."""

    origin: RequestContext
    span: Span
    tracer: Tracer
    arrival_s: float  # time.monotonic()
    is_started: bool = False


def traced_origin(origin: RequestContext | None) -> RequestContext | None:
    """``origin`` when its request is traced and its span records, else None."""
    if origin is None or origin.tracer is None or origin.span is None:
        return None
    return origin if origin.span.is_recording() else None


class StepTracer:
    """One engine's traced requests, and the spans its steps write for them."""

    __slots__ = ("_live", "model")

    def __init__(self, model: str) -> None:
        self.model = model
        self._live: dict[str, _Traced] = {}

    @property
    def num_live(self) -> int:
        """Traced requests the engine still holds (as of the last step)."""
        return len(self._live)

    def queued(self, seq_id: str, origin: RequestContext | None, arrival_s: float) -> None:
        """The engine took in a request (``arrival_s`` on ``time.monotonic``)."""
        traced = traced_origin(origin)
        if traced is None or traced.span is None or traced.tracer is None:
            return
        self._live[seq_id] = _Traced(traced, traced.span, traced.tracer, arrival_s)

    def stepped(
        self,
        seq_ids: Sequence[str],
        num_tokens: int,
        started_perf_s: float,
        live_ids: Collection[str],
    ) -> None:
        """A step computed ``seq_ids`` from ``started_perf_s`` (``time.perf_counter``) to now.

        ``live_ids`` are the requests the engine holds now; the others (finished, aborted,
        failed since the last step) are forgotten.
        """
        if not self._live:
            return
        served = [(seq_id, t) for seq_id in seq_ids if (t := self._live.get(seq_id)) is not None]
        if served:
            wall_now_ns = time.time_ns()
            step_ns = int((time.perf_counter() - started_perf_s) * 1e9)
            start_ns = wall_now_ns - step_ns
            queue_end_ns = start_ns
            mono_now = time.monotonic()
            for _, traced in served:
                if not traced.is_started:
                    traced.is_started = True
                    queued_ns = wall_now_ns - int((mono_now - traced.arrival_s) * 1e9)
                    _queue_span(traced, min(queued_ns, queue_end_ns), queue_end_ns)
            self._step_span(served, len(seq_ids), num_tokens, start_ns, wall_now_ns)
        for seq_id in [s for s in self._live if s not in live_ids]:
            del self._live[seq_id]

    def _step_span(
        self,
        served: list[tuple[str, _Traced]],
        num_seqs: int,
        num_tokens: int,
        start_ns: int,
        end_ns: int,
    ) -> None:
        """A root span for the step, linked to every traced request span it served."""
        from opentelemetry.context import Context
        from opentelemetry.trace import Link

        distinct = list({id(t.origin): t for _, t in served}.values())  # n choices share one
        span = distinct[0].tracer.start_span(
            "conveyor.engine_step",
            context=Context(),
            links=[Link(t.span.get_span_context()) for t in distinct],
            start_time=start_ns,
            attributes={
                "conveyor.model": self.model,
                "conveyor.step.num_seqs": num_seqs,
                "conveyor.step.num_tokens": num_tokens,
                "conveyor.request_ids": [t.origin.request_id for t in distinct[:MAX_IDS_ON_SPAN]],
            },
        )
        span.end(end_time=end_ns)


def _queue_span(traced: _Traced, start_ns: int, end_ns: int) -> None:
    """The request's wait for its first step, as a child of its server span."""
    from opentelemetry import trace

    context = trace.set_span_in_context(traced.span)
    span = traced.tracer.start_span("conveyor.queue_wait", context=context, start_time=start_ns)
    span.end(end_time=end_ns)
