"""What the edge (``conveyor.api.edge``) logs of each request: the line's fields, and which
paths get a line and a span.

Requests under ``/v1/`` get a server span when tracing is on, and a log line with the
request's id, tenant, model, endpoint, status and timings.
"""

from __future__ import annotations

import logging
from typing import Any

from conveyor.observability.context import RequestContext

request_log = logging.getLogger("conveyor.requests")

WORK_PREFIX = "/v1/"
# Polled every couple of seconds by open dashboards: not worth a line each.
QUIET_PATHS = frozenset({"/v1/dashboard/state"})


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def request_fields(context: RequestContext, status: int, total_s: float) -> dict[str, Any]:
    """The fields of a request's log line."""
    return {
        "event": "request",
        "request_id": context.request_id,
        "tenant": context.tenant,
        "model": context.model,
        "endpoint": context.endpoint,
        "status": status,
        "queue_wait_ms": _ms(context.queue_wait_s),
        "batch_size": context.batch_size,
        "model_ms": _ms(context.model_s),
        "total_ms": _ms(total_s),
    }
