"""The batch queue bound: a tenant's active batches may hold at most `batch_queue_tokens`
input tokens per model (validating, in progress or finalizing, as OpenAI's enqueued-token
limit). A batch that would exceed it fails at validation with `token_limit_exceeded`.

A batch's estimate (its lines' input text at about 4 bytes a token, see `tenants.estimate`)
is stored on it when it starts, so every process sees what each tenant has queued. Two of a
tenant's batches validated at the same instant may both pass; the next one sees both.
"""

from __future__ import annotations

from collections.abc import Iterable

from conveyor.jobs.validation import LineErrorCode
from conveyor.stores.records import BatchError, BatchRecord, BatchStatus

# The statuses during which a batch's tokens count against the bound.
QUEUED_STATUSES = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING)


def queued_tokens(batches: Iterable[BatchRecord], tenant: str, model: str, batch_id: str) -> int:
    """Input tokens the tenant's other active batches on `model` hold."""
    return sum(
        b.queued_input_tokens
        for b in batches
        if b.tenant == tenant and b.model == model and b.id != batch_id
        and b.status in QUEUED_STATUSES
    )  # fmt: skip


def queue_limit_error(limit: int | None, num_queued: int, num_new: int) -> BatchError | None:
    """The error when `num_new` tokens on top of `num_queued` exceed `limit` (None: no bound)."""
    if limit is None or num_queued + num_new <= limit:
        return None
    message = (
        f"this batch holds about {num_new} input tokens and {num_queued} are already queued; "
        f"the limit of enqueued tokens is {limit}. Wait for batches to finish, or split this one"
    )
    return BatchError(LineErrorCode.TOKEN_LIMIT_EXCEEDED.value, message)
