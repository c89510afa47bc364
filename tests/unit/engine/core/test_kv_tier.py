"""The second KV tier's index: slots, LRU order, the disk tier, pins and the queued ops."""

from __future__ import annotations

import pytest

from conveyor.engine.core.kv_tier import Demote, Discard, Restore, Spill, Tier, TierIndex


def h(n: int) -> bytes:
    """A stand-in block hash."""
    return bytes([n]) * 16


@pytest.mark.parametrize(("host", "disk"), [(0, 0), (-1, 0), (1, -1)])
def test_bad_sizes_are_refused(host: int, disk: int) -> None:
    with pytest.raises(ValueError, match="must be >= "):
        TierIndex(host, disk)


def test_a_spilled_block_is_held_and_restored_from_its_slot() -> None:
    index = TierIndex(2)
    index.spill(7, h(1))
    assert h(1) in index and h(2) not in index
    assert index.take_ops() == [Spill(7, 0)]
    assert index.restore(h(1), 3) is Tier.HOST
    assert index.take_ops() == [Restore(3, 0, h(1))]
    assert index.take_ops() == []
    assert h(1) in index  # the host copy stays after a restore


def test_spilling_a_held_block_again_copies_nothing() -> None:
    index = TierIndex(2)
    index.spill(7, h(1))
    index.take_ops()
    index.spill(9, h(1))
    assert index.take_ops() == []
    assert index.num_host_blocks == 1


def test_a_full_host_tier_reuses_the_least_recently_used_slot() -> None:
    index = TierIndex(2)
    index.spill(1, h(1))
    index.spill(2, h(2))
    index.restore(h(1), 5)  # h(1) is now the most recently used
    index.take_ops()
    index.spill(3, h(3))
    assert index.take_ops() == [Spill(3, 1)]  # h(2)'s slot
    assert h(2) not in index and h(1) in index and h(3) in index


def test_host_evictions_go_to_disk_and_come_back_from_it() -> None:
    index = TierIndex(1, disk_blocks=2)
    index.spill(1, h(1))
    index.spill(2, h(2))
    assert index.take_ops() == [Spill(1, 0), Demote(0, h(1)), Spill(2, 0)]
    assert (index.num_host_blocks, index.num_disk_blocks) == (1, 1)
    assert index.restore(h(1), 4) is Tier.DISK
    assert index.take_ops() == [Restore(4, None, h(1))]


def test_a_full_disk_tier_discards_its_least_recently_used_block() -> None:
    index = TierIndex(1, disk_blocks=1)
    for n in (1, 2, 3):
        index.spill(n, h(n))
    assert index.take_ops() == [
        Spill(1, 0), Demote(0, h(1)), Spill(2, 0), Discard(h(1)), Demote(0, h(2)), Spill(3, 0),
    ]  # fmt: skip
    assert h(1) not in index and h(2) in index and h(3) in index


def test_pinned_blocks_are_never_evicted() -> None:
    index = TierIndex(2)
    index.spill(1, h(1))
    index.spill(2, h(2))
    index.take_ops()
    with index.pinned([h(1)]):
        index.spill(3, h(3))  # takes h(2)'s slot, not the older pinned h(1)'s
        with index.pinned([h(3)]):
            index.spill(4, h(4))  # every slot pinned: dropped
    assert index.take_ops() == [Spill(3, 1)]
    assert h(1) in index and h(3) in index and h(4) not in index
    index.spill(4, h(4))  # pins are gone
    assert index.take_ops() == [Spill(4, 0)]


def test_restoring_an_unknown_block_is_an_error() -> None:
    with pytest.raises(KeyError):
        TierIndex(1).restore(h(1), 0)


def test_hashes_list_host_then_disk_most_recent_first() -> None:
    index = TierIndex(2, disk_blocks=4)
    for n in (1, 2, 3, 4):
        index.spill(n, h(n))
    assert index.hashes(10) == [h(4), h(3), h(2), h(1)]
    assert index.hashes(3) == [h(4), h(3), h(2)]
    assert index.hashes(0) == []


def test_clear_forgets_everything() -> None:
    index = TierIndex(2, disk_blocks=2)
    for n in (1, 2, 3):
        index.spill(n, h(n))
    index.clear()
    assert index.take_ops() == []
    assert (index.num_host_blocks, index.num_disk_blocks) == (0, 0)
    index.spill(5, h(5))
    index.spill(6, h(6))
    assert index.take_ops() == [Spill(5, 0), Spill(6, 1)]
