"""Parse a request body, and turn pydantic's validation report into a 400 that names the
bad field: the one translator for every request kind, HTTP and batch lines alike.

Pydantic reports every bad item of a list, and turning a million reports into Python
objects takes seconds with the interpreter lock held: request lists are ``FastList``
(validation stops at the first bad item), and a report of more than
``MAX_REPORTED_ERRORS`` problems (thousands of unknown fields, say) is answered with
their count instead of being read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Protocol, TypeVar

from pydantic import BaseModel, Field, ValidationError

from conveyor.errors import InvalidRequest

__all__ = [
    "EMBEDDING_HINTS",
    "GENERATION_HINTS",
    "MAX_REPORTED_ERRORS",
    "PROMPT_HINT",
    "FastList",
    "invalid_from_validation",
    "parse_body",
    "too_many_errors",
]

T = TypeVar("T")
BodyT = TypeVar("BodyT", bound=BaseModel)
_NO_HINTS: Mapping[str, str] = {}

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


# Whole-message hints for top-level fields that accept several shapes: pydantic's
# per-shape report is noise to a caller. `parse_body` gives the generation kinds'.
PROMPT_HINT = (
    "'prompt' must be a string, an array of strings, an array of token ids (integers) "
    "or an array of arrays of token ids"
)
GENERATION_HINTS: Mapping[str, str] = {"prompt": PROMPT_HINT}
EMBEDDING_HINTS: Mapping[str, str] = {
    "input": "'input' must be a string, an array of strings, an array of token ids "
    "(integers) or an array of arrays of token ids",
}
# Nested fields of several shapes, wherever they sit: one sentence after the location.
_FIELD_HINTS = {
    "content": "content must be a string or an array of text parts",
    "stop": "stop must be a string or an array of strings",
}
_SCALAR_TAGS = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


def parse_body(
    model_cls: type[BodyT],
    body: bytes | str | dict[str, Any],
    *,
    hints: Mapping[str, str] = GENERATION_HINTS,
) -> BodyT:
    """Validate a JSON body (raw or decoded); any mistake is a 400 naming the field."""
    try:
        if isinstance(body, bytes | str):
            return model_cls.model_validate_json(body)
        return model_cls.model_validate(body)
    except ValidationError as exc:
        raise invalid_from_validation(exc, hints=hints) from None


def invalid_from_validation(
    exc: ValidationReport, *, hints: Mapping[str, str] = _NO_HINTS
) -> InvalidRequest:
    """A 400 naming the first bad field, clearer than pydantic's report on unions and
    unknown fields; ``hints`` is the whole message for a top-level field of several shapes.

    Our own checks (``value_error``) win over a union's per-branch type errors; the branch
    tags pydantic puts in the location (``stop.str``) and the ``body`` FastAPI puts first
    are dropped.
    """
    crowded = too_many_errors(exc)
    if crowded is not None:
        return crowded
    errors = exc.errors()
    if not errors:
        return InvalidRequest("the request body is invalid")
    first = next((error for error in errors if error.get("type") == "value_error"), errors[0])
    kind = first.get("type")
    location = [str(part) for part in first.get("loc", ()) if not _is_union_tag(part)]
    if location[:1] == ["body"]:
        location = location[1:]
    where = ".".join(location) or "body"
    param = location[0] if location else None
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "json_invalid":
        return InvalidRequest(f"the request body is not valid JSON: {message}")
    if kind == "missing":
        return InvalidRequest(f"missing required parameter: {where!r}", param=param)
    if kind == "extra_forbidden":
        return InvalidRequest(f"unrecognized request argument: {where!r}", param=where)
    if kind != "value_error":
        hint = _hint(location, hints)
        if hint is not None:
            return InvalidRequest(hint, param=param)
    return InvalidRequest(f"invalid value for {where!r}: {message}", param=param)


def _hint(location: Sequence[str], hints: Mapping[str, str]) -> str | None:
    """The sentence for a field of several shapes at ``location``, if it is one."""
    if location and location[0] in hints:
        return hints[location[0]]
    field_name = next((part for part in reversed(location) if not part.isdigit()), "")
    if field_name in _FIELD_HINTS:
        return f"invalid value for {'.'.join(location)!r}: {_FIELD_HINTS[field_name]}"
    return None


def _is_union_tag(part: object) -> bool:
    """Whether a location part names a union branch (``str``, ``list[str]``), not a field."""
    return isinstance(part, str) and (part in _SCALAR_TAGS or "[" in part)
