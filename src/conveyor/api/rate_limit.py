"""`serve`'s tenant rate limits on the inference routes (a gateway's: `gateway.limits`).

`serve` counts tokens exactly and needs no middleware layer: the edge calls `TicketIssuer`
as a limited request starts, which puts an `AdmissionTicket` in the request's state, and
the service admits it once the request is tokenized (the route hands it over in the
payer), so the body is neither read nor parsed here and no coroutine layer is added to
every request. The answer gets OpenAI's `x-ratelimit-*` headers through the edge's
per-request hook; the service's billing settles the ticket (exact), and the edge's finish
hook settles one the service did not bill (a failed or cancelled request) at nothing.
Settling never waits on the limiter.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import Scope

from conveyor.observability.context import RequestContext
from conveyor.tenants.estimate import LIMITED_PATHS
from conveyor.tenants.gate import RateLimitGate
from conveyor.tenants.ticket import AdmissionTicket

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
