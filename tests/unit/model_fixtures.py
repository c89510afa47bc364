"""Tiny checkpoints for the tests that run a real model, and one torch thread throughout.

Imported by the ``conftest.py`` of ``tests/unit/engine`` and ``tests/unit/endpoints``, so each
of those packages builds its checkpoints once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.testing import build_tiny_llama, build_tiny_qwen3, torch_threads
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
