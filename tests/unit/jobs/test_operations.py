"""File and batch operations: streamed multipart uploads, tenants, paging, cancel rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from conveyor.api.multipart import MultipartStream
from conveyor.errors import InvalidRequest, NotFound
from conveyor.jobs.errors import BatchNotCancellable, FileTooLarge
from conveyor.jobs.keys import file_key
from conveyor.jobs.operations import JobOperations
from conveyor.jobs.supervisor import Supervisor
from conveyor.stores.records import BatchStatus
from tests.unit.jobs.fakes import input_file, make_ctx
from tests.unit.jobs.test_shard_runner import run_all

pytestmark = pytest.mark.anyio
BOUNDARY = "b0und4ry"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def form(data: bytes, *, purpose: str | None = "batch", purpose_first: bool = True) -> bytes:
    """A multipart body with a `purpose` field and a `file` part."""
    field = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n"
             f"{purpose}\r\n").encode() if purpose is not None else b""  # fmt: skip
    file_part = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"'
            "\r\nContent-Type: application/jsonl\r\n\r\n"
        ).encode()
        + data
        + b"\r\n"
    )
    parts = field + file_part if purpose_first else file_part + field
    return parts + f"--{BOUNDARY}--\r\n".encode()


async def chunked(body: bytes, size: int) -> AsyncIterator[bytes]:
    for offset in range(0, len(body), size):
        yield body[offset : offset + size]


async def upload(api: JobOperations, body: bytes, *, tenant: str = "t", chunk: int = 5):
    stream = MultipartStream(CONTENT_TYPE, api.check_upload_fields)
    return await api.upload_file(tenant, stream.file_chunks(chunked(body, chunk)), stream)


def service(**config: object) -> tuple[JobOperations, object]:
    ctx = make_ctx(**config)
    return JobOperations(ctx, lambda: None), ctx


@pytest.mark.parametrize("chunk", [1, 7, 4096])
async def test_uploads_stream_the_file_part_whatever_the_chunking(chunk: int) -> None:
    api, ctx = service()
    data = input_file(20)
    record = await upload(api, form(data), chunk=chunk)
    assert record.bytes == len(data) and record.filename == "in.jsonl"
    assert ctx.objects.default.objects[file_key(record.id)] == data
    assert (await api.get_file("t", record.id)).purpose == "batch"


async def test_a_late_purpose_is_still_checked() -> None:
    api, ctx = service()
    record = await upload(api, form(b"x\n", purpose_first=False))
    assert record.purpose == "batch"
    with pytest.raises(InvalidRequest, match="purpose"):
        await upload(api, form(b"x\n", purpose="fine-tune", purpose_first=False))
    assert list(ctx.objects.default.objects) == [file_key(record.id)]


async def test_bad_uploads_store_nothing() -> None:
    api, ctx = service(max_file_bytes=10)
    with pytest.raises(InvalidRequest, match="purpose"):
        await upload(api, form(b"x", purpose="assistants"))
    with pytest.raises(InvalidRequest, match="purpose"):
        await upload(api, form(b"x", purpose=None))
    with pytest.raises(FileTooLarge):
        await upload(api, form(b"y" * 11))
    with pytest.raises(InvalidRequest, match="file"):
        await upload(api, f"--{BOUNDARY}--\r\n".encode())
    with pytest.raises(InvalidRequest, match="multipart"):
        MultipartStream("application/json")
    assert ctx.objects.default.objects == {} and ctx.store.blocking.list_files("t") == []


async def test_other_tenants_see_nothing() -> None:
    api, _ = service()
    record = await upload(api, form(input_file(2)))
    batch = await api.create_batch("t", {"input_file_id": record.id, "endpoint": "/v1/embeddings",
                                         "completion_window": "24h"})  # fmt: skip
    for call in (api.get_file("u", record.id), api.get_batch("u", batch.id),
                 api.cancel_batch("u", batch.id), api.delete_file("u", record.id)):  # fmt: skip
        with pytest.raises(NotFound):
            await call
    with pytest.raises(NotFound):
        await api.create_batch("u", {"input_file_id": record.id, "endpoint": "/v1/embeddings",
                                     "completion_window": "24h"})  # fmt: skip
    assert (await api.list_files("u", purpose=None, after=None, limit=None)) == ([], False)
    assert (await api.list_batches("u", after=None, limit=None)) == ([], False)


async def test_pages_follow_the_after_cursor() -> None:
    api, _ = service()
    ids = [(await upload(api, form(b"x\n"))).id for _ in range(3)]
    page, has_more = await api.list_files("t", purpose="batch", after=None, limit=2)
    assert [r.id for r in page] == ids[::-1][:2] and has_more
    page, has_more = await api.list_files("t", purpose="batch", after=page[-1].id, limit=2)
    assert [r.id for r in page] == [ids[0]] and not has_more
    with pytest.raises(InvalidRequest):
        await api.list_batches("t", after=None, limit=101)


async def test_files_list_oldest_first_with_order_asc() -> None:
    api, _ = service()
    ids = [(await upload(api, form(b"x\n"))).id for _ in range(3)]
    page, has_more = await api.list_files("t", purpose=None, after=None, limit=2, order="asc")
    assert [r.id for r in page] == ids[:2] and has_more
    page, has_more = await api.list_files("t", purpose=None, after=ids[1], limit=2, order="asc")
    assert [r.id for r in page] == [ids[2]] and not has_more
    with pytest.raises(InvalidRequest, match="order"):
        await api.list_files("t", purpose=None, after=None, limit=None, order="newest")


async def test_batches_list_oldest_first_with_order_asc() -> None:
    api, _ = service()
    source = await upload(api, form(input_file(1)))
    params = {"input_file_id": source.id, "endpoint": "/v1/embeddings",
              "completion_window": "24h"}  # fmt: skip
    ids = [(await api.create_batch("t", params)).id for _ in range(3)]
    page, has_more = await api.list_batches("t", after=None, limit=2, order="asc")
    assert [r.id for r in page] == ids[:2] and has_more
    page, has_more = await api.list_batches("t", after=ids[1], limit=2, order="asc")
    assert [r.id for r in page] == [ids[2]] and not has_more
    page, _ = await api.list_batches("t", after=None, limit=None)
    assert [r.id for r in page] == ids[::-1]
    with pytest.raises(InvalidRequest, match="order") as caught:
        await api.list_batches("t", after=None, limit=None, order="sideways")
    assert caught.value.param == "order"


@pytest.mark.parametrize(("params", "match"), [
    ({"endpoint": "/v1/moderations"}, "endpoint"),
    ({"completion_window": "10m"}, "completion_window"),
    ({"completion_window": "forever"}, "completion_window"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"input_file_id": 3}, "input_file_id"),
])  # fmt: skip
async def test_bad_batch_parameters_are_400(params: dict, match: str) -> None:
    api, _ = service()
    record = await upload(api, form(b"x\n"))
    base = {"input_file_id": record.id, "endpoint": "/v1/embeddings", "completion_window": "1h"}
    with pytest.raises(InvalidRequest, match=match):
        await api.create_batch("t", {**base, **params})


async def test_cancel_rules() -> None:
    api, ctx = service(lines_per_shard=2)
    record = await upload(api, form(input_file(3)))
    params = {"input_file_id": record.id, "endpoint": "/v1/embeddings", "completion_window": "2h",
              "metadata": {"run": "7"}}  # fmt: skip
    batch = await api.create_batch("t", params)
    assert batch.status is BatchStatus.VALIDATING and batch.metadata == {"run": "7"}
    assert batch.expires_at == batch.created_at + 7200
    assert (await api.cancel_batch("t", batch.id)).status is BatchStatus.CANCELLING
    assert (await api.cancel_batch("t", batch.id)).status is BatchStatus.CANCELLING
    done = await api.create_batch("t", params)
    supervisor = Supervisor(ctx, asyncio.Event())
    await supervisor.tick()
    await run_all(ctx)
    await supervisor.tick()
    assert (await api.get_batch("t", done.id)).status is BatchStatus.COMPLETED
    assert (await api.get_batch("t", batch.id)).status is BatchStatus.CANCELLED
    with pytest.raises(BatchNotCancellable):
        await api.cancel_batch("t", done.id)


async def test_a_file_deleted_while_a_batch_reads_it_is_removed_when_the_batch_ends() -> None:
    api, ctx = service()
    record = await upload(api, form(input_file(2)))
    await api.create_batch("t", {"input_file_id": record.id, "endpoint": "/v1/embeddings",
                                 "completion_window": "1h"})  # fmt: skip
    await api.delete_file("t", record.id)
    with pytest.raises(NotFound):
        await api.get_file("t", record.id)
    assert ctx.objects.default.exists(file_key(record.id))
    supervisor = Supervisor(ctx, asyncio.Event())
    await supervisor.tick()
    await run_all(ctx)
    await supervisor.tick()
    assert not ctx.objects.default.exists(file_key(record.id))
