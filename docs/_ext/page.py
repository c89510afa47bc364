"""A page written from the code, and what the code it was written from lacks."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Page:
    """Markdown text, and problems (a missing docstring or description) to report."""

    text: str = ""
    problems: list[str] = field(default_factory=list)
