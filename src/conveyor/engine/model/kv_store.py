"""The second KV tier's data: host-memory slots (pinned on CUDA) and optional disk files.

Carries out the operations ``engine.core.kv_tier.TierIndex`` queued, in order, against
the runner's KV cache: a block is every layer's K and V for ``block_size`` positions,
``cache[:, :, block_id]`` of the ``[layers, 2, blocks, block_size, kv_heads, head_dim]``
allocation. Copies to the device are issued without waiting (the step that reads them
runs on the same stream); the host is synchronised only before it reads a slot itself
(a demotion to disk). Disk blocks are raw bytes written by ``engine.model.kv_disk`` off
the engine thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from conveyor.engine.core.kv_tier import Demote, Discard, Restore, Spill, TierOp
from conveyor.engine.model.kv_disk import DiskBlocks
from conveyor.observability.kv_tier_metrics import KV_TIER_DIRECTIONS

__all__ = ["HostKVStore", "TransferBytes"]


@dataclass(slots=True)
class TransferBytes:
    """Bytes moved by one ``apply``, per direction (``KV_TIER_DIRECTIONS``)."""

    by_direction: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(KV_TIER_DIRECTIONS, 0)
    )


class HostKVStore:
    """``num_slots`` blocks of host memory beside a KV cache, and a disk directory."""

    def __init__(
        self, kv_cache: torch.Tensor, num_slots: int, disk_dir: str | Path | None = None
    ) -> None:
        """``kv_cache`` is the runner's whole allocation; ``disk_dir`` the parent of this
        store's own directory of disk blocks (None: no disk tier)."""
        if kv_cache.dim() != 6 or kv_cache.shape[1] != 2:
            raise ValueError("kv_cache must be shaped [layers, 2, blocks, block, heads, dim]")
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self._cache = kv_cache
        layers, _, _, *block = kv_cache.shape
        pin = kv_cache.device.type == "cuda"
        self._slots = torch.zeros(
            (num_slots, layers, 2, *block), dtype=kv_cache.dtype, pin_memory=pin
        )
        self.block_bytes = self._slots[0].numel() * self._slots.element_size()
        self._disk: DiskBlocks | None = None
        if disk_dir is not None:
            self._disk = DiskBlocks(disk_dir, self.block_bytes)

    def apply(self, ops: Sequence[TierOp]) -> TransferBytes:
        """Carry out ``ops`` in order; the bytes moved per direction."""
        moved = TransferBytes()
        counts = moved.by_direction
        for op in ops:
            if isinstance(op, Spill):
                self._slots[op.slot].copy_(self._cache[:, :, op.block_id], non_blocking=True)
                counts["device_to_host"] += self.block_bytes
            elif isinstance(op, Restore):
                source = self._slots[op.slot] if op.slot is not None else self._read(op.digest)
                self._cache[:, :, op.block_id].copy_(source, non_blocking=op.slot is not None)
                direction = "host_to_device" if op.slot is not None else "disk_to_device"
                counts[direction] += self.block_bytes
            elif isinstance(op, Demote):
                self._write(op.slot, op.digest)
                counts["host_to_disk"] += self.block_bytes
            elif isinstance(op, Discard):
                self._disk_blocks().discard(op.digest)
        return moved

    def read_slot(self, slot: int) -> torch.Tensor:
        """A copy of host slot ``slot`` (for tests and checks)."""
        self._synchronize()
        return self._slots[slot].clone()

    def close(self) -> None:
        """Finish the queued disk writes, then remove this store's disk directory."""
        if self._disk is not None:
            self._disk.close()

    def _write(self, slot: int, digest: bytes) -> None:
        """Hand a host slot's bytes to the disk writer (the slot is free again at once)."""
        disk = self._disk_blocks()
        self._synchronize()  # a spill into this slot may still be in flight
        disk.write(digest, self._slots[slot].view(torch.uint8).numpy().tobytes())

    def _read(self, digest: bytes) -> torch.Tensor:
        """A block read back from disk, shaped like a slot; OSError when it is gone."""
        raw = self._disk_blocks().read(digest)
        flat = torch.frombuffer(raw, dtype=torch.uint8).view(self._slots.dtype)
        return flat.view(self._slots.shape[1:])

    def _disk_blocks(self) -> DiskBlocks:
        """The disk tier; OSError when this store has none."""
        if self._disk is None:
            raise OSError("this store has no disk tier")
        return self._disk

    def _synchronize(self) -> None:
        """Wait for queued device copies before the host reads a slot."""
        if self._cache.device.type == "cuda":
            torch.cuda.synchronize(self._cache.device)
