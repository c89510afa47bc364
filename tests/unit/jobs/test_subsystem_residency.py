"""The jobs subsystem opens each resident tenant's region store, and refuses to start
when a resident tenant's region has none (never the default store instead)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conveyor.errors import ConfigError
from conveyor.jobs.config import JobsConfig
from conveyor.jobs.subsystem import JobsSubsystem

pytestmark = pytest.mark.anyio


async def no_lines(endpoint: str, body: dict[str, Any], payer: object) -> dict[str, Any]:
    raise AssertionError("no line runs here")


def subsystem(tmp_path: Path, regions: dict[str, str], **pins: tuple[str, ...]) -> JobsSubsystem:
    config = JobsConfig(is_worker=False, region_object_store_urls=regions)
    return JobsSubsystem(config, tmp_path, no_lines, lambda name: True, tenant_regions=pins)


def test_a_resident_tenant_without_a_region_store_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tenant 'acme'.*region 'eu' has no object store"):
        subsystem(tmp_path, {"us": str(tmp_path / "us")}, acme=("eu",))


async def test_each_tenant_gets_its_regions_directory(tmp_path: Path) -> None:
    urls = {"eu": f"file://{tmp_path / 'eu'}", "us": str(tmp_path / "us")}
    jobs = subsystem(tmp_path, urls, acme=("eu",), globex=("us", "eu"))
    await jobs.start()
    try:
        objects = jobs.context.objects
        for tenant, region in (("acme", "eu"), ("globex", "us"), ("anyone", "objects")):
            objects.for_tenant(tenant).put_stream(f"files/{tenant}", [tenant.encode()])
            assert (tmp_path / region / "files" / tenant).read_bytes() == tenant.encode()
    finally:
        await jobs.stop()
