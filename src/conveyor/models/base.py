"""The protocol a one-shot (embedding) model implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

EmbeddingInput = str | list[int]
Vector = npt.NDArray[np.float32]


@dataclass(slots=True, frozen=True)
class EncodedInput:
    """An input made ready for the model, with its real token count."""

    payload: Any
    num_tokens: int


class EmbeddingModel(Protocol):
    """A model that maps each input to one vector, in batches.

    ``encode`` runs on the event loop (cheap: tokenising, validating) and raises
    ``InvalidRequest`` for inputs it cannot take; ``embed_batch`` runs on the
    model's own thread and returns exactly one vector per payload.
    """

    name: str
    dim: int
    max_input_tokens: int

    def encode(self, inputs: Sequence[EmbeddingInput], *, truncate: bool) -> list[EncodedInput]:
        """Tokenise and validate inputs; raise ``InvalidRequest`` naming the bad one."""
        ...

    def embed_batch(self, payloads: list[Any]) -> list[Vector]:
        """Run one batch; raise ``ModelOutOfMemory``, ``InputRejected`` or anything else."""
        ...

    def close(self) -> None:
        """Release the model's resources."""
        ...


def too_long_message(index: int, num_tokens: int, limit: int) -> str:
    """The 400 message for an input over the model's limit."""
    return (
        f"input[{index}] has {num_tokens} tokens, more than this model accepts ({limit}); "
        'shorten it or send "truncate": true'
    )


def shorten_vectors(vectors: list[Vector], dimensions: int) -> list[Vector]:
    """The first ``dimensions`` of each vector, renormalised to unit length (Matryoshka).

    A zero prefix stays zero rather than dividing by zero.
    """
    shortened: list[Vector] = []
    for vector in vectors:
        head = vector[:dimensions].astype(np.float32, copy=True)
        norm = float(np.linalg.norm(head))
        shortened.append(head / norm if norm > 0 else head)
    return shortened
