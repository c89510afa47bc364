"""Package fixtures: the tiny checkpoints and one torch thread (see ``tests/unit/model_fixtures``)."""

from tests.unit.model_fixtures import (
    _one_torch_thread,
    adapter_dirs,
    llama_path,
    llama_reference,
    qwen3_path,
)

__all__ = ["_one_torch_thread", "adapter_dirs", "llama_path", "llama_reference", "qwen3_path"]
