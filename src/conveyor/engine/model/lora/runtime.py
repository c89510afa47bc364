"""Adapters on the device, and each step's per-token adapter groups.

The base projections run once for the whole step; every projection with LoRA then adds,
for each adapter present in the step, ``(x[rows] A^T) B^T`` into its rows (a segmented
gather matmul, as Punica's SGMV): one pair of small matmuls per adapter in the step,
none for base-only rows, and nothing at all in a step without adapters.

At most ``max_loras_per_batch`` adapters are resident on the device (an LRU); the
scheduler keeps the running sequences within that many distinct adapters, so a step's
adapters always fit. Runs on the engine thread only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from conveyor.config.model_config import DEFAULT_MAX_ADAPTER_BYTES
from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.hf_config import DecoderConfig
from conveyor.engine.model.lora.peft_format import LoraWeights, ModuleKey, load_peft_adapter
from conveyor.engine.model.lora.registry import LoraRegistry

__all__ = ["LoraLinear", "LoraRuntime", "LoraStepState", "new_lora_runtime"]

# The decoder's projections adapters may change: (parent module attribute, projection).
_TARGETS = (
    ("self_attn", "qkv_proj"),
    ("self_attn", "o_proj"),
    ("mlp", "gate_up_proj"),
    ("mlp", "down_proj"),
)


# A step of at most this many tokens with several adapters takes the stacked path.
STACKED_MAX_TOKENS = 64

# Per projection: every step adapter's A stacked [sum of ranks, in], their B side by side
# [out, sum of ranks], and which adapter (its index in the step's list) owns each rank.
Stack = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(slots=True)
class StackedStep:
    """A small step's adapters stacked: each token keeps only its own adapter's ranks."""

    token_slots: torch.Tensor  # [T, 1]: the token's adapter index, -1 for the base
    stacks: dict[ModuleKey, Stack]


@dataclass(slots=True)
class LoraStepState:
    """The current step's adapters, as groups (weights, token rows) or stacked."""

    groups: list[tuple[LoraWeights, torch.Tensor]] = field(default_factory=list)
    stacked: StackedStep | None = None


class LoraLinear(nn.Module):
    """A base projection plus the low-rank delta of each token's adapter."""

    def __init__(self, base: nn.Module, key: tuple[int, str], state: LoraStepState) -> None:
        super().__init__()
        self.base = base
        self.key = key
        self.state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``base(x)``, then each adapter group's delta added into its rows."""
        out: torch.Tensor = self.base(x)
        stacked = self.state.stacked
        if stacked is not None:
            stack = stacked.stacks.get(self.key)
            if stack is not None:
                a, b, owner = stack
                # All adapters' ranks at once; each token's row keeps its own adapter's.
                low = (x @ a.T) * (owner == stacked.token_slots)
                out.addmm_(low, b.T)
            return out
        for weights, rows in self.state.groups:
            pair = weights.modules.get(self.key)
            if pair is None:
                continue
            a, b = pair
            delta = (x.index_select(0, rows) @ a.T) @ b.T
            out.index_add_(0, rows, delta)
        return out


class LoraRuntime:
    """Device-resident adapters (an LRU of ``slots``) and the step state the layers read."""

    def __init__(
        self,
        registry: LoraRegistry[LoraWeights],
        *,
        slots: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.registry = registry
        self.slots = slots
        self.device = device
        self.dtype = dtype
        self.state = LoraStepState()
        self._resident: OrderedDict[int, LoraWeights] = OrderedDict()
        self._stacks_key: tuple[int, ...] = ()
        self._stacks: dict[ModuleKey, Stack] = {}
        self.num_device_loads = 0

    @property
    def resident_ids(self) -> list[int]:
        """Adapter ids on the device, least recently used first."""
        return list(self._resident)

    def attach(self, model: nn.Module) -> None:
        """Wrap the decoder's projections (after its weights are loaded) in ``LoraLinear``."""
        layers = model.get_submodule("model.layers")
        assert isinstance(layers, nn.ModuleList)
        for index, layer in enumerate(layers):
            for parent_name, name in _TARGETS:
                parent = layer.get_submodule(parent_name)
                base = getattr(parent, name)
                setattr(parent, name, LoraLinear(base, (index, name), self.state))

    def begin_step(self, chunks: Sequence[SeqChunk]) -> None:
        """Make the step's adapters resident and group the step's token rows by adapter."""
        rows: dict[int, list[int]] = {}
        start = 0
        for chunk in chunks:
            end = start + len(chunk.token_ids)
            if chunk.adapter_id:
                rows.setdefault(chunk.adapter_id, []).extend(range(start, end))
            start = end
        resident = self._activate(set(rows))
        if len(rows) > 1 and start <= STACKED_MAX_TOKENS:
            self.state.stacked = self._stacked_step(chunks, resident)
            return
        self.state.groups = [
            (resident[adapter_id], torch.tensor(ids, dtype=torch.int64).to(self.device))
            for adapter_id, ids in rows.items()
        ]

    def end_step(self) -> None:
        """Forget the step's adapters."""
        self.state.groups = []
        self.state.stacked = None

    def _stacked_step(
        self, chunks: Sequence[SeqChunk], resident: dict[int, LoraWeights]
    ) -> StackedStep:
        """Stacks of the step's adapters (kept while the set is unchanged) and token slots.

        Few tokens and several adapters: a few large matmuls beat a few small ones per
        adapter, whose fixed cost dominates then (the extra work is the other adapters'
        ranks, multiplied by zero).
        """
        key = tuple(sorted(resident))
        if self._stacks_key != key:
            self._stacks = _stack([resident[adapter_id] for adapter_id in key])
            self._stacks_key = key
        slot_of = {adapter_id: index for index, adapter_id in enumerate(key)}
        slots = [slot_of.get(chunk.adapter_id, -1) for chunk in chunks for _ in chunk.token_ids]
        token_slots = torch.tensor(slots, dtype=torch.int64).to(self.device)[:, None]
        return StackedStep(token_slots, self._stacks)

    def _activate(self, adapter_ids: set[int]) -> dict[int, LoraWeights]:
        """Bring every adapter of the step onto the device, evicting others (LRU)."""
        if len(adapter_ids) > self.slots:
            raise ValueError(
                f"a step uses {len(adapter_ids)} adapters; only {self.slots} fit on the device"
            )
        for adapter_id in adapter_ids:
            if adapter_id in self._resident:
                self._resident.move_to_end(adapter_id)
                continue
            while len(self._resident) >= self.slots:
                victim = next(i for i in self._resident if i not in adapter_ids)
                del self._resident[victim]
            weights = self.registry.weights(adapter_id)
            self._resident[adapter_id] = weights.to(self.device, self.dtype)
            self.num_device_loads += 1
        return {adapter_id: self._resident[adapter_id] for adapter_id in adapter_ids}


def new_lora_runtime(
    config: DecoderConfig,
    *,
    slots: int,
    max_cpu_loras: int,
    max_rank: int,
    device: torch.device,
    dtype: torch.dtype,
    max_adapter_bytes: int = DEFAULT_MAX_ADAPTER_BYTES,
) -> LoraRuntime:
    """A runtime with an empty registry that reads PEFT adapters for a decoder of ``config``."""

    def load(path: Path) -> tuple[int, LoraWeights]:
        weights = load_peft_adapter(path, config, max_rank=max_rank, max_bytes=max_adapter_bytes)
        return weights.rank, weights

    registry: LoraRegistry[LoraWeights] = LoraRegistry(load, max_cpu_loras=max_cpu_loras)
    return LoraRuntime(registry, slots=slots, device=device, dtype=dtype)


def _stack(adapters: list[LoraWeights]) -> dict[ModuleKey, Stack]:
    """Per projection, the adapters' A and B side by side and each rank's adapter index."""
    keys = sorted({key for weights in adapters for key in weights.modules})
    stacks: dict[ModuleKey, Stack] = {}
    for key in keys:
        present = [(i, w.modules[key]) for i, w in enumerate(adapters) if key in w.modules]
        a = torch.cat([pair[0] for _, pair in present])
        b = torch.cat([pair[1] for _, pair in present], dim=1)
        owner = torch.cat(
            [torch.full((pair[0].shape[0],), i, dtype=torch.int64) for i, pair in present]
        ).to(a.device)
        stacks[key] = (a, b.contiguous(), owner)
    return stacks
