"""Chained block hashes of token ids, and the compact digest workers send in heartbeats.

One definition for both sides: the engine's block manager registers cached blocks under
``hash_block``, and the gateway computes ``chain_hashes`` of a prompt to compare with the
digests workers report. Deterministic across processes (no ``hash()``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from collections.abc import Iterable, Sequence

__all__ = [
    "DIGEST_KEY_BYTES",
    "chain_hashes",
    "decode_digest",
    "digest_key",
    "encode_digest",
    "hash_block",
    "num_reusable_blocks",
]

_HASH_DIGEST_BYTES = 16
# A digest carries this many leading bytes of each block hash: 2^-64 false matches per
# lookup is plenty for a routing hint, and it halves the heartbeat.
DIGEST_KEY_BYTES = 8


def hash_block(parent_hash: bytes, token_ids: Sequence[int]) -> bytes:
    """Content hash of one full block, chained to the hash of the block before it.

    blake2b over the parent hash and the token ids packed as little-endian unsigned
    64-bit integers. Use ``b""`` as the parent of a sequence's first block.
    """
    digest = hashlib.blake2b(parent_hash, digest_size=_HASH_DIGEST_BYTES)
    digest.update(struct.pack(f"<{len(token_ids)}Q", *token_ids))
    return digest.digest()


def num_reusable_blocks(num_tokens: int, block_size: int) -> int:
    """Leading full blocks of a prompt the prefix cache can serve.

    The block holding the last token is never taken from the cache (that token is always
    computed for its logits), so a prompt of ``n`` tokens can reuse ``(n - 1) // size``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return max(0, num_tokens - 1) // block_size


def chain_hashes(
    token_ids: Sequence[int], block_size: int, max_blocks: int | None = None
) -> list[bytes]:
    """Hashes of the reusable leading blocks of ``token_ids``, first block first."""
    count = num_reusable_blocks(len(token_ids), block_size)
    if max_blocks is not None:
        count = min(count, max_blocks)
    hashes: list[bytes] = []
    parent = b""
    for index in range(count):
        start = index * block_size
        parent = hash_block(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


def digest_key(block_hash: bytes) -> bytes:
    """What a digest keeps of one block hash (its leading ``DIGEST_KEY_BYTES``)."""
    return block_hash[:DIGEST_KEY_BYTES]


def encode_digest(block_hashes: Iterable[bytes]) -> str:
    """The keys of ``block_hashes`` as one ASCII string (base64 of the concatenated keys)."""
    return base64.b64encode(b"".join(digest_key(h) for h in block_hashes)).decode("ascii")


def decode_digest(text: str) -> frozenset[bytes]:
    """The set of keys in a digest string; a malformed one is empty (it is only a hint)."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return frozenset()
    if len(raw) % DIGEST_KEY_BYTES:
        return frozenset()
    return frozenset(raw[i : i + DIGEST_KEY_BYTES] for i in range(0, len(raw), DIGEST_KEY_BYTES))
