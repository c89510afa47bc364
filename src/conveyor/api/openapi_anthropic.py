"""What the OpenAPI document says of Anthropic's routes: their errors, pages and batch body.

Errors under ``/v1/messages`` are Anthropic's shape (``{"type": "error", "error": {"type",
"message"}}``, see ``api.anthropic_errors``), so those operations point at that schema
instead of OpenAI's; the Message Batches routes list their own 4xx and query parameters.
"""

from __future__ import annotations

from typing import Any

from conveyor.api.anthropic_errors import is_anthropic_path

__all__ = ["ANTHROPIC_ERROR_SCHEMA", "MESSAGE_BATCH_CREATE", "describe_anthropic"]

ANTHROPIC_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"type": "string", "enum": ["error"]},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
ANTHROPIC_ERROR_REF = {"$ref": "#/components/schemas/AnthropicError"}
MESSAGE_BATCH_CREATE = {
    "application/json": {
        "schema": {
            "type": "object",
            "required": ["requests"],
            "properties": {
                "requests": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["custom_id", "params"],
                        "properties": {
                            "custom_id": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                            "params": {"$ref": "#/components/schemas/MessagesRequest"},
                        },
                    },
                }
            },
        }
    }
}
_BATCH = "/v1/messages/batches/{message_batch_id}"
# Each Message Batches operation's own 4xx, beyond 401 (keys) and 408/413 (bodies).
ROUTE_ERRORS: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/messages/batches"): (400,),
    ("get", "/v1/messages/batches"): (400,),
    ("get", _BATCH): (404,),
    ("post", _BATCH + "/cancel"): (404,),
    ("delete", _BATCH): (400, 404),
    ("get", _BATCH + "/results"): (400, 404),
}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}  # fmt: skip


LIST_PARAMETERS = [
    _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000},
           "Items on the page (default 20; a page holds at most 100)."),
    _query("after_id", {"type": "string"}, "The page after this id (older batches)."),
    _query("before_id", {"type": "string"}, "The page before this id (newer batches)."),
]  # fmt: skip


def describe_anthropic(schema: dict[str, Any], status_text: dict[int, str]) -> None:
    """Point Anthropic's operations' errors at Anthropic's shape, add their own 4xx (each
    described by ``status_text``) and the list's query parameters."""
    schema.setdefault("components", {}).setdefault("schemas", {})["AnthropicError"] = (
        ANTHROPIC_ERROR_SCHEMA
    )
    content = {"application/json": {"schema": ANTHROPIC_ERROR_REF}}
    for path, operations in schema.get("paths", {}).items():
        if not is_anthropic_path(path):
            continue
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for status in ROUTE_ERRORS.get((method, path), ()):
                responses[str(status)] = {"description": status_text[status]}
            for status, response in responses.items():
                if status.startswith("4"):
                    response["content"] = content
    listing = schema.get("paths", {}).get("/v1/messages/batches", {}).get("get")
    if listing is not None:
        listing["parameters"] = [*listing.get("parameters", []), *LIST_PARAMETERS]
