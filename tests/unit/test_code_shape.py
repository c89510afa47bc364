"""The shape the code keeps: no import cycle, short modules and functions, a light gateway.

- No import cycle, between modules or between subpackages. The graph is read from the
  source with `ast`, so imports inside functions count too; only imports under
  `if TYPE_CHECKING:` are left out (they never run).
- No module over `MAX_MODULE_LINES` lines, no function or method over
  `MAX_FUNCTION_LINES` (from its `def` line to its last line, nested functions included).
- The gateway's import closure (the `gateway` package and what `conveyor gateway` imports)
  holds neither torch nor the model host, the batcher or the engine: read from the graph
  (every import counted, run or not) and checked in a fresh interpreter.

No allow-list: a module or function over the limit is split by role.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import conveyor
from tests.unit.engine.test_torch_free import CALLER_MODULES, core_modules

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


@functools.cache
def module_graph() -> dict[str, set[str]]:
    """Who imports whom, module by module (read once per run; callers do not change it)."""
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


MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def long_modules(paths: dict[str, Path], limit: int) -> list[str]:
    """`name: N lines` for every module over `limit` lines."""
    found = []
    for name, path in sorted(paths.items()):
        num_lines = len(path.read_text().splitlines())
        if num_lines > limit:
            found.append(f"{name}: {num_lines} lines")
    return found


def long_functions(name: str, source: str, limit: int) -> list[str]:
    """`module:line function: N lines` for every function of `source` over `limit` lines,
    counted from its `def` line to its last line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            num_lines = node.end_lineno - node.lineno + 1
            if num_lines > limit:
                found.append(f"{name}:{node.lineno} {node.name}: {num_lines} lines")
    return found


def test_the_length_checks_measure_def_to_end() -> None:
    source = (
        "@decorated\ndef f(\n    x,\n):\n    a = 1\n\n    return a\n\n\nasync def g():\n    pass\n"
    )
    assert long_functions("m", source, 6) == []
    assert long_functions("m", source, 5) == ["m:2 f: 6 lines"]
    assert long_functions("m", "class C:\n    def m(self):\n        return 1\n", 1) == [
        "m:2 m: 2 lines"
    ]


def test_no_module_is_over_the_limit() -> None:
    assert long_modules(module_paths(), MAX_MODULE_LINES) == []


def test_no_function_is_over_the_limit() -> None:
    found = []
    for name, path in sorted(module_paths().items()):
        found += long_functions(name, path.read_text(), MAX_FUNCTION_LINES)
    assert found == []


# What a gateway must not load: it hosts no model.
MODEL_CODE = ("conveyor.host", "conveyor.batching", "conveyor.engine")
HEAVY_PACKAGES = ("torch", "transformers")
CLI_MODULE = "conveyor.cli.main"
GATEWAY_COMMAND = "gateway"


def _is_model_code(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in MODEL_CODE)


def command_imports(source: str, command: str, modules: dict[str, Path]) -> set[str]:
    """The package modules imported inside `command` (a function of `source`) and inside
    the module's functions it calls, at any depth."""
    functions = {
        node.name: node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    found: set[str] = set()
    seen: set[str] = set()
    pending = [command]
    while pending:
        name = pending.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.Name) and node.id in functions:
                pending.append(node.id)
        body = ast.Module(body=[functions[name]], type_ignores=[])
        found |= {t for t in _absolute_imports(body) if t.startswith("conveyor")}
    return {m for m in (_resolve(t, modules) for t in found) if m is not None}


def _absolute_imports(tree: ast.AST) -> set[str]:
    """Dotted names of the absolute imports under `tree` (`from m import x` as `m.x`)."""
    names: set[str] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif node.level == 0 and node.module:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def gateway_roots() -> set[str]:
    """The gateway package's modules and what the `gateway` command imports when it runs
    (the CLI module's own imports aside: its other commands are not the gateway's)."""
    modules = module_paths()
    source = modules[CLI_MODULE].read_text()
    package = {name for name in modules if name.startswith("conveyor.gateway")}
    return package | command_imports(source, GATEWAY_COMMAND, modules)


def closure(graph: dict[str, set[str]], roots: set[str]) -> set[str]:
    """Every module reachable from `roots`, themselves included."""
    found: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name not in found:
            found.add(name)
            pending.extend(graph.get(name, ()))
    return found


def test_command_imports_follow_the_functions_a_command_calls() -> None:
    source = (
        "def cmd():\n    import conveyor.errors\n    helper()\n\n"
        "def helper():\n    from conveyor.priority import Priority\n\n"
        "def other():\n    import conveyor.gateway.process\n"
    )
    modules = module_paths()
    assert command_imports(source, "cmd", modules) == {"conveyor.errors", "conveyor.priority"}


def test_the_gateway_closure_holds_no_model_code() -> None:
    """Read from the graph, every import the gateway's modules may run (inside functions
    too) reaches neither torch, the model host nor the batcher. Of the engine it reaches
    only torch-free modules that describe requests and model files (the sampling limits
    the chat schema checks, the config readers the dashboard's plan uses, LoRA file
    names), and those only from inside functions: none loads when the gateway starts (the
    next test)."""
    modules = module_paths()
    reached = closure(module_graph(), gateway_roots())
    assert "conveyor.gateway.proxy" in reached and "conveyor.api.gateway_app" in reached
    torch_free = {*core_modules(), *CALLER_MODULES}
    assert sorted(m for m in reached if _is_model_code(m) and m not in torch_free) == []
    heavy = [
        name
        for name in sorted(reached)
        for imported in _absolute_imports(ast.parse(modules[name].read_text()))
        if imported.split(".")[0] in HEAVY_PACKAGES
    ]
    assert heavy == []


def test_the_gateway_loads_neither_torch_nor_any_model_code() -> None:
    """Checked in a fresh interpreter too, for third-party imports (torch, transformers):
    importing the CLI, the gateway's modules and what its command imports loads none of
    them."""
    roots = sorted(gateway_roots() | {CLI_MODULE})
    probe = (
        f"import importlib, sys\nfor name in {roots!r}:\n    importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m in {HEAVY_PACKAGES!r} "
        f"or m.startswith({MODEL_CODE!r})))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=60)  # fmt: skip
    assert done.stdout.strip() == "[]"


UNIT_TESTS = Path(__file__).parent
REPO_ROOT = PACKAGE_ROOT.parent.parent
# Unit tests of the repository as a whole rather than of one module.
REPO_WIDE_TESTS = frozenset({
    "test_code_shape.py",  # this file: the code's shape
    "test_deploy.py",  # deploy/'s manifests
    "test_missing_services.py",  # tests/missing.py: a missing service fails under CI
    "test_exit_report.py",  # tests/exit_report.py: a server that exits before it is ready
    "test_worker_groups.py",  # tests/worker_groups.py: the suite's split between workers
    "test_mutation_report.py",  # bench/mutation_report.py
    "engine/test_torch_free.py",  # the engine's modules import without torch
    "docs/test_readme.py",  # README.md
})  # fmt: skip


def mirrored_module(test: Path, package_dir: Path) -> bool:
    """Whether `test` (`test_<name>.py`) is named after a module in `package_dir`: `name`
    is the module's, or `<module>_<aspect>` for one aspect of it."""
    name = test.stem.removeprefix("test_")
    modules = {path.stem for path in package_dir.glob("*.py") if path.stem != "__init__"}
    return any(name == module or name.startswith(module + "_") for module in modules)


def unmirrored_tests() -> list[str]:
    """Unit test files that do not mirror a module: `tests/unit/<package>/test_<module>.py`
    for `src/conveyor/<package>/<module>.py` (`tests/unit/docs` mirrors `docs/_ext`, and
    `tests/unit/bench` the benchmarks' own modules in `bench`)."""
    other_roots = {"docs": REPO_ROOT / "docs" / "_ext", "bench": REPO_ROOT / "bench"}
    found = []
    for test in sorted(UNIT_TESTS.rglob("test_*.py")):
        relative = test.relative_to(UNIT_TESTS)
        if relative.as_posix() in REPO_WIDE_TESTS:
            continue
        parts = relative.parent.parts
        if parts[:1] and parts[0] in other_roots:
            package_dir = other_roots[parts[0]].joinpath(*parts[1:])
        else:
            package_dir = PACKAGE_ROOT.joinpath(*parts)
        if not mirrored_module(test, package_dir):
            found.append(relative.as_posix())
    return found


def test_the_mirror_check_matches_modules_and_their_aspects(tmp_path: Path) -> None:
    (tmp_path / "batcher.py").touch()
    assert mirrored_module(Path("test_batcher.py"), tmp_path)
    assert mirrored_module(Path("test_batcher_clock.py"), tmp_path)
    assert not mirrored_module(Path("test_batching.py"), tmp_path)
    assert not mirrored_module(Path("test_batcher.py"), tmp_path / "elsewhere")


def test_unit_tests_mirror_the_package_module_for_module() -> None:
    assert unmirrored_tests() == []
