"""``/v1/rerank`` and ``/v1/score``: pairs through a cross-encoder, OpenAI-style envelopes."""

from __future__ import annotations

import time
import uuid
from typing import Any

from conveyor.endpoints.rerank_schemas import RerankRequest, ScoreRequest
from conveyor.endpoints.validation import parse_body
from conveyor.errors import InvalidRequest
from conveyor.host.service import Service
from conveyor.priority import Priority
from conveyor.tenants.usage import Payer


def parse_rerank_request(body: bytes | dict[str, Any]) -> RerankRequest:
    """Validate a rerank body; any mistake is a 400 naming the field."""
    return parse_body(RerankRequest, body)


def parse_score_request(body: bytes | dict[str, Any]) -> ScoreRequest:
    """Validate a score body; any mistake is a 400 naming the field."""
    return parse_body(ScoreRequest, body)


async def run_rerank(
    service: Service,
    request: RerankRequest,
    *,
    priority: Priority = Priority.ONLINE,
    timeout_ms: float | None = None,
    payer: Payer | None = None,
) -> dict[str, Any]:
    """``{id, model, results: [{index, relevance_score, document?}], usage}``, best first."""
    texts = request.texts()
    result = await service.score_pairs(
        request.model, [(request.query, text) for text in texts],
        priority=priority, timeout_ms=timeout_ms, truncate=request.truncate, payer=payer,
    )  # fmt: skip
    scores = [float(vector[0]) for vector in result.vectors]
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[: request.top_n]
    results = []
    for index in order:
        entry: dict[str, Any] = {"index": index, "relevance_score": scores[index]}
        if request.return_documents:
            entry["document"] = {"text": texts[index]}
        results.append(entry)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": request.model,
        "results": results,
        "usage": {"prompt_tokens": result.num_tokens, "total_tokens": result.num_tokens},
    }


async def run_score(
    service: Service,
    request: ScoreRequest,
    *,
    priority: Priority = Priority.ONLINE,
    timeout_ms: float | None = None,
    payer: Payer | None = None,
) -> dict[str, Any]:
    """vLLM's score list: ``data`` of ``{index, object: "score", score}`` in pair order."""
    try:
        pairs = request.pairs()
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="text_2") from None
    result = await service.score_pairs(
        request.model, pairs, priority=priority, timeout_ms=timeout_ms,
        truncate=request.truncate, payer=payer,
    )  # fmt: skip
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": request.model,
        "data": [
            {"index": i, "object": "score", "score": float(vector[0])}
            for i, vector in enumerate(result.vectors)
        ],
        "usage": {"prompt_tokens": result.num_tokens, "total_tokens": result.num_tokens},
    }
