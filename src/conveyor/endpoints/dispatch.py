"""Run one request body against an endpoint path: how batch lines reach the models.

A table of request kinds by path, each with its parser and its run (``DOORS``).

``execute`` returns the OpenAI response body and raises ``ConveyorError`` subclasses for
anything that is not a 200.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from conveyor.endpoints.chat import chat_body, parse_chat_request, prepare_chat
from conveyor.endpoints.completions import (
    completion_body,
    parse_completion_request,
    prepare_completion,
)
from conveyor.endpoints.embeddings import parse_embedding_request, run_embeddings
from conveyor.endpoints.generation import ChoiceResult, GenerationRun
from conveyor.endpoints.messages.reply import message_body
from conveyor.endpoints.messages.run import parse_messages_request, prepare_messages
from conveyor.endpoints.off_loop import Prepare, run_unstreamed
from conveyor.endpoints.rerank import parse_rerank_request, run_rerank
from conveyor.endpoints.responses.run import parse_response_request, run_response
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

Body = bytes | dict[str, Any]
# A request kind's parser: the body, validated (400 naming the field otherwise).
Parse = Callable[[Body], Any]
# Its run: ``run(service, parsed, *, priority, timeout_ms, payer)``, the response body.
Run = Callable[..., Awaitable[dict[str, Any]]]
MakeBody = Callable[[GenerationRun, Sequence[ChoiceResult]], dict[str, Any]]


def whole_generation(prepare: Prepare, make_body: MakeBody) -> Run:
    """The run of a generative kind answered whole: prepare, wait for every choice, format
    (``off_loop.run_unstreamed``, one function for completions, chat and messages)."""
    return functools.partial(run_unstreamed, prepare=prepare, make_body=make_body)


# Every request kind a batch line (or a background response) may be: how its body is
# parsed and how it runs.
DOORS: Mapping[str, tuple[Parse, Run]] = {
    EMBEDDINGS: (parse_embedding_request, run_embeddings),
    COMPLETIONS: (parse_completion_request, whole_generation(prepare_completion, completion_body)),
    CHAT_COMPLETIONS: (parse_chat_request, whole_generation(prepare_chat, chat_body)),
    RESPONSES: (parse_response_request, run_response),
    MESSAGES: (parse_messages_request, whole_generation(prepare_messages, message_body)),
    RERANK: (parse_rerank_request, run_rerank),
}


async def execute(
    service: Service,
    endpoint: str,
    body: Body,
    *,
    priority: Priority = Priority.BATCH,
    timeout_ms: float | None = None,
    payer: Payer | None = None,
) -> dict[str, Any]:
    """Run one request body against ``endpoint`` (billed to ``payer``); the response body."""
    door = DOORS.get(endpoint)
    if door is None:
        raise InvalidRequest(f"unsupported endpoint {endpoint!r}", param="url")
    parse, run = door
    return await run(service, parse(body), priority=priority, timeout_ms=timeout_ms, payer=payer)


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
