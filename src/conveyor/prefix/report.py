"""The heartbeat's prefix entry: a model's block size and the digest of blocks it holds.

Wire form, under ``load.models.<name>.prefix``: ``{"block_size": 16, "blocks": "<base64>"}``
(``hashing.encode_digest``). Gateways that predate it ignore it; a gateway reading a worker
that predates it sees no prefix and routes by load.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from conveyor.prefix.hashing import decode_digest, encode_digest

__all__ = ["PrefixHoldings", "parse_prefix_report", "prefix_report"]


@dataclass(frozen=True, slots=True)
class PrefixHoldings:
    """What one worker's prefix cache holds for one model: digest keys of its blocks."""

    block_size: int
    keys: frozenset[bytes]


def prefix_report(block_size: int, block_hashes: Iterable[bytes]) -> dict[str, Any]:
    """The heartbeat entry for one model."""
    return {"block_size": block_size, "blocks": encode_digest(block_hashes)}


def parse_prefix_report(entry: object) -> PrefixHoldings | None:
    """The holdings in a heartbeat entry, or None when it is absent or malformed."""
    if not isinstance(entry, Mapping):
        return None
    block_size, blocks = entry.get("block_size"), entry.get("blocks")
    if not isinstance(block_size, int) or block_size < 1 or not isinstance(blocks, str):
        return None
    return PrefixHoldings(block_size, decode_digest(blocks))
