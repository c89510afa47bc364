"""The module map written from the source tree (docs/_ext/module_map)."""

from __future__ import annotations

from pathlib import Path

from docs._ext.module_map import render

SRC = Path(__file__).resolve().parents[3] / "src" / "conveyor"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_packages_and_modules_with_their_summaries(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    _write(root / "__init__.py", '"""The package."""\n')
    _write(root / "b.py", '"""Second: a | b,\nwrapped.\n\nNot this paragraph."""\n')
    _write(root / "a.py", '"""First."""\n')
    _write(root / "sub" / "__init__.py", '"""A subpackage."""\n')
    _write(root / "sub" / "c.py", '"""Third."""\n')
    page = render(root)
    assert page.problems == []
    lines = page.text.splitlines()
    assert lines[lines.index("## `pkg`") + 2] == "The package."
    assert "| `a.py` | First. |" in lines
    assert "| `b.py` | Second: a \\| b, wrapped. |" in lines
    assert lines.index("| `a.py` | First. |") < lines.index(
        "| `b.py` | Second: a \\| b, wrapped. |"
    )
    assert (
        lines.index("## `pkg`") < lines.index("## `pkg.sub`") < lines.index("| `c.py` | Third. |")
    )


def test_a_module_without_a_docstring_is_a_problem(tmp_path: Path) -> None:
    _write(tmp_path / "pkg" / "__init__.py", '"""The package."""\n')
    _write(tmp_path / "pkg" / "bare.py", "VALUE = 1\n")
    page = render(tmp_path / "pkg")
    assert page.problems == [f"{(tmp_path / 'pkg' / 'bare.py').as_posix()} has no module docstring"]
    assert "| `bare.py` |  |" in page.text


def test_every_module_of_conveyor_is_mapped() -> None:
    page = render(SRC)
    assert page.problems == []
    for module in SRC.rglob("*.py"):
        if module.name != "__init__.py":
            assert f"| `{module.name}` |" in page.text
    assert "## `conveyor.engine.core`" in page.text
