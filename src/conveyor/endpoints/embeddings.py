"""Embeddings: validate a body, batch its inputs, format OpenAI's response."""

from __future__ import annotations

import base64
from typing import Any

from conveyor.endpoints.schemas import EmbeddingRequest
from conveyor.endpoints.validation import EMBEDDING_HINTS, parse_body
from conveyor.host.service import Service
from conveyor.models.base import Vector
from conveyor.priority import Priority
from conveyor.tenants.usage import Payer


def parse_embedding_request(body: bytes | dict[str, Any]) -> EmbeddingRequest:
    """Validate a JSON body (raw bytes or decoded); any mistake is a 400 naming the field."""
    return parse_body(EmbeddingRequest, body, hints=EMBEDDING_HINTS)


async def run_embeddings(
    service: Service,
    request: EmbeddingRequest,
    *,
    priority: Priority = Priority.ONLINE,
    timeout_ms: float | None = None,
    payer: Payer | None = None,
) -> dict[str, Any]:
    """Embed every input of one request; cancelling this drops inputs not yet run."""
    result = await service.embed(
        request.model,
        request.inputs(),
        priority=priority,
        timeout_ms=timeout_ms,
        truncate=request.truncate,
        dimensions=request.dimensions,
        payer=payer,
    )
    return embedding_body(request.model, result.vectors, result.num_tokens, request.encoding_format)


def embedding_body(
    model: str, vectors: list[Vector], num_tokens: int, encoding_format: str
) -> dict[str, Any]:
    """OpenAI's embedding list object."""
    encode = _as_base64 if encoding_format == "base64" else _as_floats
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode(v)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


def _as_floats(vector: Vector) -> list[float]:
    return vector.tolist()  # type: ignore[no-any-return]


def _as_base64(vector: Vector) -> str:
    return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")
