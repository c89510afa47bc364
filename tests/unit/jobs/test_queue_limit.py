"""The batch queue bound: a batch's estimated input tokens count against its tenant's
`batch_queue_tokens` while it is active; one that would exceed it fails at validation."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.jobs.context import JobsContext
from conveyor.jobs.queue_limit import queue_limit_error, queued_tokens
from conveyor.jobs.supervisor import Supervisor
from conveyor.jobs.validation import InputValidator
from conveyor.stores.records import BatchRecord, BatchStatus
from tests.unit.jobs.fakes import ENDPOINT, MODEL, create_batch, input_file, make_ctx, upload

TOKENS_PER_LINE = 2  # "text-N": 6 bytes, about 4 bytes a token


def test_the_validator_estimates_input_tokens_as_the_limiter_does() -> None:
    validator = InputValidator(ENDPOINT, lambda name: True, 100, 10)
    for line_no, raw in enumerate(input_file(10).splitlines()):
        validator.check_line(line_no, raw)
    assert validator.finish().num_input_tokens == 10 * TOKENS_PER_LINE


def batch(tenant: str, model: str, tokens: int, status: BatchStatus, num: int) -> BatchRecord:
    return BatchRecord(id=f"batch_{num}", tenant=tenant, endpoint=ENDPOINT, input_file_id="f",
                       completion_window="24h", created_at=0, status=status, model=model,
                       queued_input_tokens=tokens)  # fmt: skip


def test_only_the_tenants_other_active_batches_on_the_model_count() -> None:
    batches = [
        batch("a", "m", 100, BatchStatus.IN_PROGRESS, 1),
        batch("a", "m", 10, BatchStatus.FINALIZING, 2),
        batch("a", "m", 1000, BatchStatus.COMPLETED, 3),
        batch("a", "other", 1000, BatchStatus.IN_PROGRESS, 4),
        batch("b", "m", 1000, BatchStatus.IN_PROGRESS, 5),
        batch("a", "m", 5, BatchStatus.IN_PROGRESS, 6),  # the batch being checked
    ]
    assert queued_tokens(batches, "a", "m", "batch_6") == 110


def test_the_bound_is_inclusive_and_none_is_unbounded() -> None:
    assert queue_limit_error(None, 10**9, 10**9) is None
    assert queue_limit_error(100, 60, 40) is None
    error = queue_limit_error(100, 60, 41)
    assert error is not None and error.code == "token_limit_exceeded"


async def planned(ctx: JobsContext, tenant: str, num_lines: int) -> BatchRecord:
    source = upload(ctx, input_file(num_lines), tenant=tenant)
    record = create_batch(ctx, source.id, tenant=tenant)
    await Supervisor(ctx, asyncio.Event()).plan(record)
    found = ctx.store.blocking.get_batch_any(record.id)
    assert found is not None
    return found


@pytest.mark.anyio
async def test_a_batch_that_would_overfill_the_queue_fails_with_token_limit_exceeded() -> None:
    ctx = make_ctx()
    limits = {("a", MODEL): 30}
    ctx.batch_queue_tokens = lambda tenant, model: limits.get((tenant, model))
    first = await planned(ctx, "a", 10)
    assert first.status is BatchStatus.IN_PROGRESS
    assert first.queued_input_tokens == 10 * TOKENS_PER_LINE
    refused = await planned(ctx, "a", 10)  # 20 queued + 20 > 30
    assert refused.status is BatchStatus.FAILED and refused.errors is not None
    assert [e.code for e in refused.errors] == ["token_limit_exceeded"]
    assert (await planned(ctx, "b", 10)).status is BatchStatus.IN_PROGRESS  # unbounded
    assert (await planned(ctx, "a", 5)).status is BatchStatus.IN_PROGRESS  # 20 + 10 fits
    ctx.store.blocking.transition(first.id, [BatchStatus.IN_PROGRESS], BatchStatus.COMPLETED, 0)
    assert (await planned(ctx, "a", 10)).status is BatchStatus.IN_PROGRESS  # first no longer counts
