"""The request kinds' table: every batchable path has its parser and its run, and
``execute`` parses with the one and runs the other, nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.endpoints import dispatch
from conveyor.endpoints.dispatch import DOORS, execute
from conveyor.errors import InvalidRequest
from conveyor.host.service import Service
from conveyor.openai_paths import BATCH_ENDPOINTS, CHAT_COMPLETIONS, MESSAGES
from conveyor.priority import Priority
from conveyor.tenants.usage import Payer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_every_batch_path_and_messages_has_a_door() -> None:
    assert set(DOORS) == {*BATCH_ENDPOINTS, MESSAGES}


def test_chat_completions_and_messages_share_one_run() -> None:
    """One function answers every generative kind whole; only what it prepares and formats
    differs."""
    chat_run, messages_run = DOORS[CHAT_COMPLETIONS][1], DOORS[MESSAGES][1]
    assert getattr(chat_run, "func", None) is getattr(messages_run, "func", None) is not None
    assert chat_run.keywords != messages_run.keywords  # type: ignore[attr-defined]


async def test_execute_runs_the_parsed_request_with_its_priority_deadline_and_payer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[Any, ...]] = []

    def parse(body: dict[str, Any]) -> str:
        calls.append(("parse", body))
        return "parsed"

    async def run(service: Service, request: str, **options: Any) -> dict[str, Any]:
        calls.append(("run", service, request, options))
        return {"ok": True}

    monkeypatch.setitem(dispatch.DOORS, "/v1/fake", (parse, run))  # type: ignore[index]
    service, payer = object(), Payer("acme")
    answer = await execute(
        service,  # type: ignore[arg-type]
        "/v1/fake",
        {"model": "m"},
        priority=Priority.ONLINE,
        timeout_ms=250.0,
        payer=payer,
    )
    assert answer == {"ok": True}
    assert calls == [
        ("parse", {"model": "m"}),
        ("run", service, "parsed", {"priority": Priority.ONLINE, "timeout_ms": 250.0,
                                    "payer": payer}),
    ]  # fmt: skip


async def test_a_body_its_parser_refuses_never_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def parse(body: dict[str, Any]) -> str:
        raise InvalidRequest("bad body", param="input")

    async def run(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("ran a request its parser refused")

    monkeypatch.setitem(dispatch.DOORS, "/v1/fake", (parse, run))  # type: ignore[index]
    with pytest.raises(InvalidRequest, match="bad body"):
        await execute(object(), "/v1/fake", {})  # type: ignore[arg-type]


async def test_batch_priority_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Priority] = []

    async def run(service: Service, request: Any, *, priority: Priority, **_: Any) -> dict:
        seen.append(priority)
        return {}

    monkeypatch.setitem(dispatch.DOORS, "/v1/fake", (lambda body: body, run))  # type: ignore[index]
    await execute(object(), "/v1/fake", {})  # type: ignore[arg-type]
    assert seen == [Priority.BATCH]


async def test_an_unknown_path_is_a_400_naming_the_url() -> None:
    with pytest.raises(InvalidRequest, match="unsupported endpoint") as caught:
        await execute(object(), "/v1/images/generations", {})  # type: ignore[arg-type]
    assert caught.value.param == "url"
