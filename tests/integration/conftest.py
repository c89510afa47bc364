"""Integration fixtures: the real SmolLM2, loaded once per test run (see ``smollm2_fixtures``),
and the vLLM server the engine: vllm modules share (see ``vllm_worker``)."""

from tests.integration.smollm2_fixtures import (
    one_torch_thread,
    smollm2_hf,
    smollm2_path,
    smollm2_runner,
    smollm2_scorer,
    smollm2_tokenizer,
)
from tests.integration.vllm_worker import smollm2_dir, vllm_adapter_root, vllm_launched

__all__ = [
    "one_torch_thread",
    "smollm2_dir",
    "smollm2_hf",
    "smollm2_path",
    "smollm2_runner",
    "smollm2_scorer",
    "smollm2_tokenizer",
    "vllm_adapter_root",
    "vllm_launched",
]
