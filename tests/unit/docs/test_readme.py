"""The README stays a front page: short, two set-up commands, links and paths that exist."""

from __future__ import annotations

import re
from pathlib import Path

from docs._ext.repo_paths import missing_paths

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_it_is_short() -> None:
    assert len(README.splitlines()) < 200


def test_set_up_is_make_serve_then_make_test() -> None:
    section = README.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert [command for command in commands if command] == ["make serve", "make test"]


def test_links_and_named_paths_exist() -> None:
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)
    assert targets, "the README links into docs/"
    assert [target for target in targets if not (ROOT / target).exists()] == []
    assert missing_paths(README, ROOT) == []
