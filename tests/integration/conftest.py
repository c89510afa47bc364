"""Integration fixtures: the real SmolLM2, loaded once per test run (see ``smollm2_fixtures``)."""

from tests.integration.smollm2_fixtures import (
    one_torch_thread,
    smollm2_hf,
    smollm2_path,
    smollm2_runner,
    smollm2_scorer,
    smollm2_tokenizer,
)

__all__ = [
    "one_torch_thread",
    "smollm2_hf",
    "smollm2_path",
    "smollm2_runner",
    "smollm2_scorer",
    "smollm2_tokenizer",
]
