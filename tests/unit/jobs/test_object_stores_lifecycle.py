"""A resident tenant's batch files, through their whole life, in its region's store only.

Upload, plan, shard outputs and checkpoints, output and error files, reading them back,
Anthropic message batches, expiry and deletion: every byte of tenant ``resident`` is in the
``eu`` store and none in the default one; the unpinned tenant's are all in the default store.
"""

from __future__ import annotations

import asyncio

import pytest

from conveyor.fakes import MemoryObjectStore
from conveyor.jobs.context import JobsContext
from conveyor.jobs.expiry import delete_expired_files
from conveyor.jobs.keys import file_key
from conveyor.jobs.message_batch_views import public_id
from conveyor.jobs.message_batches import MessageBatches
from conveyor.jobs.operations import JobOperations
from conveyor.jobs.supervisor import Supervisor
from conveyor.stores.records import BatchStatus
from tests.unit.jobs.fakes import input_file, make_ctx
from tests.unit.jobs.test_expiry import HOUR_S, expiring_form
from tests.unit.jobs.test_message_batches import answer, create_body, results_of
from tests.unit.jobs.test_operations import form, upload
from tests.unit.jobs.test_shard_runner import run_all

pytestmark = pytest.mark.anyio
PARAMS = {"endpoint": "/v1/embeddings", "completion_window": "1h"}


def stores() -> tuple[MemoryObjectStore, MemoryObjectStore]:
    """The default store and region eu's."""
    return MemoryObjectStore(), MemoryObjectStore()


def holds(store: MemoryObjectStore, data: bytes) -> bool:
    """Whether any object of ``store`` holds ``data``."""
    return any(data in value for value in store.objects.values())


async def run_to_end(ctx: JobsContext) -> None:
    supervisor = Supervisor(ctx, asyncio.Event())
    await supervisor.tick()
    await run_all(ctx)
    await supervisor.tick()


async def test_a_resident_batch_lives_in_its_regions_store_and_the_others_in_the_default() -> None:
    default, eu = stores()
    ctx = make_ctx(objects=default, tenant_objects={"resident": eu}, lines_per_shard=3,
                   region="eu")  # fmt: skip
    ctx.tenant_regions = {"resident": ("eu",)}
    api = JobOperations(ctx, lambda: None)
    home_data, away_data = input_file(7, prefix="home-"), input_file(5, prefix="away-")
    home = await upload(api, form(home_data), tenant="resident")
    away = await upload(api, form(away_data), tenant="t")
    assert eu.objects == {file_key(home.id): home_data}
    assert default.objects == {file_key(away.id): away_data}
    home_batch = await api.create_batch("resident", {"input_file_id": home.id, **PARAMS})
    away_batch = await api.create_batch("t", {"input_file_id": away.id, **PARAMS})
    await run_to_end(ctx)
    ended = await api.get_batch("resident", home_batch.id)
    assert ended.status is BatchStatus.COMPLETED and ended.request_counts.completed == 7
    assert (await api.get_batch("t", away_batch.id)).status is BatchStatus.COMPLETED
    assert ended.output_file_id is not None
    assert set(eu.objects) == {file_key(home.id), file_key(ended.output_file_id)}
    record, chunks = await api.file_content("resident", ended.output_file_id)
    output = b"".join(chunks)
    assert output.count(b"home-") == 7 and eu.objects[record.object_key] == output
    assert not holds(default, b"home-") and not holds(eu, b"away-")
    await api.delete_file("resident", home.id)
    await api.delete_file("resident", ended.output_file_id)
    assert eu.objects == {} and default.objects != {}


async def test_a_resident_message_batch_and_its_results_stay_in_its_region() -> None:
    default, eu = stores()
    ctx = make_ctx(objects=default, tenant_objects={"resident": eu}, endpoint=answer,
                   lines_per_shard=2)  # fmt: skip
    api = MessageBatches(ctx, lambda: None)
    created = await api.create("resident", create_body(3, prefix="home-"))
    await run_to_end(ctx)
    found = await results_of(api, public_id(created.id), tenant="resident")
    assert sorted(found) == ["home-0", "home-1", "home-2"]
    assert default.objects == {} and holds(eu, b"home-0")
    assert await api.delete("resident", public_id(created.id)) == created.id
    assert eu.objects == {}


async def test_expired_resident_files_are_deleted_from_its_regions_store() -> None:
    default, eu = stores()
    ctx = make_ctx(objects=default, tenant_objects={"resident": eu})
    api = JobOperations(ctx, lambda: None)
    record = await upload(api, expiring_form(b"x\n", str(HOUR_S)), tenant="resident")
    assert eu.exists(file_key(record.id)) and default.objects == {}
    ctx.clock.now += HOUR_S  # type: ignore[attr-defined]
    assert await asyncio.to_thread(delete_expired_files, ctx) == 1
    assert eu.objects == {}
