"""Package fixtures: the tiny Llama checkpoint and one torch thread (see
``tests/unit/model_fixtures``)."""

from tests.unit.model_fixtures import _one_torch_thread, llama_path

__all__ = ["_one_torch_thread", "llama_path"]
