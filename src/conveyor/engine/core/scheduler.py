"""Continuous-batching scheduler: which sequences compute which tokens each step.

Policy, kept deliberately simple:

* Order.  Every queue is ordered by ``(priority, arrival)``: online before
  batch, older before newer.  Waiting sequences are admitted strictly in that
  order (the head blocks the queue when it does not fit), so a preempted
  sequence, which keeps its arrival, is readmitted before newer arrivals of the
  same or lower priority.
* Each step.  While an online prompt waits or is being prefilled, running
  batch-job sequences sit the step out (at most ``MAX_BATCH_PAUSE_STEPS`` in a
  row), so the online caller's first token does not wait for a step full of
  job decodes.  Decodes (single-token steps) of the served sequences go
  first, in order: they are cheap and hold callers mid-answer.  Then, class by
  class (online, then batch): that class's running chunked prefills, then its
  waiting sequences are admitted while the sequence cap, the token budget and
  free blocks allow.  So an online prompt takes the step's token budget before
  any batch-job prefill does.  A prompt longer than the remaining budget is
  prefilled in chunks over several steps.
* Room for arrivals.  While a sequence of its class waits, running prefills
  leave half of what is left of the step to admission (``ADMISSION_SHARE``), as
  does an admitted online prompt too long for the room for those behind it (never a
  sliver: ``share_left_behind``); prefills take back what admission left: a short
  request behind long prompts starts the next step.
* Job share.  While online traffic is present, batch-job sequences take at most
  a capped number of a step's tokens (see ``job_share``): job decodes past the
  cap sit the step out keeping their blocks, job prefills are chunked to fit, so
  the step an online request finds in flight stays short.
* Preemption.  When a running sequence needs a block and none is free, the
  running sequence with the largest ``(priority, arrival)`` is preempted (its
  blocks are freed and its tokens, generated ones included, are recomputed
  after readmission).  A step whose running sequences were short of blocks
  admits no one.  A waiting online request that lacks a seat or blocks which
  running batch-job sequences hold preempts those, newest first, as long as
  that makes it fit; it never evicts another online request.
* LoRA adapters.  The running sequences never use more distinct adapters than
  ``max_loras_per_batch`` (the slots resident on the device), so every step fits;
  a waiting sequence of another adapter is stepped over until a slot frees.
* Siblings.  A sequence waits, as if it did not fit, while a running sibling
  computes the prompt blocks it will share (see ``siblings``).
* Two-phase steps.  ``schedule`` reserves blocks but does not advance any
  sequence; ``postprocess`` does, after the model ran.  If the run fails (out
  of memory), the caller shrinks the token budget and schedules again.
"""

from __future__ import annotations

import bisect
from collections.abc import Set

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.job_share import JobShare
from conveyor.engine.core.scheduler_config import SchedulerConfig
from conveyor.engine.core.sequence import Sequence, SequenceStatus
from conveyor.engine.core.siblings import waits_for_sibling
from conveyor.engine.core.step_plan import ScheduledSeq, SchedulerOutput, StepPlan, check_sampled
from conveyor.priority import Priority

# Steps in a row that batch-job sequences may sit out while online prompts are prefilled.
MAX_BATCH_PAUSE_STEPS = 8


def _order_key(seq: Sequence) -> tuple[int, int]:
    """Queue order: more important first, then older first."""
    return (int(seq.priority), seq.arrival)


class Scheduler:
    """Decides each step's batch; see the module docstring for the policy."""

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        job_share: JobShare | None = None,
    ) -> None:
        """Refuse a pool that cannot hold one sequence of ``max_model_len`` tokens.

        ``job_share`` caps batch-job tokens a step while online traffic is present (None:
        no cap). That guarantee is what makes every admitted sequence able to run to
        completion (alone, if it must), so preemption can never livelock.
        """
        needed = block_manager.num_blocks_needed(config.max_model_len)
        if needed > block_manager.num_blocks:
            raise ValueError(
                f"max_model_len {config.max_model_len} needs {needed} blocks of "
                f"{block_manager.block_size} tokens but the pool has {block_manager.num_blocks}; "
                "lower max_model_len or give the KV cache more blocks"
            )
        self._config = config
        self._block_manager = block_manager
        self._waiting: list[Sequence] = []
        self._running: list[Sequence] = []
        self._by_id: dict[str, Sequence] = {}
        self._length_capped: set[str] = set()
        self._token_budget = config.max_num_batched_tokens
        self._pending: SchedulerOutput | None = None
        self._num_batch_pauses = 0
        self._job_share = job_share

    @property
    def config(self) -> SchedulerConfig:
        """The limits this scheduler enforces."""
        return self._config

    @property
    def block_manager(self) -> BlockManager:
        """The KV-cache pool this scheduler allocates from."""
        return self._block_manager

    @property
    def token_budget(self) -> int:
        """Current per-step token budget (lowered after out-of-memory failures)."""
        return self._token_budget

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission (preempted ones included)."""
        return len(self._waiting)

    @property
    def num_waiting_online(self) -> int:
        """Online sequences waiting for admission (the queue holds online ones first)."""
        after_online = (int(Priority.ONLINE) + 1, -1)
        return bisect.bisect_left(self._waiting, after_online, key=_order_key)

    def waiting_online(self) -> list[Sequence]:
        """The online sequences waiting for admission, in the order they will be admitted."""
        return self._waiting[: self.num_waiting_online]

    @property
    def num_running(self) -> int:
        """Sequences holding KV-cache blocks."""
        return len(self._running)

    @property
    def num_batch(self) -> int:
        """Batch-job sequences waiting or running (both queues hold online ones first)."""
        after_online = (int(Priority.ONLINE) + 1, -1)
        running_online = bisect.bisect_left(self._running, after_online, key=_order_key)
        return len(self._waiting) - self.num_waiting_online + len(self._running) - running_online

    @property
    def has_unfinished(self) -> bool:
        """Whether any sequence is waiting or running."""
        return bool(self._by_id)

    def get(self, seq_id: str) -> Sequence | None:
        """The waiting or running sequence with this id, if any."""
        return self._by_id.get(seq_id)

    # -- life cycle -------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a fresh sequence for admission.

        Raises ValueError for a sequence that is not fresh, whose id is already
        queued, or that is longer than ``max_model_len`` (anything within
        ``max_model_len`` fits the pool, see ``__init__``).
        """
        if seq.status is not SequenceStatus.WAITING or seq.block_table or seq.num_computed_tokens:
            raise ValueError(f"sequence {seq.seq_id!r} is not fresh (status {seq.status.value})")
        if seq.seq_id in self._by_id:
            raise ValueError(f"a sequence with id {seq.seq_id!r} is already queued")
        if seq.num_tokens > self._config.max_model_len:
            raise ValueError(
                f"sequence {seq.seq_id!r} has {seq.num_tokens} tokens, more than "
                f"max_model_len {self._config.max_model_len}"
            )
        bisect.insort(self._waiting, seq, key=_order_key)
        self._by_id[seq.seq_id] = seq

    def abort(self, seq_id: str) -> Sequence | None:
        """Drop a sequence wherever it is and free its blocks; None if unknown."""
        seq = self._by_id.get(seq_id)
        if seq is None:
            return None
        self._remove(seq)
        seq.status = SequenceStatus.ABORTED
        return seq

    def finish(self, seq_id: str) -> Sequence:
        """Mark a sequence finished (the caller saw a stop condition) and free it."""
        seq = self._by_id.get(seq_id)
        if seq is None:
            raise ValueError(f"no waiting or running sequence has id {seq_id!r}")
        self._remove(seq)
        seq.status = SequenceStatus.FINISHED
        return seq

    def _remove(self, seq: Sequence) -> None:
        """Take ``seq`` out of the queues, releasing its blocks if it holds any."""
        if seq.status is SequenceStatus.RUNNING:
            self._running.remove(seq)
            self._block_manager.free(seq)
        else:
            self._waiting.remove(seq)
        del self._by_id[seq.seq_id]
        self._length_capped.discard(seq.seq_id)

    # -- token budget -----------------------------------------------------------

    def shrink_token_budget(self) -> int:
        """Halve the per-step token budget (floor 1) after the runner ran out of memory."""
        self._token_budget = max(1, self._token_budget // 2)
        return self._token_budget

    def restore_token_budget(self) -> int:
        """Double the budget back towards the configured one; call after a good step."""
        self._token_budget = min(self._config.max_num_batched_tokens, self._token_budget * 2)
        return self._token_budget

    # -- stepping ---------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Plan the next step; reserves blocks but advances no sequence.

        Raises RuntimeError if a sequence that reached ``max_model_len`` (as
        reported by ``postprocess``) has not been finished.
        """
        if self._length_capped:
            capped = ", ".join(sorted(self._length_capped))
            raise RuntimeError(f"finish() the sequences at max_model_len first: {capped}")
        plan = StepPlan(self._token_budget, self._job_token_cap())
        classes = self._classes_this_step()
        # Decodes first: one token each, and they hold the most latency-bound users.
        running = SequenceStatus.RUNNING
        for seq in list(self._running):
            # A decode: one uncomputed token (``num_uncomputed_tokens``, inlined: hot).
            is_decode = len(seq.token_ids) - seq.num_computed_tokens == 1
            if is_decode and seq.status is running and seq.priority in classes:
                self._schedule_decode(seq, plan)
        for priority in classes:
            self._schedule_class(plan, priority)
        self._pending = plan.to_output()
        return self._pending

    def _schedule_class(self, plan: StepPlan, priority: Priority) -> None:
        """Running prefills of ``priority``, then its waiting sequences (see "Room for
        arrivals" in the module docstring)."""
        prefills = [
            s for s in self._running if s.num_uncomputed_tokens > 1 and s.priority is priority
        ]
        is_waiting = bool(self._waiting) and self._waiting[0].priority is priority
        held = plan.share_left_behind(plan.room_for(priority)) if is_waiting else 0
        for seq in prefills:
            if seq.status is SequenceStatus.RUNNING:
                self._schedule_running(seq, plan, held)
        admitted = [] if plan.is_short else self._admit_waiting(plan, priority)
        for seq in prefills + admitted:
            self._top_up(seq, plan)

    def _classes_this_step(self) -> tuple[Priority, ...]:
        """The priority classes this step serves: online alone while an online prompt waits
        or is prefilled (a step's time grows with every sequence in it), for at most
        ``MAX_BATCH_PAUSE_STEPS`` steps in a row, so batch jobs always progress."""
        # Running sequences are in queue order: a batch-job one, if any, is last.
        has_batch = bool(self._running) and self._running[-1].priority is not Priority.ONLINE
        is_paused = has_batch and self._num_batch_pauses < MAX_BATCH_PAUSE_STEPS
        if is_paused and self._has_online_prefill():
            self._num_batch_pauses += 1
            return (Priority.ONLINE,)
        self._num_batch_pauses = 0
        return tuple(Priority)

    def _job_token_cap(self) -> int | None:
        """This step's cap on batch-job tokens (see ``job_share``); None: no cap."""
        if self._job_share is None:
            return None
        is_online_waiting = bool(self._waiting) and self._waiting[0].priority is Priority.ONLINE
        is_online_running = bool(self._running) and self._running[0].priority is Priority.ONLINE
        return self._job_share.job_token_cap(is_online_waiting or is_online_running)

    def _has_online_prefill(self) -> bool:
        """An online sequence can be admitted now, or still has prompt tokens to compute."""
        if self._waiting and self._waiting[0].priority is Priority.ONLINE:
            head = self._waiting[0]
            num_new = min(
                head.num_tokens - self._block_manager.num_cache_hit_tokens(head),
                self._token_budget,
            )
            fits = self._fits(head, num_new) or self._is_reclaimable(head, num_new)
            if fits and self._adapter_fits(head, self._running_adapters()):
                return True
        return any(
            seq.priority is Priority.ONLINE and seq.num_uncomputed_tokens > 1
            for seq in self._running
        )

    def _schedule_decode(self, seq: Sequence, plan: StepPlan) -> None:
        """A decode: as ``_schedule_running``, without its block checks while the last block
        has room for the token (15 decodes in 16 with blocks of 16 tokens)."""
        if len(seq.block_table) * self._block_manager.block_size > seq.num_computed_tokens:
            if plan.room_for(seq.priority) > 0:
                plan.add(ScheduledSeq(seq, 1))
            return
        self._schedule_running(seq, plan)

    def _schedule_running(self, seq: Sequence, plan: StepPlan, held: int = 0) -> None:
        """Give a running sequence its next chunk, preempting others for blocks; it leaves
        ``held`` of the step's tokens to admission."""
        room_left = plan.room_for(seq.priority) - held
        if room_left <= 0:
            return
        manager = self._block_manager
        while (room := manager.num_appendable_tokens(seq)) < 1:
            victim = self._running[-1]
            plan.is_short = True
            self._preempt(victim, plan)
            if victim is seq:
                return
            room_left = plan.room_for(seq.priority) - held
        # A prefill squeezed for blocks takes a shorter chunk instead of preempting.
        num_new = min(seq.num_uncomputed_tokens, room_left, room)
        manager.append(seq, num_new)
        plan.add(ScheduledSeq(seq, num_new))

    def _top_up(self, seq: Sequence, plan: StepPlan) -> None:
        """Give a running prefill the step's tokens that admission left, as free blocks
        allow (nobody is preempted for them)."""
        if seq.status is not SequenceStatus.RUNNING:  # preempted for an online arrival
            return
        granted = plan.num_new_tokens(seq)
        appendable = self._block_manager.num_appendable_tokens(seq)
        total = min(seq.num_uncomputed_tokens, granted + plan.room_for(seq.priority), appendable)
        if total > granted:
            self._block_manager.append(seq, total)
            plan.add(ScheduledSeq(seq, total))

    def _preempt(self, victim: Sequence, plan: StepPlan) -> None:
        """Free a running sequence's blocks and requeue it at its arrival position."""
        self._running.remove(victim)
        plan.drop(victim)
        self._block_manager.free(victim)
        victim.status = SequenceStatus.WAITING
        victim.num_preemptions += 1
        bisect.insort(self._waiting, victim, key=_order_key)
        plan.preempted.append(victim)

    def _admit_waiting(self, plan: StepPlan, priority: Priority) -> list[Sequence]:
        """Admit waiting sequences of ``priority`` in order while seats, budget, blocks allow
        (an online one leaves half of the room to online ones behind it); return them.

        The queue head blocks everything behind it, whatever their class, except a head
        whose LoRA adapter would exceed ``max_loras_per_batch``: it is stepped over.
        """
        manager = self._block_manager
        skipped = 0  # sequences left waiting because every adapter slot is taken
        admitted: list[Sequence] = []
        # Changes only when a sequence is admitted (or preempted to admit one): a long
        # queue of stepped-over sequences must not rescan the running ones each.
        active = self._running_adapters()
        while len(self._waiting) > skipped and (room := plan.room_for(priority)) > 0:
            seq = self._waiting[skipped]
            if seq.priority is not priority:
                break
            if not self._adapter_fits(seq, active):
                skipped += 1
                continue
            if waits_for_sibling(seq, self._running, manager.block_size):
                break
            num_needed = seq.num_tokens - manager.num_cache_hit_tokens(seq)
            behind = self._waiting[skipped + 1 : skipped + 2]
            if priority is Priority.ONLINE and behind and behind[0].priority is priority:
                room -= plan.share_left_behind(room, num_needed)
            num_new = min(num_needed, room)
            if not self._fits(seq, num_new) and not self._make_room(seq, num_new, plan):
                break
            self._waiting.pop(skipped)
            manager.allocate(seq)
            manager.append(seq, num_new)
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self._running, seq, key=_order_key)
            plan.add(ScheduledSeq(seq, num_new))
            admitted.append(seq)
            active = self._running_adapters()
        return admitted

    def _fits(self, seq: Sequence, num_new: int) -> bool:
        """Whether ``seq`` can be admitted now with ``num_new`` tokens: a seat and blocks."""
        has_seat = len(self._running) < self._config.max_num_seqs
        return has_seat and self._block_manager.can_allocate(seq, num_new)

    def _running_adapters(self) -> set[int]:
        """The LoRA adapters of the running sequences (empty when adapters are not limited)."""
        if self._config.max_loras_per_batch is None:
            return set()
        return {seq.adapter_id for seq in self._running if seq.adapter_id}

    def _adapter_fits(self, seq: Sequence, active: set[int]) -> bool:
        """Whether admitting ``seq`` keeps the running adapters (``active``) within the limit."""
        limit = self._config.max_loras_per_batch
        if limit is None or seq.adapter_id == 0:
            return True
        return seq.adapter_id in active or len(active) < limit

    def _make_room(self, seq: Sequence, num_new: int, plan: StepPlan) -> bool:
        """Preempt running batch-job sequences, newest first, until online ``seq`` fits.

        Nothing is preempted unless freeing every batch-job sequence would be enough.
        """
        if not self._is_reclaimable(seq, num_new):
            return False
        victims = [other for other in self._running if other.priority is not Priority.ONLINE]
        while victims and not self._fits(seq, num_new):
            self._preempt(victims.pop(), plan)
        return self._fits(seq, num_new)

    def _is_reclaimable(self, seq: Sequence, num_new: int) -> bool:
        """Whether online ``seq`` would fit if every running batch-job sequence were freed."""
        if seq.priority is not Priority.ONLINE:
            return False
        victims = [other for other in self._running if other.priority is not Priority.ONLINE]
        reclaimable = sum(len(victim.block_table) for victim in victims)
        manager = self._block_manager
        needed = manager.num_blocks_needed(num_new)
        return bool(victims) and manager.num_free_blocks + reclaimable >= needed

    def postprocess(
        self, output: SchedulerOutput, sampled: dict[str, int], unsampled: Set[str] = frozenset()
    ) -> list[Sequence]:
        """Apply a step the model completed: advance caches, append sampled tokens.

        ``output`` must be the latest ``schedule()`` result, postprocessed once.
        ``sampled`` maps the seq_id of every scheduled sequence with ``needs_logits`` but
        the ``unsampled`` (the caller ends those next, their blocks cached) to its new
        token.  Sequences aborted or finished since ``schedule`` are ignored, with their
        tokens.  Returns the sequences that reached ``max_model_len``: the caller must
        ``finish`` them before the next step.  Everything is validated first.
        """
        if output is not self._pending:
            raise ValueError("output is not the latest schedule() result, or was postprocessed")
        live = [item for item in output.scheduled if self._is_running(item.seq)]
        check_sampled(output, live, sampled, unsampled)
        self._pending = None
        capped: list[Sequence] = []
        for item in live:
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            self._block_manager.cache_computed_blocks(seq)
            if item.needs_logits and seq.seq_id not in unsampled:
                seq.append_token(sampled[seq.seq_id])
                if seq.num_tokens >= self._config.max_model_len:
                    capped.append(seq)
                    self._length_capped.add(seq.seq_id)
        return capped

    def _is_running(self, seq: Sequence) -> bool:
        """Whether ``seq`` itself (not a namesake) is still running."""
        return self._by_id.get(seq.seq_id) is seq and seq.status is SequenceStatus.RUNNING
