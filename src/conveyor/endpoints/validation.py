"""Turn pydantic's validation report into a 400 that names the bad field.

Pydantic reports every bad item of a list, and turning a million reports into Python
objects takes seconds with the interpreter lock held: request lists are ``FastList``
(validation stops at the first bad item), and a report of more than
``MAX_REPORTED_ERRORS`` problems (thousands of unknown fields, say) is answered with
their count instead of being read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Protocol, TypeVar

from pydantic import Field

from conveyor.errors import InvalidRequest

__all__ = ["MAX_REPORTED_ERRORS", "FastList", "invalid_from_validation", "too_many_errors"]

T = TypeVar("T")

# A list that stops validating at its first bad item (one report, not one per item).
FastList = Annotated[list[T], Field(fail_fast=True)]

MAX_REPORTED_ERRORS = 100


class ValidationReport(Protocol):
    """What pydantic's ``ValidationError`` (and FastAPI's wrapper of it) offer: ``errors()``."""

    def errors(self) -> Sequence[Any]:
        """One dict per problem, with ``loc``, ``msg`` and ``type``."""
        ...


def too_many_errors(exc: ValidationReport) -> InvalidRequest | None:
    """A 400 giving the count when there are too many problems to read; else None.

    Pydantic's own error counts them without building anything; FastAPI's wrapper cannot.
    """
    error_count = getattr(exc, "error_count", None)
    count = error_count() if callable(error_count) else 0
    if count <= MAX_REPORTED_ERRORS:
        return None
    return InvalidRequest(
        f"the request body has {count} problems (such as unknown fields); fix the first few "
        "and send it again"
    )


# Fields that accept several shapes: pydantic's per-shape report is noise to a caller.
UNION_HINTS = {
    "input": "'input' must be a string, an array of strings, an array of token ids "
    "(integers) or an array of arrays of token ids",
}


def invalid_from_validation(exc: ValidationReport) -> InvalidRequest:
    """A 400 naming the first bad field, from pydantic's report."""
    crowded = too_many_errors(exc)
    if crowded is not None:
        return crowded
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
