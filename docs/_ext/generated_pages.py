"""Sphinx extension: the pages written from the code, and a check of the paths pages name.

``configuration/reference`` and ``architecture/modules`` are placeholders in the tree; their
text is replaced, as Sphinx reads them, by what ``config_reference`` and ``module_map``
write from the code. Every page's code spans that name repository paths are checked. What
either finds missing is a warning, so the build (``-W``) fails on it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from docs._ext import config_reference, module_map
from docs._ext.page import Page
from docs._ext.repo_paths import missing_paths
from sphinx.application import Sphinx
from sphinx.util import logging

REPO_ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger(__name__)


def _config_reference() -> Page:
    from conveyor.config.settings import ENV_VARS, ServerConfig

    return config_reference.render(ServerConfig, ENV_VARS)


def _module_map() -> Page:
    return module_map.render(REPO_ROOT / "src" / "conveyor")


GENERATED: dict[str, Callable[[], Page]] = {
    "configuration/reference": _config_reference,
    "architecture/modules": _module_map,
}


def _on_source_read(app: Sphinx, docname: str, source: list[str]) -> None:
    """Swap a generated page's placeholder for its text; report what is missing."""
    problems: list[str] = []
    make = GENERATED.get(docname)
    if make is not None:
        page = make()
        source[0] = page.text
        problems += page.problems
    problems += [
        f"names {path}, which does not exist" for path in missing_paths(source[0], REPO_ROOT)
    ]
    for problem in problems:
        log.warning(problem, location=docname)


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the hook with Sphinx."""
    app.connect("source-read", _on_source_read)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
