"""The documentation builds as ``make docs`` builds it: Sphinx, every warning an error.

A broken link or anchor, a page in no table of contents, a configuration field without a
description, a module without a docstring or a page naming a path that does not exist
fails the build, so it fails here. The two pages written from the code come out whole.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# The options of `make docs`: warnings are errors, nitpicky references, a fresh environment.
SPHINX = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-E", "-q"]


def _build(docs: Path, out: Path, builder: str = "html") -> subprocess.CompletedProcess[str]:
    command = [*SPHINX, "-b", builder, str(docs), str(out)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    result = _build(ROOT / "docs", tmp_path)
    assert result.returncode == 0, result.stderr
    reference = (tmp_path / "configuration" / "reference.html").read_text(encoding="utf-8")
    assert "max_num_batched_tokens" in reference
    assert "CONVEYOR_FLEET_KEY" in reference
    modules = (tmp_path / "architecture" / "modules.html").read_text(encoding="utf-8")
    assert "conveyor.engine.core" in modules
    assert "scheduler.py" in modules


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The same pages plus one broken link, in a copy of the tree (the rest linked in); the
    dummy builder resolves every reference as the HTML one does, and writes nothing."""
    for entry in ROOT.iterdir():
        if entry.name not in {"docs", "site", ".git", ".venv"}:
            (tmp_path / entry.name).symlink_to(entry)
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    page = tmp_path / "docs" / "testing.md"
    page.write_text(page.read_text(encoding="utf-8") + "\n[gone](no-such-page.md)\n")
    result = _build(tmp_path / "docs", tmp_path / "site", builder="dummy")
    assert result.returncode != 0
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "no-such-page.md" in warnings[0], result.stderr
