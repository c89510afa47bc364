"""A gateway's tenant rate limits, applied by its proxy (no middleware layer).

A gateway has no tokenizer: the proxy, which reads the request body anyway, estimates its
tokens (`tenants.estimate`) and reserves the tenant's buckets before it forwards the body;
the answer gets OpenAI's `x-ratelimit-*` headers (through the edge's per-request hook) and
the request is settled when the answer has gone: from the `usage` the worker reports (a
whole answer's is read from its last bytes; a stream's from its usage chunk), a stream
without one at about a token a content event, a failed request at nothing. A request
cancelled or disconnected on the way settles too (in a `finally`). Settling never waits
on the limiter.

Doing this in the proxy, not in a layer of its own, saves each limited request a second
pass over its body, an ASGI layer with its `receive` replay and, for whole answers, a
`send` wrapper.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from conveyor.gateway.forward import ProxiedResponse
from conveyor.observability.context import RequestContext, current_request
from conveyor.tenants.estimate import ask_of
from conveyor.tenants.gate import RateLimitGate, Reservation, reservation_headers

# OpenAI's chat and completions name them prompt / completion tokens, Anthropic's Messages
# input / output tokens.
_PROMPT_TOKENS = re.compile(rb'"(?:prompt|input)_tokens":\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"(?:completion|output)_tokens":\s*(\d+)')
TAIL_BYTES = 2048  # a whole answer's `usage` sits in its last bytes


def read_usage(text: bytes, before: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """`(input, output)` tokens from a `usage` object in `text`, if there; a figure `text`
    lacks is `before`'s (Anthropic's stream tells input tokens first, output tokens last)."""
    prompt = _PROMPT_TOKENS.findall(text)
    completion = _COMPLETION_TOKENS.findall(text)
    if not prompt and (before is None or not completion):
        return None
    num_input = int(prompt[-1]) if prompt else before[0] if before else 0
    num_output = int(completion[-1]) if completion else 0
    return num_input, num_output


def answer_usage(res: Reservation, status: int, body: bytes) -> tuple[int, int]:
    """Input and output tokens to settle a whole (non-stream) answer at."""
    if status >= 400:
        return 0, 0
    usage = read_usage(body[-TAIL_BYTES:])
    return usage if usage is not None else (res.input_tokens, res.output_tokens)


@dataclass(slots=True)
class StreamMeter:
    """Watches an event stream go out and says what it used."""

    status: int = 0
    num_events: int = 0
    usage: tuple[int, int] | None = None

    def on_message(self, message: Message) -> None:
        """Note the status; count events; keep the usage chunk's figures."""
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunk: bytes = message.get("body", b"")
            self.num_events += chunk.count(b"data: ") - chunk.count(b"data: [DONE]")
            if b'"usage":{' in chunk:
                self.usage = read_usage(chunk, self.usage) or self.usage

    def used(self, res: Reservation) -> tuple[int, int]:
        """Input and output tokens to settle at (no usage chunk: about a token an event)."""
        if self.status >= 400 or self.status == 0:
            return 0, 0
        if self.usage is not None:
            return self.usage
        return res.input_tokens, max(0, self.num_events - 1)


class ProxyLimits:
    """The gateway proxy's limits: reserve on the estimated tokens, headers on the answer,
    settle from the answer."""

    def __init__(self, gate: RateLimitGate) -> None:
        """Admit and settle against `gate`."""
        self.gate = gate
        self.default_max_tokens = gate.tenancy.rate_limits.default_max_output_tokens

    async def admit(self, scope: Scope, body: dict[str, Any]) -> Admitted | None:
        """Reserve the buckets of a request to a limited path (`LIMITED_PATHS`), from its
        parsed body (None: no limit applies). Raises 400, 429 or 503 as
        `RateLimitGate.admit`."""
        ask = ask_of(body, scope["path"], self.default_max_tokens)
        if ask is None:
            return None
        res = await self.gate.admit(scope.get("state", {}).get("tenant", "default"), ask)
        if res is None:
            return None
        edge_context().response_headers = lambda: reservation_headers(res)
        return Admitted(self.gate, res)


@dataclass(frozen=True, slots=True)
class Admitted:
    """One admitted request, to be settled exactly once: `release` or `send`."""

    gate: RateLimitGate
    reservation: Reservation

    def release(self) -> None:
        """The request failed before an answer: it used nothing."""
        self.gate.settle(self.reservation, 0, 0)

    async def send(
        self,
        response: ProxiedResponse | StreamingResponse,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Send the answer, then settle at what it used (also when sending is cut off)."""
        res = self.reservation
        if isinstance(response, ProxiedResponse):
            try:
                await response(scope, receive, send)
            finally:
                self.gate.settle(res, *answer_usage(res, response.status_code, response.body))
            return
        meter = StreamMeter()

        async def metered(message: Message) -> None:
            meter.on_message(message)
            await send(message)

        try:
            await response(scope, receive, metered)
        finally:
            self.gate.settle(res, *meter.used(res))


def edge_context() -> RequestContext:
    """The request's context, which the edge set: its `response_headers` hook is how the
    rate-limit headers reach every answer."""
    context = current_request()
    if context is None:
        raise RuntimeError("the gateway's rate limits must run behind the edge (api.edge.Edge)")
    return context
