"""Run one request body against an endpoint path: how batch lines reach the models.

``execute`` returns the OpenAI response body and raises ``ConveyorError`` subclasses for
anything that is not a 200.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conveyor.endpoints.chat import run_chat
from conveyor.endpoints.completions import run_completion
from conveyor.endpoints.embeddings import run_embeddings
from conveyor.endpoints.messages.run import run_messages
from conveyor.endpoints.rerank import run_rerank
from conveyor.endpoints.responses.run import run_response
from conveyor.errors import InvalidRequest
from conveyor.host.service import Service
from conveyor.jobs.fair_share import FairShare
from conveyor.jobs.subsystem import JobsSubsystem
from conveyor.openai_paths import (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGES,
    RERANK,
    RESPONSES,
)
from conveyor.priority import Priority
from conveyor.tenants.budget import MonthlyBudgets
from conveyor.tenants.usage import Payer


async def execute(
    service: Service,
    endpoint: str,
    body: bytes | dict[str, Any],
    *,
    priority: Priority = Priority.BATCH,
    timeout_ms: float | None = None,
    payer: Payer | None = None,
) -> dict[str, Any]:
    """Run one request body against ``endpoint`` (billed to ``payer``); the response body."""
    if endpoint == EMBEDDINGS:
        return await run_embeddings(
            service, body, priority=priority, timeout_ms=timeout_ms, payer=payer
        )
    if endpoint == COMPLETIONS:
        return await run_completion(
            service, body, priority=priority, timeout_ms=timeout_ms, payer=payer
        )
    if endpoint == CHAT_COMPLETIONS:
        return await run_chat(service, body, priority=priority, timeout_ms=timeout_ms, payer=payer)
    if endpoint == RESPONSES:
        return await run_response(
            service, body, priority=priority, timeout_ms=timeout_ms, payer=payer
        )
    if endpoint == MESSAGES:  # a Message Batch's request
        return await run_messages(
            service, body, priority=priority, timeout_ms=timeout_ms, payer=payer
        )
    if endpoint == RERANK:
        return await run_rerank(
            service, body, priority=priority, timeout_ms=timeout_ms, payer=payer
        )
    raise InvalidRequest(f"unsupported endpoint {endpoint!r}", param="url")


def jobs_for_service(
    service: Service, *, is_model_served: Callable[[str], bool] | None = None
) -> JobsSubsystem:
    """Batch jobs that run their lines on ``service``'s models at batch priority.

    A batch's model counts as served when ``service`` hosts it, unless ``is_model_served``
    says otherwise (a fleet worker also accepts models other workers host).
    """
    config = service.config
    tenancy = config.tenancy
    timeout_ms = config.jobs.line_timeout_ms

    async def run_request(endpoint: str, body: dict[str, Any], payer: Payer) -> dict[str, Any]:
        return await execute(
            service, endpoint, body, priority=Priority.BATCH, timeout_ms=timeout_ms, payer=payer
        )

    def is_hosted(name: str) -> bool:
        return config.model(name) is not None

    return JobsSubsystem(
        config.jobs, config.data_dir, run_request, is_model_served or is_hosted,
        metrics=service.metrics, can_run_model=is_hosted,
        fair_share=FairShare(config.fair_share_half_life_s, tenancy.weights),
        budgets=MonthlyBudgets(tenancy.budgets_usd),
        batch_queue_tokens=tenancy.batch_queue_tokens, tenant_regions=tenancy.regions,
    )  # fmt: skip
