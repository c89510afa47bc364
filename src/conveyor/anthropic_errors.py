"""Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}``.

Conveyor's errors carry OpenAI's body (``errors``); on Anthropic's routes and in Message
Batch results the same error is told in Anthropic's words, its ``type`` chosen by the HTTP
status as Anthropic's API chooses it. Pure: used by the HTTP layer and the batch results.
"""

from __future__ import annotations

from typing import Any

__all__ = ["anthropic_error", "error_type_for", "from_openai_body"]

# Anthropic's error type per HTTP status; other 4xx are invalid requests, other 5xx api errors.
_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_type_for(status_code: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status."""
    named = _TYPES.get(status_code)
    if named is not None:
        return named
    return "invalid_request_error" if status_code < 500 else "api_error"


def anthropic_error(status_code: int, message: str) -> dict[str, Any]:
    """The error body Anthropic's API answers ``status_code`` with."""
    return {"type": "error", "error": {"type": error_type_for(status_code), "message": message}}


def from_openai_body(status_code: int, body: Any) -> dict[str, Any]:
    """An OpenAI-shaped error body (``{"error": {"message", ...}}``) in Anthropic's shape;
    a body of any other shape keeps only the status's meaning."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str):
        message = f"the request failed with HTTP status {status_code}"
    return anthropic_error(status_code, message)
