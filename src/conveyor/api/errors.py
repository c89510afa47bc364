"""Exception handlers: every error leaves as OpenAI's ``{"error": {...}}`` shape."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from conveyor.api.responses import json_response
from conveyor.endpoints.validation import invalid_from_validation
from conveyor.errors import ClientGone, ConveyorError

log = logging.getLogger(__name__)


def error_response(error: ConveyorError) -> Response:
    """The JSON response for ``error``, with its status and headers."""
    return json_response(error.to_body(), error.status_code, error.headers())


def install_error_handlers(app: FastAPI) -> None:
    """Map Conveyor errors, validation errors, HTTP errors and crashes to OpenAI bodies."""

    async def on_conveyor_error(request: Request, exc: Exception) -> Response:
        if not isinstance(exc, ConveyorError):
            raise exc
        return error_response(exc)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        if not isinstance(exc, RequestValidationError | ValidationError):
            raise exc
        return error_response(invalid_from_validation(exc))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        if not isinstance(exc, HTTPException):
            raise exc
        error = ConveyorError(str(exc.detail), code=None)
        error.status_code = exc.status_code
        error.error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(error)

    async def on_client_gone(request: Request, exc: Exception) -> Response:
        # The client left (or was dropped as too slow) while sending its body: no bug.
        return error_response(ClientGone("the client disconnected while sending its request"))

    async def on_crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(ConveyorError("internal server error"))

    app.add_exception_handler(ConveyorError, on_conveyor_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(ValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(ClientDisconnect, on_client_gone)
    app.add_exception_handler(Exception, on_crash)
