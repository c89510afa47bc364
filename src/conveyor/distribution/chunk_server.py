"""The fleet-internal chunk server: `GET /v1/internal/chunks/{sha256}` from the local cache.

It serves only verified chunks (the cache holds no other kind) and runs on its own listener,
so it is up while the worker's models are still loading, and it can be firewalled to the
fleet apart from the public API port. With `upload_bytes_s` set, everything it sends shares
one paced rate (`--peer-upload-mb-s`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from conveyor.distribution.chunk_cache import ChunkCache
from conveyor.distribution.manifest import is_digest
from conveyor.distribution.pacer import PIECE_BYTES, BytePacer
from conveyor.errors import ConveyorError, InvalidRequest, NotFound
from conveyor.metrics import DistributionMetrics


def chunk_app(
    cache: ChunkCache, metrics: DistributionMetrics, upload_bytes_s: float | None = None
) -> Starlette:
    """An ASGI app serving the cache's verified chunks to peers, at most `upload_bytes_s`."""
    pacer = None if upload_bytes_s is None else BytePacer(upload_bytes_s)

    async def get_chunk(request: Request) -> Response:
        digest = str(request.path_params["digest"])
        if not is_digest(digest):
            return error_response(InvalidRequest(f"not a SHA-256 hex digest: {digest[:80]!r}"))
        path = cache.chunk_path(digest)
        if not path.is_file():
            return error_response(NotFound(f"chunk {digest} is not held here"))
        metrics.chunks_served.inc()
        if pacer is None:
            return FileResponse(path, media_type="application/octet-stream")
        size = str(path.stat().st_size)
        return StreamingResponse(
            pacer.paced(_read_pieces(path)), media_type="application/octet-stream",
            headers={"content-length": size},
        )  # fmt: skip

    return Starlette(
        routes=[Route("/v1/internal/chunks/{digest}", get_chunk, methods=["GET"])],
        # Unknown paths (404) and methods (405) in the API's error shape, not plain text.
        exception_handlers={HTTPException: _http_error},
    )


def error_response(error: ConveyorError) -> Response:
    """`error` in the API's JSON shape (``conveyor.api`` builds on this package, so its
    helper cannot be used here)."""
    return JSONResponse(error.to_body(), status_code=error.status_code, headers=error.headers())


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's routing errors (unknown path, wrong method) in the API's JSON shape."""
    if not isinstance(exc, HTTPException):
        raise exc
    error = NotFound(str(exc.detail)) if exc.status_code == 404 else InvalidRequest(str(exc.detail))
    error.status_code = exc.status_code
    return error_response(error)


async def _read_pieces(path: Path) -> AsyncIterator[bytes]:
    """The file's bytes in pieces the pacer can space out."""
    async with await anyio.open_file(path, "rb") as file:
        while piece := await file.read(PIECE_BYTES):
            yield piece
