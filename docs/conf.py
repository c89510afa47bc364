"""Sphinx configuration of Conveyor's documentation (``make docs`` builds it into ``site/``).

Pages are Markdown read by MyST. ``_ext/generated_pages.py`` writes the configuration reference
and the module map from the code as the build reads them. Every warning is an error
(``-W``): a broken link or anchor, a page in no table of contents, a setting without a
description, a module without a docstring, a path that does not exist.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The tree's own package (not whichever copy is installed), and docs._ext beside this file.
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

project = "Conveyor"
author = "Conveyor's authors"
extensions = ["myst_parser", "docs._ext.generated_pages"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_ext"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
nitpicky = True
html_theme = "furo"
html_title = "Conveyor"
html_show_sourcelink = False
html_copy_source = False
