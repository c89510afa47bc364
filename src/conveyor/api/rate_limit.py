"""Tenant rate limits on the inference routes.

Two ways to admit. A gateway has no tokenizer: `RateLimitMiddleware` reads the request body
(already capped by the body limit), estimates its tokens (`tenants.estimate`), reserves the
tenant's buckets and passes the body on. `serve` counts exactly and needs no middleware
layer: the edge calls `TicketIssuer` as a limited request starts, which puts an
`AdmissionTicket` in the request's state, and the service admits it once the request is
tokenized (the route hands it over in the payer), so the body is neither read nor parsed
here and no coroutine layer is added to every request.

Either way the answer gets OpenAI's `x-ratelimit-*` headers (through the edge's
per-request hook), and the request is settled when the answer ends: on `serve` by the
service's billing (exact; the edge's finish hook settles an unbilled ticket at nothing),
else from the `usage` the model reports (JSON bodies and streams that ask for usage), a
stream at the chunks it sent, a failed request at nothing. A cancelled or disconnected
request settles at what it produced too (in a `finally`). Settling never waits on the
limiter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.api.errors import error_response
from conveyor.errors import ConveyorError
from conveyor.observability.context import RequestContext, current_request
from conveyor.tenants.estimate import LIMITED_PATHS, parse_ask
from conveyor.tenants.gate import RateLimitGate, Reservation, reservation_headers
from conveyor.tenants.ticket import AdmissionTicket

_PROMPT_TOKENS = re.compile(rb'"prompt_tokens":\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')
TAIL_BYTES = 2048
TICKET_KEY = "rate_limit_ticket"  # in the request's scope state, on `serve`


def admission_of(request: Request) -> AdmissionTicket | None:
    """The request's admission ticket (on `serve` under rate limits), for its payer, for
    the caller's tenant (known by now: the API key middleware has run)."""
    state = request.scope.get("state", {})
    ticket: AdmissionTicket | None = state.get(TICKET_KEY)
    if ticket is not None:
        ticket.tenant = state.get("tenant", "default")
    return ticket


class TicketIssuer:
    """`serve`'s rate limits, called by the edge as each request starts (no ASGI layer)."""

    def __init__(self, gate: RateLimitGate) -> None:
        """Tickets admit against `gate`."""
        self.gate = gate

    def __call__(self, scope: Scope, context: RequestContext) -> None:
        """A limited request gets a ticket, the headers hook and a settlement at its end."""
        if scope["method"] != "POST" or scope["path"] not in LIMITED_PATHS:
            return
        ticket = scope.setdefault("state", {})[TICKET_KEY] = AdmissionTicket(self.gate)
        context.response_headers = ticket.headers
        context.on_finish = ticket.finish


@dataclass(slots=True)
class UsageMeter:
    """Watches an answer go out and says what it used."""

    status: int = 0
    is_stream: bool = False
    num_events: int = 0
    tail: bytes = b""
    usage: tuple[int, int] | None = None

    def on_start(self, message: Message) -> None:
        """Note the status and whether the answer is an event stream."""
        self.status = int(message["status"])
        for name, value in message.get("headers", ()):
            if name == b"content-type":
                self.is_stream = value.startswith(b"text/event-stream")
                break

    def on_body(self, chunk: bytes) -> None:
        """Count stream events; keep the tail where a JSON body's `usage` sits."""
        if self.is_stream:
            self.num_events += chunk.count(b"data: ") - chunk.count(b"data: [DONE]")
            if b'"usage":{' in chunk:
                self.usage = read_usage(chunk)
        else:
            self.tail = (self.tail + chunk)[-TAIL_BYTES:]

    def used(self, res: Reservation) -> tuple[int, int]:
        """Input and output tokens to settle at."""
        if self.status >= 400 or self.status == 0:
            return 0, 0
        usage = self.usage if self.is_stream else read_usage(self.tail)
        if usage is not None:
            return usage
        if self.is_stream:  # no usage chunk: about one token a content event
            return res.input_tokens, max(0, self.num_events - 1)
        return res.input_tokens, res.output_tokens


def read_usage(text: bytes) -> tuple[int, int] | None:
    """`(prompt_tokens, completion_tokens)` from a `usage` object in `text`, if there."""
    prompt = _PROMPT_TOKENS.findall(text)
    if not prompt:
        return None
    completion = _COMPLETION_TOKENS.findall(text)
    return int(prompt[-1]), int(completion[-1]) if completion else 0


async def read_body(receive: Receive) -> tuple[bytes, Receive]:
    """The whole request body, and a `receive` that hands it on and then the rest."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ConnectionError("client disconnected while sending the body")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    is_replayed = False

    async def replay() -> Message:
        nonlocal is_replayed
        if not is_replayed:
            is_replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


class RateLimitMiddleware:
    """A gateway's limits: reserve on the estimated tokens, headers on every answer, settle
    from the answer."""

    def __init__(self, app: ASGIApp, gate: RateLimitGate) -> None:
        """Limit the inference routes of `app` against `gate`."""
        self.app = app
        self.gate = gate
        self.default_max_tokens = gate.tenancy.rate_limits.default_max_output_tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        is_limited = scope["type"] == "http" and scope["method"] == "POST"
        if not is_limited or scope["path"] not in LIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        tenant = scope.setdefault("state", {}).get("tenant", "default")
        await self._at_door(scope, receive, send, tenant)

    async def _at_door(self, scope: Scope, receive: Receive, send: Send, tenant: str) -> None:
        """Admit on the body's estimated tokens before the app; settle from the answer."""
        try:
            body, replay = await read_body(receive)
        except ConnectionError:
            return
        ask = parse_ask(body, scope["path"], self.default_max_tokens)
        try:
            res = None if ask is None else await self.gate.admit(tenant, ask)
        except ConveyorError as exc:
            await error_response(exc)(scope, replay, send)
            return
        if res is None:
            await self.app(scope, replay, send)
            return
        edge_context().response_headers = lambda: reservation_headers(res)
        meter = UsageMeter()

        async def metered(message: Message) -> None:
            if message["type"] == "http.response.start":
                meter.on_start(message)
            elif message["type"] == "http.response.body":
                meter.on_body(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, replay, metered)
        finally:
            self.gate.settle(res, *meter.used(res))


def edge_context() -> RequestContext:
    """The request's context, which the edge (outside this middleware) set: its
    `response_headers` hook is how the rate-limit headers reach every answer."""
    context = current_request()
    if context is None:
        raise RuntimeError("the rate-limit middleware must run behind the edge (api.edge.Edge)")
    return context
