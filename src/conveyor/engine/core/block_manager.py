"""Paged KV-cache bookkeeping: a pool of fixed-size blocks with prefix caching.

Each running sequence owns a block table (block ids in position order).  Blocks
are reference-counted so that sequences with a common prompt prefix share the
blocks holding it.  A block that is full and whose keys/values have been
computed gets a content hash chained over every token before it; freed blocks
keep that hash and can be revived by a later request with the same prefix until
the pool hands them out for other content.

Sequences grow their tables step by step (``append``), so a chunked prefill only
holds the blocks its computed chunks need.

With a second tier (``kv_tier.TierIndex``), a cached block handed out for other content
is spilled to host memory first, and a prefix lookup that runs past the pool's own blocks
goes on in the tier: those blocks get fresh pool blocks, and the tier queues their copy.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from itertools import islice

from conveyor.engine.core.kv_tier import TierIndex
from conveyor.engine.core.sequence import Sequence
from conveyor.prefix.hashing import hash_block

__all__ = ["BlockManager", "hash_block"]


def adapter_hash_seed(adapter_id: int) -> bytes:
    """Parent hash of a sequence's first block: ``b""`` for the base, else the adapter's.

    Keys the prefix cache by LoRA adapter, so two adapters never share KV blocks.
    """
    return b"" if adapter_id == 0 else b"lora:%d" % adapter_id


@dataclass(slots=True)
class _Block:
    """One KV-cache block's bookkeeping."""

    block_id: int
    ref_count: int = 0
    # Set once the block is full and computed; cleared when it is reused.
    content_hash: bytes | None = None


class BlockManager:
    """Allocates KV-cache blocks to sequences and shares cached prefixes.

    Free blocks live in two pools: blocks without a usable hash, handed out
    first, and cached blocks (refcount 0 but findable by hash) in LRU order,
    evicted oldest first only when the first pool is empty.
    """

    def __init__(self, num_blocks: int, block_size: int, tier: TierIndex | None = None) -> None:
        """Create a pool of ``num_blocks`` blocks of ``block_size`` tokens each; ``tier``
        keeps the blocks it evicts (None: evicted content is lost)."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._block_size = block_size
        self._blocks = [_Block(block_id) for block_id in range(num_blocks)]
        self._free_uncached: deque[int] = deque(range(num_blocks))
        # Insertion order is eviction order: the least recently freed comes first.
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._block_by_hash: dict[bytes, int] = {}
        self._allocated: dict[str, Sequence] = {}
        self.tier = tier
        # Held blocks (refcount > 0) that carry a hash, kept as they change so the prefix
        # digest reads them without scanning the pool.
        self._held_hashed: dict[int, None] = {}

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return len(self._blocks)

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds (cached ones included: they can be evicted)."""
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of the pool held by sequences, 0..1."""
        return self.num_used_blocks / self.num_blocks

    def num_blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self._block_size)

    def block_ref_count(self, block_id: int) -> int:
        """How many sequences hold block ``block_id`` (for metrics and tests)."""
        if not 0 <= block_id < len(self._blocks):
            raise ValueError(f"block id {block_id} is outside the pool of {len(self._blocks)}")
        return self._blocks[block_id].ref_count

    def cached_hashes(self, limit: int) -> list[bytes]:
        """Up to ``limit`` hashes of blocks the cache can serve, the most useful first.

        Blocks sequences hold come first, then free cached blocks from the most recently
        freed (the last to be evicted), then the tier's. For the heartbeat's prefix digest.
        """
        blocks = self._blocks
        hashes = [h for i in islice(self._held_hashed, limit) if (h := blocks[i].content_hash)]
        for block_id in reversed(self._free_cached):
            if len(hashes) >= limit:
                break
            digest = self._blocks[block_id].content_hash
            if digest is not None:
                hashes.append(digest)
        if self.tier is not None and len(hashes) < limit:
            seen = set(hashes)
            more = self.tier.hashes(limit - len(hashes) + len(seen))
            hashes.extend([h for h in more if h not in seen][: limit - len(hashes)])
        return hashes

    def is_allocated(self, seq: Sequence) -> bool:
        """Whether ``seq`` currently holds an allocation from this manager."""
        return self._allocated.get(seq.seq_id) is seq

    # -- allocation -------------------------------------------------------------

    def num_cache_hit_tokens(self, seq: Sequence) -> int:
        """Leading tokens of ``seq`` that ``allocate`` would take from the cache."""
        return len(self._match_prefix(seq)) * self._block_size

    def can_allocate(self, seq: Sequence, num_new_tokens: int = 0) -> bool:
        """Whether ``allocate(seq)`` followed by ``append(seq, num_new_tokens)`` fits.

        ``num_new_tokens`` counts tokens after the cached prefix (see
        ``num_cache_hit_tokens``); 0 asks about ``allocate`` alone.
        """
        if self._allocation_error(seq) is not None:
            return False
        return self._fits(seq, self._match_prefix(seq), num_new_tokens)

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` the cached blocks of its longest cached prefix.

        Sets ``block_table``, ``num_cached_tokens`` and ``num_computed_tokens``
        (to the cached length).  Blocks for the rest come from ``append`` as
        chunks get scheduled.  Blocks found in the pool are shared or revived; blocks
        found in the tier take a fresh block each, whose copy the tier queues (so
        ``can_allocate`` first).  Raises ValueError for a sequence that already has
        cache state.
        """
        error = self._allocation_error(seq)
        if error is not None:
            raise ValueError(error)
        hits = self._match_prefix(seq)
        if None in hits and not self._fits(seq, hits, 0):
            raise ValueError(f"not enough free blocks to restore {seq.seq_id!r}'s prefix")
        for block_id in hits:
            if block_id is not None:
                self._take(block_id)
        seq.block_table = self._table(seq, hits)
        seq.num_cached_tokens = len(hits) * self._block_size
        seq.num_computed_tokens = seq.num_cached_tokens
        self._allocated[seq.seq_id] = seq

    def _table(self, seq: Sequence, hits: list[int | None]) -> list[int]:
        """The table of ``hits`` with a fresh block for each tier hit (None), its copy
        queued; the tier's entries stay pinned until every fresh block is taken."""
        tier = self.tier
        if tier is None or None not in hits:
            return [b for b in hits if b is not None]
        digests = [self._block_hash(seq, i) for i, b in enumerate(hits) if b is None]
        table: list[int] = []
        with tier.pinned(digests):
            for index, block_id in enumerate(hits):
                if block_id is None:
                    block_id = self._take_fresh()
                    digest = self._block_hash(seq, index)
                    tier.restore(digest, block_id)
                    self._blocks[block_id].content_hash = digest
                    self._block_by_hash[digest] = block_id
                    self._held_hashed[block_id] = None
                table.append(block_id)
        return table

    def _allocation_error(self, seq: Sequence) -> str | None:
        """Why ``seq`` cannot start an allocation, or None if it can."""
        if seq.seq_id in self._allocated:
            return f"sequence {seq.seq_id!r} is already allocated"
        if seq.block_table or seq.num_computed_tokens:
            return f"sequence {seq.seq_id!r} still has cache state; free it first"
        return None

    def _fits(self, seq: Sequence, hits: list[int | None], num_new_tokens: int) -> bool:
        """Whether the free pool covers revived hits, a block per tier hit, and blocks
        for the new tokens."""
        num_cached = len(hits) * self._block_size
        if num_new_tokens < 0 or num_cached + num_new_tokens > seq.num_tokens:
            return False
        num_taken = sum(1 for b in hits if b is None or self._blocks[b].ref_count == 0)
        num_fresh = self.num_blocks_needed(num_cached + num_new_tokens) - len(hits)
        return num_taken + num_fresh <= self.num_free_blocks

    def _match_prefix(self, seq: Sequence) -> list[int | None]:
        """Block ids of the longest run of leading full blocks found in the cache; None
        for a block found in the tier instead of the pool.

        Stops before the block holding the last token: that token is always
        computed (its logits give the next sample), and computing it must write
        into a private block, never into one another sequence shares. None for a
        sequence that computes every position (``uses_prefix_cache`` False).
        """
        if not seq.uses_prefix_cache:
            return []
        num_reusable = (seq.num_tokens - 1) // self._block_size
        hits: list[int | None] = []
        for index in range(num_reusable):
            digest = self._block_hash(seq, index)
            block_id = self._block_by_hash.get(digest)
            if block_id is None and (self.tier is None or digest not in self.tier):
                break
            hits.append(block_id)
        return hits

    def _block_hash(self, seq: Sequence, index: int) -> bytes:
        """Hash of ``seq``'s full block ``index``, extending the sequence's memo."""
        block_size = self._block_size
        if seq.block_hash_size != block_size:
            seq.block_hashes = []
            seq.block_hash_size = block_size
        hashes = seq.block_hashes
        while len(hashes) <= index:
            start = len(hashes) * block_size
            parent = hashes[-1] if hashes else adapter_hash_seed(seq.adapter_id)
            hashes.append(hash_block(parent, seq.token_ids[start : start + block_size]))
        return hashes[index]

    # -- growth -----------------------------------------------------------------

    def num_appendable_tokens(self, seq: Sequence) -> int:
        """How many tokens past ``num_computed_tokens`` could get slots right now."""
        self._require_allocated(seq)
        slack = len(seq.block_table) * self._block_size - seq.num_computed_tokens
        return slack + self.num_free_blocks * self._block_size

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether ``append(seq, num_new_tokens)`` would succeed."""
        if not self.is_allocated(seq) or num_new_tokens < 0:
            return False
        if seq.num_computed_tokens + num_new_tokens > seq.num_tokens:
            return False
        return self._num_missing_blocks(seq, num_new_tokens) <= self.num_free_blocks

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow ``seq``'s table so positions below computed + new tokens have blocks.

        Hashes are registered later, by ``cache_computed_blocks``, once the
        tokens are actually in the cache.
        """
        self._require_allocated(seq)
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        end = seq.num_computed_tokens + num_new_tokens
        if end > seq.num_tokens:
            raise ValueError(
                f"sequence {seq.seq_id!r} has {seq.num_tokens} tokens; cannot reserve up to {end}"
            )
        num_missing = self._num_missing_blocks(seq, num_new_tokens)
        if num_missing > self.num_free_blocks:
            raise ValueError(f"not enough free blocks for {seq.seq_id!r}; check can_append")
        for _ in range(num_missing):
            seq.block_table.append(self._take_fresh())

    def _num_missing_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks to add so the table covers ``num_new_tokens`` more tokens."""
        needed = self.num_blocks_needed(seq.num_computed_tokens + num_new_tokens)
        return max(0, needed - len(seq.block_table))

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register the hashes of ``seq``'s blocks that are full and computed.

        Call after advancing ``num_computed_tokens``.  If another block already
        holds the same content (two sequences computed one prefix
        concurrently), the first stays the one the cache finds.
        """
        self._require_allocated(seq)
        num_full = min(seq.num_computed_tokens // self._block_size, len(seq.block_table))
        # Registration runs in position order: scan back to the first unhashed block.
        first = num_full
        while first > 0 and self._blocks[seq.block_table[first - 1]].content_hash is None:
            first -= 1
        for index in range(first, num_full):
            block = self._blocks[seq.block_table[index]]
            block.content_hash = self._block_hash(seq, index)
            self._block_by_hash.setdefault(block.content_hash, block.block_id)
            self._held_hashed[block.block_id] = None

    def forget(self, block_ids: list[int]) -> None:
        """Stop serving ``block_ids`` from the cache (their content cannot be trusted: a
        copy into them failed); they are reused once released."""
        for block_id in block_ids:
            block = self._blocks[block_id]
            if block.content_hash is not None:
                if self._block_by_hash.get(block.content_hash) == block_id:
                    del self._block_by_hash[block.content_hash]
                block.content_hash = None
                self._held_hashed.pop(block_id, None)

    # -- release ----------------------------------------------------------------

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks, clear its table and reset its computed count.

        Blocks are released last-first so that, among equally old cached
        blocks, the tail of a prefix is evicted before its head (a head miss
        makes every later block of the chain unreachable anyway).
        """
        self._require_allocated(seq)
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0
        del self._allocated[seq.seq_id]

    def _require_allocated(self, seq: Sequence) -> None:
        """Refuse operations on sequences this manager does not hold."""
        if self._allocated.get(seq.seq_id) is not seq:
            raise ValueError(f"sequence {seq.seq_id!r} is not allocated")

    def _take(self, block_id: int) -> None:
        """Add a reference to a cached block, reviving it if it was free."""
        block = self._blocks[block_id]
        if block.ref_count == 0:
            del self._free_cached[block_id]
            if block.content_hash is not None:
                self._held_hashed[block_id] = None
        block.ref_count += 1

    def _take_fresh(self) -> int:
        """Hand out a free block for new content, evicting a cached one if needed."""
        if self._free_uncached:
            block_id = self._free_uncached.popleft()
        else:
            block_id, _ = self._free_cached.popitem(last=False)
        block = self._blocks[block_id]
        digest = block.content_hash
        if digest is not None:
            if self._block_by_hash.get(digest) == block_id:
                del self._block_by_hash[digest]
                if self.tier is not None:
                    self.tier.spill(block_id, digest)
            block.content_hash = None
        block.ref_count = 1
        return block_id

    def _release(self, block_id: int) -> None:
        """Drop one reference; a block nobody holds goes back to a free pool."""
        block = self._blocks[block_id]
        block.ref_count -= 1
        if block.ref_count > 0:
            return
        self._held_hashed.pop(block_id, None)
        digest = block.content_hash
        # setdefault: a duplicate whose twin was evicted becomes the findable copy.
        if digest is not None and self._block_by_hash.setdefault(digest, block_id) == block_id:
            self._free_cached[block_id] = None
        else:
            # Unfindable content is worthless: hand this block out first.
            block.content_hash = None
            self._free_uncached.append(block_id)
