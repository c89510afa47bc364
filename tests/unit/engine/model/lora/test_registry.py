"""The adapter registry: names, never-reused ids, and the host-copy LRU (a fake loader)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.engine.model.lora.registry import LoraRegistry
from conveyor.errors import InvalidRequest, ModelNotFound


class FakeLoader:
    """Returns (rank, a token naming the path and the read) and counts the reads."""

    def __init__(self) -> None:
        self.reads: list[Path] = []

    def __call__(self, path: Path) -> tuple[int, str]:
        if path.name == "broken":
            raise InvalidRequest(f"adapter {path} is broken")
        self.reads.append(path)
        return 4, f"{path.name}#{len(self.reads)}"


def test_ids_are_never_reused_and_names_are_unique() -> None:
    registry = LoraRegistry(FakeLoader(), max_cpu_loras=4)
    first = registry.load("a", Path("/x/a"))
    with pytest.raises(InvalidRequest, match="already loaded"):
        registry.load("a", Path("/x/other"))
    registry.unload("a")
    again = registry.load("a", Path("/x/a2"))
    assert (first.adapter_id, again.adapter_id) == (1, 2)
    assert registry.names() == ["a"] and "a" in registry
    assert registry.get("a") == again and registry.get("b") is None
    # By id, an unloaded adapter is still found (requests queued for it still run).
    assert registry.entry(first.adapter_id) == first and registry.entry(9) is None


def test_a_failed_load_registers_nothing() -> None:
    registry = LoraRegistry(FakeLoader(), max_cpu_loras=4)
    with pytest.raises(InvalidRequest, match="broken"):
        registry.load("b", Path("/x/broken"))
    assert registry.names() == [] and registry.num_host_copies == 0


def test_host_copies_beyond_the_bound_are_read_again() -> None:
    loader = FakeLoader()
    registry = LoraRegistry(loader, max_cpu_loras=2)
    ids = [registry.load(name, Path(f"/x/{name}")).adapter_id for name in "abc"]
    assert registry.num_host_copies == 2  # "a" was the least recently used
    assert registry.weights(ids[1]) == "b#2"  # still held: no read
    assert registry.weights(ids[0]) == "a#4"  # read again, evicting "c" (not "b": used)
    assert registry.weights(ids[1]) == "b#2"
    assert registry.weights(ids[2]) == "c#5"
    assert len(loader.reads) == 5


def test_unloading_drops_the_name_but_queued_requests_still_get_weights() -> None:
    registry = LoraRegistry(FakeLoader(), max_cpu_loras=2)
    entry = registry.load("a", Path("/x/a"))
    registry.unload("a")
    assert "a" not in registry and registry.num_host_copies == 0
    assert registry.weights(entry.adapter_id) == "a#2"
    with pytest.raises(ModelNotFound):
        registry.unload("a")
    with pytest.raises(ModelNotFound):
        registry.weights(99)


def test_the_host_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LoraRegistry(FakeLoader(), max_cpu_loras=0)
