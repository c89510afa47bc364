"""The gateway app's online path: auth and the body cap first, then the proxy, bytes untouched.

A scripted worker on 127.0.0.1 (in the test's own event loop) records what reaches it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import pytest

from conveyor.errors import InvalidRequest
from conveyor.gateway.proxy import is_proxied
from conveyor.gateway.sniff import read_model, scan_model
from conveyor.tenants.keys import new_key_record
from tests.unit.gateway.scripted_gateway import gateway_before

pytestmark = pytest.mark.anyio

KEY = "sk-test-0123456789"
ANSWER = b'{"object":"list","data":[]}'


@dataclass
class Worker:
    """Answers every request with ``ANSWER``; keeps what it received."""

    bodies: list[bytes] = field(default_factory=list)
    heads: list[bytes] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                self.heads.append(head)
                self.bodies.append(await reader.readexactly(length))
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"x-worker: w1\r\ncontent-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)
                )
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Worker]]:
    worker = Worker()
    config = {"api_keys": [{"key": KEY}], "max_request_bytes": 1024}
    async with gateway_before(worker.handle, tmp_path, config) as (client, _):
        yield client, worker


AUTH = {"Authorization": f"Bearer {KEY}"}


async def test_a_request_reaches_the_worker_byte_for_byte(
    fleet: tuple[httpx.AsyncClient, Worker],
) -> None:
    client, worker = fleet
    body = b'{ "input": ["a"],   "model": "m" }'  # odd spacing: forwarded as it came
    answer = await client.post("/v1/embeddings?x=1", content=body, headers=AUTH)
    assert answer.status_code == 200 and answer.content == ANSWER
    assert answer.headers["x-worker"] == "w1"
    assert answer.headers["content-length"] == str(len(ANSWER))
    assert worker.bodies == [body]
    (head,) = worker.heads
    assert head.startswith(b"POST /v1/embeddings?x=1 HTTP/1.1\r\n")
    assert b"authorization: Bearer " in head and b"x-conveyor-timeout-ms: " in head


async def test_keys_and_the_body_cap_run_before_the_proxy(
    fleet: tuple[httpx.AsyncClient, Worker],
) -> None:
    client, worker = fleet
    body = orjson.dumps({"model": "m", "input": ["a"]})
    assert (await client.post("/v1/embeddings", content=body)).status_code == 401
    big = orjson.dumps({"model": "m", "input": ["x" * 2000]})
    assert (await client.post("/v1/embeddings", content=big, headers=AUTH)).status_code == 413
    assert worker.bodies == []


async def test_bad_bodies_and_unknown_models_are_answered_by_the_gateway(
    fleet: tuple[httpx.AsyncClient, Worker],
) -> None:
    client, worker = fleet
    bad = await client.post("/v1/embeddings", content=b"{nope", headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    unknown = await client.post("/v1/chat/completions", content=b'{"model": "x"}', headers=AUTH)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    timeout = {**AUTH, "X-Conveyor-Timeout-Ms": "-1"}
    negative = await client.post("/v1/embeddings", content=b'{"model": "m"}', headers=timeout)
    assert negative.status_code == 400
    assert worker.bodies == []


async def test_job_routes_are_not_proxied_but_other_paths_under_them_are(
    fleet: tuple[httpx.AsyncClient, Worker],
) -> None:
    client, worker = fleet
    batch = await client.post("/v1/batches", json={"model": "m"}, headers=AUTH)
    # The Batches route answered (its jobs subsystem is not started here), not a worker.
    assert batch.status_code == 503 and "error" in batch.json() and worker.bodies == []
    stray = await client.post("/v1/files/f1/extra", content=b'{"model": "m"}', headers=AUTH)
    assert stray.status_code == 200 and worker.bodies == [b'{"model": "m"}']


def test_only_online_posts_take_the_shortcut() -> None:
    def scope(method: str, path: str) -> dict[str, str]:
        return {"type": "http", "method": method, "path": path}

    assert is_proxied(scope("POST", "/v1/embeddings"))
    assert is_proxied(scope("POST", "/v1/chat/completions"))
    assert not is_proxied(scope("GET", "/v1/models"))
    assert not is_proxied(scope("POST", "/v1/batches"))
    assert not is_proxied(scope("POST", "/v1/files"))
    assert not is_proxied(scope("POST", "/health"))
    assert not is_proxied({"type": "lifespan"})


@pytest.mark.parametrize(
    ("body", "model"),
    [
        (b'{"model": "m", "messages": []}', "m"),
        (b'  {"messages": [{"role": "user", "content": "hi"}],\n "model" :"llama-3"}', "llama-3"),
        (b'{"prompt": "x", "model": "caf\xc3\xa9"}', "caf\u00e9"),
        # Doubt of any kind: leave it to the parser.
        (b'{"messages": [{"model": "x"}], "model": "m"}', None),  # nested and twice
        (b'{"meta": {"model": "x"}}', None),  # only nested
        (b'{"meta": {"model": "x"}, "n": {}}', None),  # nested, braces after
        (b'{"a": {"b": 1}, "meta": {"model": "x"}}', None),  # nested, braces before
        (b'{"messages": [{"content": "}"}], "model": "m"}', "m"),
        (b'{"model": "m", "messages": [{"content": "}"}]}', "m"),
        (b'{"model": "a\\"b"}', None),  # an escape in the value
        (b'{"content": "say \\"model": 1}', None),  # the tail of a string
        (b'{"model": 3}', None),
        (b'["model", "m"]', None),
        (b'{"model": ""}', None),
    ],
)
def test_the_model_scan_is_sure_or_declines(body: bytes, model: str | None) -> None:
    assert scan_model(body) == model


def test_read_model_scans_or_parses_to_the_same_answer() -> None:
    assert read_model(b'{"messages": [], "model": "m"}') == ("m", 1)
    assert read_model(b'{"input": ["a", "b"], "model": "m"}') == ("m", 2)  # counted: parsed
    assert read_model(b'{"messages": [{"model": "x"}], "model": "m"}') == ("m", 1)
    items = b'{"input": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]'
    assert read_model(items + b', "model": "m"}') == ("m", 1)  # a Responses conversation
    for bad in (b"not json", b'{"model": 3}', b'{"messages": []}'):
        with pytest.raises(InvalidRequest):
            read_model(bad)


FLEET_KEY = "fleet-key-0123456789abcdef"
SPOOF = {"X-Conveyor-Tenant": "victim", "X-Conveyor-Tenant-Admin": "1"}


def head_lines(head: bytes) -> list[bytes]:
    return head.lower().split(b"\r\n")


async def test_with_the_fleet_key_a_stored_key_s_tenant_reaches_the_worker_unspoofable(
    tmp_path: Path,
) -> None:
    worker = Worker()
    key, record = new_key_record("acme")  # as `conveyor keys create` makes it
    config = {"fleet": {"internal_key": FLEET_KEY}}
    async with gateway_before(worker.handle, tmp_path, config, [record]) as (client, _):
        body = b'{"model": "m", "input": ["a"]}'
        headers = {"Authorization": f"Bearer {key}", **SPOOF}
        answer = await client.post("/v1/embeddings", content=body, headers=headers)
        unknown = await client.post("/v1/embeddings", content=body, headers=SPOOF)
        # The fleet key is no client key at a gateway: only workers take it.
        as_fleet = {"Authorization": f"Bearer {FLEET_KEY}", **SPOOF}
        posing = await client.post("/v1/embeddings", content=body, headers=as_fleet)
    assert answer.status_code == 200
    assert unknown.status_code == 401 and posing.status_code == 401
    (head,) = worker.heads
    lines = head_lines(head)
    # The fleet key instead of the client's, and the tenant the gateway authenticated, once.
    assert f"authorization: bearer {FLEET_KEY}".encode() in lines
    assert key.lower().encode() not in head.lower()
    assert [ln for ln in lines if ln.startswith(b"x-conveyor-tenant")] == [
        b"x-conveyor-tenant: acme"
    ]


async def test_without_the_fleet_key_a_client_s_tenant_headers_are_dropped(
    tmp_path: Path,
) -> None:
    worker = Worker()
    async with gateway_before(worker.handle, tmp_path, {"api_keys": [{"key": KEY}]}) as (
        client,
        _,
    ):
        body = b'{"model": "m", "input": ["a"]}'
        answer = await client.post("/v1/embeddings", content=body, headers={**AUTH, **SPOOF})
    assert answer.status_code == 200
    (head,) = worker.heads
    assert f"authorization: bearer {KEY}".encode() in head_lines(head)  # the worker checks it
    assert b"x-conveyor-tenant" not in head.lower()
