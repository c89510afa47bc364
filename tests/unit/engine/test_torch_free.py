"""The engine's plain logic and caller-facing modules import without loading torch.

The HTTP layer and batch validation import these; torch costs seconds and memory in
a process (the gateway) that hosts no model. All of ``engine/core`` is torch-free, and so
are the modules callers import from the rest of the engine.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import conveyor.engine.core

# Outside engine/core: what callers import (the generator and its streams, the sampling
# parameters) and what sizes or describes a model before it loads.
CALLER_MODULES = (
    "conveyor.engine.engine_protocol",
    "conveyor.engine.generator",
    "conveyor.engine.inbox",
    "conveyor.engine.model.decode_buckets",
    "conveyor.engine.model.gguf_format",
    "conveyor.engine.model.hf_config",
    "conveyor.engine.model.lora.files",
    "conveyor.engine.model.lora.registry",
    "conveyor.engine.outputs",
    "conveyor.engine.sampling.params",
    "conveyor.engine.stream",
    "conveyor.engine.vllm_mapping",
)


def core_modules() -> tuple[str, ...]:
    """Every module of ``engine/core``, found on disk (a new one is covered at once)."""
    found = pkgutil.walk_packages(conveyor.engine.core.__path__, "conveyor.engine.core.")
    return tuple(sorted(info.name for info in found))


def test_engine_core_has_the_plain_logic() -> None:
    """The walk finds the core (a wrong path would make the import test below vacuous)."""
    names = core_modules()
    for module in ("block_manager", "scheduler", "sequence", "step_plan", "job_share"):
        assert f"conveyor.engine.core.{module}" in names


def test_modules_import_without_torch() -> None:
    modules = ("conveyor.engine.core", *core_modules(), *CALLER_MODULES)
    code = (
        f"import importlib, sys\nfor name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
