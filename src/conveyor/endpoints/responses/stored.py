"""Stored responses, scoped to the caller's tenant: what the Responses routes do with the
job store, on ``serve``, a fleet worker and a gateway alike (no model code here).

Another tenant's response is answered exactly like a missing one (404), so ids leak
nothing. A stored row keeps the Response object and the input items (the conversation up
to this turn), so continuing a conversation reads one row: its items and its output.
A background response is stored queued with its runnable request (the whole
conversation as input); a worker runs it (``background``) and writes the result.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from conveyor.endpoints.responses.input import input_items
from conveyor.endpoints.responses.output import envelope
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.errors import InvalidRequest, NotFound
from conveyor.jobs.operations import check_limit, check_order
from conveyor.jobs.views import list_page
from conveyor.response_ids import new_response_id
from conveyor.stores.protocols import JobStore
from conveyor.stores.response_records import ResponseStatus, StoredResponse

__all__ = ["StoredResponses", "cancelled_body", "finished_body", "job_body"]

DEFAULT_ITEMS_PAGE = 20
MAX_ITEMS_PAGE = 100
# Fields a run decides; the rest of a stored body is what the request said.
RUN_FIELDS = ("status", "output", "usage", "error", "incomplete_details", "completed_at")
# Request fields a background run's own body leaves out: it runs on its own.
_NOT_IN_JOB = {
    "input", "previous_response_id", "background", "store", "stream", "stream_options",
    "client_metadata",
}  # fmt: skip


def job_body(request: ResponseRequest, items: list[dict[str, Any]]) -> dict[str, Any]:
    """The self-contained request a background run executes: the whole conversation."""
    body = request.model_dump(mode="json", by_alias=True, exclude_none=True, exclude=_NOT_IN_JOB)
    return {**body, "input": items}


def finished_body(stored: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The stored body with what a run (its Response object) decided."""
    return {**stored, **{name: result[name] for name in RUN_FIELDS if name in result}}


def cancelled_body(stored: dict[str, Any]) -> dict[str, Any]:
    """The stored body of a response cancelled before it ended."""
    return {**stored, "status": ResponseStatus.CANCELLED.value}


def view(row: StoredResponse) -> dict[str, Any]:
    """A stored response as the API shows it (its status is the row's)."""
    body: dict[str, Any] = json.loads(row.body)
    body["status"] = row.status.value
    return body


class StoredResponses:
    """The Responses routes' store operations for one job store (blocking calls in threads)."""

    def __init__(
        self,
        store: JobStore,
        *,
        clock: Callable[[], float] = time.time,
        wake_runner: Callable[[], None] | None = None,
    ) -> None:
        """``wake_runner`` tells this process's background runner that work was queued."""
        self._store = store
        self._clock = clock
        self._wake_runner = wake_runner

    async def _row(
        self, tenant: str, response_id: str, param: str = "response_id"
    ) -> StoredResponse:
        """The tenant's stored response, or 404."""
        row = await asyncio.to_thread(self._store.get_response, tenant, response_id)
        if row is None:
            raise NotFound(f"no response with id {response_id!r}", param=param)
        return row

    async def context_of(self, tenant: str, previous_id: str | None) -> list[dict[str, Any]]:
        """The conversation a new turn continues: the previous response's items and output."""
        if previous_id is None:
            return []
        row = await self._row(tenant, previous_id, "previous_response_id")
        if not row.is_terminal:
            raise InvalidRequest(
                f"response {previous_id!r} is still {row.status.value}; continue it once it ends",
                param="previous_response_id",
            )
        items: list[dict[str, Any]] = json.loads(row.input_items)
        return items + list(json.loads(row.body).get("output") or [])

    async def save(
        self, tenant: str, response: dict[str, Any], items: list[dict[str, Any]]
    ) -> None:
        """Store a finished response with the conversation's input items."""
        row = StoredResponse(
            id=response["id"], tenant=tenant, model=response["model"],
            status=ResponseStatus(response["status"]), created_at=int(response["created_at"]),
            body=json.dumps(response), input_items=json.dumps(items),
        )  # fmt: skip
        await asyncio.to_thread(self._store.create_response, row)

    async def queue(
        self, tenant: str, request: ResponseRequest, context: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Store a background response, queued with its runnable request; the Response."""
        items = [*context, *input_items(request)]
        body = envelope(request, new_response_id(request.previous_response_id), int(self._clock()))
        body["status"] = ResponseStatus.QUEUED.value
        row = StoredResponse(
            id=body["id"], tenant=tenant, model=request.model, status=ResponseStatus.QUEUED,
            created_at=body["created_at"], body=json.dumps(body), input_items=json.dumps(items),
            job=json.dumps(job_body(request, items)),
        )  # fmt: skip
        await asyncio.to_thread(self._store.create_response, row)
        if self._wake_runner is not None:
            self._wake_runner()
        return body

    async def get(self, tenant: str, response_id: str) -> dict[str, Any]:
        """The tenant's response, or 404."""
        return view(await self._row(tenant, response_id))

    async def input_items(
        self,
        tenant: str,
        response_id: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        order: str | None = None,
    ) -> dict[str, Any]:
        """One page of the response's input items (newest first unless ``asc``)."""
        size = check_limit(limit, DEFAULT_ITEMS_PAGE, MAX_ITEMS_PAGE)
        items: list[dict[str, Any]] = json.loads((await self._row(tenant, response_id)).input_items)
        if check_order(order) == "desc":
            items.reverse()
        if after is not None:
            ids = [item.get("id") for item in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        return list_page(items[:size], len(items) > size)

    async def delete(self, tenant: str, response_id: str) -> dict[str, Any]:
        """Delete the tenant's response (a running one stops); OpenAI's deletion object."""
        if not await asyncio.to_thread(self._store.delete_response, tenant, response_id):
            raise NotFound(f"no response with id {response_id!r}", param="response_id")
        return {"id": response_id, "object": "response", "deleted": True}

    async def cancel(self, tenant: str, response_id: str) -> dict[str, Any]:
        """Cancel a queued or running background response; an ended one is left as it is."""
        row = await self._row(tenant, response_id)
        body = view(row)
        if not body.get("background"):
            raise InvalidRequest("only background responses can be cancelled", param="response_id")
        if row.is_terminal:
            return body
        cancelled = json.dumps(cancelled_body(json.loads(row.body)))
        await asyncio.to_thread(self._store.cancel_response, tenant, response_id, cancelled)
        return await self.get(tenant, response_id)  # cancelled, or ended meanwhile
