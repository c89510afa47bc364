"""The KV tier's disk blocks: written on their own thread, readable at once, deleted in
order, and a failed write reads as a missing block."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.engine.model.kv_disk import DiskBlocks

SIZE = 16


class HeldWrites:
    """``Path.write_bytes`` that waits for ``release`` and records its thread."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.threads: list[str] = []
        self.fail_next = False
        self._real = Path.write_bytes

    def __call__(self, path: Path, data: bytes) -> int:
        self.threads.append(threading.current_thread().name)
        assert self.released.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk full")
        return self._real(path, data)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> HeldWrites:
    writes = HeldWrites()

    def write_bytes(path: Path, data: bytes) -> int:
        return writes(path, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    return writes


@pytest.fixture
def disk(tmp_path: Path, held: HeldWrites) -> Iterator[DiskBlocks]:
    blocks = DiskBlocks(tmp_path, SIZE)
    yield blocks
    held.released.set()
    blocks.close()


def test_a_write_waits_for_no_disk_and_reads_back_at_once(
    disk: DiskBlocks, held: HeldWrites
) -> None:
    disk.write(b"a", b"x" * SIZE)  # the disk is held: this would hang on the caller's thread
    assert disk.read(b"a") == b"x" * SIZE
    held.released.set()
    disk.flush()
    assert disk.path(b"a").read_bytes() == b"x" * SIZE
    assert held.threads and all(name.startswith("kv-disk") for name in held.threads)
    assert disk.read(b"a") == b"x" * SIZE  # now from the file


def test_a_discarded_block_is_gone_even_before_its_write_lands(
    disk: DiskBlocks, held: HeldWrites
) -> None:
    disk.write(b"a", b"x" * SIZE)
    disk.discard(b"a")
    with pytest.raises(OSError, match="discarded"):
        disk.read(b"a")
    held.released.set()
    disk.flush()
    assert not disk.path(b"a").exists()
    with pytest.raises(OSError):
        disk.read(b"a")


def test_a_block_written_again_after_a_discard_reads_its_new_bytes(
    disk: DiskBlocks, held: HeldWrites
) -> None:
    disk.write(b"a", b"x" * SIZE)
    disk.discard(b"a")
    disk.write(b"a", b"y" * SIZE)
    assert disk.read(b"a") == b"y" * SIZE
    held.released.set()
    disk.flush()
    assert disk.read(b"a") == b"y" * SIZE


def test_a_failed_write_reads_as_a_missing_block(disk: DiskBlocks, held: HeldWrites) -> None:
    held.fail_next = True
    disk.write(b"a", b"x" * SIZE)
    held.released.set()
    disk.flush()
    with pytest.raises(OSError, match="not written"):
        disk.read(b"a")
    assert list(disk.directory.iterdir()) == []  # no partial file left


def test_close_finishes_the_writes_then_removes_the_directory(tmp_path: Path) -> None:
    blocks = DiskBlocks(tmp_path, SIZE)
    blocks.write(b"a", b"x" * SIZE)
    blocks.close()
    assert list(tmp_path.iterdir()) == []


def test_a_block_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    blocks = DiskBlocks(tmp_path, SIZE)
    with pytest.raises(ValueError, match="16 bytes"):
        blocks.write(b"a", b"x")
    blocks.path(b"b").write_bytes(b"short")
    with pytest.raises(OSError, match="5 bytes"):
        blocks.read(b"b")
    blocks.close()
