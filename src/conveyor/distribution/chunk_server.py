"""The fleet-internal chunk server: `GET /v1/internal/chunks/{sha256}` from the local cache.

It serves only verified chunks (the cache holds no other kind) and runs on its own listener,
so it is up while the worker's models are still loading, and it can be firewalled to the
fleet apart from the public API port. With `upload_bytes_s` set, everything it sends shares
one paced rate (`--peer-upload-mb-s`). With the fleet's internal key configured, it
serves only peers that present it (``Authorization: Bearer``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.asgi.json import error_response
from conveyor.distribution.chunk_cache import ChunkCache
from conveyor.distribution.manifest import is_digest
from conveyor.distribution.pacer import PIECE_BYTES, BytePacer
from conveyor.errors import AuthenticationFailed, InvalidRequest, NotFound
from conveyor.fleet.credential import FleetCredential
from conveyor.observability.metrics import DistributionMetrics
from conveyor.tenants.keys import bearer_token


def chunk_app(
    cache: ChunkCache,
    metrics: DistributionMetrics,
    upload_bytes_s: float | None = None,
    *,
    credential: FleetCredential | None = None,
) -> Starlette:
    """An ASGI app serving the cache's verified chunks to peers, at most `upload_bytes_s`;
    with a fleet `credential`, only to callers presenting the fleet key."""
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

    guard = [] if credential is None else [Middleware(FleetKeyRequired, credential=credential)]
    return Starlette(
        routes=[Route("/v1/internal/chunks/{digest}", get_chunk, methods=["GET"])],
        middleware=guard,
        # Unknown paths (404) and methods (405) in the API's error shape, not plain text.
        exception_handlers={HTTPException: _http_error},
    )


class FleetKeyRequired:
    """Refuses, with 401 in the API's error shape, every request without the fleet key."""

    def __init__(self, app: ASGIApp, credential: FleetCredential) -> None:
        """Guard `app` with `credential`."""
        self.app = app
        self.credential = credential

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._is_presented(scope):
            refusal = AuthenticationFailed("the chunk server wants the fleet's internal key")
            await error_response(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _is_presented(self, scope: Scope) -> bool:
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        token = bearer_token(header) if header is not None else None
        return token is not None and self.credential.matches(token)


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
