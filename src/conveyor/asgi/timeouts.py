"""The caller's own deadline, from the ``X-Conveyor-Timeout-Ms`` header."""

from __future__ import annotations

import math

from starlette.requests import Request

from conveyor.errors import InvalidRequest

TIMEOUT_HEADER = "x-conveyor-timeout-ms"


def timeout_from_headers(request: Request) -> float | None:
    """The caller's deadline in ms, if sent; 400 unless a positive, finite number."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequest(f"{TIMEOUT_HEADER} must be a number of milliseconds") from None
    if not math.isfinite(value) or value <= 0:
        raise InvalidRequest(f"{TIMEOUT_HEADER} must be a positive, finite number of milliseconds")
    return value
