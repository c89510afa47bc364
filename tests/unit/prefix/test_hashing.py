"""Chained block hashes and the heartbeat digest: one definition for engine and gateway."""

from __future__ import annotations

import base64

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.prefix_digest import PrefixDigest
from conveyor.engine.core.sequence import Sequence
from conveyor.prefix.hashing import (
    DIGEST_KEY_BYTES,
    chain_hashes,
    decode_digest,
    digest_key,
    encode_digest,
    hash_block,
    num_reusable_blocks,
)
from conveyor.prefix.report import PrefixHoldings, parse_prefix_report, prefix_report


def _computed(manager: BlockManager, seq_id: str, tokens: list[int]) -> Sequence:
    """A sequence whose whole prompt was computed and registered in the cache."""
    seq = Sequence(seq_id, tokens)
    manager.allocate(seq)
    manager.append(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    manager.cache_computed_blocks(seq)
    return seq


def test_the_chain_is_the_block_managers_chain() -> None:
    tokens = list(range(3, 3 + 19))  # 4 full blocks of 4, and 3 tokens over
    chain = chain_hashes(tokens, 4)
    assert len(chain) == num_reusable_blocks(len(tokens), 4) == 4
    assert chain[0] == hash_block(b"", tokens[:4])
    assert chain[1] == hash_block(chain[0], tokens[4:8])
    manager = BlockManager(num_blocks=16, block_size=4)
    _computed(manager, "a", tokens)
    assert set(chain) <= set(manager.cached_hashes(16))


def test_the_last_token_never_counts_as_a_cached_block() -> None:
    # 8 tokens fill two blocks, but the engine always computes the last token: one block.
    assert num_reusable_blocks(8, 4) == 1
    assert num_reusable_blocks(9, 4) == 2
    assert num_reusable_blocks(0, 4) == 0
    assert len(chain_hashes(list(range(100)), 4, max_blocks=3)) == 3


def test_cached_hashes_put_held_blocks_first_then_the_most_recently_freed() -> None:
    manager = BlockManager(num_blocks=16, block_size=2)
    old = _computed(manager, "old", [5, 6, 7])
    new = _computed(manager, "new", [8, 9, 10])
    held = _computed(manager, "held", [11, 12, 13])
    manager.free(old)
    manager.free(new)
    hashes = manager.cached_hashes(16)
    assert hashes == [held.block_hashes[0], new.block_hashes[0], old.block_hashes[0]]
    assert manager.cached_hashes(2) == hashes[:2]
    assert manager.cached_hashes(0) == []


def test_the_digest_round_trips_and_keeps_only_the_key_bytes() -> None:
    hashes = chain_hashes(list(range(40)), 4)
    text = encode_digest(hashes)
    assert len(base64.b64decode(text)) == len(hashes) * DIGEST_KEY_BYTES
    assert decode_digest(text) == {digest_key(h) for h in hashes}
    assert decode_digest(encode_digest([])) == frozenset()


def test_a_malformed_digest_is_empty_not_an_error() -> None:
    assert decode_digest("not base64!") == frozenset()
    assert decode_digest(base64.b64encode(b"12345").decode()) == frozenset()  # not whole keys
    assert decode_digest("é") == frozenset()


def test_the_heartbeat_entry_round_trips() -> None:
    hashes = chain_hashes(list(range(20)), 4)
    parsed = parse_prefix_report(prefix_report(4, hashes))
    assert parsed == PrefixHoldings(4, frozenset(digest_key(h) for h in hashes))
    assert parse_prefix_report(None) is None
    assert parse_prefix_report({"block_size": 0, "blocks": ""}) is None
    assert parse_prefix_report({"block_size": 4, "blocks": 7}) is None


def test_the_engine_snapshot_is_throttled_unless_forced() -> None:
    now = [0.0]
    digest = PrefixDigest(8, interval_s=1.0, clock=lambda: now[0])
    manager = BlockManager(num_blocks=8, block_size=2)
    digest.refresh(manager)
    assert digest.hashes == ()
    _computed(manager, "a", [5, 6, 7])
    now[0] = 0.5
    digest.refresh(manager)
    assert digest.hashes == ()  # too soon
    digest.refresh(manager, force=True)
    assert len(digest.hashes) == 1
    _computed(manager, "b", [8, 9, 10])
    now[0] = 2.0
    digest.refresh(manager)
    assert len(digest.hashes) == 2
