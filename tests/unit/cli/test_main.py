"""The command line: what it prints and how it exits before any server starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conveyor.cli.main import app

runner = CliRunner()


def write_config(tmp_path: Path, config: object) -> Path:
    path = tmp_path / "conveyor.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_check_config_lists_every_model_with_its_kind(tmp_path: Path) -> None:
    models = [{"name": "fast", "kind": "synthetic"}, {"name": "slow", "kind": "synthetic"}]
    result = runner.invoke(app, ["check-config", str(write_config(tmp_path, {"models": models}))])
    assert result.exit_code == 0, result.output
    assert result.stdout == "fast: synthetic\nslow: synthetic\n"


@pytest.mark.parametrize(
    "command",
    [
        ["check-config"],
        ["serve", "--config"],
        ["worker", "--store", "sqlite:///unused.db", "--config"],
        ["gateway", "--store", "sqlite:///unused.db", "--config"],
    ],
)
def test_a_bad_config_file_exits_2_with_the_reason(tmp_path: Path, command: list[str]) -> None:
    path = write_config(tmp_path, {"models": [{"name": "m", "kind": "nonsense"}]})
    result = runner.invoke(app, [*command, str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"invalid configuration in {path}:\n  models.0: ")
    assert "'nonsense'" in result.stderr
    assert result.stdout == ""


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    result = runner.invoke(app, ["check-config", str(missing)])
    assert result.exit_code == 2
    assert f"config file {missing} not found" in result.stderr


def test_worker_refuses_a_malformed_listen_address() -> None:
    result = runner.invoke(app, ["worker", "--store", "sqlite:///unused.db", "--listen", "8001"])
    assert result.exit_code == 2
    assert "--listen must be HOST:PORT, got '8001'" in result.stderr


def test_gateway_refuses_a_target_utilisation_above_one() -> None:
    argv = ["gateway", "--store", "sqlite:///unused.db", "--target-utilisation", "1.5"]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert "target_utilisation must be in (0, 1]" in result.stderr


def test_require_api_keys_counts_stored_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conveyor.cli import main as cli
    from conveyor.stores import open_job_store
    from conveyor.tenants.keys import new_key_record

    monkeypatch.delenv("CONVEYOR_API_KEYS", raising=False)
    store_url = f"sqlite:///{tmp_path}/jobs.sqlite"
    argv = ["gateway", "--store", store_url, "--require-api-keys", "--port", "0"]
    refused = runner.invoke(app, argv)
    assert refused.exit_code == 2 and "--require-api-keys is set" in refused.stderr
    store = open_job_store(store_url)
    store.create_api_key(new_key_record("acme")[1])
    store.close()
    started: list[object] = []
    monkeypatch.setattr(cli, "_run_uvicorn", lambda app, settings: started.append(app))
    assert runner.invoke(app, argv).exit_code == 0
    assert len(started) == 1  # a stored key is a key: the gateway starts
