"""Fetch one chunk into the local cache, from the origin or from a peer (blocking).

Both paths stream into `ChunkCache.write_chunk`, which keeps the bytes only if they hash to
the chunk's digest. Run these in worker threads.
"""

from __future__ import annotations

import httpx

from conveyor.distribution.chunk_cache import ChunkCache
from conveyor.distribution.manifest import ChunkRef, chunk_key
from conveyor.distribution.planner import Peer
from conveyor.errors import ConveyorError
from conveyor.stores.object_store import ObjectStore

CHUNK_PATH = "/v1/internal/chunks/"


class PeerFailed(ConveyorError):
    """A peer did not deliver a chunk (refused, timed out, cut off, answered an error)."""


def fetch_from_origin(objects: ObjectStore, cache: ChunkCache, chunk: ChunkRef) -> int:
    """Copy a chunk from the object store into the cache; return its size."""
    return cache.write_chunk(
        chunk.digest, chunk.size_bytes, objects.iter_chunks(chunk_key(chunk.digest))
    )


def fetch_from_peer(client: httpx.Client, peer: Peer, cache: ChunkCache, chunk: ChunkRef) -> int:
    """Copy a chunk from a peer's chunk server into the cache; return its size."""
    url = f"{peer.address.rstrip('/')}{CHUNK_PATH}{chunk.digest}"
    try:
        with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise PeerFailed(f"peer {peer.worker_id} answered {response.status_code}")
            return cache.write_chunk(chunk.digest, chunk.size_bytes, response.iter_bytes())
    except httpx.HTTPError as exc:
        raise PeerFailed(f"peer {peer.worker_id} failed: {exc!r}") from exc
