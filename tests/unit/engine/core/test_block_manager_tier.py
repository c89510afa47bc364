"""The block manager with a second KV tier: evictions spill, lookups go on in the tier."""

from __future__ import annotations

import pytest

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.kv_tier import Restore, Spill, TierIndex
from conveyor.engine.core.sequence import Sequence
from tests.unit.engine.core.test_block_manager import compute, run_prefill


def finished(manager: BlockManager, seq_id: str, tokens: list[int]) -> Sequence:
    """A sequence prefilled and freed: its blocks stay cached in the pool."""
    seq = Sequence(seq_id, tokens)
    run_prefill(manager, seq)
    manager.free(seq)
    return seq


def test_an_evicted_block_is_spilled_and_a_later_prompt_restores_it() -> None:
    tier = TierIndex(8)
    manager = BlockManager(4, 4, tier)
    first = finished(manager, "a", list(range(9)))  # blocks 0, 1 full and cached; 2 partial
    digests = first.block_hashes[:2]
    finished(manager, "b", list(range(100, 113)))  # three full blocks: evicts a's two
    spills = tier.take_ops()
    # Freed tail first, so evicted tail first.
    assert [op for op in spills if isinstance(op, Spill)] == [Spill(1, 0), Spill(0, 1)]
    again = Sequence("c", list(range(9)))
    assert manager.num_cache_hit_tokens(again) == 8
    assert manager.can_allocate(again, 1)
    manager.allocate(again)
    assert (again.num_cached_tokens, again.num_computed_tokens) == (8, 8)
    ops = tier.take_ops()
    restores = [op for op in ops if isinstance(op, Restore)]
    assert [(op.slot, op.digest) for op in restores] == [(1, digests[0]), (0, digests[1])]
    assert [op.block_id for op in restores] == again.block_table
    # Held now: the digest lists the restored blocks first, as the pool's own held blocks.
    assert manager.cached_hashes(2) == digests
    # The restored blocks serve the next prompt from the pool, sharing them.
    twin = Sequence("d", list(range(9)))
    manager.allocate(twin)
    assert twin.block_table == again.block_table
    assert tier.take_ops() == []


def test_without_a_tier_eviction_loses_the_prefix() -> None:
    manager = BlockManager(4, 4)
    finished(manager, "a", list(range(9)))
    finished(manager, "b", list(range(100, 113)))
    assert manager.num_cache_hit_tokens(Sequence("c", list(range(9)))) == 0


def test_restoring_takes_blocks_so_a_full_pool_cannot_restore() -> None:
    tier = TierIndex(8)
    manager = BlockManager(4, 4, tier)
    finished(manager, "a", list(range(9)))
    holder = Sequence("b", list(range(100, 117)))
    manager.allocate(holder)
    compute(manager, holder, 16)  # holds the whole pool
    again = Sequence("c", list(range(9)))
    assert manager.num_cache_hit_tokens(again) == 8
    assert not manager.can_allocate(again)
    with pytest.raises(ValueError, match="not enough free blocks"):
        manager.allocate(again)
    assert not manager.is_allocated(again)


def test_a_chain_mixing_pool_and_tier_blocks_is_restored_in_place() -> None:
    tier = TierIndex(8)
    manager = BlockManager(3, 4, tier)
    first = finished(manager, "a", list(range(9)))  # blocks 0 and 1 cached, 2 free
    other = Sequence("b", [50, 51, 52, 53, 54])
    manager.allocate(other)
    compute(manager, other)  # takes block 2 then evicts block 0 (the head of a's chain)
    manager.free(other)
    tier.take_ops()
    again = Sequence("c", list(range(9)))
    hit = manager.num_cache_hit_tokens(again)
    assert hit == 8
    manager.allocate(again)
    assert again.block_table[0] == 0  # the head stayed in the pool
    restores = [op for op in tier.take_ops() if isinstance(op, Restore)]
    assert [(op.block_id, op.digest) for op in restores] == [
        (again.block_table[1], first.block_hashes[1])
    ]


def test_restores_pin_their_entries_while_the_spills_they_cause_need_slots() -> None:
    tier = TierIndex(2)  # as small as the chain: every spill would evict one of its blocks
    manager = BlockManager(4, 4, tier)
    first = finished(manager, "a", list(range(9)))
    finished(manager, "b", list(range(100, 113)))  # a's two blocks -> host slots 0, 1
    tier.take_ops()
    again = Sequence("c", list(range(9)))
    manager.allocate(again)  # takes b's cached blocks: their spills find every slot pinned
    ops = tier.take_ops()
    assert [op for op in ops if isinstance(op, Spill)] == []
    restores = [op for op in ops if isinstance(op, Restore)]
    assert [op.digest for op in restores] == first.block_hashes[:2]


def test_the_digest_lists_tier_blocks_after_the_pools() -> None:
    tier = TierIndex(8)
    manager = BlockManager(4, 4, tier)
    first = finished(manager, "a", list(range(9)))
    second = finished(manager, "b", list(range(100, 113)))
    hashes = manager.cached_hashes(10)
    assert set(hashes[:3]) == set(second.block_hashes[:3])
    assert set(hashes[3:]) == set(first.block_hashes[:2])
    assert len(manager.cached_hashes(4)) == 4


def test_forgotten_blocks_are_not_served_again() -> None:
    manager = BlockManager(4, 4, TierIndex(4))
    seq = Sequence("a", list(range(9)))
    run_prefill(manager, seq)
    manager.forget(seq.block_table[:1])
    assert seq.block_hashes[0] not in manager.cached_hashes(10)
    manager.free(seq)
    assert manager.num_cache_hit_tokens(Sequence("b", list(range(9)))) == 0
