"""Exception handlers: every error leaves as OpenAI's ``{"error": {...}}`` shape."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from conveyor.asgi.json import error_response
from conveyor.endpoints.validation import invalid_from_validation
from conveyor.errors import ClientGone, ConveyorError

log = logging.getLogger(__name__)


def http_error(exc: HTTPException) -> ConveyorError:
    """Starlette's ``HTTPException`` (a 404, a 405) as a Conveyor error."""
    error = ConveyorError(str(exc.detail), code=None)
    error.status_code = exc.status_code
    error.error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return error


def answered_error(exc: Exception) -> Response | None:
    """The answer to a handled exception, or None for a crash (an unexpected exception).

    The one mapping both the app's exception handlers and the direct routes use.
    """
    if isinstance(exc, ConveyorError):
        return error_response(exc)
    if isinstance(exc, RequestValidationError | ValidationError):
        return error_response(invalid_from_validation(exc))
    if isinstance(exc, HTTPException):
        return error_response(http_error(exc))
    if isinstance(exc, ClientDisconnect):
        # The client left (or was dropped as too slow) while sending its body: no bug.
        return error_response(ClientGone("the client disconnected while sending its request"))
    return None


def install_error_handlers(app: FastAPI) -> None:
    """Map Conveyor errors, validation errors, HTTP errors and crashes to OpenAI bodies."""

    async def on_handled(request: Request, exc: Exception) -> Response:
        response = answered_error(exc)
        if response is None:
            raise exc
        return response

    async def on_crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(ConveyorError("internal server error"))

    for handled in (ConveyorError, RequestValidationError, ValidationError, HTTPException,
                    ClientDisconnect):  # fmt: skip
        app.add_exception_handler(handled, on_handled)
    app.add_exception_handler(Exception, on_crash)
