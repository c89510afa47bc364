"""The inference routes over HTTP: embeddings, completions, chat completions, tokenize.

Thin: each parses, hands the body to ``endpoints`` (shared with batch jobs) and answers.
Embeddings is a plain Starlette route (no FastAPI per-request machinery on the hot path);
the generation routes answer as JSON or server-sent events (``api.sse``).
"""

from __future__ import annotations

import functools

from fastapi import APIRouter, Request
from starlette.responses import Response

from conveyor.api.rate_limit import admission_of
from conveyor.api.request_state import tenant_of
from conveyor.api.sse import serve_generation
from conveyor.asgi.disconnect import disconnect_cancels
from conveyor.asgi.json import json_response
from conveyor.asgi.timeouts import timeout_from_headers
from conveyor.endpoints.chat import chat_body, chat_chunks, parse_chat_request, prepare_chat
from conveyor.endpoints.completions import (
    completion_body,
    completion_chunks,
    parse_completion_body,
    prepare_completion,
)
from conveyor.endpoints.embeddings import parse_embedding_request, run_embeddings
from conveyor.endpoints.rerank import (
    parse_rerank_request,
    parse_score_request,
    run_rerank,
    run_score,
)
from conveyor.endpoints.tokenize import run_detokenize, run_tokenize
from conveyor.host.offload import run_sized
from conveyor.host.service import Service

router = APIRouter()


async def create_embeddings(request: Request) -> Response:
    """``POST /v1/embeddings``: several inputs are batched like separate requests."""
    service: Service = request.app.state.service
    raw = await request.body()
    body = await run_sized(len(raw), parse_embedding_request, raw)
    timeout_ms = timeout_from_headers(request)
    with disconnect_cancels(request.receive, request.scope):
        payer = service.online_payer(tenant_of(request), admission_of(request))
        result = await run_embeddings(service, body, timeout_ms=timeout_ms, payer=payer)
    return json_response(result)


@router.post("/v1/completions")
async def create_completion(request: Request) -> Response:
    """OpenAI text completions; one choice per prompt, ``stream: true`` for SSE."""
    parse = functools.partial(parse_completion_body, request.app.state.service)
    return await serve_generation(
        request, parse, prepare_completion, completion_body, completion_chunks
    )


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request) -> Response:
    """OpenAI chat completions through the model's chat template; ``stream: true`` for SSE."""
    return await serve_generation(request, parse_chat_request, prepare_chat, chat_body, chat_chunks)


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    """vLLM's ``/tokenize``: a prompt, or a chat through its template, to token ids."""
    return json_response(await run_tokenize(request.app.state.service, await request.body()))


@router.post("/detokenize")
async def detokenize(request: Request) -> Response:
    """vLLM's ``/detokenize``: token ids to text."""
    return json_response(await run_detokenize(request.app.state.service, await request.body()))


@router.post("/v1/rerank")
async def rerank(request: Request) -> Response:
    """Cohere/Jina-style rerank: documents scored against a query by a cross-encoder."""
    body = await request.body()
    service: Service = request.app.state.service
    payer = service.online_payer(tenant_of(request), admission_of(request))
    timeout_ms = timeout_from_headers(request)
    parsed = parse_rerank_request(body)
    return json_response(await run_rerank(service, parsed, timeout_ms=timeout_ms, payer=payer))


@router.post("/v1/score")
async def score(request: Request) -> Response:
    """vLLM-style score: text pairs scored by a cross-encoder."""
    body = await request.body()
    service: Service = request.app.state.service
    payer = service.online_payer(tenant_of(request), admission_of(request))
    timeout_ms = timeout_from_headers(request)
    parsed = parse_score_request(body)
    return json_response(await run_score(service, parsed, timeout_ms=timeout_ms, payer=payer))
