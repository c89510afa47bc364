"""Residency at start-up: a resident tenant whose region has no object store, or a malformed
``--region-objects``, stops ``serve``, ``worker`` and ``gateway`` with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from conveyor.cli.main import app
from tests.unit.cli.test_main import write_config

runner = CliRunner()
PINNED = {
    "models": [{"name": "m", "kind": "synthetic"}],
    "tenants": [{"name": "acme", "regions": ["eu"]}],
    "jobs": {"region_object_store_urls": {"us": "/srv/us"}},
}
COMMANDS = [
    ["serve", "--config"],
    ["worker", "--store", "sqlite:///unused.db", "--region-objects", "ap=/srv/ap", "--config"],
    ["gateway", "--store", "sqlite:///unused.db", "--region-objects", "ap=/srv/ap", "--config"],
]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_resident_tenant_without_its_regions_store_stops_start_up(
    tmp_path: Path, command: list[str]
) -> None:
    result = runner.invoke(app, [*command, str(write_config(tmp_path, PINNED))])
    assert result.exit_code == 2, result.output
    assert "tenant 'acme'" in result.stderr
    assert "region 'eu' has no object store" in result.stderr


@pytest.mark.parametrize("command", ["worker", "gateway"])
def test_a_malformed_region_objects_pair_is_refused(command: str) -> None:
    argv = [command, "--store", "sqlite:///unused.db", "--region-objects", "eu"]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert "--region-objects takes REGION=URL, got 'eu'" in result.stderr
