"""The second KV tier's data: a block spilled and restored (through host or disk) is
bit-identical, and the bytes each direction moved are counted."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from conveyor.engine.core.kv_tier import Demote, Discard, Restore, Spill
from conveyor.engine.model.kv_store import HostKVStore

SHAPE = (3, 2, 5, 4, 2, 8)  # layers, K/V, blocks, block size, kv heads, head dim


def random_cache(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_block_restored_from_host_is_bit_identical(dtype: torch.dtype) -> None:
    cache = random_cache(dtype)
    original = cache[:, :, 2].clone()
    store = HostKVStore(cache, num_slots=2)
    store.apply([Spill(2, 1)])
    cache[:, :, 2] = 0  # the pool block is reused for other content
    moved = store.apply([Restore(4, 1, b"x")])
    assert torch.equal(cache[:, :, 4].view(torch.uint8), original.view(torch.uint8))
    assert moved.by_direction["host_to_device"] == store.block_bytes
    assert store.block_bytes == original.numel() * original.element_size()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_block_restored_from_disk_is_bit_identical(tmp_path: Path, dtype: torch.dtype) -> None:
    cache = random_cache(dtype)
    original = cache[:, :, 1].clone()
    store = HostKVStore(cache, num_slots=1, disk_dir=tmp_path)
    moved = store.apply([Spill(1, 0), Demote(0, b"d1"), Spill(3, 0)])
    assert moved.by_direction == {
        "device_to_host": 2 * store.block_bytes, "host_to_device": 0,
        "host_to_disk": store.block_bytes, "disk_to_device": 0,
    }  # fmt: skip
    assert torch.equal(store.read_slot(0), cache[:, :, 3])
    cache[:, :, 1] = 0
    moved = store.apply([Restore(0, None, b"d1")])
    assert torch.equal(cache[:, :, 0].view(torch.uint8), original.view(torch.uint8))
    assert moved.by_direction["disk_to_device"] == store.block_bytes
    store.apply([Discard(b"d1")])
    with pytest.raises(OSError):
        store.apply([Restore(0, None, b"d1")])
    store.close()
    assert list(tmp_path.iterdir()) == []


def test_a_store_without_a_disk_tier_refuses_disk_ops() -> None:
    store = HostKVStore(random_cache(), num_slots=1)
    with pytest.raises(OSError, match="no disk tier"):
        store.apply([Demote(0, b"d")])


def test_bad_shapes_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="shaped"):
        HostKVStore(torch.zeros(2, 3, 4), num_slots=1)
    with pytest.raises(ValueError, match="num_slots"):
        HostKVStore(random_cache(), num_slots=0)


def test_a_demotion_does_not_wait_for_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write to disk runs on the tier's own thread; until it lands, a restore reads the
    bytes held in memory."""
    disk_free = threading.Event()
    writers: list[str] = []
    real_write = Path.write_bytes

    def held_write(path: Path, data: bytes) -> int:
        writers.append(threading.current_thread().name)
        assert disk_free.wait(10)
        return real_write(path, data)

    monkeypatch.setattr(Path, "write_bytes", held_write)
    cache = random_cache()
    original = cache[:, :, 1].clone()
    store = HostKVStore(cache, num_slots=1, disk_dir=tmp_path)
    store.apply([Spill(1, 0), Demote(0, b"d1"), Spill(3, 0)])
    store.apply([Restore(2, None, b"d1")])
    assert torch.equal(cache[:, :, 2], original)
    disk_free.set()
    store.close()
    assert writers and threading.current_thread().name not in writers
