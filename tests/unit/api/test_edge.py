"""The edge: which crashes it answers, swallows or lets close the connection; the request id
and the request counter on every answer; the direct routes."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry, Counter
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.api.edge import Dispatch, Edge, direct_routes
from conveyor.errors import ModelNotFound
from conveyor.observability.context import RequestContext

SCOPE: Scope = {"type": "http", "method": "POST", "path": "/v1/x", "headers": []}


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def run(app: ASGIApp, scope: Scope | None = None) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(dict(message))

    asyncio.run(app(dict(scope or SCOPE), _receive, send))
    return sent


def counter() -> Counter:
    return Counter("requests", "HTTP requests", ["method", "route", "status"],
                   registry=CollectorRegistry())  # fmt: skip


def guard(app: ASGIApp, requests: Counter | None = None) -> Edge:
    return Edge(app, counter=requests if requests is not None else counter())


async def crash_after(messages: list[Message], scope: Scope, receive: Receive, send: Send) -> None:
    for message in messages:
        await send(dict(message))
    raise RuntimeError("boom")


START: Message = {"type": "http.response.start", "status": 500, "headers": []}
LAST_BODY: Message = {"type": "http.response.body", "body": b"{}", "more_body": False}


def test_crash_after_a_complete_response_is_swallowed() -> None:
    requests = counter()
    sent = run(guard(lambda s, r, w: crash_after([START, LAST_BODY], s, r, w), requests))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[1] == LAST_BODY
    assert requests.labels("POST", "unmatched", "500")._value.get() == 1


def test_crash_before_any_response_is_an_openai_500() -> None:
    requests = counter()
    sent = run(guard(lambda s, r, w: crash_after([], s, r, w), requests))
    assert sent[0]["status"] == 500
    assert dict(sent[0]["headers"])[b"x-request-id"].startswith(b"req-")
    assert requests.labels("POST", "unmatched", "500")._value.get() == 1
    body = orjson.loads(sent[1]["body"])
    assert body["error"] == {
        "message": "internal server error", "type": "server_error", "param": None, "code": None,
    }  # fmt: skip


def test_crash_mid_response_is_reraised_so_the_server_closes_the_connection() -> None:
    partial: Message = {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True}
    with pytest.raises(RuntimeError, match="boom"):
        run(guard(lambda s, r, w: crash_after([START, partial], s, r, w)))


async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"x-request-id", b"from-the-app"), (b"content-type", b"text/plain")]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


def test_every_answer_carries_one_request_id_the_callers_when_acceptable() -> None:
    scope = {**SCOPE, "headers": [(b"x-request-id", b"caller-7")]}
    sent = run(guard(_answer), scope)
    ids = [v for k, v in sent[0]["headers"] if k == b"x-request-id"]
    assert ids == [b"caller-7"]


def test_requests_are_counted_by_method_route_template_and_status() -> None:
    requests = counter()

    async def routed(scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = type("R", (), {"path": "/v1/things/{id}"})()
        await _answer(scope, receive, send)

    run(guard(routed, requests))
    run(guard(_answer, requests))
    assert requests.labels("POST", "/v1/things/{id}", "201")._value.get() == 1
    assert requests.labels("POST", "unmatched", "201")._value.get() == 1


def _direct_app() -> FastAPI:
    app = FastAPI()

    async def fine(request: Request) -> Response:
        return Response(await request.body(), status_code=200)

    async def missing(request: Request) -> Response:
        raise ModelNotFound("no such model", param="model")

    async def broken(request: Request) -> Response:
        raise RuntimeError("bug")

    app.add_route("/fine", fine, methods=["POST"])
    app.add_route("/missing", missing, methods=["POST"])
    app.add_route("/broken", broken, methods=["POST"])
    return app


def test_direct_routes_answer_only_their_paths_and_methods() -> None:
    shortcut = direct_routes(_direct_app(), frozenset({"/fine", "/missing"}))
    assert shortcut({**SCOPE, "path": "/fine"}) is not None
    assert shortcut({**SCOPE, "path": "/fine", "method": "GET"}) is None
    assert shortcut({**SCOPE, "path": "/broken"}) is None  # not asked for
    assert shortcut({**SCOPE, "path": "/elsewhere"}) is None


def test_a_direct_route_answers_errors_as_the_app_does_and_is_labelled() -> None:
    shortcut = direct_routes(_direct_app(), frozenset({"/fine", "/missing", "/broken"}))
    scope = {**SCOPE, "path": "/fine"}
    direct = shortcut(scope)
    assert direct is not None
    requests = counter()
    assert run(guard(direct, requests), scope)[0]["status"] == 200
    assert requests.labels("POST", "/fine", "200")._value.get() == 1
    scope = {**SCOPE, "path": "/missing"}
    sent = run(guard(shortcut(scope) or _answer), scope)
    assert sent[0]["status"] == 404
    assert orjson.loads(sent[1]["body"])["error"]["code"] == "model_not_found"
    scope = {**SCOPE, "path": "/broken"}
    sent = run(guard(shortcut(scope) or _answer, requests), scope)
    assert sent[0]["status"] == 500  # the crash reaches the edge's guard
    assert requests.labels("POST", "/broken", "500")._value.get() == 1


def test_lifespan_and_other_scopes_pass_through_to_the_full_app() -> None:
    seen: list[str] = []

    async def full(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    edge = guard(Dispatch(full, direct_routes(_direct_app(), frozenset({"/fine"}))))
    asyncio.run(edge({"type": "lifespan"}, _receive, _noop_send))
    assert seen == ["lifespan"]


async def _noop_send(message: Message) -> None:
    pass


def test_on_request_hooks_add_headers_and_finish_even_after_a_crash() -> None:
    finished: list[str] = []

    def on_request(scope: Scope, context: RequestContext) -> None:
        context.response_headers = lambda: ((b"x-extra", b"1"),)
        context.on_finish = lambda: finished.append(scope["path"])

    answered = run(Edge(_answer, counter=counter(), on_request=on_request))
    assert dict(answered[0]["headers"])[b"x-extra"] == b"1" and finished == ["/v1/x"]
    crashed = Edge(lambda s, r, w: crash_after([], s, r, w), counter=counter(),
                   on_request=on_request)  # fmt: skip
    assert run(crashed)[0]["status"] == 500 and finished == ["/v1/x", "/v1/x"]
