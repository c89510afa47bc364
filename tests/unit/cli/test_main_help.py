"""Every command's ``--help`` at 80 columns: whole option names, no type on flags."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from conveyor.cli.main import app

WIDTH = 80


def _commands() -> list[list[str]]:
    """The argv prefix of every command and command group, ``[]`` being the top."""
    found: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:
        found.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def _help(path: list[str]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("path", _commands(), ids=lambda p: " ".join(p) or "conveyor")
def test_help_fits_80_columns_with_whole_option_names(path: list[str]) -> None:
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    shown = _help(path)
    assert "…" not in shown and "<bool>" not in shown
    assert max(len(line) for line in shown.splitlines()) <= WIDTH
    words = set(re.findall(r"--[a-z0-9-]+", shown))
    for param in command.params:
        for option in (*param.opts, *param.secondary_opts):
            if option.startswith("--"):
                assert option in words, f"{option} is not shown whole"


def test_the_gateway_lists_its_long_options_and_flags_without_a_type() -> None:
    shown = _help(["gateway"])
    assert "--target-utilisation <float>" in shown
    assert "--require-api-keys / --no-require-api-keys\n" in shown
    assert re.search(r"^  --affinity / --no-affinity +Route", shown, re.MULTILINE)


def test_plan_json_is_a_bare_flag() -> None:
    assert re.search(r"^  --json +Print", _help(["plan"]), re.MULTILINE)
