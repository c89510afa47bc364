"""Turn pydantic's validation report into a 400 that names the bad field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from conveyor.errors import InvalidRequest


class ValidationReport(Protocol):
    """What pydantic's ``ValidationError`` (and FastAPI's wrapper of it) offer: ``errors()``."""

    def errors(self) -> Sequence[Any]:
        """One dict per problem, with ``loc``, ``msg`` and ``type``."""
        ...


# Fields that accept several shapes: pydantic's per-shape report is noise to a caller.
UNION_HINTS = {
    "input": "'input' must be a string, an array of strings, an array of token ids "
    "(integers) or an array of arrays of token ids",
}


def invalid_from_validation(exc: ValidationReport) -> InvalidRequest:
    """A 400 naming the first bad field, from pydantic's report."""
    errors = exc.errors()
    if not errors:
        return InvalidRequest("the request body is invalid")
    first = errors[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = location[0] if location else None
    where = ".".join(location) or "body"
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        return InvalidRequest(f"the request body is not valid JSON: {message}")
    if first.get("type") == "missing":
        return InvalidRequest(f"missing required parameter: {where!r}", param=param)
    if first.get("type") == "extra_forbidden":
        return InvalidRequest(f"unrecognized request argument: {where!r}", param=where)
    if param in UNION_HINTS and first.get("type") != "value_error":
        return InvalidRequest(UNION_HINTS[param], param=param)
    return InvalidRequest(f"invalid value for {where!r}: {message}", param=param)
