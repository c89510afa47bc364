"""The decoding sequences of a counted worker (``counted_worker``), kept as counts.

A decoding sequence computes one token a step and samples one. The pool advances all of
them at once: a step counter ``t`` (steps planned), and for each sequence only what it
had when it joined. With ``base = covered - t`` at joining (``covered``: the tokens its
KV blocks cover, the step in flight's included), at any later ``t`` it covers
``base + t`` tokens, so:

* the KV tokens a step reads are ``sum(base) + n x t`` (``n`` sequences), kept as a sum;
* a sequence takes a new block in the step that starts covering a multiple of the block
  size: the number of them a step is the count of sequences whose ``base`` has one
  residue modulo the block size (one counter a residue), so the blocks in use are a
  running sum advanced per step in bulk, exactly as the block manager would count them
  (tables are minimal: ``ceil(covered / block_size)`` blocks);
* a sequence samples its last planned token at a known step, ``t`` at joining plus the
  tokens it has left: a heap keyed by that step hands out the ones that finish.

Planning a step and ending it cost O(1) plus the sequences that finish; removing one
(an abort, a preemption) is O(1) (a removed sequence's heap entry is skipped later).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from conveyor.sim.request import SimRequest
from conveyor.sim.worker import Reply


@dataclass(slots=True, eq=False)
class CountedSeq:
    """One request on a counted worker: its token counts, not its tokens."""

    request: SimRequest
    reply: Reply
    arrival: int
    admitted_s: float
    num_tokens: int  # prompt plus sampled tokens
    num_prompt: int
    planned: int  # output tokens it ends at
    deadline_s: float  # its request's, read by every look for late waiting requests
    num_output: int = 0
    computed: int = 0  # outside the pool: tokens in the KV cache
    blocks: int = 0  # outside the pool: KV blocks held
    base: int = 0  # in the pool: covered tokens minus the pool's step count at joining
    end_t: int = 0  # in the pool: the step count after which its last token is sampled
    state: int = 0  # WAITING, PREFILL, DECODE or GONE
    num_preemptions: int = 0


WAITING, PREFILL, DECODE, GONE = range(4)


class DecodePool:
    """Decoding sequences as counts (see the module docstring)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.t = 0
        self.n = 0
        self.base_sum = 0
        self.blocks = 0
        self._residues = [0] * block_size
        self._heap: list[tuple[int, int, CountedSeq]] = []
        self._live: dict[int, CountedSeq] = {}  # by arrival

    @property
    def kv_tokens(self) -> int:
        """Tokens the pool's sequences cover (what a step planned now reads)."""
        return self.base_sum + self.n * self.t

    def covered(self, seq: CountedSeq) -> int:
        """Tokens ``seq``'s blocks cover now."""
        return seq.base + self.t

    def add(self, seq: CountedSeq, covered: int, outputs_left: int) -> None:
        """``seq`` joins covering ``covered`` tokens with ``ceil(covered / block_size)``
        blocks; it samples its last token ``outputs_left`` steps from now."""
        seq.state = DECODE
        seq.base = covered - self.t
        seq.end_t = self.t + outputs_left
        self.n += 1
        self.base_sum += seq.base
        self._residues[seq.base % self.block_size] += 1
        self.blocks += -(-covered // self.block_size)
        self._live[seq.arrival] = seq
        heapq.heappush(self._heap, (seq.end_t, seq.arrival, seq))

    def remove(self, seq: CountedSeq) -> None:
        """Take ``seq`` out (its blocks freed, the step in flight's included)."""
        seq.state = GONE
        del self._live[seq.arrival]
        self.n -= 1
        self.base_sum -= seq.base
        self._residues[seq.base % self.block_size] -= 1
        self.blocks -= -(-(seq.base + self.t) // self.block_size)
        seq.computed = seq.blocks = 0

    def blocks_needed(self) -> int:
        """New blocks the next step takes (sequences starting a block)."""
        return self._residues[-self.t % self.block_size]

    def plan_step(self) -> None:
        """Every sequence decodes one more token (its block reserved)."""
        self.blocks += self._residues[-self.t % self.block_size]
        self.t += 1

    def finished(self) -> list[CountedSeq]:
        """The sequences whose last planned token the step ending now sampled (still in
        the pool: ``remove`` them)."""
        heap, done = self._heap, []
        while heap and heap[0][0] <= self.t:
            end_t, _, seq = heapq.heappop(heap)
            # A sequence preempted and back in the pool has an older entry: skipped.
            if seq.state == DECODE and seq.end_t == end_t:
                done.append(seq)
        return done

    def members(self) -> list[CountedSeq]:
        """The sequences in the pool, oldest first (O(n): for the rare decisions that
        look at each, preemption when blocks run out)."""
        return [self._live[arrival] for arrival in sorted(self._live)]

    def newest(self) -> CountedSeq | None:
        """The sequence that arrived last (O(n): a preemption's victim)."""
        return self._live[max(self._live)] if self._live else None

    def outputs_of(self, seq: CountedSeq, planned: int) -> int:
        """Tokens ``seq`` has sampled once the steps planned so far end."""
        return planned - (seq.end_t - self.t)
