"""The requests an engine holds, from admission to their end, and every way one ends.

A live request is the request and the stream its outputs go to. Each step gives the
scheduled ones their chunks, their prompt scores and their share of the step's time. A
request ends by finishing (its last token, or the context length), by an abort, by being
refused as too late for its deadline, by a failed step or by the engine failing
everything; each end frees its sequence in the scheduler and moves its counters. Used
only on the engine thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from conveyor.engine.core.engine_config import EngineStats
from conveyor.engine.core.scheduler import Scheduler
from conveyor.engine.core.seat_turnover import SeatTurnover, late_ones
from conveyor.engine.core.step import SeqChunk
from conveyor.engine.core.step_plan import SchedulerOutput
from conveyor.engine.engine_metrics import record_finish
from conveyor.engine.outputs import FinishReason, GenerationOutput, TokenLogprobs
from conveyor.engine.request import GenerationRequest
from conveyor.engine.stream import GenerationStream
from conveyor.errors import ConveyorError
from conveyor.observability.metrics import GeneratorMetrics
from conveyor.tenants.usage import split_by_tokens

# Weight of the newest finished request in the running mean of request run time.
RUN_TIME_SMOOTHING = 0.1

Delivery = tuple[GenerationStream, GenerationOutput | ConveyorError]


@dataclass(slots=True)
class Entry:
    """A live request and where its outputs go."""

    request: GenerationRequest
    stream: GenerationStream


class LiveRequests:
    """The engine's live requests by id, and their ends (each frees its scheduler seat)."""

    def __init__(
        self,
        scheduler: Scheduler,
        stats: EngineStats,
        metrics: GeneratorMetrics,
        turnover: SeatTurnover,
    ) -> None:
        """Requests of `scheduler`, counted in `stats` and `metrics`; finishes timed by
        `turnover`."""
        self._scheduler = scheduler
        self._stats = stats
        self._metrics = metrics
        self._turnover = turnover
        self._entries: dict[str, Entry] = {}
        self.mean_run_s = 0.0

    def __getitem__(self, request_id: str) -> Entry:
        return self._entries[request_id]

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def requests(self) -> Iterator[GenerationRequest]:
        """Every live request."""
        return (entry.request for entry in self._entries.values())

    def add(self, request: GenerationRequest, stream: GenerationStream) -> None:
        """Hold `request` (its sequence is already in the scheduler)."""
        self._entries[request.request_id] = Entry(request, stream)

    def abort(self, request_id: str) -> None:
        """Free an aborted request's blocks (it may have finished meanwhile)."""
        if self._entries.pop(request_id, None) is None:
            return
        self._scheduler.abort(request_id)
        self._stats.num_aborted += 1
        self._metrics.finished["abort"].inc()

    def take_token(
        self, entry: Entry, token_id: int, logprobs: TokenLogprobs | None, now_s: float
    ) -> GenerationOutput:
        """Give a sampled token to its request; retire the request if it stopped."""
        request = entry.request
        previous_s = request.last_token_s
        output = request.add_token(token_id, logprobs, now_s)
        self._stats.num_generated_tokens += 1
        self._metrics.generated_tokens.inc()
        if previous_s is None:
            self._metrics.time_to_first_token_s[request.priority].observe(now_s - request.arrival_s)
        else:
            self._metrics.time_per_output_token_s[request.priority].observe(now_s - previous_s)
        if output.is_finished:
            self.retire(entry)
        return output

    def end_at_length(self, entry: Entry, now_s: float) -> Delivery:
        """End a request at its length (max_tokens 0, or the context length): its last
        output, and it is retired."""
        last = entry.request.final_output(FinishReason.LENGTH, now_s)
        self.retire(entry)
        return entry.stream, last

    def retire(self, entry: Entry) -> None:
        """Release a finished request's blocks and fold its run time into the mean."""
        request = entry.request
        del self._entries[request.request_id]
        self._scheduler.finish(request.request_id)
        self._turnover.on_finish(time.monotonic(), self._scheduler.num_waiting)
        self._stats.num_finished += 1
        record_finish(self._metrics, request)
        if request.first_token_s is not None and request.finished_s is not None:
            run_s = request.finished_s - request.arrival_s
            self.mean_run_s += RUN_TIME_SMOOTHING * (run_s - self.mean_run_s)

    def chunks(self, output: SchedulerOutput) -> list[SeqChunk]:
        """The step's chunks, each asking to score the prompt positions its request wants."""
        return [
            self._entries[scheduled.seq.seq_id].request.with_scoring(chunk)
            for scheduled, chunk in zip(output.scheduled, output.to_chunks(), strict=True)
        ]

    def keep_prompt_scores(
        self,
        output: SchedulerOutput,
        chunks: list[SeqChunk],
        scores: Sequence[tuple[TokenLogprobs, ...]],
    ) -> None:
        """Hand the positions the runner scored (``scores``, in chunk order) to their
        requests."""
        scored = iter(scores)
        for scheduled, chunk in zip(output.scheduled, chunks, strict=True):
            if chunk.scoring is not None:
                request = self._entries[scheduled.seq.seq_id].request
                request.add_prompt_scores(chunk.scoring, next(scored))

    def charge(self, output: SchedulerOutput, chunks: list[SeqChunk], step_s: float) -> None:
        """Give each scheduled request its share of the step's time, by tokens computed."""
        shares_s = split_by_tokens(step_s, [len(chunk.token_ids) for chunk in chunks])
        for scheduled, share_s in zip(output.scheduled, shares_s, strict=True):
            self._entries[scheduled.seq.seq_id].request.model_s += share_s

    def shed_late(
        self, now_s: float, interval_s: float, refusal: Callable[[], ConveyorError]
    ) -> list[Delivery]:
        """Refuse the waiting online requests whose seat, a seat every ``interval_s``, would
        come after their first-token deadline: what to send (a ``refusal()`` each)."""
        waiting = [self._entries[seq.seq_id].request for seq in self._scheduler.waiting_online()]
        deadlines = [r.deadline_s if r.first_token_s is None else None for r in waiting]
        deliveries: list[Delivery] = []
        for index in late_ones(deadlines, now_s, interval_s):
            request_id = waiting[index].request_id
            self._scheduler.abort(request_id)
            deliveries.append((self._entries.pop(request_id).stream, refusal()))
        if deliveries:
            self._metrics.finished["shed"].inc(len(deliveries))
        return deliveries

    def fail_step(self, output: SchedulerOutput, error: ConveyorError) -> list[Delivery]:
        """Fail every request scheduled in this step (the others carry on): what to send."""
        deliveries: list[Delivery] = []
        for scheduled in output.scheduled:
            if scheduled.seq.seq_id in self._entries:
                deliveries.append(self._fail(scheduled.seq.seq_id, error))
        return deliveries

    def fail_all(self, error: ConveyorError) -> list[Delivery]:
        """Fail every live request (shutdown, or an engine fault): what to send."""
        return [self._fail(request_id, error) for request_id in list(self._entries)]

    def _fail(self, request_id: str, error: ConveyorError) -> Delivery:
        entry = self._entries.pop(request_id)
        self._scheduler.abort(request_id)
        self._stats.num_failed += 1
        self._metrics.finished["error"].inc()
        return entry.stream, error
