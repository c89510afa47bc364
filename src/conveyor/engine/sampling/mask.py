"""Grammar masks for one engine step, computed on a side thread while the model runs.

The masks depend only on the tokens already sampled, so they are started before the
forward pass and collected after it: llguidance fills them in Rust with the GIL
released, in parallel over the step's constrained rows, while torch runs the model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import torch

__all__ = ["MaskComputer", "PendingMasks", "unpack_bitmask"]

_BITS = 32


def unpack_bitmask(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """bool [N, width] from llguidance's int32 bitmask [N, words]; ids past the mask: False."""
    shifts = torch.arange(_BITS, dtype=torch.int32)
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(bitmask.shape[0], -1).bool()
    if bits.shape[1] >= width:
        return bits[:, :width]
    padding = torch.zeros((bits.shape[0], width - bits.shape[1]), dtype=torch.bool)
    return torch.cat([bits, padding], dim=1)


class PendingMasks:
    """A step's masks being computed; :meth:`wait` returns them as bool [N, V]."""

    def __init__(self, future: Future[torch.Tensor], vocab_size: int) -> None:
        self._future = future
        self._vocab_size = vocab_size
        self.wait_s = 0.0

    def wait(self) -> torch.Tensor:
        """Block until the masks are ready: bool [N, V] (time blocked kept in ``wait_s``)."""
        started_s = time.perf_counter()
        bitmask = self._future.result()
        allowed = unpack_bitmask(bitmask, self._vocab_size)
        self.wait_s = time.perf_counter() - started_s
        return allowed


class MaskComputer:
    """Starts mask computations for a step's rows; one side thread, llguidance's own pool.

    ``compute_s`` adds up the seconds spent filling masks (on the side thread), so a
    benchmark can report what constrained decoding costs.
    """

    def __init__(self, *, num_threads: int | None = None) -> None:
        self._executor = llguidance.LLExecutor(num_threads)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        self.compute_s = 0.0

    def start(
        self, matchers: Sequence[llguidance.LLMatcher | None], vocab_size: int
    ) -> PendingMasks | None:
        """Masks of ``vocab_size`` bits per row (the matchers' tokenizer size); rows without a
        matcher allow everything. None when no row has a matcher."""
        indexed = [(matcher, row) for row, matcher in enumerate(matchers) if matcher is not None]
        if not indexed:
            return None
        num_words = (vocab_size + _BITS - 1) // _BITS
        bitmask = torch.full((len(matchers), num_words), -1, dtype=torch.int32)
        future = self._pool.submit(self._fill, indexed, bitmask)
        return PendingMasks(future, vocab_size)

    def _fill(
        self, indexed: list[tuple[llguidance.LLMatcher, int]], bitmask: torch.Tensor
    ) -> torch.Tensor:
        """Fill the rows of ``bitmask`` that have matchers (GIL released inside)."""
        started_s = time.perf_counter()
        row_bytes = bitmask.shape[1] * bitmask.element_size()
        self._executor.unsafe_compute_mask_ptr(
            indexed, bitmask.data_ptr(), row_bytes, bitmask.shape[0]
        )
        self.compute_s += time.perf_counter() - started_s
        return bitmask

    def close(self) -> None:
        """Stop the side thread (pending work finishes first)."""
        self._pool.shutdown(wait=True)
