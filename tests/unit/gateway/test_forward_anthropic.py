"""Anthropic's routes on a gateway: ``/v1/messages`` and ``count_tokens`` are forwarded like
chat (a key in ``x-api-key`` accepted, and not passed on when the fleet key is), Message
Batches stay with the gateway's own job routes, and a refusal is in Anthropic's shape."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from conveyor.gateway.proxy import is_proxied
from tests.unit.gateway.scripted_gateway import gateway_before

pytestmark = pytest.mark.anyio

KEY = "sk-test-0123456789"
FLEET_KEY = "fleet-key-0123456789abcdef"
ANSWER = b'{"type":"message"}'


@dataclass
class Worker:
    """Answers every request with ``ANSWER``; keeps the heads it received."""

    heads: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                self.heads.append(head)
                self.bodies.append(await reader.readexactly(length))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))  # fmt: skip
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def scope(method: str, path: str) -> dict[str, str]:
    return {"type": "http", "method": method, "path": path}


def test_messages_are_proxied_and_message_batches_are_not() -> None:
    assert is_proxied(scope("POST", "/v1/messages"))
    assert is_proxied(scope("POST", "/v1/messages/count_tokens"))
    for path in ("/v1/messages/batches", "/v1/messages/batches/msgbatch_1/cancel"):
        assert not is_proxied(scope("POST", path))


@pytest.mark.parametrize("fleet_key", [None, FLEET_KEY])
async def test_a_message_reaches_a_worker_with_the_key_in_x_api_key(
    tmp_path: Path, fleet_key: str | None
) -> None:
    worker = Worker()
    config: dict[str, object] = {"api_keys": [{"key": KEY}]}
    if fleet_key is not None:
        config["fleet"] = {"internal_key": fleet_key}
    body = orjson.dumps({"model": "m", "max_tokens": 4,
                         "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    async with gateway_before(worker.handle, tmp_path, config) as (client, _):
        headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
        answer = await client.post("/v1/messages", content=body, headers=headers)
        assert answer.status_code == 200 and answer.content == ANSWER
        refused = await client.post("/v1/messages", content=body, headers={"x-api-key": "no"})
    assert worker.bodies == [body]
    (head,) = worker.heads
    assert head.startswith(b"POST /v1/messages HTTP/1.1\r\n")
    assert (b"x-api-key: " + KEY.encode() in head) is (fleet_key is None)
    assert refused.status_code == 401
    assert refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "authentication_error"
