"""No import cycles, between modules or between subpackages; the gateway loads no model code.

The graph is read from the source with `ast`, so imports inside functions count too; only
imports under `if TYPE_CHECKING:` are left out (they never run).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import conveyor

PACKAGE_ROOT = Path(conveyor.__file__).parent


def module_paths() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    paths: dict[str, Path] = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        paths[".".join(parts)] = path
    return paths


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under `node`, skipping `if TYPE_CHECKING:` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _import_nodes(child)


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module a dotted import name lands in (an attribute's module for `from m import x`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `name` imports."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            if target.startswith("conveyor"):
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != name:
                    found.add(resolved)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                on_stack.discard(top)
                component.append(top)
            on_stack.discard(node)
            if component:
                found.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def module_graph() -> dict[str, set[str]]:
    """Who imports whom, module by module."""
    modules = module_paths()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto `conveyor.<first level>` (subpackage or module)."""
    folded: dict[str, set[str]] = {}
    for name, targets in graph.items():
        unit = ".".join(name.split(".")[:2])
        folded.setdefault(unit, set()).update(
            ".".join(t.split(".")[:2]) for t in targets if not t.startswith(unit)
        )
    return folded


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_module_imports_itself_back() -> None:
    assert cycles(module_graph()) == []


def test_no_subpackage_imports_itself_back() -> None:
    assert cycles(subpackage_graph(module_graph())) == []


def test_the_gateway_loads_neither_torch_nor_any_model_code() -> None:
    """A gateway hosts no model: importing it must not pay for torch, the model host (its
    service), the batcher or the engine (checked in a fresh interpreter)."""
    probe = (
        "import sys, conveyor.gateway.process, conveyor.api.gateway_app; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith("
        "('conveyor.host', 'conveyor.batching', 'conveyor.engine'))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=60)  # fmt: skip
    assert done.stdout.strip() == "[]"
