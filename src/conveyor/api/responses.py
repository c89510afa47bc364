"""Answers shared by the model lists of a worker and a gateway, and ``/version``."""

from __future__ import annotations

import conveyor
from conveyor.errors import ModelNotFound


def find_model(entries: list[dict[str, object]], model_id: str) -> dict[str, object]:
    """The OpenAI model object whose id is ``model_id``, or 404 in OpenAI's shape."""
    for entry in entries:
        if entry["id"] == model_id:
            return entry
    raise ModelNotFound(f"the model {model_id!r} does not exist", param="model")


def version_body() -> dict[str, str]:
    """``GET /version``: the running Conveyor version (as vLLM's)."""
    return {"version": conveyor.__version__}
