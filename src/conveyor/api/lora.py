"""`/v1/load_lora_adapter` and `/v1/unload_lora_adapter`: adapters added at run time.

The names and bodies are vLLM's, and so is the plain-text success answer. Loading reads
a directory on this server, so with API keys configured only an admin key may do it.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import PlainTextResponse, Response

from conveyor.api.request_state import is_admin
from conveyor.endpoints.lora_adapters import (
    LoadLoraAdapterRequest,
    UnloadLoraAdapterRequest,
    load_adapter,
    unload_adapter,
)
from conveyor.errors import PermissionDenied
from conveyor.host.service import Service

router = APIRouter()


def _check_allowed(request: Request) -> None:
    """403 unless the server is open (no keys) or the caller holds an admin key."""
    if request.app.state.guards.keyring.is_enforced and not is_admin(request):
        raise PermissionDenied("only an admin API key may load or unload LoRA adapters")


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request) -> Response:
    """Read a PEFT adapter directory and serve it as model ``lora_name``."""
    _check_allowed(request)
    body = LoadLoraAdapterRequest.model_validate_json(await request.body())
    service: Service = request.app.state.service
    return PlainTextResponse(await load_adapter(service, body))


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> Response:
    """Stop serving adapter ``lora_name`` (requests already queued for it finish)."""
    _check_allowed(request)
    body = UnloadLoraAdapterRequest.model_validate_json(await request.body())
    service: Service = request.app.state.service
    return PlainTextResponse(await unload_adapter(service, body))
