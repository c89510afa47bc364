"""The engine's plain-logic and caller-facing modules import without loading torch.

The HTTP layer and batch validation import these; torch costs seconds and memory in
a process (the gateway) that hosts no model.
"""

from __future__ import annotations

import subprocess
import sys

TORCH_FREE_MODULES = (
    "conveyor.engine.block_manager",
    "conveyor.engine.decode_buckets",
    "conveyor.engine.engine_config",
    "conveyor.engine.generator",
    "conveyor.engine.gguf_format",
    "conveyor.engine.hf_config",
    "conveyor.engine.inbox",
    "conveyor.engine.lora.registry",
    "conveyor.engine.outputs",
    "conveyor.engine.prefill_time",
    "conveyor.engine.sampling_params",
    "conveyor.engine.scheduler",
    "conveyor.engine.sequence",
    "conveyor.engine.siblings",
    "conveyor.engine.step",
    "conveyor.engine.stream",
)


def test_modules_import_without_torch() -> None:
    code = (
        f"import importlib, sys\nfor name in {TORCH_FREE_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
