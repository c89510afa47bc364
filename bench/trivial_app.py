"""A trivial FastAPI app on Conveyor's server stack (uvicorn, uvloop, httptools): the
HTTP ceiling. Its POST endpoint reads the raw body and answers a small orjson body.

    python -m bench.trivial_app --port 8001
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from bench.common import LOCALHOST


def create_app() -> FastAPI:
    """The app: ``POST /v1/embeddings`` (same path as Conveyor) and ``GET /ready``."""
    app = FastAPI(title="trivial")

    @app.post("/v1/embeddings")
    async def answer(request: Request) -> Response:
        """Read the whole body, answer with its size."""
        body = await request.body()
        content = orjson.dumps({"object": "list", "num_bytes": len(body)})
        return Response(content, media_type="application/json")

    @app.get("/ready")
    async def ready() -> Response:
        """Always ready: nothing to load."""
        return Response(orjson.dumps({"status": "ready"}), media_type="application/json")

    return app


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the trivial app the way ``conveyor serve`` serves Conveyor."""
    import uvicorn

    parser = argparse.ArgumentParser(description="Trivial FastAPI app for the HTTP ceiling.")
    parser.add_argument("--host", default=LOCALHOST)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(
        create_app(),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
