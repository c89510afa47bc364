"""Where requests come from: open-loop Poisson sources with rate steps, chat sessions with
think time, and the prompts and lengths they carry.

Prompts are token ids: an optional shared prefix (a system prompt every request of the
source carries), then ids unique to the request, so the prefix cache sees exactly the reuse
the scenario describes. A chat turn's prompt is the whole conversation so far (earlier
prompts and answers) plus the new message, as a chat client sends it.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

from conveyor.fleet.affinity import Affinity, PromptKey
from conveyor.sim.clock import Clock
from conveyor.sim.request import Outcome, SimRequest
from conveyor.sim.scenario import Lengths, TrafficSpec

SHARED_BASE = 1_000
UNIQUE_BASE = 10_000_000
ANSWER_TOKEN = 7  # what the simulated engine samples


def draw(lengths: Lengths, rng: random.Random) -> int:
    """A token count from ``lengths``."""
    if lengths.dist == "fixed":
        value = lengths.mean
    elif lengths.dist == "exponential":
        value = rng.expovariate(1 / lengths.mean)
    else:
        mu = math.log(lengths.mean) - lengths.sigma**2 / 2
        value = rng.lognormvariate(mu, lengths.sigma)
    count = max(1, round(value))
    return count if lengths.max is None else min(count, lengths.max)


class Prompts:
    """Builds requests: ids, lengths, deadlines, affinity hints."""

    def __init__(self, rng: random.Random, use_affinity: bool, lengths_only: bool = False) -> None:
        """``lengths_only``: a request without history or affinity carries its prompt's
        length, not its ids (the counted worker model reads nothing else; a thousand ids a
        request held by a million requests in flight do not fit memory)."""
        self.rng = rng
        self.use_affinity = use_affinity
        self.lengths_only = lengths_only
        self._ids = itertools.count(1)

    def next_rid(self) -> int:
        """A fresh request id."""
        return next(self._ids)

    def request(
        self, spec: TrafficSpec, now: float, *, history: list[int] | None = None,
        session: str | None = None,
    ) -> SimRequest:  # fmt: skip
        """A request of ``spec`` sent at ``now`` (after ``history``, for a chat turn)."""
        rid = self.next_rid()
        new = draw(spec.prompt_tokens, self.rng)
        if self.lengths_only and not history and not self.use_affinity:
            return SimRequest(rid, spec.name, spec.tenant, [], draw(spec.output_tokens, self.rng),
                              now, now + spec.timeout_s, prompt_len=new)  # fmt: skip
        if history:  # a chat's first turn has none yet: it starts with the shared prefix
            ids = [*history, *([UNIQUE_BASE + rid] * new)]
        else:
            shared = min(spec.shared_prefix_tokens, new - 1)
            ids = list(range(SHARED_BASE, SHARED_BASE + shared))
            ids += [UNIQUE_BASE + rid] * (new - shared)
        affinity = None
        if self.use_affinity:
            affinity = Affinity(prompt=PromptKey(ids), session=session)
        return SimRequest(rid, spec.name, spec.tenant, ids, draw(spec.output_tokens, self.rng),
                          now, now + spec.timeout_s, affinity=affinity)  # fmt: skip

    def line(self, spec: TrafficSpec, now: float, deadline_s: float) -> SimRequest:
        """A batch-job line (no affinity: a worker runs its own shard's lines)."""
        rid = self.next_rid()
        ids = [UNIQUE_BASE + rid] * draw(spec.prompt_tokens, self.rng)
        return SimRequest(rid, spec.name, spec.tenant, ids, draw(spec.output_tokens, self.rng),
                          now, now + deadline_s)  # fmt: skip


Send = Callable[[SimRequest], None]


def rate_at(spec: TrafficSpec, now: float) -> float:
    """The Poisson source's rate at ``now``."""
    rate = spec.rate_rps
    for step in spec.steps:
        if step.at_s <= now:
            rate = step.rate_rps
    return rate


def _next_change(spec: TrafficSpec, now: float) -> float:
    return min((s.at_s for s in spec.steps if s.at_s > now), default=math.inf)


class PoissonSource:
    """Open-loop arrivals: each gap drawn at the rate of the moment (memoryless, so a rate
    change restarts the draw at the change)."""

    def __init__(self, spec: TrafficSpec, clock: Clock, prompts: Prompts, send: Send,
                 end_s: float) -> None:  # fmt: skip
        self.spec, self._clock, self._prompts, self._send = spec, clock, prompts, send
        self._end_s = end_s if spec.stop_s is None else min(spec.stop_s, end_s)

    def start(self) -> None:
        """Schedule the first arrival."""
        self._clock.at(self.spec.start_s, self._next)

    def _next(self) -> None:
        now = self._clock.now
        rate = rate_at(self.spec, now)
        change = _next_change(self.spec, now)
        if rate <= 0:
            gap = math.inf
        elif self.spec.arrivals == "constant":
            gap = 1.0 / rate
        else:
            gap = self._prompts.rng.expovariate(rate)
        if now + gap >= change:
            self._clock.at(change, self._next)
        elif now + gap < self._end_s:
            self._clock.at(now + gap, self._arrive)

    def _arrive(self) -> None:
        self._send(self._prompts.request(self.spec, self._clock.now))
        self._next()


class ChatSession:
    """One user: ``turns`` turns, each sent ``think_s`` (exponential) after the answer."""

    def __init__(self, spec: TrafficSpec, name: str, clock: Clock, prompts: Prompts,
                 send: Send) -> None:  # fmt: skip
        self.spec, self.name, self._clock = spec, name, clock
        self._prompts, self._send = prompts, send
        self.history: list[int] = []
        self.turns_done = 0

    def start(self, at_s: float) -> None:
        """First turn at ``at_s``."""
        self._clock.at(at_s, self._turn)

    def _turn(self) -> None:
        history = self.history if self.spec.kind == "chat" else None
        request = self._prompts.request(self.spec, self._clock.now, history=history,
                                        session=self.name)  # fmt: skip
        request.session = self
        if self.spec.kind == "chat":
            self.history = list(request.prompt_ids)
        self._send(request)

    def on_answer(self, request: SimRequest, outcome: Outcome) -> None:
        """The turn ended; the next one follows after a think time."""
        self.turns_done += 1
        if outcome is Outcome.COMPLETED and self.spec.kind == "chat":
            self.history += [ANSWER_TOKEN] * request.output_tokens
        if self.turns_done < self.spec.turns:
            think = self._prompts.rng.expovariate(1 / self.spec.think_s) if self.spec.think_s else 0
            self._clock.after(think, self._turn)
