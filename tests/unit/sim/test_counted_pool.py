"""Decoding sequences as counts: the sums equal what each sequence would count alone."""

from __future__ import annotations

import random

from conveyor.sim.counted_pool import DECODE, GONE, CountedSeq, DecodePool
from conveyor.sim.request import SimRequest


def _seq(arrival: int) -> CountedSeq:
    request = SimRequest(arrival, "t", "t", [], 10, 0.0, 9.0, prompt_len=10)
    return CountedSeq(request, print, arrival, 0.0, 10, 10, 10, 9.0)


def test_blocks_kv_tokens_and_finishes_match_a_sequence_by_sequence_count() -> None:
    rng = random.Random(4)
    pool = DecodePool(4)
    covered: dict[int, int] = {}  # arrival -> tokens covered, counted one by one
    left: dict[int, int] = {}
    seqs: dict[int, CountedSeq] = {}
    for arrival in range(300):
        if rng.random() < 0.5:
            seq = seqs[arrival] = _seq(arrival)
            covered[arrival], left[arrival] = rng.randint(1, 30), rng.randint(1, 12)
            pool.add(seq, covered[arrival], left[arrival])
        if covered and rng.random() < 0.1:
            gone = rng.choice(sorted(covered))
            pool.remove(seqs[gone])
            del covered[gone], left[gone]
        assert pool.blocks_needed() == sum(1 for c in covered.values() if c % 4 == 0)
        pool.plan_step()
        for key in covered:
            covered[key] += 1
            left[key] -= 1
        assert pool.kv_tokens == sum(covered.values())
        assert pool.blocks == sum(-(-c // 4) for c in covered.values())
        due = {seq.arrival for seq in pool.finished()}
        assert due == {key for key, value in left.items() if value == 0}
        for key in due:
            pool.remove(seqs[key])
            del covered[key], left[key]
    assert pool.n == len(covered)
    assert all(seqs[key].state == DECODE for key in covered)
    assert [seq.arrival for seq in pool.members()] == sorted(covered)


def test_a_sequence_back_in_the_pool_is_not_finished_by_its_old_entry() -> None:
    pool = DecodePool(4)
    seq = _seq(1)
    pool.add(seq, 8, 2)
    pool.remove(seq)
    assert seq.state == GONE
    pool.add(seq, 8, 5)
    pool.plan_step()
    pool.plan_step()
    assert pool.finished() == []
    for _ in range(3):
        pool.plan_step()
    assert pool.finished() == [seq]
