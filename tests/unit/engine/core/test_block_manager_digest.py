"""The block manager's cached hashes, kept as blocks change, match a scan of the pool.

``cached_hashes`` feeds the heartbeat's prefix digest; it used to scan every block (ms per
refresh on a large pool). Random operations check the incremental set against the scan.
"""

from __future__ import annotations

import random

import pytest

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.sequence import Sequence


def _scan(manager: BlockManager) -> tuple[list[bytes], list[bytes]]:
    """Held hashes (sorted; twins of one prefix computed at once both count) and free
    cached hashes (most recently freed first), read from the pool."""
    blocks = manager._blocks
    held = sorted(b.content_hash for b in blocks if b.ref_count > 0 and b.content_hash)
    freed = [blocks[i].content_hash for i in reversed(manager._free_cached)]
    return held, [h for h in freed if h is not None]


def _step(manager: BlockManager, rng: random.Random, live: list[Sequence], n: int) -> None:
    """One random operation: start a sequence, compute a chunk, or free one."""
    if not live or rng.random() < 0.3:
        prefix = [rng.randrange(3)] * rng.randrange(0, 9)  # shared prefixes hit the cache
        tokens = prefix + [rng.randrange(50) for _ in range(rng.randrange(1, 12))]
        seq = Sequence(f"s{n}", tokens)
        if manager.can_allocate(seq):
            manager.allocate(seq)
            live.append(seq)
        return
    seq = live[rng.randrange(len(live))]
    chunk = min(rng.randrange(1, 6), seq.num_tokens - seq.num_computed_tokens)
    if chunk > 0 and rng.random() < 0.7 and manager.can_append(seq, chunk):
        manager.append(seq, chunk)
        seq.num_computed_tokens += chunk
        manager.cache_computed_blocks(seq)
    else:
        manager.free(seq)
        live.remove(seq)


@pytest.mark.parametrize("seed", range(6))
def test_cached_hashes_match_a_scan_of_the_pool(seed: int) -> None:
    rng = random.Random(seed)
    manager = BlockManager(num_blocks=12, block_size=2)
    live: list[Sequence] = []
    for n in range(400):
        _step(manager, rng, live, n)
        held, freed = _scan(manager)
        hashes = manager.cached_hashes(manager.num_blocks)
        assert sorted(hashes[: len(held)]) == held
        assert hashes[len(held) :] == freed
        assert manager.cached_hashes(3) == hashes[:3]
