"""``POST /v1/chat/completions``: the model's chat template, answered as JSON or SSE."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from conveyor.api.sse import serve_generation
from conveyor.endpoints.chat import chat_body, chat_chunks, parse_chat_request, prepare_chat

router = APIRouter()


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request) -> Response:
    """OpenAI chat completions through the model's chat template; ``stream: true`` for SSE."""
    return await serve_generation(request, parse_chat_request, prepare_chat, chat_body, chat_chunks)
