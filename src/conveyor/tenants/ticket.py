"""Admission where the tokens are counted: `serve` admits a request after tokenizing it.

`serve` has every model's tokenizer, so its requests are admitted with their exact input
tokens, from the ids the model then runs (tokenized once), and an output reserve of
`max_tokens` or the model's remaining context. The edge gives each limited request a
ticket as it starts (`api.rate_limit.TicketIssuer`); the service calls `admit` once the ids
are in hand, before queueing, and `settle` when it bills the request; the edge calls
`finish` when the request ends, which settles a ticket the service did not bill (a request
that failed or was cancelled) at nothing.
"""

from __future__ import annotations

from conveyor.tenants.gate import MustWait, RateLimitGate, Reservation, reservation_headers


class AdmissionTicket:
    """One request's admission against its tenant's limits, taken when its tokens are known."""

    __slots__ = ("gate", "is_settled", "reservation", "tenant")

    def __init__(self, gate: RateLimitGate, tenant: str = "default") -> None:
        """Not admitted yet; `tenant` may be set until the service admits (the edge issues
        tickets before the API key middleware knows the caller)."""
        self.gate = gate
        self.tenant = tenant
        self.reservation: Reservation | None = None
        self.is_settled = False

    def admit_at_once(self, model: str, input_tokens: int, output_tokens: int) -> bool:
        """Admit without waiting when the limiter can answer from memory (False: it must
        be awaited: call `admit`). Raises as `admit`."""
        if self.reservation is not None:
            raise RuntimeError("a request is admitted once")
        found = self.gate.admit_at_once(self.tenant, model, input_tokens, output_tokens)
        if isinstance(found, MustWait):
            return False
        self.reservation = found
        return True

    async def admit(self, model: str, input_tokens: int, output_tokens: int) -> None:
        """Reserve the buckets by waiting for the limiter, after `admit_at_once` said it
        must (raises 400, 429 or 503 as `RateLimitGate.admit`)."""
        if self.reservation is not None:
            raise RuntimeError("a request is admitted once")
        self.reservation = await self.gate.admit_waiting(
            self.tenant, model, input_tokens, output_tokens
        )

    def settle(self, input_tokens: int, output_tokens: int) -> None:
        """Settle at what the request used (once; later calls do nothing)."""
        if self.reservation is None or self.is_settled:
            return
        self.is_settled = True
        self.gate.settle(self.reservation, input_tokens, output_tokens)

    def finish(self) -> None:
        """The request ended: a ticket the service did not bill used nothing."""
        self.settle(0, 0)

    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """The answer's `x-ratelimit-*` headers (none before admission or without a decision)."""
        return reservation_headers(self.reservation)
