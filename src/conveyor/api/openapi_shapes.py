"""What the OpenAPI document says beyond the routes' signatures: query parameters and errors.

The list routes read their query parameters themselves (no FastAPI parameter machinery on
the request path), so their parameters are stated here, with the bounds the handlers check.
Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, and each
operation lists the 4xx it can answer: every route outside the open ones may answer 401 when
API keys are on, every body may be too large (413) or too slow (408), and each route adds its
own. FastAPI's default 422 is dropped: a request Conveyor cannot take is a 400.
"""

from __future__ import annotations

from typing import Any

from conveyor.api.auth import OPEN_PATHS
from conveyor.endpoints.responses.stored import MAX_ITEMS_PAGE
from conveyor.openai_paths import DETOKENIZE, PROXIED_ENDPOINTS, TOKENIZE
from conveyor.stores.protocols import MAX_BATCHES_PAGE, MAX_FILES_PAGE
from conveyor.tenants.usage_report import BUCKET_LIMITS, BUCKET_WIDTH_S, GROUP_FIELDS, MAX_UNIX_S

__all__ = ["ERROR_SCHEMA", "describe_errors", "describe_query_parameters"]

_NULLABLE_STRING = {"anyOf": [{"type": "string"}, {"type": "null"}]}
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": _NULLABLE_STRING,
                "code": _NULLABLE_STRING,
            },
        }
    },
}
ERROR_REF = {"$ref": "#/components/schemas/Error"}
STATUS_TEXT = {
    400: "The request is malformed or its values are out of range",
    401: "API keys are on and the key is missing or wrong",
    403: "This key (or this server's configuration) does not allow it",
    404: "No such model, file, batch, response or adapter (another tenant's is not found either)",
    408: "The request body arrived too slowly",
    413: "The request body or the uploaded file is too large",
    429: "The model's queue is full, or a rate limit or budget is spent",
}
_INFERENCE = (400, 404, 429)
# Each operation's own 4xx, beyond 401 (keys) and 408/413 (bodies).
ROUTE_ERRORS: dict[tuple[str, str], tuple[int, ...]] = {
    **{("post", path): _INFERENCE for path in PROXIED_ENDPOINTS},
    ("post", TOKENIZE): (400, 404),
    ("post", DETOKENIZE): (400, 404),
    ("get", "/v1/models/{model_id}"): (404,),
    ("get", "/v1/files"): (400,),
    ("post", "/v1/files"): (400,),
    ("get", "/v1/files/{file_id}"): (404,),
    ("delete", "/v1/files/{file_id}"): (404,),
    ("get", "/v1/files/{file_id}/content"): (404,),
    ("get", "/v1/batches"): (400,),
    ("post", "/v1/batches"): (400, 404),
    ("get", "/v1/batches/{batch_id}"): (404,),
    ("post", "/v1/batches/{batch_id}/cancel"): (400, 404),
    ("get", "/v1/responses/{response_id}"): (404,),
    ("get", "/v1/responses/{response_id}/input_items"): (400, 404),
    ("delete", "/v1/responses/{response_id}"): (404,),
    ("post", "/v1/responses/{response_id}/cancel"): (400, 404),
    ("get", "/v1/usage"): (400,),
    ("post", "/v1/load_lora_adapter"): (400, 403),
    ("post", "/v1/unload_lora_adapter"): (400, 403, 404),
    ("get", "/metrics"): (401,),  # open unless the config closes it
}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    """An optional query parameter."""
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


def _page_parameters(maximum: int, default: int) -> list[dict[str, Any]]:
    """`after`, `limit` and `order`, as files and batches take them."""
    limit = {"type": "integer", "minimum": 1, "maximum": maximum}
    order = {"type": "string", "enum": ["asc", "desc"], "default": "desc"}
    return [
        _query("after", {"type": "string"}, "The last id of the previous page."),
        _query("limit", limit, f"Items on the page (default {default})."),
        _query("order", order, "By creation: oldest first (asc) or newest first (desc)."),
    ]


def _usage_parameters() -> list[dict[str, Any]]:
    """The usage page's parameters (OpenAI's organization usage API)."""
    width = {"type": "string", "enum": list(BUCKET_WIDTH_S), "default": "1d"}
    group_by = {"type": "array", "items": {"type": "string", "enum": sorted(GROUP_FIELDS)}}
    max_limit = max(limit for _, limit in BUCKET_LIMITS.values())
    limit = {"type": "integer", "minimum": 1, "maximum": max_limit}
    unix_s = {"type": "integer", "minimum": 0, "maximum": MAX_UNIX_S}
    return [
        _query("start_time", unix_s, "Unix seconds; required unless `page`."),
        _query("end_time", unix_s, "Unix seconds, after start_time (default now)."),
        _query("bucket_width", width, "The width of each bucket."),
        _query("group_by", group_by, "Fields to group by (tenant: admin keys only)."),
        _query("limit", limit, "Buckets on the page (at most 1440 for 1m, 168 for 1h, 31 for 1d)."),
        _query("page", unix_s, "The `next_page` of the previous answer."),
    ]


def query_parameters() -> dict[str, list[dict[str, Any]]]:
    """The query parameters of each GET route that reads its own."""
    return {
        "/v1/files": [
            _query("purpose", {"type": "string"}, "Only files of this purpose."),
            *_page_parameters(MAX_FILES_PAGE, MAX_FILES_PAGE),
        ],
        "/v1/batches": _page_parameters(MAX_BATCHES_PAGE, 20),
        "/v1/responses/{response_id}/input_items": _page_parameters(MAX_ITEMS_PAGE, 20),
        "/v1/usage": _usage_parameters(),
    }


def describe_query_parameters(schema: dict[str, Any]) -> None:
    """Add the list routes' query parameters to the GET operations that exist."""
    for path, parameters in query_parameters().items():
        operation = schema.get("paths", {}).get(path, {}).get("get")
        if operation is not None:
            operation["parameters"] = [*operation.get("parameters", []), *parameters]


def error_statuses(method: str, path: str, has_body: bool) -> list[int]:
    """The 4xx an operation may answer."""
    statuses = set(ROUTE_ERRORS.get((method, path), ()))
    if path not in OPEN_PATHS:
        statuses.add(401)
    if has_body:
        statuses |= {408, 413}
    return sorted(statuses)


def describe_errors(schema: dict[str, Any]) -> None:
    """Replace FastAPI's 422 with each operation's 4xx in OpenAI's error shape."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    components["Error"] = ERROR_SCHEMA
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status in error_statuses(method, path, "requestBody" in operation):
                responses[str(status)] = {
                    "description": STATUS_TEXT[status],
                    "content": {"application/json": {"schema": ERROR_REF}},
                }
