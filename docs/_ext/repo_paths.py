"""A check that the files and folders a page names in code spans exist in the repository.

Pages name files as code (`` `bench/results/online.json` ``, `` `batching/mix.py` ``) rather
than linking out of the site; when code moves, the page that still names the old place is
reported (the docs build fails on it). A path is looked up from the repository root, then
from ``src/conveyor`` (how pages name modules). Only spans that look like a relative path
to a file of a known kind, or to a folder (a trailing ``/``), are checked.
"""

from __future__ import annotations

import re
from pathlib import Path

_CODE_SPAN = re.compile(r"`([^`\s]+)`")
_FILE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+\.(py|json|png|sh|yaml|jsonl|toml|md)$")
_FOLDER = re.compile(r"^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*/$")
# Folders the tools create, which a fresh checkout does not have.
MADE_BY_TOOLS = frozenset({"mutants/", "wheels/", "site/", "bench/results/device/"})


def missing_paths(text: str, repo_root: Path) -> list[str]:
    """The paths named in ``text``'s code spans that exist neither from the repository
    root nor from ``src/conveyor``, each once, in order of appearance."""
    missing: list[str] = []
    for match in _CODE_SPAN.finditer(text):
        path = match.group(1)
        if path in MADE_BY_TOOLS or not (_FILE.match(path) or _FOLDER.match(path)):
            continue
        roots = (repo_root, repo_root / "src" / "conveyor")
        if not any((root / path).exists() for root in roots) and path not in missing:
            missing.append(path)
    return missing
