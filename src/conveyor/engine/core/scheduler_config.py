"""The scheduler's per-step limits, validated when they are made (standard library only)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    """Per-step limits of the scheduler."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    # Distinct LoRA adapters among running sequences (so in any step); None: no adapters.
    max_loras_per_batch: int | None = None

    def __post_init__(self) -> None:
        names = ["max_num_seqs", "max_num_batched_tokens", "max_model_len"]
        if self.max_loras_per_batch is not None:
            names.append("max_loras_per_batch")
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs}) so every running sequence can decode"
            )
