"""A counted worker's step planning: the scheduler's rules over counts.

The same decisions as ``engine.core.scheduler.Scheduler`` for online traffic, taken over
token counts instead of ``Sequence`` objects and block tables (``counted_pool`` holds the
decoding sequences). Each step, in the scheduler's order:

1. Decodes: every decoding sequence computes one token. When the new blocks they need
   are free (the common case) the whole pool steps at once; otherwise they are gone
   through oldest first, and each that lacks a block preempts the newest running
   sequence (its blocks freed, its tokens recomputed after readmission), as the
   scheduler does; a step short of blocks admits no one.
2. Running prefills take their next chunk; while a request waits they leave it
   ``ADMISSION_SHARE`` of the step's room (``share_left_behind``: not a sliver), and one
   lacking any block preempts the newest.
3. Waiting requests are admitted oldest first while a seat (``max_num_seqs``), the
   step's token budget (``max_num_batched_tokens``, a long prompt chunked) and free
   blocks allow; each too long for the room leaves ``ADMISSION_SHARE`` of it to those
   behind it (never a sliver: ``share_left_behind``); the head blocks the queue.
4. Running prefills take back the room admission left (as free blocks allow).

Not modelled (the scenario is refused where it matters, see ``counted_worker``): the
prefix cache (no prompt block is ever a hit), batch-job priority (its pauses and job
share), LoRA adapter slots, siblings, and the budget's shrinking after out-of-memory.
"""

from __future__ import annotations

import bisect

from conveyor.engine.core.step_plan import share_left_behind
from conveyor.sim.counted_cache import NOBODY, FreeBlocks
from conveyor.sim.counted_pool import DECODE, GONE, PREFILL, WAITING, CountedSeq, DecodePool
from conveyor.sim.counted_queue import WaitingQueue


def _arrival(seq: CountedSeq) -> int:
    return seq.arrival


class CountedStep:
    """One planned step: the pool's decodes and the chunks of the others."""

    __slots__ = ("chunk_tokens", "chunks", "is_short", "num_preempted")

    def __init__(self) -> None:
        self.chunks: dict[int, tuple[CountedSeq, int]] = {}  # by arrival
        self.chunk_tokens = 0
        self.is_short = False
        self.num_preempted = 0

    def add(self, seq: CountedSeq, num_new: int) -> None:
        """Schedule ``seq`` for ``num_new`` tokens (replacing an earlier grant)."""
        self.chunk_tokens += num_new - self.tokens_of(seq)
        self.chunks[seq.arrival] = (seq, num_new)

    def drop(self, seq: CountedSeq) -> None:
        """Unschedule ``seq`` (preempted later in the step)."""
        self.chunk_tokens -= self.tokens_of(seq)
        self.chunks.pop(seq.arrival, None)

    def tokens_of(self, seq: CountedSeq) -> int:
        """Tokens granted to ``seq`` so far (0: not scheduled)."""
        chunk = self.chunks.get(seq.arrival)
        return 0 if chunk is None else chunk[1]


class CountedEngine:
    """Waiting, prefilling and decoding sequences of one worker, and its KV blocks."""

    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, budget: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_num_seqs, self.budget = max_num_seqs, budget
        self.pool = DecodePool(block_size)
        self.waiting = WaitingQueue()  # oldest first
        self.prefilling: list[CountedSeq] = []  # running outside the pool, oldest first
        self.prefill_blocks = 0
        self.free = FreeBlocks(num_blocks)
        self._pool_ahead = False  # the pool has planned the step in flight

    @property
    def free_blocks(self) -> int:
        """Blocks nobody holds."""
        return self.num_blocks - self.pool.blocks - self.prefill_blocks

    @property
    def num_running(self) -> int:
        """Sequences holding a seat."""
        return self.pool.n + len(self.prefilling)

    @property
    def has_work(self) -> bool:
        """Whether anything waits or runs."""
        return bool(self.waiting or self.prefilling or self.pool.n)

    def add(self, seq: CountedSeq) -> None:
        """Queue a new request for admission."""
        seq.state = WAITING
        self.waiting.add(seq)

    def remove(self, seq: CountedSeq, owner: int = NOBODY) -> None:
        """Drop ``seq`` wherever it is, freeing its blocks (its computed full ones stay
        findable by ``owner``'s readmission)."""
        if seq.state == WAITING:
            self.waiting.remove(seq)
        elif seq.state == PREFILL:
            self.prefilling.remove(seq)
            self.prefill_blocks -= seq.blocks
            self._release(owner, seq.computed, seq.blocks)
        elif seq.state == DECODE:
            covered = self.pool.covered(seq)
            self.pool.remove(seq)
            blocks = -(-covered // self.block_size)
            self._release(owner, covered - int(self._pool_ahead), blocks)
        seq.state = GONE
        seq.computed = seq.blocks = 0

    def _release(self, owner: int, computed: int, blocks: int) -> None:
        cached = min(computed // self.block_size, blocks)
        self.free.release(owner, cached, blocks - cached)

    # -- planning ----------------------------------------------------------------------

    def room(self, step: CountedStep) -> int:
        """Tokens left in the step's budget (every pool sequence decodes one)."""
        return self.budget - self.pool.n - step.chunk_tokens

    def plan(self) -> CountedStep:
        """Plan the next step (blocks reserved, nothing advanced)."""
        step = CountedStep()
        self._pool_ahead = False
        prefills = self.prefilling[:]
        ones = []  # one token left: planned with the decodes
        for seq in self.prefilling:
            if seq.num_tokens - seq.computed == 1:
                ones.append(seq)
                prefills.remove(seq)
        self._plan_decodes(step, ones)
        held = share_left_behind(self.room(step), self.budget) if self.waiting else 0
        for seq in prefills:
            if self.room(step) - held <= 0:
                break  # the room only shrinks (a preemption comes after this check)
            if seq.state == PREFILL:
                self._schedule_prefill(seq, step, held)
        admitted = [] if step.is_short else self._admit(step)
        for seq in prefills + admitted:
            if self.room(step) <= 0:
                break  # a top-up takes room only
            self._top_up(seq, step)
        return step

    def _plan_decodes(self, step: CountedStep, ones: list[CountedSeq]) -> None:
        """Every decoding sequence one token (and ``ones``, prefills with one token
        left): at once when the blocks are there."""
        size = self.block_size
        lacking = sum(1 for s in ones if s.blocks * size <= s.computed) if ones else 0
        if self.pool.blocks_needed() + lacking > self.free_blocks:
            self._plan_decodes_short(step, ones)
            return
        self._step_pool()
        for seq in ones:
            self._reserve(seq, 1)
            step.add(seq, 1)

    def _plan_decodes_short(self, step: CountedStep, ones: list[CountedSeq]) -> None:
        """Decodes oldest first; one lacking a block preempts the newest running."""
        pool, size = self.pool, self.block_size
        taken: set[int] = set()  # pool sequences given a block this step (by arrival)
        for seq in sorted(pool.members() + ones, key=_arrival):
            if seq.state == DECODE:
                if pool.covered(seq) % size == 0:
                    if not self._free_one(seq, step, taken):
                        continue
                    taken.add(seq.arrival)
            elif seq.state == PREFILL:
                if seq.blocks * size <= seq.computed and not self._free_one(seq, step, taken):
                    continue
                self._reserve(seq, 1)
                step.add(seq, 1)
        self._step_pool()  # the blocks of ``taken`` are the ones it counts

    def _step_pool(self) -> None:
        self.free.take(self.pool.blocks_needed())
        self.pool.plan_step()
        self._pool_ahead = True

    def _free_one(self, seq: CountedSeq, step: CountedStep, taken: set[int]) -> bool:
        """Preempt the newest running sequences until a block is free for ``seq``;
        False when ``seq`` itself was the one preempted."""
        while self.free_blocks - len(taken) < 1:
            victim = self._newest_running()
            step.is_short = True
            taken.discard(victim.arrival)
            self._preempt(victim, step)
            if victim is seq:
                return False
        return True

    def _newest_running(self) -> CountedSeq:
        latest = self.prefilling[-1] if self.prefilling else None
        return max((s for s in (self.pool.newest(), latest) if s is not None), key=_arrival)

    def _preempt(self, victim: CountedSeq, step: CountedStep) -> None:
        """Free ``victim``'s blocks and queue it again at its arrival; its tokens are
        recomputed, but for the head of them still cached when it is readmitted."""
        if victim.state == DECODE:
            outputs = self.pool.outputs_of(victim, victim.planned) - int(self._pool_ahead)
            victim.num_output = outputs
            victim.num_tokens = victim.num_prompt + outputs
        step.drop(victim)
        self.remove(victim, victim.arrival)
        victim.num_preemptions += 1
        step.num_preempted += 1
        self.add(victim)

    def _reserve(self, seq: CountedSeq, num_new: int) -> None:
        """Blocks so ``seq`` covers ``num_new`` tokens past its computed ones."""
        need = -(-(seq.computed + num_new) // self.block_size) - seq.blocks
        if need > 0:
            seq.blocks += need
            self.prefill_blocks += need
            self.free.take(need)

    def _appendable(self, seq: CountedSeq) -> int:
        return seq.blocks * self.block_size - seq.computed + self.free_blocks * self.block_size

    def _schedule_prefill(self, seq: CountedSeq, step: CountedStep, held: int) -> None:
        """A running prefill's next chunk, leaving ``held`` tokens to admission."""
        room_left = self.room(step) - held
        if room_left <= 0:
            return
        while (appendable := self._appendable(seq)) < 1:
            victim = self._newest_running()
            step.is_short = True
            self._preempt(victim, step)
            if victim is seq:
                return
            room_left = self.room(step) - held
        num_new = min(seq.num_tokens - seq.computed, room_left, appendable)
        self._reserve(seq, num_new)
        step.add(seq, num_new)

    def _admit(self, step: CountedStep) -> list[CountedSeq]:
        """Admit waiting requests oldest first while seats, budget and blocks allow."""
        admitted: list[CountedSeq] = []
        size = self.block_size
        while self.waiting and (room := self.room(step)) > 0:
            seq = self.waiting[0]
            hits = self.free.cached_for(seq.arrival) * size
            if len(self.waiting) > 1:
                room -= share_left_behind(room, self.budget, seq.num_tokens - hits)
            num_new = min(seq.num_tokens - hits, room)
            needed = -(-(hits + num_new) // size)  # the cached blocks are free ones too
            if self.num_running >= self.max_num_seqs or needed > self.free_blocks:
                break
            self.waiting.pop_head()
            seq.state = PREFILL
            seq.blocks = self.free.revive(seq.arrival)
            seq.computed = seq.blocks * size
            self.prefill_blocks += seq.blocks
            self._reserve(seq, num_new)
            bisect.insort(self.prefilling, seq, key=_arrival)
            step.add(seq, num_new)
            admitted.append(seq)
        return admitted

    def _top_up(self, seq: CountedSeq, step: CountedStep) -> None:
        """Give a running prefill the room admission left, as free blocks allow."""
        if seq.state != PREFILL:
            return
        granted = step.tokens_of(seq)
        total = min(seq.num_tokens - seq.computed, granted + self.room(step),
                    self._appendable(seq))  # fmt: skip
        if total > granted:
            self._reserve(seq, total)
            step.add(seq, total)

    # -- a step's figures and its end --------------------------------------------------

    def figures(self, step: CountedStep) -> tuple[int, int, int]:
        """Tokens computed, sequences scheduled and KV tokens read by ``step``."""
        kv_tokens = self.pool.kv_tokens
        for seq, num_new in step.chunks.values():
            kv_tokens += seq.computed + num_new
        num_seqs = self.pool.n + len(step.chunks)
        return self.pool.n + step.chunk_tokens, num_seqs, kv_tokens

    def end(self, step: CountedStep) -> tuple[list[CountedSeq], list[CountedSeq]]:
        """Apply the step: the chunks' sequences that sampled, and those done (in the
        pool: their last planned token; others: sampled up to their plan)."""
        self._pool_ahead = False
        done = self.pool.finished()
        for seq in done:
            self.remove(seq)
            seq.num_output = seq.planned
        sampled: list[CountedSeq] = []
        for seq, num_new in step.chunks.values():
            if seq.state != PREFILL:
                continue  # aborted since it was planned
            seq.computed += num_new
            if seq.computed < seq.num_tokens:
                continue
            seq.num_tokens += 1
            seq.num_output += 1
            sampled.append(seq)
            if seq.num_output >= seq.planned:
                self.remove(seq)
                done.append(seq)
            else:
                self.prefilling.remove(seq)
                self.prefill_blocks -= seq.blocks
                self.pool.add(seq, seq.computed, seq.planned - seq.num_output)
        return sampled, done
