"""The free pool's hand-out order as counts: uncached first, then the oldest release."""

from __future__ import annotations

from conveyor.sim.counted_cache import NOBODY, FreeBlocks


def test_blocks_holding_nothing_go_first_then_the_oldest_cached_tail_first() -> None:
    free = FreeBlocks(4)
    free.take(4)
    free.release(NOBODY, 2, 1)  # a finished sequence: 2 full blocks and a partial one
    free.release(7, 3, 0)  # preempted sequence 7: 3 full blocks
    free.take(1)
    assert free.uncached == 0 and free.cached_for(7) == 3
    free.take(3)  # the finished one's 2, then the tail of 7's run
    assert free.cached_for(7) == 2
    assert free.revive(7) == 2
    assert free.cached_for(7) == 0 and free.num_cached == 0


def test_a_run_evicted_whole_is_not_found() -> None:
    free = FreeBlocks(0)
    free.release(3, 2, 0)
    free.release(4, 1, 0)
    free.take(2)
    assert free.cached_for(3) == 0 and free.revive(3) == 0
    assert free.cached_for(4) == 1
