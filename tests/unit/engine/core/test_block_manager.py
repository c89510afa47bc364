"""Tests for KV-cache block allocation, reference counting and prefix caching."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conveyor.engine.core.block_manager import BlockManager, hash_block
from conveyor.engine.core.sequence import Sequence


def make_seq(seq_id: str, token_ids: list[int]) -> Sequence:
    """A fresh sequence whose prompt is ``token_ids``."""
    return Sequence(seq_id, token_ids)


def compute(manager: BlockManager, seq: Sequence, num_new_tokens: int | None = None) -> None:
    """Reserve and 'compute' the next tokens of an allocated sequence, as a step would."""
    num = seq.num_uncomputed_tokens if num_new_tokens is None else num_new_tokens
    manager.append(seq, num)
    seq.num_computed_tokens += num
    manager.cache_computed_blocks(seq)


def run_prefill(manager: BlockManager, seq: Sequence) -> None:
    """Allocate a sequence and compute all its tokens."""
    manager.allocate(seq)
    compute(manager, seq)


def assert_pool_whole(manager: BlockManager) -> None:
    """Every block is free and nobody holds a reference."""
    assert manager.num_free_blocks == manager.num_blocks
    assert manager.num_used_blocks == 0
    assert manager.usage == 0.0
    assert all(manager.block_ref_count(b) == 0 for b in range(manager.num_blocks))


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 4), (4, 0), (-1, 1)])
def test_bad_pool_is_refused(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        BlockManager(num_blocks, block_size)


def test_fresh_allocation_takes_no_blocks_until_appended() -> None:
    manager = BlockManager(8, 4)
    seq = make_seq("a", list(range(10)))
    assert manager.num_cache_hit_tokens(seq) == 0
    assert manager.can_allocate(seq)
    manager.allocate(seq)
    assert seq.block_table == []
    assert (seq.num_cached_tokens, seq.num_computed_tokens) == (0, 0)
    assert manager.is_allocated(seq)
    assert manager.num_used_blocks == 0


def test_chunked_growth_takes_blocks_as_chunks_arrive() -> None:
    manager = BlockManager(8, 4)
    seq = make_seq("a", list(range(10)))
    manager.allocate(seq)
    compute(manager, seq, 3)
    assert len(seq.block_table) == 1
    compute(manager, seq, 3)  # positions 3..5 spill into a second block
    assert len(seq.block_table) == 2
    compute(manager, seq, 2)  # positions 6..7 fit the second block
    assert len(seq.block_table) == 2
    compute(manager, seq, 2)
    assert len(seq.block_table) == 3
    assert manager.num_used_blocks == 3
    assert manager.usage == pytest.approx(3 / 8)
    manager.free(seq)
    assert seq.block_table == []
    assert seq.num_computed_tokens == 0
    assert not manager.is_allocated(seq)
    assert_pool_whole(manager)


def test_append_is_idempotent_for_reserved_positions() -> None:
    # A step that failed and is rescheduled reserves the same positions again.
    manager = BlockManager(8, 4)
    seq = make_seq("a", list(range(10)))
    manager.allocate(seq)
    manager.append(seq, 9)
    manager.append(seq, 5)
    assert len(seq.block_table) == 3
    assert manager.num_appendable_tokens(seq) == 3 * 4 + 5 * 4


def test_same_three_block_prompt_shares_blocks_and_recomputes_the_last() -> None:
    manager = BlockManager(16, 4)
    prompt = list(range(100, 112))  # exactly three full blocks
    first = make_seq("a", prompt)
    run_prefill(manager, first)
    second = make_seq("b", prompt)
    manager.allocate(second)
    # The last block holds the last prompt token, which must be computed in a
    # private block: only the first two blocks are shared.
    assert second.block_table == first.block_table[:2]
    assert [manager.block_ref_count(b) for b in first.block_table] == [2, 2, 1]
    assert second.num_cached_tokens == second.num_computed_tokens == 8
    assert second.num_uncomputed_tokens == 4
    compute(manager, second)
    assert second.block_table[2] != first.block_table[2]
    assert manager.num_used_blocks == 4
    manager.free(first)
    manager.free(second)
    assert_pool_whole(manager)


def test_cached_blocks_are_shared_only_under_the_same_adapter() -> None:
    """The same tokens under another LoRA adapter, or the base model, hold other KV values."""
    manager = BlockManager(32, 4)
    prompt = list(range(100, 112))  # three full blocks: two are shareable
    run_prefill(manager, Sequence("lora-1", prompt, adapter_id=1))
    for seq_id, adapter_id, num_shared in [("again", 1, 8), ("lora-2", 2, 0), ("base", 0, 0)]:
        seq = Sequence(seq_id, prompt, adapter_id=adapter_id)
        assert manager.num_cache_hit_tokens(seq) == num_shared, seq_id
    run_prefill(manager, Sequence("base-first", prompt))
    assert manager.num_cache_hit_tokens(Sequence("base-again", prompt)) == 8


def test_a_sequence_off_the_prefix_cache_computes_everything_but_fills_the_cache() -> None:
    manager = BlockManager(16, 4)
    prompt = list(range(100, 112))
    first = make_seq("a", prompt)
    run_prefill(manager, first)
    scored = Sequence("b", prompt, uses_prefix_cache=False)
    assert manager.num_cache_hit_tokens(scored) == 0
    manager.allocate(scored)
    assert (scored.block_table, scored.num_computed_tokens) == ([], 0)
    compute(manager, scored)
    assert not set(scored.block_table) & set(first.block_table)
    manager.free(first)  # its blocks stay findable, but the scored copy's are as good
    manager.free(scored)
    reader = make_seq("c", [*prompt, 7])
    assert manager.num_cache_hit_tokens(reader) == 12


def test_prompt_past_a_block_boundary_reuses_every_full_block() -> None:
    manager = BlockManager(16, 4)
    prompt = list(range(13))
    first = make_seq("a", prompt)
    run_prefill(manager, first)
    second = make_seq("b", prompt)
    manager.allocate(second)
    assert second.block_table == first.block_table[:3]
    assert [manager.block_ref_count(b) for b in first.block_table] == [2, 2, 2, 1]
    assert second.num_cached_tokens == 12
    assert second.num_uncomputed_tokens == 1


@pytest.mark.parametrize("num_tokens", range(1, 14))
def test_last_token_is_always_computed_in_a_private_block(num_tokens: int) -> None:
    manager = BlockManager(16, 4)
    prompt = list(range(num_tokens))
    run_prefill(manager, make_seq("a", prompt))
    seq = make_seq("b", prompt)
    manager.allocate(seq)
    assert seq.num_cached_tokens <= num_tokens - 1
    assert seq.num_cached_tokens == (num_tokens - 1) // 4 * 4
    manager.append(seq, seq.num_uncomputed_tokens)
    last_block = seq.block_table[(num_tokens - 1) // 4]
    assert manager.block_ref_count(last_block) == 1


def test_partial_blocks_are_not_cached() -> None:
    manager = BlockManager(16, 4)
    run_prefill(manager, make_seq("a", list(range(7))))
    # Only the first block (tokens 0..3) is full; 4..6 sit in a partial block.
    assert manager.num_cache_hit_tokens(make_seq("b", list(range(9)))) == 4


def test_chunk_registers_blocks_only_once_computed() -> None:
    manager = BlockManager(16, 4)
    first = make_seq("a", list(range(9)))
    manager.allocate(first)
    manager.append(first, 8)  # reserved, not yet computed
    probe = make_seq("b", list(range(9)))
    assert manager.num_cache_hit_tokens(probe) == 0
    first.num_computed_tokens = 5
    manager.cache_computed_blocks(first)
    assert manager.num_cache_hit_tokens(probe) == 4
    first.num_computed_tokens = 8
    manager.cache_computed_blocks(first)
    manager.cache_computed_blocks(first)  # idempotent
    assert manager.num_cache_hit_tokens(probe) == 8


def test_generated_tokens_are_cached_too() -> None:
    manager = BlockManager(16, 4)
    seq = make_seq("a", [1, 2, 3])
    run_prefill(manager, seq)
    for token in (4, 5, 6):
        seq.append_token(token)
        compute(manager, seq)
    # Tokens 1..6 computed: block [1,2,3,4] is full and cached.
    assert manager.num_cache_hit_tokens(make_seq("b", [1, 2, 3, 4, 5, 6])) == 4


def test_freed_cached_blocks_are_revived() -> None:
    manager = BlockManager(4, 4)
    prompt = list(range(12))
    first = make_seq("a", prompt)
    run_prefill(manager, first)
    first_table = list(first.block_table)
    manager.free(first)
    assert_pool_whole(manager)
    second = make_seq("b", [*prompt, 99])
    assert manager.num_cache_hit_tokens(second) == 12
    # Reviving three blocks plus one fresh block fills the pool exactly.
    assert manager.can_allocate(second, 1)
    manager.allocate(second)
    assert second.block_table == first_table
    assert manager.num_used_blocks == 3
    assert manager.can_append(second, 1)
    compute(manager, second)
    assert manager.num_free_blocks == 0
    manager.free(second)
    assert_pool_whole(manager)


def test_can_allocate_counts_revived_blocks_against_the_pool() -> None:
    manager = BlockManager(5, 2)
    prompt = [1, 2, 3, 4, 5]
    first = make_seq("a", prompt)
    run_prefill(manager, first)  # [1,2] [3,4] cached, [5] partial
    manager.free(first)
    hog = make_seq("hog", list(range(10, 15)))
    manager.allocate(hog)
    manager.append(hog, 5)  # three blocks, all from the uncached pool
    seq = make_seq("c", prompt)
    assert manager.num_cache_hit_tokens(seq) == 4
    assert manager.num_free_blocks == 2
    assert manager.can_allocate(seq)  # reviving the two cached blocks fits
    # One fresh block would fit the two free blocks, but both are the revived ones.
    assert not manager.can_allocate(seq, 1)
    manager.free(hog)
    assert manager.can_allocate(seq, 1)


def test_a_namesake_is_a_different_sequence() -> None:
    manager = BlockManager(4, 2)
    seq = make_seq("a", [1, 2, 3])
    manager.allocate(seq)
    namesake = make_seq("a", [1, 2, 3])
    assert not manager.is_allocated(namesake)
    assert not manager.can_allocate(namesake)
    with pytest.raises(ValueError, match="already allocated"):
        manager.allocate(namesake)
    with pytest.raises(ValueError, match="not allocated"):
        manager.free(namesake)


def test_eviction_prefers_uncached_then_oldest_cached_tail_first() -> None:
    manager = BlockManager(6, 2)
    first = make_seq("a", [1, 2, 3, 4, 5])  # blocks: [1,2] [3,4] cached, [5] partial
    second = make_seq("b", [6, 7, 8, 9, 10])
    run_prefill(manager, first)
    run_prefill(manager, second)
    first_table = list(first.block_table)
    manager.free(first)
    manager.free(second)
    assert_pool_whole(manager)
    hog = make_seq("hog", list(range(20, 28)))
    manager.allocate(hog)
    manager.append(hog, 6)  # the two partial blocks, then first's tail [3,4]
    assert hog.block_table[2] == first_table[1]
    assert manager.num_cache_hit_tokens(make_seq("p", [1, 2, 3, 4, 5])) == 2
    assert manager.num_cache_hit_tokens(make_seq("q", [6, 7, 8, 9, 10])) == 4
    manager.append(hog, 8)  # then first's head [1,2]
    assert hog.block_table[3] == first_table[0]
    assert manager.num_cache_hit_tokens(make_seq("p", [1, 2, 3, 4, 5])) == 0
    assert manager.num_cache_hit_tokens(make_seq("q", [6, 7, 8, 9, 10])) == 4


def test_an_evicted_block_caches_the_content_it_is_reused_for() -> None:
    manager = BlockManager(4, 2)
    first = make_seq("a", [1, 2, 3])
    run_prefill(manager, first)  # [1,2] cached, [3] partial
    manager.free(first)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    second = make_seq("b", prompt)
    run_prefill(manager, second)  # its last block is first's [1,2], evicted
    assert manager.num_cache_hit_tokens(make_seq("p", [1, 2, 3])) == 0
    manager.free(second)
    assert manager.num_cache_hit_tokens(make_seq("q", prompt)) == 6


def test_a_pool_of_one_token_blocks_caches_every_token_but_the_last() -> None:
    manager = BlockManager(4, 1)
    first = make_seq("a", [1, 2, 3])
    run_prefill(manager, first)
    first_table = list(first.block_table)
    assert len(first_table) == 3
    manager.free(first)
    second = make_seq("b", [1, 2, 4])
    run_prefill(manager, second)
    assert second.num_cached_tokens == 2
    assert second.block_table[:2] == first_table[:2]
    manager.free(second)
    assert_pool_whole(manager)


def test_concurrent_identical_prefills_keep_one_findable_copy() -> None:
    manager = BlockManager(8, 2)
    prompt = [1, 2, 3, 4, 5]
    first = make_seq("a", prompt)
    second = make_seq("b", prompt)
    manager.allocate(first)
    manager.allocate(second)  # both miss: nothing is computed yet
    compute(manager, first)
    compute(manager, second)
    first_table = list(first.block_table)
    assert set(first_table).isdisjoint(second.block_table)
    manager.free(first)
    manager.free(second)
    assert_pool_whole(manager)
    third = make_seq("c", prompt)
    manager.allocate(third)
    assert third.block_table == first_table[:2]


def test_duplicate_becomes_findable_when_its_twin_is_evicted() -> None:
    manager = BlockManager(6, 2)
    prompt = [1, 2, 3]
    first = make_seq("a", prompt)
    second = make_seq("b", prompt)
    manager.allocate(first)
    manager.allocate(second)
    compute(manager, first)
    compute(manager, second)
    second_table = list(second.block_table)
    manager.free(first)  # first's [1,2] is the findable copy; now free and cached
    hog = make_seq("hog", list(range(10, 20)))
    manager.allocate(hog)
    manager.append(hog, 8)  # takes every free block, evicting first's copy
    assert manager.num_cache_hit_tokens(make_seq("p", prompt)) == 0
    manager.free(second)
    third = make_seq("c", prompt)
    manager.allocate(third)
    assert third.block_table == second_table[:1]
    assert third.num_cached_tokens == 2


def test_can_append_and_append_refuse_an_exhausted_pool() -> None:
    manager = BlockManager(2, 2)
    seq = make_seq("a", list(range(6)))
    manager.allocate(seq)
    assert manager.can_append(seq, 4)
    assert not manager.can_append(seq, 5)
    with pytest.raises(ValueError, match="check can_append"):
        manager.append(seq, 5)
    assert seq.block_table == []
    compute(manager, seq, 4)
    assert manager.num_appendable_tokens(seq) == 0
    assert not manager.can_append(seq, 1)
    assert manager.can_append(seq, 0)
    manager.append(seq, 0)  # what can_append allows, append does: nothing, here
    assert len(seq.block_table) == 2


def test_append_refuses_positions_past_the_sequence() -> None:
    manager = BlockManager(8, 2)
    seq = make_seq("a", [1, 2, 3])
    manager.allocate(seq)
    assert not manager.can_append(seq, 4)
    with pytest.raises(ValueError, match="cannot reserve up to 4"):
        manager.append(seq, 4)
    assert not manager.can_append(seq, -1)
    with pytest.raises(ValueError, match=">= 0"):
        manager.append(seq, -1)


def test_operations_on_unallocated_sequences_raise() -> None:
    manager = BlockManager(8, 2)
    seq = make_seq("a", [1, 2, 3])
    assert not manager.can_append(seq, 1)
    for action in (
        lambda: manager.append(seq, 1),
        lambda: manager.free(seq),
        lambda: manager.cache_computed_blocks(seq),
        lambda: manager.num_appendable_tokens(seq),
    ):
        with pytest.raises(ValueError, match="not allocated"):
            action()


def test_allocate_refuses_a_sequence_with_cache_state() -> None:
    manager = BlockManager(8, 2)
    seq = make_seq("a", [1, 2, 3])
    manager.allocate(seq)
    assert not manager.can_allocate(seq)
    with pytest.raises(ValueError, match="already allocated"):
        manager.allocate(seq)
    stray = make_seq("b", [1, 2, 3])
    stray.num_computed_tokens = 2
    assert not manager.can_allocate(stray)
    with pytest.raises(ValueError, match="cache state"):
        manager.allocate(stray)


def test_can_allocate_rejects_impossible_chunks() -> None:
    manager = BlockManager(8, 2)
    seq = make_seq("a", [1, 2, 3])
    assert manager.can_allocate(seq, 3)
    assert not manager.can_allocate(seq, 4)
    assert not manager.can_allocate(seq, -1)
    assert not BlockManager(1, 2).can_allocate(seq, 3)


def test_block_ref_count_checks_the_id() -> None:
    manager = BlockManager(2, 2)
    with pytest.raises(ValueError, match="outside the pool"):
        manager.block_ref_count(2)
    with pytest.raises(ValueError, match="outside the pool"):
        manager.block_ref_count(-1)


def test_num_blocks_needed_rounds_up() -> None:
    manager = BlockManager(2, 4)
    assert [manager.num_blocks_needed(n) for n in range(6)] == [0, 1, 1, 1, 1, 2]
    assert (manager.num_blocks, manager.block_size) == (2, 4)


def test_block_hash_is_chained_and_position_sensitive() -> None:
    first = hash_block(b"", [1, 2])
    assert hash_block(b"", [1, 2]) == first
    assert hash_block(first, [1, 2]) != first
    assert hash_block(b"", [2, 1]) != first
    assert len(first) == 16


def test_block_hash_is_the_same_in_another_process() -> None:
    code = (
        "from conveyor.engine.core.block_manager import hash_block;"
        "print(hash_block(hash_block(b'', [1, 2, 3]), [2**40, 0, 7]).hex())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == hash_block(hash_block(b"", [1, 2, 3]), [2**40, 0, 7]).hex()


def test_hash_memo_follows_the_block_size() -> None:
    prompt = list(range(9))
    big = BlockManager(8, 4)
    run_prefill(big, make_seq("a", prompt))
    small = BlockManager(8, 2)
    run_prefill(small, make_seq("a", prompt))
    probe = make_seq("b", prompt)
    assert big.num_cache_hit_tokens(probe) == 8
    assert probe.block_hash_size == 4
    assert small.num_cache_hit_tokens(probe) == 8
    assert probe.block_hash_size == 2
    assert probe.block_hashes[0] == hash_block(b"", [0, 1])
