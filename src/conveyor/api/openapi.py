"""The OpenAPI document, with the request bodies the hot-path handlers parse themselves.

Those handlers take the raw ``Request`` (no per-request FastAPI body machinery), so the
generated document knows nothing of their bodies; this adds each body's JSON schema,
from the same pydantic models the handlers validate with, and (see `openapi_shapes`) the
query parameters the list routes read and the 4xx each route answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from conveyor.api.openapi_anthropic import MESSAGE_BATCH_CREATE, describe_anthropic
from conveyor.api.openapi_shapes import STATUS_TEXT, describe_errors, describe_query_parameters

BodyModels = Callable[[], dict[str, type[BaseModel]]]
FILE_UPLOAD = {
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "required": ["file", "purpose"],
            "properties": {
                "file": {"type": "string", "format": "binary"},
                "purpose": {"type": "string", "enum": ["batch"]},
                "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
                "expires_after[seconds]": {"type": "integer"},
            },
        }
    }
}
BATCH_CREATE = {
    "type": "object",
    "required": ["input_file_id", "endpoint", "completion_window"],
    "properties": {
        "input_file_id": {"type": "string"},
        "endpoint": {"type": "string"},
        "completion_window": {"type": "string"},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "output_expires_after": {
            "type": "object",
            "required": ["anchor", "seconds"],
            "properties": {
                "anchor": {"type": "string", "enum": ["created_at"]},
                "seconds": {"type": "integer"},
            },
        },
    },
}


def request_body_models() -> dict[str, type[BaseModel]]:
    """The bodies of the routes that parse their own JSON (imported on first use)."""
    from conveyor.endpoints.chat_schemas import ChatCompletionRequest
    from conveyor.endpoints.generation_schemas import CompletionRequest
    from conveyor.endpoints.messages.schemas import CountTokensRequest, MessagesRequest
    from conveyor.endpoints.rerank_schemas import RerankRequest, ScoreRequest
    from conveyor.endpoints.responses.schemas import ResponseRequest
    from conveyor.endpoints.schemas import DetokenizeRequest, EmbeddingRequest, TokenizeRequest
    from conveyor.openai_paths import (
        CHAT_COMPLETIONS,
        COMPLETIONS,
        DETOKENIZE,
        EMBEDDINGS,
        MESSAGES,
        MESSAGES_COUNT_TOKENS,
        RERANK,
        RESPONSES,
        SCORE,
        TOKENIZE,
    )

    return {
        EMBEDDINGS: EmbeddingRequest,
        COMPLETIONS: CompletionRequest,
        CHAT_COMPLETIONS: ChatCompletionRequest,
        RESPONSES: ResponseRequest,
        RERANK: RerankRequest,
        SCORE: ScoreRequest,
        TOKENIZE: TokenizeRequest,
        DETOKENIZE: DetokenizeRequest,
        MESSAGES: MessagesRequest,
        MESSAGES_COUNT_TOKENS: CountTokensRequest,
    }


def _routed_body_models() -> dict[str, type[BaseModel]]:
    """Bodies of FastAPI routes that parse their own JSON, where the app has the route."""
    from conveyor.endpoints.lora_adapters import LoadLoraAdapterRequest, UnloadLoraAdapterRequest

    return {
        "/v1/load_lora_adapter": LoadLoraAdapterRequest,
        "/v1/unload_lora_adapter": UnloadLoraAdapterRequest,
    }


def install_openapi(app: FastAPI, body_models: BodyModels = request_body_models) -> None:
    """Serve ``/openapi.json`` with request bodies from ``body_models()`` (path → model).

    ``body_models`` is called on the first request for the document, so modules it imports
    (generation schemas) load only when someone asks.
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path, model in body_models().items():
                _add_json_body(schema, path, model)
            for path, model in _routed_body_models().items():
                if "post" in schema.get("paths", {}).get(path, {}):  # on this app
                    _add_json_body(schema, path, model)
            _add_body(schema, "/v1/files", FILE_UPLOAD)
            _add_body(schema, "/v1/batches", {"application/json": {"schema": BATCH_CREATE}})
            _add_body(schema, "/v1/messages/batches", MESSAGE_BATCH_CREATE)
            describe_query_parameters(schema)
            describe_errors(schema)
            describe_anthropic(schema, STATUS_TEXT)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _add_json_body(schema: dict[str, Any], path: str, model: type[BaseModel]) -> None:
    """Document ``model`` as the JSON body of ``POST path``, its sub-schemas as components."""
    body = model.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(body.pop("$defs", {}))
    components[model.__name__] = body
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    _add_body(schema, path, {"application/json": {"schema": ref}})


def _add_body(schema: dict[str, Any], path: str, content: dict[str, Any]) -> None:
    """Set the request body of ``POST path`` (the operation is created if absent)."""
    operations = schema.setdefault("paths", {}).setdefault(path, {})
    operation = operations.setdefault(
        "post", {"summary": path, "responses": {"200": {"description": "Successful Response"}}}
    )
    operation["requestBody"] = {"required": True, "content": content}
