"""``POST /v1/embeddings``."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import Response

from conveyor.api.disconnect import DisconnectWatcher
from conveyor.api.errors import invalid_from_validation
from conveyor.api.schemas import EmbeddingRequest
from conveyor.errors import ClientGone, ConveyorError, InvalidRequest
from conveyor.metrics import ModelMetrics
from conveyor.models.base import Vector
from conveyor.service import HostedModel, Service, gather_items

router = APIRouter()

TIMEOUT_HEADER = "x-conveyor-timeout-ms"
OUTCOME_BY_STATUS = {
    400: "input_error",
    429: "rejected_queue_full",
    504: "deadline",
    499: "client_gone",
}


def parse_embedding_request(body: bytes) -> EmbeddingRequest:
    """Validate the JSON body; any mistake is a 400 naming the field."""
    try:
        return EmbeddingRequest.model_validate_json(body)
    except ValidationError as exc:
        raise invalid_from_validation(exc) from None


def timeout_from_headers(request: Request) -> float | None:
    """The caller's own deadline in ms, if sent (bounded by the model's default)."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequest(f"{TIMEOUT_HEADER} must be a number of milliseconds") from None
    if value <= 0:
        raise InvalidRequest(f"{TIMEOUT_HEADER} must be positive")
    return value


@router.post("/v1/embeddings")
async def create_embeddings(request: Request) -> Response:
    """Embed each input; several inputs are batched like separate requests."""
    service: Service = request.app.state.service
    started = time.perf_counter()
    body = parse_embedding_request(await request.body())
    hosted = service.hosted(body.model)
    try:
        response = await _embed(request, service, hosted, body)
    except ConveyorError as exc:
        _count(hosted.metrics, OUTCOME_BY_STATUS.get(exc.status_code, "model_error"))
        raise
    _count(hosted.metrics, "ok")
    hosted.metrics.latency_s.observe(time.perf_counter() - started)
    return response


async def _embed(
    request: Request, service: Service, hosted: HostedModel, body: EmbeddingRequest
) -> Response:
    if body.dimensions is not None and body.dimensions != hosted.model.dim:
        raise InvalidRequest(
            f"model {body.model!r} returns {hosted.model.dim} dimensions; "
            f"it cannot return {body.dimensions}",
            param="dimensions",
        )
    inputs = body.inputs()
    if len(inputs) > hosted.config.max_inputs_per_request:
        raise InvalidRequest(
            f"too many inputs: {len(inputs)} (at most {hosted.config.max_inputs_per_request})",
            param="input",
        )
    items, num_tokens = service.submit_embeddings(
        hosted, inputs, timeout_ms=timeout_from_headers(request), truncate=body.truncate
    )

    def abandon_all() -> None:
        for item in items:
            hosted.batcher.abandon(item)

    watcher = DisconnectWatcher(request.receive, abandon_all)
    try:
        vectors = await gather_items(hosted.batcher, items)
    except asyncio.CancelledError:
        if watcher.is_gone:
            raise ClientGone("the client disconnected before the result was ready") from None
        raise
    finally:
        watcher.close()
    return Response(
        orjson.dumps(embedding_body(body.model, vectors, num_tokens, body.encoding_format)),
        media_type="application/json",
    )


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


def _count(metrics: ModelMetrics, outcome: str) -> None:
    metrics.requests[outcome].inc()
