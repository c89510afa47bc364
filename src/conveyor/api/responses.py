"""The one way Conveyor answers with JSON: orjson, no FastAPI response model on the way."""

from __future__ import annotations

import orjson
from starlette.responses import Response

import conveyor
from conveyor.errors import ModelNotFound


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


def find_model(entries: list[dict[str, object]], model_id: str) -> dict[str, object]:
    """The OpenAI model object whose id is ``model_id``, or 404 in OpenAI's shape."""
    for entry in entries:
        if entry["id"] == model_id:
            return entry
    raise ModelNotFound(f"the model {model_id!r} does not exist", param="model")


def version_body() -> dict[str, str]:
    """``GET /version``: the running Conveyor version (as vLLM's)."""
    return {"version": conveyor.__version__}
