"""The uvicorn set-up shared by serve, worker and gateway."""

from __future__ import annotations

from starlette.types import Receive, Scope, Send

from conveyor.api.connection_limits import HeadLimits, ReadTimeouts
from conveyor.api.server import uvicorn_config
from conveyor.api.slow_clients import SlowClientProtocol
from conveyor.config.settings import ServerConfig


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """Never called."""


def test_every_process_gets_the_timeouts_the_head_limits_and_the_cap() -> None:
    config = ServerConfig(max_connections=7, header_timeout_s=1.5, body_timeout_s=2.5,
                          body_min_bytes_per_s=10, max_header_bytes=4096, max_headers=20)  # fmt: skip
    settings = uvicorn_config(app, config, host="127.0.0.1", port=0, timeout_keep_alive=30)
    assert settings.app is app  # the app's own edge guards against crashes
    assert isinstance(settings.http, type) and issubclass(settings.http, SlowClientProtocol)
    assert settings.http.timeouts == ReadTimeouts(
        header_timeout_s=1.5, body_timeout_s=2.5, body_min_bytes_per_s=10
    )
    assert settings.http.head_limits == HeadLimits(max_header_bytes=4096, max_headers=20)
    # The protocol's budget is the cap, one per server; uvicorn's own would count every
    # open connection, those that never send a request included.
    assert settings.http.budget is not None and settings.http.budget.capacity == 7
    other = uvicorn_config(app, config, host="127.0.0.1", port=0)
    assert isinstance(other.http, type) and issubclass(other.http, SlowClientProtocol)
    assert other.http.budget is not settings.http.budget
    assert settings.limit_concurrency is None and settings.ws == "none"
    assert (settings.timeout_keep_alive, settings.access_log) == (30, False)
    # No X-Forwarded-* is read, so uvicorn's proxy-headers layer is not stacked on each request.
    assert settings.proxy_headers is False
