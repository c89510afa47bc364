"""A calibrated stand-in for a GPU model, with fault injection.

A batch of n inputs takes ``batch_latency_ms + n * per_item_ms``, spent in
``time.sleep`` so the GIL is free as it would be while a GPU computes. Vectors
are deterministic functions of each input.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from conveyor.config.model_config import SyntheticModelConfig
from conveyor.errors import InputRejected, InvalidRequest, ModelOutOfMemory
from conveyor.models.base import EmbeddingInput, EncodedInput, Vector, too_long_message


class SyntheticModel:
    """An embedding model whose cost and failures are set by configuration."""

    def __init__(self, config: SyntheticModelConfig) -> None:
        self.config = config
        self.name = config.name
        self.dim = config.dim
        self.max_input_tokens = config.max_input_tokens
        self.num_batches = 0
        self.batch_sizes: list[int] = []

    def encode(self, inputs: Sequence[EmbeddingInput], *, truncate: bool) -> list[EncodedInput]:
        """Whitespace words are this model's tokens; token-id lists count as they are."""
        encoded = []
        for index, item in enumerate(inputs):
            if self.config.crash_marker is not None and self.config.crash_marker in _text(item):
                # Not a ConveyorError: stands for a bug, so it must surface as a 500.
                raise RuntimeError(f"input contains the crash marker {self.config.crash_marker!r}")
            tokens: Sequence[object] = item.split() if isinstance(item, str) else item
            num_tokens = max(1, len(tokens))
            payload: Any = item if isinstance(item, str) else tuple(item)
            if num_tokens > self.max_input_tokens:
                if not truncate:
                    raise InvalidRequest(
                        too_long_message(index, num_tokens, self.max_input_tokens), param="input"
                    )
                num_tokens = self.max_input_tokens
                payload = _truncate(payload, self.max_input_tokens)
            encoded.append(EncodedInput(payload, num_tokens))
        return encoded

    def embed_batch(self, payloads: list[Any]) -> list[Vector]:
        """Sleep for the batch time, inject configured faults, return vectors."""
        cfg = self.config
        self.num_batches += 1
        self.batch_sizes.append(len(payloads))
        if cfg.oom_above is not None and len(payloads) > cfg.oom_above:
            raise ModelOutOfMemory(f"batch of {len(payloads)} exceeds {cfg.oom_above}")
        delay_ms = cfg.batch_latency_ms + len(payloads) * cfg.per_item_ms
        if cfg.slow_marker is not None:
            delay_ms += cfg.slow_ms * sum(cfg.slow_marker in _text(p) for p in payloads)
        if delay_ms > 0:
            time.sleep(delay_ms / 1000)
        if cfg.fail_marker is not None:
            for payload in payloads:
                if cfg.fail_marker in _text(payload):
                    raise InputRejected(f"input contains the fail marker {cfg.fail_marker!r}")
        return [synthetic_vector(p, self.dim) for p in payloads]

    def close(self) -> None:
        """Nothing to release."""


def synthetic_vector(payload: Any, dim: int) -> Vector:
    """A unit vector derived from the input alone (same input, same vector)."""
    seed = _text(payload).encode()
    chunks: list[np.ndarray[Any, np.dtype[np.int32]]] = []
    counter = 0
    while len(chunks) * 16 < dim:
        digest = hashlib.blake2b(seed, digest_size=64, salt=counter.to_bytes(8, "little"))
        chunks.append(np.frombuffer(digest.digest(), dtype=np.int32))
        counter += 1
    raw = np.concatenate(chunks)[:dim].astype(np.float32)
    norm = float(np.linalg.norm(raw)) or 1.0
    return (raw / norm).astype(np.float32)


def _text(payload: Any) -> str:
    return payload if isinstance(payload, str) else " ".join(map(str, payload))


def _truncate(payload: Any, limit: int) -> Any:
    if isinstance(payload, str):
        return " ".join(payload.split()[:limit])
    return tuple(payload[:limit])
