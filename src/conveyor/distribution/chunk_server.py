"""The fleet-internal chunk server: `GET /v1/internal/chunks/{sha256}` from the local cache.

It serves only verified chunks (the cache holds no other kind) and runs on its own listener,
so it is up while the worker's models are still loading, and it can be firewalled to the
fleet apart from the public API port.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from conveyor.distribution.chunk_cache import ChunkCache
from conveyor.distribution.manifest import is_digest
from conveyor.errors import InvalidRequest, NotFound
from conveyor.metrics import DistributionMetrics


def chunk_app(cache: ChunkCache, metrics: DistributionMetrics) -> Starlette:
    """An ASGI app serving the cache's verified chunks to peers."""

    async def get_chunk(request: Request) -> Response:
        digest = str(request.path_params["digest"])
        if not is_digest(digest):
            error = InvalidRequest(f"not a SHA-256 hex digest: {digest[:80]!r}")
            return JSONResponse(error.to_body(), status_code=error.status_code)
        path = cache.chunk_path(digest)
        if not path.is_file():
            missing = NotFound(f"chunk {digest} is not held here")
            return JSONResponse(missing.to_body(), status_code=missing.status_code)
        metrics.chunks_served.inc()
        return FileResponse(path, media_type="application/octet-stream")

    return Starlette(routes=[Route("/v1/internal/chunks/{digest}", get_chunk, methods=["GET"])])
