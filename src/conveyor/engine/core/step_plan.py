"""One step's plan: which sequences compute how many tokens, and who was preempted for it.

Plain records the scheduler fills (``StepPlan``) and hands out (``SchedulerOutput``), the
share of a step's room a prompt leaves to those waiting behind it (``share_left_behind``,
the simulator's too), and the check of a finished step's sampled tokens against its plan
(``check_sampled``).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field

from conveyor.engine.core.sequence import Sequence, check_token_id
from conveyor.engine.core.step import SeqChunk
from conveyor.priority import Priority

# The share of a step's room left to the sequences waiting behind (the scheduler's "Room
# for arrivals").
ADMISSION_SHARE = 0.5
# The smallest share an admitted prompt leaves behind it, as a part of the step's token
# budget: a smaller one buys the prompt behind only a piece of itself (one more chunk,
# attended apart, in a later step), while the prompt admitted could take the room whole.
MIN_SHARE_OF_BUDGET = 1 / 32


def share_left_behind(room: int, token_budget: int, num_needed: int | None = None) -> int:
    """The tokens of ``room`` a prompt leaves to those waiting behind it: none where it
    needs no more than the room (``num_needed``: it is taken whole) or where the share
    would be under ``MIN_SHARE_OF_BUDGET`` of the step, else ``ADMISSION_SHARE`` of the
    room. So a burst of equal prompts fills a step with whole ones and one piece, not a
    trail of halves, while a short prompt behind long ones still starts at once."""
    if num_needed is not None and num_needed <= room:
        return 0
    share = int(room * ADMISSION_SHARE)
    return share if share >= token_budget * MIN_SHARE_OF_BUDGET else 0


@dataclass(slots=True, frozen=True)
class ScheduledSeq:
    """A sequence picked for this step: compute ``num_new_tokens`` of its tokens.

    The scheduler's decision, holding the live ``seq``; :meth:`to_chunk` freezes it into
    the ``SeqChunk`` the model runner computes. ``start_pos`` and ``needs_logits`` are
    captured from the sequence when the decision is made, so one that outlived its step
    is detected.
    """

    seq: Sequence
    num_new_tokens: int
    start_pos: int = field(init=False)
    needs_logits: bool = field(init=False)

    def __post_init__(self) -> None:
        seq, num_new = self.seq, self.num_new_tokens
        start = seq.num_computed_tokens
        end, num_tokens = start + num_new, len(seq.token_ids)  # ``seq.num_tokens``, inlined
        if num_new < 1:
            raise ValueError(f"num_new_tokens must be >= 1, got {num_new}")
        if end > num_tokens:
            raise ValueError(
                f"sequence {seq.seq_id!r} has {seq.num_uncomputed_tokens} "
                f"uncomputed tokens, cannot schedule {num_new}"
            )
        # Frozen dataclass: derived fields are set through object.__setattr__.
        object.__setattr__(self, "start_pos", start)
        # Reaching the newest token means the model must sample after this step.
        object.__setattr__(self, "needs_logits", end == num_tokens)

    def to_chunk(self) -> SeqChunk:
        """The runner's view: tokens, first position, block table, whether to sample."""
        if self.seq.num_computed_tokens != self.start_pos:
            raise ValueError(
                f"chunk of {self.seq.seq_id!r} is stale: it starts at {self.start_pos} but the "
                f"sequence has {self.seq.num_computed_tokens} computed tokens"
            )
        end = self.start_pos + self.num_new_tokens
        return SeqChunk(
            token_ids=tuple(self.seq.token_ids[self.start_pos : end]),
            start_pos=self.start_pos,
            block_table=tuple(self.seq.block_table),
            needs_logits=self.needs_logits,
            adapter_id=self.seq.adapter_id,
        )


@dataclass(slots=True)
class SchedulerOutput:
    """One step's plan: the sequences to compute and who was preempted for it."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        """Whether there is nothing to compute this step."""
        return not self.scheduled

    def to_chunks(self) -> list[SeqChunk]:
        """Every scheduled sequence as the runner's chunk, in step order."""
        return [scheduled.to_chunk() for scheduled in self.scheduled]


class StepPlan:
    """Mutable accumulator for one ``schedule`` call."""

    __slots__ = (
        "budget_left",
        "is_short",
        "job_budget_left",
        "num_batched_tokens",
        "preempted",
        "scheduled",
        "token_budget",
    )

    def __init__(self, token_budget: int, job_token_cap: int | None = None) -> None:
        """``job_token_cap``: the most tokens batch-job sequences may take (None: no cap)."""
        self.token_budget = token_budget
        self.scheduled: dict[str, ScheduledSeq] = {}
        self.preempted: list[Sequence] = []
        # Running sequences were short of blocks: nobody is admitted this step.
        self.is_short = False
        self.budget_left = token_budget
        self.job_budget_left = job_token_cap
        self.num_batched_tokens = 0

    def room_for(self, priority: Priority) -> int:
        """Tokens a sequence of ``priority`` may still take this step."""
        if priority is Priority.ONLINE or self.job_budget_left is None:
            return self.budget_left
        return min(self.budget_left, self.job_budget_left)

    def share_left_behind(self, room: int, num_needed: int | None = None) -> int:
        """The tokens of ``room`` left to those waiting behind (``share_left_behind``)."""
        return share_left_behind(room, self.token_budget, num_needed)

    def num_new_tokens(self, seq: Sequence) -> int:
        """Tokens ``seq`` computes in this step so far (0: not scheduled)."""
        scheduled = self.scheduled.get(seq.seq_id)
        return 0 if scheduled is None else scheduled.num_new_tokens

    def add(self, scheduled: ScheduledSeq) -> None:
        """Schedule a sequence, or give a scheduled one a new chunk in its place in the
        step, and charge its tokens to the budget."""
        previous = self.scheduled.get(scheduled.seq.seq_id)
        if previous is not None:
            self._charge(previous, -previous.num_new_tokens)
        self.scheduled[scheduled.seq.seq_id] = scheduled
        self._charge(scheduled, scheduled.num_new_tokens)

    def drop(self, seq: Sequence) -> None:
        """Unschedule ``seq`` (it was preempted later in the step) and refund it."""
        scheduled = self.scheduled.pop(seq.seq_id, None)
        if scheduled is not None:
            self._charge(scheduled, -scheduled.num_new_tokens)

    def _charge(self, scheduled: ScheduledSeq, num_tokens: int) -> None:
        """Take ``num_tokens`` (negative: refund) from the budgets that apply."""
        self.budget_left -= num_tokens
        self.num_batched_tokens += num_tokens
        if self.job_budget_left is not None and scheduled.seq.priority is not Priority.ONLINE:
            self.job_budget_left -= num_tokens

    def to_output(self) -> SchedulerOutput:
        """Freeze the plan into the public output."""
        return SchedulerOutput(
            list(self.scheduled.values()), self.preempted, self.num_batched_tokens
        )


def check_sampled(
    output: SchedulerOutput,
    live: list[ScheduledSeq],
    sampled: dict[str, int],
    unsampled: Set[str] = frozenset(),
) -> None:
    """Every live sampling sequence of ``output`` (but the ``unsampled``) has a valid
    token; no token lacks one."""
    expected = {i.seq.seq_id for i in live if i.needs_logits and i.seq.seq_id not in unsampled}
    gone = {item.seq.seq_id for item in output.scheduled} - {i.seq.seq_id for i in live}
    missing = expected - sampled.keys()
    if missing:
        raise ValueError(f"no sampled token for {sorted(missing)}")
    unexpected = sampled.keys() - expected - gone
    if unexpected:
        raise ValueError(f"sampled tokens for sequences that did not sample: {sorted(unexpected)}")
    for seq_id in expected:
        check_token_id(seq_id, sampled[seq_id])
