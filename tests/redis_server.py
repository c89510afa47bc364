"""The local Redis the tests use: a unique key prefix per test, deleted afterwards."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from tests.missing import missing

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REDIS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"


@contextmanager
def unique_prefix() -> Iterator[str]:
    """A fresh key prefix; every key under it is deleted afterwards. Without Redis the test
    is skipped, or fails under CI (which has the server)."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError:
        missing(f"no Redis on {REDIS_HOST}:{REDIS_PORT}")
    prefix = f"conveyor-test:{secrets.token_hex(6)}:"
    try:
        yield prefix
    finally:
        keys = list(client.scan_iter(match=prefix + "*"))
        if keys:
            client.delete(*keys)
        client.close()
