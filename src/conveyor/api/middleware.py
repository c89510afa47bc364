"""The middleware every Conveyor app wears, in one place: the body cap, then API keys."""

from __future__ import annotations

from fastapi import FastAPI

from conveyor.api.auth import ApiKeyMiddleware, static_principals
from conveyor.api.body_limit import UPLOAD_PATHS, BodyLimitMiddleware
from conveyor.config import ServerConfig
from conveyor.stores.protocols import ApiKeyStore
from conveyor.tenants.keyring import KeyRing


def install_middleware(
    app: FastAPI,
    config: ServerConfig,
    *,
    key_store: ApiKeyStore | None = None,
    owns_key_store: bool = False,
) -> KeyRing:
    """Add the body cap and API-key checks (keys run first: added last, outermost).

    Keys are the config's plus, with `key_store`, the stored ones (read once now, then
    reread by the returned key ring, which the app's lifespan starts and stops).
    """
    keyring = KeyRing(static_principals(config.api_keys), key_store, owns_store=owns_key_store)
    keyring.load()
    app.state.keyring = keyring
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=config.max_request_bytes, exempt_paths=UPLOAD_PATHS
    )
    app.add_middleware(ApiKeyMiddleware, keyring=keyring, is_metrics_open=not config.metrics_auth)
    return keyring
