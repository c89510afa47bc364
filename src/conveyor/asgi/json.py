"""The one way Conveyor answers with JSON: orjson, no FastAPI response model on the way."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from conveyor.errors import ConveyorError


def json_response(
    body: object, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """``body`` as a JSON response."""
    return Response(
        orjson.dumps(body), status_code=status_code, media_type="application/json", headers=headers
    )


def raw_json_response(content: bytes, status_code: int = 200) -> Response:
    """A response of JSON already written (a large answer is written off the loop)."""
    return Response(content, status_code=status_code, media_type="application/json")


def error_response(error: ConveyorError) -> Response:
    """The JSON response for ``error``, with its status and headers."""
    return json_response(error.to_body(), error.status_code, error.headers())
