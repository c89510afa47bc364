"""Background responses: durable jobs of one request, run by whichever worker claims them.

A background response is stored queued with its runnable request (``stored``). Each
process hosting models runs a ``BackgroundRunner``: it claims queued responses of models
it runs (oldest first, at most ``jobs.max_lines_in_flight`` at once), runs each at batch
priority as a batch line runs (back-pressure waited out, transient failures retried), and
renews its lease while it runs. The result is written only while the claim's attempt
holds the response, with its usage in the same transaction, so each response is answered
once. A worker killed mid-run (SIGKILL) leaves its lease to expire; another claim runs
the response again from the start (a run that crashes is handed back at once). One that
keeps killing or crashing its worker ends ``failed`` after ``jobs.isolate_after_attempts +
1`` tries. A cancel or a delete ends the run at
the next renewal; shutting down hands running responses back (queued) at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from conveyor.endpoints.dispatch import execute
from conveyor.endpoints.responses.output import error_body
from conveyor.endpoints.responses.stored import finished_body
from conveyor.errors import ConveyorError
from conveyor.host.service import Service
from conveyor.jobs.context import JobsContext, wait_for_any, wait_for_event
from conveyor.jobs.line_caller import LineCaller, RunRequest
from conveyor.jobs.lines import RequestLine
from conveyor.jobs.subsystem import JobsSubsystem
from conveyor.openai_paths import RESPONSES
from conveyor.priority import Priority
from conveyor.stores.errors import StoreError
from conveyor.stores.response_records import ResponseStatus, StoredResponse
from conveyor.tenants.usage import Payer, UsageTally

log = logging.getLogger(__name__)

__all__ = ["BackgroundRunner", "start_runner"]

CLAIM_CANDIDATES = 64


class BackgroundRunner:
    """Claims and runs background responses until stopped."""

    def __init__(
        self,
        ctx: JobsContext,
        run_request: RunRequest,
        can_run_model: Callable[[str], bool],
    ) -> None:
        """Run responses of models ``can_run_model`` accepts with ``run_request``."""
        self._ctx = ctx
        self._run_request = run_request
        self._can_run_model = can_run_model
        self._wake = asyncio.Event()
        self._shutdown = asyncio.Event()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._loop_task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Look for work now (a response was queued here)."""
        self._wake.set()

    def start(self) -> None:
        """Start claiming."""
        self._shutdown.clear()
        self._loop_task = asyncio.create_task(self._loop(), name="conveyor-background-responses")

    async def stop(self) -> None:
        """Stop claiming; running responses are handed back (queued) for the next claim."""
        self._shutdown.set()
        tasks = [task for task in (self._loop_task, *self._running.values()) if task]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._running.clear()

    async def _loop(self) -> None:
        """Claim while there is room; wait for a wake-up, a finished run or the poll."""
        poll_s = self._ctx.config.poll_every_s
        while not self._shutdown.is_set():
            self._wake.clear()
            try:
                await self.claim_some()
            except StoreError as exc:
                log.warning("cannot claim background responses yet: %s", exc)
            await wait_for_any([self._shutdown, self._wake], poll_s)

    async def claim_some(self) -> list[asyncio.Task[None]]:
        """Claim runnable responses up to the room left; the runs started."""
        ctx = self._ctx
        room = ctx.config.max_lines_in_flight - len(self._running)
        started: list[asyncio.Task[None]] = []
        if room <= 0:
            return started
        store = ctx.store.blocking
        candidates = await asyncio.to_thread(
            store.claimable_responses, ctx.clock(), max(room, CLAIM_CANDIDATES)
        )
        for response_id, model in candidates:
            if room <= 0 or response_id in self._running or not self._can_run_model(model):
                continue
            rec = await asyncio.to_thread(
                store.claim_response, response_id, ctx.worker_id, ctx.clock(), ctx.config.lease_s
            )
            if rec is not None:
                room -= 1
                task = asyncio.create_task(self._run(rec), name=f"conveyor-response-{rec.id}")
                self._running[rec.id] = task
                task.add_done_callback(functools.partial(self._done, rec.id))
                started.append(task)
        return started

    def _done(self, response_id: str, _task: asyncio.Task[None]) -> None:
        """A run ended: make room and look for more."""
        self._running.pop(response_id, None)
        self._wake.set()

    async def _run(self, rec: StoredResponse) -> None:
        """Run one claimed response and write its end (or hand it back when stopping)."""
        max_attempts = self._ctx.config.isolate_after_attempts + 1
        if rec.attempt > max_attempts:
            reason = (
                f"the response was interrupted {rec.attempt - 1} times (its worker stopped or "
                "crashed while running it) and is not run again"
            )
            await self._finish(rec, _failed(rec, error_body(500, reason)), ())
            return
        run = asyncio.ensure_future(self._call(rec))
        heartbeat = asyncio.ensure_future(self._heartbeat(rec, run))
        try:
            status, body, usage = await run
        except asyncio.CancelledError:
            if self._shutdown.is_set():
                await _quietly(asyncio.to_thread(self._ctx.store.blocking.release_response, rec))
            return  # cancelled, deleted or taken over: nothing is written
        except Exception:
            # Not the request's own error (those end it as failed): the run crashed. It goes
            # back; one that keeps crashing ends failed once its attempts are spent.
            log.exception("background response %s crashed on attempt %d", rec.id, rec.attempt)
            await _quietly(asyncio.to_thread(self._ctx.store.blocking.release_response, rec))
            return
        finally:
            heartbeat.cancel()
        await self._finish(rec, (status, body), usage)

    async def _call(self, rec: StoredResponse) -> tuple[ResponseStatus, str, list[Any]]:
        """Run the response's request as a batch line is run; its end and usage."""
        tally = UsageTally()
        caller = LineCaller(
            self._run_request, RESPONSES, rec.id, self._ctx.retry, Payer(rec.tenant, tally),
            sleep=self._ctx.sleep,
        )  # fmt: skip
        job = json.loads(rec.job or "{}")
        result = await caller.run(0, RequestLine(rec.id, job))
        response = orjson.loads(result.record)["response"]
        stored = json.loads(rec.body)
        if response["status_code"] != 200:
            message = str(response["body"].get("error", {}).get("message", "the run failed"))
            status, body = _failed(rec, error_body(response["status_code"], message))
            return status, body, tally.take()
        done = finished_body(stored, response["body"])
        return ResponseStatus(done["status"]), json.dumps(done), tally.take()

    async def _heartbeat(self, rec: StoredResponse, run: asyncio.Future[Any]) -> None:
        """Renew the lease; stop the run once its attempt lost the response."""
        ctx = self._ctx
        while not await wait_for_event(self._shutdown, ctx.config.renew_every_s):
            try:
                is_held = await asyncio.to_thread(
                    ctx.store.blocking.renew_response, rec, ctx.clock(), ctx.config.lease_s
                )
            except StoreError as exc:
                log.warning("cannot renew background response %s yet: %s", rec.id, exc)
                continue
            if not is_held:
                log.info("background response %s was cancelled, deleted or taken over", rec.id)
                run.cancel()
                return

    async def _finish(
        self, rec: StoredResponse, end: tuple[ResponseStatus, str], usage: Any
    ) -> None:
        """Write the run's end, fenced by its attempt (a lost run writes nothing)."""
        status, body = end
        store = self._ctx.store.blocking
        is_written = await asyncio.to_thread(store.finish_response, rec, status, body, usage)
        if not is_written:
            log.info("background response %s ended elsewhere; this run's end is dropped", rec.id)


def _failed(rec: StoredResponse, error: dict[str, Any]) -> tuple[ResponseStatus, str]:
    """A failed end: the stored body with the ``error`` object."""
    body = {**json.loads(rec.body), "status": "failed", "error": error}
    return ResponseStatus.FAILED, json.dumps(body)


async def _quietly(step: Awaitable[Any]) -> None:
    """Run a best-effort store write (a lease that expires does the same, later)."""
    try:
        await step
    except StoreError as exc:
        log.warning("cannot hand a background response back yet: %s", exc)


def start_runner(service: Service, jobs: JobsSubsystem) -> BackgroundRunner | None:
    """Start the background runner of a process that runs jobs (None where it runs none)."""
    if not jobs.config.is_worker:
        return None
    timeout_ms = jobs.config.line_timeout_ms

    async def run_request(endpoint: str, body: dict[str, Any], payer: Payer) -> dict[str, Any]:
        return await execute(
            service, endpoint, body, priority=Priority.BATCH, timeout_ms=timeout_ms, payer=payer
        )

    def can_run(model: str) -> bool:
        try:
            service.generator(model)
        except ConveyorError:
            return False
        return True

    runner = BackgroundRunner(jobs.context, run_request, can_run)
    runner.start()
    return runner
