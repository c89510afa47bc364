"""The module map, written from the source tree: each package, each module's summary.

``render(src / "conveyor")`` lists every package (a folder with ``__init__.py``) under
its dotted name with its own docstring, then a table of its modules with the first
paragraph of each one's docstring. A module without a docstring is reported as a problem
(the docs build fails on it). Sources are parsed, not imported: nothing is run.
"""

from __future__ import annotations

import ast
from pathlib import Path

from docs._ext.page import Page

INTRO = (
    "Every package and module under `src/conveyor/`, with the summary its own docstring "
    "gives, written from the source tree each time the documentation is built. How the "
    "parts work together is in [Architecture](index.md)."
)


def render(package_dir: Path) -> Page:
    """The module map of the package at ``package_dir`` and its subpackages."""
    page = Page()
    lines = ["# Module map", "", INTRO, ""]
    packages = sorted(path.parent for path in package_dir.rglob("__init__.py"))
    for package in packages:
        name = ".".join(package.relative_to(package_dir.parent).parts)
        lines += [f"## `{name}`", "", _summary(package / "__init__.py", page) or "", ""]
        modules = sorted(p for p in package.glob("*.py") if p.name != "__init__.py")
        if modules:
            lines += ["| module | what it holds |", "| --- | --- |"]
            for module in modules:
                summary = (_summary(module, page) or "").replace("|", "\\|")
                lines.append(f"| `{module.name}` | {summary} |")
            lines.append("")
    page.text = "\n".join(lines)
    return page


def _summary(path: Path, page: Page) -> str | None:
    """The first paragraph of the module's docstring, on one line; None (a problem) if none."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not docstring:
        page.problems.append(f"{path.as_posix()} has no module docstring")
        return None
    return " ".join(docstring.split("\n\n")[0].split())
