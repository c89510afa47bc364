"""The one way Conveyor answers with JSON: orjson, no FastAPI response model on the way."""

from __future__ import annotations

import orjson
from starlette.responses import Response


def json_response(
    body: object, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """``body`` as a JSON response."""
    return Response(
        orjson.dumps(body), status_code=status_code, media_type="application/json", headers=headers
    )
