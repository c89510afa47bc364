"""A gateway app in front of one scripted worker on 127.0.0.1 (in the test's own event
loop), driven in-process through httpx."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from conveyor.api.gateway_app import create_gateway_app
from conveyor.config.settings import ServerConfig
from conveyor.gateway.process import Gateway, GatewaySettings
from conveyor.stores import open_job_store
from conveyor.stores.tenant_records import ApiKeyRecord

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def gateway_before(
    handler: Handler,
    tmp_path: Path,
    config: dict[str, Any],
    stored_keys: Sequence[ApiKeyRecord] = (),
) -> AsyncIterator[tuple[httpx.AsyncClient, Gateway]]:
    """A client of a started gateway whose one worker `w1` (model `m`) is `handler`, with
    `stored_keys` in its store (as `conveyor keys create` puts them)."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = open_job_store(f"sqlite://{tmp_path}/jobs.sqlite")
    for record in stored_keys:
        store.create_api_key(record)
    store.upsert_worker("w1", f"http://127.0.0.1:{port}", ["m"], 8, {}, time.time())
    server_config = ServerConfig.model_validate({"data_dir": str(tmp_path), **config})
    app = create_gateway_app(GatewaySettings(store_url="unused"), server_config, store=store)
    gateway: Gateway = app.state.gateway
    await gateway.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client, gateway
    finally:
        await gateway.stop()
        server.close()
