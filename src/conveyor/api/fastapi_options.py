"""Options every Conveyor FastAPI app is built with."""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import FastAPI

# Conveyor exports its own Prometheus metrics; FastAPI's built-in OpenTelemetry
# hooks cost a provider lookup per request on the hot path, so they are off.
_NO_TELEMETRY = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}


def fastapi_options() -> dict[str, Any]:
    """Keyword arguments for ``FastAPI(...)``, limited to what this FastAPI accepts."""
    if "telemetry" in inspect.signature(FastAPI).parameters:
        return {"telemetry": dict(_NO_TELEMETRY)}
    return {}
