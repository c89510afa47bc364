"""OpenAI endpoint logic shared by the HTTP API and batch jobs (no HTTP here).

``execute`` runs one request body for an endpoint and returns the response
body, raising ``ConveyorError`` subclasses for anything that is not a 200.
"""

from __future__ import annotations

from typing import Any

from conveyor.endpoints.chat import run_chat
from conveyor.endpoints.completions import run_completion
from conveyor.endpoints.embeddings import run_embeddings
from conveyor.errors import InvalidRequest
from conveyor.priority import Priority
from conveyor.service import Service

EMBEDDINGS = "/v1/embeddings"
COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
ENDPOINTS = (EMBEDDINGS, COMPLETIONS, CHAT_COMPLETIONS)


async def execute(
    service: Service,
    endpoint: str,
    body: bytes | dict[str, Any],
    *,
    priority: Priority = Priority.BATCH,
    timeout_ms: float | None = None,
) -> dict[str, Any]:
    """Run one request body against ``endpoint`` and return the OpenAI response body."""
    if endpoint == EMBEDDINGS:
        return await run_embeddings(service, body, priority=priority, timeout_ms=timeout_ms)
    if endpoint == COMPLETIONS:
        return await run_completion(service, body, priority=priority, timeout_ms=timeout_ms)
    if endpoint == CHAT_COMPLETIONS:
        return await run_chat(service, body, priority=priority, timeout_ms=timeout_ms)
    raise InvalidRequest(f"unsupported endpoint {endpoint!r}", param="url")
