"""LoRA adapters through the Service and the endpoint layer batch jobs use: configured and
run-time adapters answer as models, bad adapters are refused clearly, the base serves on; an
engine with its own adapter table (vLLM's) is told of loads and unloads."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from openai.types import Completion

from conveyor.config.settings import ServerConfig
from conveyor.endpoints.dispatch import execute
from conveyor.endpoints.lora_adapters import (
    LoadLoraAdapterRequest,
    UnloadLoraAdapterRequest,
    adapter_entries,
    load_adapter,
    unload_adapter,
)
from conveyor.engine.model.lora.files import (
    CONFIG_FILE,
    CONFIG_MAX_BYTES,
    REFUSAL,
    AdapterError,
    AdapterRefused,
)
from conveyor.engine.model.lora.registry import AdapterEntry
from conveyor.engine.tokenizer import Tokenizer
from conveyor.errors import ConfigError, InvalidRequest, ModelNotFound, PermissionDenied
from conveyor.fakes.checkpoints import build_lora_adapter
from conveyor.host.service import Service
from conveyor.openai_paths import COMPLETIONS
from conveyor.priority import Priority
from tests.unit.model_helpers import HFReference, merged_reference, random_prompts

# Building PEFT adapters (peft's first import included) takes seconds on a busy machine.
pytestmark = [pytest.mark.anyio, pytest.mark.model, pytest.mark.timeout(120)]


def config_of(
    llama_path: Path,
    adapters: dict[str, str],
    max_rank: int = 8,
    load_roots: Sequence[Path] = (),
) -> ServerConfig:
    """A tiny generative model with LoRA on, beside nothing else."""
    model = {
        "name": "tiny",
        "kind": "generate",
        "path": str(llama_path),
        "kv_cache_tokens": 2048,
        "block_size": 4,
        "max_model_len": 128,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 64,
        "lora": {
            "adapters": adapters,
            "max_loras_per_batch": 2,
            "max_rank": max_rank,
            "load_roots": [str(root) for root in load_roots],
        },
    }
    return ServerConfig.model_validate({"models": [model]})


@pytest.fixture
async def service(
    llama_path: Path, adapter_dirs: list[Path], tmp_path: Path
) -> AsyncIterator[Service]:
    roots = [adapter_dirs[0].parent, tmp_path / "root"]
    (tmp_path / "root").mkdir()
    config = config_of(llama_path, {"sql": str(adapter_dirs[0])}, load_roots=roots)
    async with Service(config) as running:
        yield running


async def complete(service: Service, model: str, prompt: list[int]) -> str:
    """A greedy batch-priority completion of 8 tokens, as a batch job line runs it."""
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    result = await execute(service, COMPLETIONS, body, priority=Priority.BATCH)
    return Completion.model_validate(result).choices[0].text


async def test_adapters_answer_as_models_in_batch_lines(
    service: Service, llama_path: Path, adapter_dirs: list[Path], llama_reference: HFReference
) -> None:
    prompt = random_prompts([9], 512, seed=4)[0]
    decode = Tokenizer(llama_path).decode
    await load_adapter(
        service, LoadLoraAdapterRequest(lora_name="chat", lora_path=str(adapter_dirs[1]))
    )
    for model, reference in [
        ("tiny", llama_reference),
        ("sql", merged_reference(llama_path, adapter_dirs[0])),
        ("chat", merged_reference(llama_path, adapter_dirs[1])),
    ]:
        assert await complete(service, model, prompt) == decode(reference.generate(prompt, 8))
    entries = {entry["id"]: entry["parent"] for entry in adapter_entries(service)}
    assert entries == {"sql": "tiny", "chat": "tiny"}


async def test_bad_adapters_are_refused_and_the_base_serves_on(
    service: Service, llama_path: Path, adapter_dirs: list[Path], tmp_path: Path
) -> None:
    with pytest.raises(ModelNotFound):
        await complete(service, "nope", [5, 6, 7])
    too_big = LoadLoraAdapterRequest(lora_name="big", lora_path=str(adapter_dirs[2]))
    with pytest.raises(InvalidRequest, match="rank 16, above this model's max_rank 8"):
        await load_adapter(service, too_big)
    broken = tmp_path / "root" / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    with pytest.raises(InvalidRequest, match=REFUSAL):  # no weights file
        await load_adapter(service, LoadLoraAdapterRequest(lora_name="b", lora_path=str(broken)))
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(InvalidRequest, match=r"cannot read adapter_model\.safetensors"):
        await load_adapter(service, LoadLoraAdapterRequest(lora_name="b", lora_path=str(broken)))
    taken = LoadLoraAdapterRequest(lora_name="tiny", lora_path=str(adapter_dirs[1]))
    with pytest.raises(InvalidRequest, match="already a model or an adapter"):
        await load_adapter(service, taken)
    assert [entry["id"] for entry in adapter_entries(service)] == ["sql"]
    assert await complete(service, "tiny", [5, 6, 7])  # the base still answers


@pytest.mark.timeout(60)  # a FIFO read without O_NONBLOCK would hang here
async def test_every_path_it_will_not_read_gets_one_message(
    service: Service, adapter_dirs: list[Path], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    shutil.copytree(adapter_dirs[1], outside)  # a good adapter, in the wrong place
    (root / "escape").symlink_to(outside)
    fifo = root / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / CONFIG_FILE)
    big = root / "big"
    shutil.copytree(adapter_dirs[1], big)
    (big / CONFIG_FILE).write_text(" " * CONFIG_MAX_BYTES + json.dumps({"r": 4}))
    paths = [outside, root / "escape", root / ".." / "outside", fifo, big, root / "missing",
             tmp_path / "missing"]  # fmt: skip
    messages = set()
    for index, path in enumerate(paths):
        body = LoadLoraAdapterRequest(lora_name=f"x{index}", lora_path=str(path))
        with pytest.raises(AdapterRefused) as caught:
            await load_adapter(service, body)
        messages.add(caught.value.message)
    assert messages == {REFUSAL}
    assert [entry["id"] for entry in adapter_entries(service)] == ["sql"]
    good = LoadLoraAdapterRequest(lora_name="chat", lora_path=str(adapter_dirs[1]))
    await load_adapter(service, good)  # under a root: loads
    assert [entry["id"] for entry in adapter_entries(service)] == ["sql", "chat"]


async def test_without_load_roots_nothing_loads_at_run_time(
    llama_path: Path, adapter_dirs: list[Path]
) -> None:
    async with Service(config_of(llama_path, {"sql": str(adapter_dirs[0])})) as running:
        body = LoadLoraAdapterRequest(lora_name="chat", lora_path=str(adapter_dirs[1]))
        with pytest.raises(PermissionDenied, match=r"lora\.load_roots"):
            await load_adapter(running, body)
        assert [entry["id"] for entry in adapter_entries(running)] == ["sql"]


async def test_an_unloaded_adapter_is_gone(service: Service) -> None:
    await unload_adapter(service, UnloadLoraAdapterRequest(lora_name="sql"))
    with pytest.raises(ModelNotFound):
        await complete(service, "sql", [5, 6, 7])
    with pytest.raises(ModelNotFound):
        await unload_adapter(service, UnloadLoraAdapterRequest(lora_name="sql"))


@dataclass
class FakeSync:
    """An engine's own adapter table (vLLM's), refusing adapters named in ``refuse``."""

    refuse: set[str] = field(default_factory=set)
    added: list[AdapterEntry] = field(default_factory=list)
    removed: list[AdapterEntry] = field(default_factory=list)

    async def add_adapter(self, entry: AdapterEntry) -> None:
        self.added.append(entry)
        if entry.name in self.refuse:
            raise AdapterError(f"vLLM cannot load the LoRA adapter {entry.name!r}")

    async def remove_adapter(self, entry: AdapterEntry) -> None:
        self.removed.append(entry)


async def test_an_engine_with_its_own_adapter_table_follows_loads_and_unloads(
    service: Service, adapter_dirs: list[Path]
) -> None:
    sync = FakeSync(refuse={"odd"})
    service.generators["tiny"].adapter_sync = sync
    await load_adapter(
        service, LoadLoraAdapterRequest(lora_name="chat", lora_path=str(adapter_dirs[1]))
    )
    assert [(entry.name, entry.path) for entry in sync.added] == [("chat", adapter_dirs[1])]
    odd = LoadLoraAdapterRequest(lora_name="odd", lora_path=str(adapter_dirs[1]))
    with pytest.raises(AdapterError, match="vLLM cannot load"):
        await load_adapter(service, odd)
    # What the engine refuses is not served at all: the name is free again.
    assert [entry["id"] for entry in adapter_entries(service)] == ["sql", "chat"]
    with pytest.raises(ModelNotFound):
        await complete(service, "odd", [5, 6, 7])
    await unload_adapter(service, UnloadLoraAdapterRequest(lora_name="chat"))
    assert sync.removed == [sync.added[0]]


async def test_a_configured_adapter_that_cannot_load_stops_start_up(
    llama_path: Path, tmp_path: Path
) -> None:
    adapter = build_lora_adapter(llama_path, tmp_path / "big", rank=16)
    config = config_of(llama_path, {"big": str(adapter)})
    with pytest.raises(ConfigError, match=r"LoRA adapter 'big'.*max_rank 8"):
        async with Service(config):
            pass


def test_adapter_names_must_not_shadow_models(llama_path: Path) -> None:
    with pytest.raises(ValueError, match="repeated: tiny"):
        config_of(llama_path, {"tiny": "/x"})


def test_an_adapter_sees_its_merged_model(llama_path: Path, adapter_dirs: list[Path]) -> None:
    # The fixture's adapters change the model (the parity tests rely on it).
    base: Any = HFReference(llama_path)
    merged = merged_reference(llama_path, adapter_dirs[0])
    prompt = random_prompts([9], 512, seed=4)[0]
    assert base.generate(prompt, 8) != merged.generate(prompt, 8)
