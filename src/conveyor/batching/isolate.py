"""Run a batch so that failures stay small.

When a batch raises, it is split in halves and each half retried, so only the
inputs that really fail get an error and every other input gets its result.
An out-of-memory error halves the batch (and tells the governor) instead.
Runs on the model thread; pure apart from calling ``run``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from conveyor.errors import (
    ConveyorError,
    ModelContractError,
    ModelFault,
    ModelOutOfMemory,
)

log = logging.getLogger(__name__)

RunBatch = Callable[[list[Any]], Sequence[Any]]
OnOom = Callable[[int], int]


class _Cap:
    """The live batch cap: lowered by every OOM, read before every model call."""

    def __init__(self, value: int, on_oom: OnOom) -> None:
        self.value = max(1, value)
        self._on_oom = on_oom

    def lower(self, failed_size: int) -> None:
        self.value = max(1, min(self.value, self._on_oom(failed_size), failed_size // 2))


def run_isolated(run: RunBatch, payloads: list[Any], *, cap: int, on_oom: OnOom) -> list[Any]:
    """Results for ``payloads`` in order: each a model output or a ``ConveyorError``.

    ``cap`` bounds each model call; ``on_oom(size)`` records an out-of-memory
    error at that size and returns the new cap, which every later call obeys.
    """
    return _run_capped(run, payloads, _Cap(cap, on_oom))


def _run_capped(run: RunBatch, payloads: list[Any], cap: _Cap) -> list[Any]:
    results: list[Any] = []
    start = 0
    while start < len(payloads):
        chunk = payloads[start : start + cap.value]
        results.extend(_run_chunk(run, chunk, cap))
        start += len(chunk)
    return results


def _run_chunk(run: RunBatch, payloads: list[Any], cap: _Cap) -> list[Any]:
    try:
        outputs = run(payloads)
    except ModelOutOfMemory as exc:
        if len(payloads) == 1:
            return [ModelFault(f"out of memory on a single input: {exc}", code="out_of_memory")]
        cap.lower(len(payloads))
        return _run_capped(run, payloads, cap)
    except Exception as exc:  # a model fault of any kind: isolate it, never crash the loop
        return _bisect(run, payloads, cap, exc)
    if len(outputs) != len(payloads):
        message = f"model returned {len(outputs)} outputs for a batch of {len(payloads)} inputs"
        log.error(message)
        return [ModelContractError(message) for _ in payloads]
    return list(outputs)


def _bisect(run: RunBatch, payloads: list[Any], cap: _Cap, exc: Exception) -> list[Any]:
    if len(payloads) == 1:
        return [_as_item_error(exc)]
    middle = len(payloads) // 2
    return _run_chunk(run, payloads[:middle], cap) + _run_chunk(run, payloads[middle:], cap)


def _as_item_error(exc: Exception) -> ConveyorError:
    if isinstance(exc, ConveyorError):  # InputRejected (400) and ModelFault (500) keep theirs
        return exc
    log.exception("model fault on a single input", exc_info=exc)
    return ModelFault(f"model failed on this input: {type(exc).__name__}: {exc}")
