"""Tiny checkpoints for the tests that run a real model, and one torch thread throughout.

Imported by the ``conftest.py`` of ``tests/unit/engine`` and ``tests/unit/endpoints``, so each
of those packages builds its checkpoints once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.fakes.checkpoints import (
    build_lora_adapter,
    build_tiny_llama,
    build_tiny_qwen3,
    torch_threads,
)
from tests.unit.model_helpers import HFReference


@pytest.fixture(autouse=True, scope="package")
def _one_torch_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture(scope="package")
def llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="package")
def qwen3_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="package")
def llama_reference(llama_path: Path) -> HFReference:
    return HFReference(llama_path)


@pytest.fixture(scope="package")
def adapter_dirs(llama_path: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Four PEFT adapters of the tiny Llama: different ranks, targets and scalings."""
    root = tmp_path_factory.mktemp("adapters")
    specs: list[dict[str, Any]] = [
        {"rank": 8, "alpha": 16},
        {"rank": 4, "alpha": 8, "target_modules": ("q_proj", "v_proj")},
        {"rank": 16, "alpha": 16, "use_rslora": True},
        {"rank": 2, "alpha": 4, "target_modules": ("gate_proj", "down_proj", "o_proj")},
    ]
    return [
        build_lora_adapter(llama_path, root / f"a{index}", seed=index + 1, **spec)
        for index, spec in enumerate(specs)
    ]
