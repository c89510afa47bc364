"""Exception handlers: every error leaves as OpenAI's ``{"error": {...}}`` shape."""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from conveyor.errors import ConveyorError, InvalidRequest

log = logging.getLogger(__name__)

# Fields that accept several shapes: pydantic's per-shape report is noise to a caller.
UNION_HINTS = {
    "input": "'input' must be a string, an array of strings, an array of token ids "
    "(integers) or an array of arrays of token ids",
}


def error_response(error: ConveyorError) -> Response:
    """The JSON response for ``error``, with its status and headers."""
    return Response(
        orjson.dumps(error.to_body()),
        status_code=error.status_code,
        media_type="application/json",
        headers=error.headers(),
    )


def invalid_from_validation(exc: ValidationError | RequestValidationError) -> InvalidRequest:
    """A 400 naming the first bad field, from pydantic's report."""
    errors = exc.errors()
    if not errors:
        return InvalidRequest("the request body is invalid")
    first = errors[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = location[0] if location else None
    where = ".".join(location) or "body"
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if param in UNION_HINTS and first.get("type") != "value_error":
        return InvalidRequest(UNION_HINTS[param], param=param)
    if first.get("type") == "json_invalid":
        return InvalidRequest(f"the request body is not valid JSON: {message}")
    if first.get("type") == "missing":
        return InvalidRequest(f"missing required parameter: {where!r}", param=param)
    return InvalidRequest(f"invalid value for {where!r}: {message}", param=param)


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

    async def on_crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(ConveyorError("internal server error"))

    app.add_exception_handler(ConveyorError, on_conveyor_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(ValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_crash)
