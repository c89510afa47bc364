"""File expiry: `expires_after` on uploads, `output_expires_after` on batches, the supervisor's
deletion of expired files (record and bytes), all on a settable clock."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.errors import InvalidRequest, NotFound
from conveyor.jobs.expiry import form_expires_after, parse_expires_after
from conveyor.jobs.keys import file_key
from conveyor.jobs.operations import JobOperations
from conveyor.jobs.supervisor import Supervisor
from conveyor.jobs.views import file_object
from conveyor.stores.records import BatchStatus
from tests.unit.jobs.fakes import Clock, input_file, make_ctx
from tests.unit.jobs.test_operations import BOUNDARY, form, upload
from tests.unit.jobs.test_shard_runner import run_all

pytestmark = pytest.mark.anyio
HOUR_S = 3600
BOUNDS = {"min_s": HOUR_S, "max_s": 30 * 24 * HOUR_S}


def expiring_form(
    data: bytes, seconds: str, anchor: str = "created_at", *, after_file: bool = False
) -> bytes:
    """An upload body with `expires_after[anchor]` and `expires_after[seconds]` fields."""
    fields = {"expires_after[anchor]": anchor, "expires_after[seconds]": seconds}
    parts = "".join(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ).encode()
    if not after_file:
        return parts + form(data)
    end = f"--{BOUNDARY}--\r\n".encode()
    return form(data).removesuffix(end) + parts + end


def service(clock: Clock) -> tuple[JobOperations, Supervisor, object]:
    ctx = make_ctx(clock=clock)
    return JobOperations(ctx, lambda: None), Supervisor(ctx, asyncio.Event()), ctx


def test_expires_after_is_parsed_and_bounded() -> None:
    assert parse_expires_after(None, param="p", **BOUNDS) is None
    assert (
        parse_expires_after({"anchor": "created_at", "seconds": 7200}, param="p", **BOUNDS) == 7200
    )
    assert (
        parse_expires_after({"anchor": "created_at", "seconds": "3600"}, param="p", **BOUNDS)
        == 3600
    )
    bad = [
        ({"anchor": "last_active_at", "seconds": 7200}, "p.anchor"),
        ({"anchor": "created_at", "seconds": 10}, "p.seconds"),
        ({"anchor": "created_at", "seconds": 31 * 24 * HOUR_S}, "p.seconds"),
        ({"anchor": "created_at", "seconds": True}, "p.seconds"),
        ({"anchor": "created_at", "seconds": "soon"}, "p.seconds"),
        ({"seconds": 7200}, "p"),
        (7200, "p"),
    ]
    for value, param in bad:
        with pytest.raises(InvalidRequest) as caught:
            parse_expires_after(value, param="p", **BOUNDS)
        assert caught.value.param == param


def test_form_fields_carry_expires_after() -> None:
    fields = {
        "purpose": "batch",
        "expires_after[anchor]": "created_at",
        "expires_after[seconds]": "9",
    }
    assert form_expires_after(fields) == {"anchor": "created_at", "seconds": "9"}
    assert form_expires_after({"purpose": "batch"}) is None


async def test_an_expiring_upload_is_deleted_by_the_supervisor_once_due() -> None:
    clock = Clock()
    api, supervisor, ctx = service(clock)
    record = await upload(api, expiring_form(b"x\n", str(2 * HOUR_S)))
    kept = await upload(api, form(b"y\n"))
    late = await upload(api, expiring_form(b"z\n", str(3 * HOUR_S), after_file=True))
    assert late.expires_at == late.created_at + 3 * HOUR_S
    assert record.expires_at == record.created_at + 2 * HOUR_S
    assert file_object(record)["expires_at"] == record.expires_at and kept.expires_at is None

    clock.now = record.expires_at - 1
    await supervisor.tick()
    assert (await api.get_file("t", record.id)) == record

    clock.now = record.expires_at
    await supervisor.tick()
    with pytest.raises(NotFound):
        await api.get_file("t", record.id)
    assert not ctx.objects.default.exists(file_key(record.id))
    assert (await api.get_file("t", kept.id)) == kept and ctx.objects.default.exists(
        file_key(kept.id)
    )


async def test_a_bad_expires_after_stores_nothing() -> None:
    api, _, ctx = service(Clock())
    with pytest.raises(InvalidRequest, match="seconds"):
        await upload(api, expiring_form(b"x\n", "59"))
    with pytest.raises(InvalidRequest, match="anchor"):
        await upload(api, expiring_form(b"x\n", "3600", anchor="now"))
    assert ctx.objects.default.objects == {}


async def test_an_expired_input_keeps_its_bytes_until_its_batch_ends() -> None:
    clock = Clock()
    api, supervisor, ctx = service(clock)
    record = await upload(api, expiring_form(input_file(3), str(HOUR_S)))
    await api.create_batch("t", {"input_file_id": record.id, "endpoint": "/v1/embeddings",
                                 "completion_window": "24h"})  # fmt: skip
    clock.now += HOUR_S
    await supervisor.tick()
    with pytest.raises(NotFound):
        await api.get_file("t", record.id)
    assert ctx.objects.default.exists(file_key(record.id))
    await run_all(ctx)
    await supervisor.tick()
    assert not ctx.objects.default.exists(file_key(record.id))


async def test_output_expires_after_dates_the_result_files_which_then_expire() -> None:
    clock = Clock()
    api, supervisor, ctx = service(clock)
    record = await upload(api, form(input_file(2)))
    batch = await api.create_batch("t", {
        "input_file_id": record.id, "endpoint": "/v1/embeddings", "completion_window": "24h",
        "output_expires_after": {"anchor": "created_at", "seconds": 5 * HOUR_S},
    })  # fmt: skip
    assert batch.output_expires_after_s == 5 * HOUR_S
    await supervisor.tick()
    await run_all(ctx)
    clock.now += 60
    await supervisor.tick()
    done = await api.get_batch("t", batch.id)
    assert done.status is BatchStatus.COMPLETED and done.output_file_id is not None
    output = await api.get_file("t", done.output_file_id)
    assert (
        output.created_at == int(clock.now) and output.expires_at == output.created_at + 5 * HOUR_S
    )

    clock.now += 5 * HOUR_S
    await supervisor.tick()
    with pytest.raises(NotFound):
        await api.get_file("t", done.output_file_id)
    assert not ctx.objects.default.exists(output.object_key)
    assert (await api.get_file("t", record.id)) == record  # the input had no expiry


async def test_a_bad_output_expires_after_is_400() -> None:
    api, _, _ = service(Clock())
    record = await upload(api, form(b"x\n"))
    params = {"input_file_id": record.id, "endpoint": "/v1/embeddings", "completion_window": "24h",
              "output_expires_after": {"anchor": "created_at", "seconds": 60}}  # fmt: skip
    with pytest.raises(InvalidRequest, match="output_expires_after"):
        await api.create_batch("t", params)
